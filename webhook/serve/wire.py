"""``admission.k8s.io/v1`` AdmissionReview, as pydantic models, and its translation to core values."""

import base64
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.core.decide import admission
from webhook.core.model.quoting import shorten
from webhook.core.model.verdicts import Allowed, Decision, Denied, Request
from webhook.errors import BadReview


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)  # the fields read, no more


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Model):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(_Model):
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str = Field("", alias="subResource")
    name: str = ""
    namespace: str = ""
    operation: str
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(None, alias="oldObject")
    dry_run: bool = Field(False, alias="dryRun")


class AdmissionReview(_Model):
    api_version: str = Field(alias="apiVersion")
    kind: str
    request: AdmissionRequest


API_VERSION = "admission.k8s.io/v1"


def parse_review(body: bytes | str) -> AdmissionRequest:
    """Parse an AdmissionReview; raise :class:`BadReview` saying what is wrong.

    orjson refuses what JSON forbids (NaN, Infinity, lone surrogates, numbers past 64 bits) and
    nesting past 1,024 levels; pydantic then checks only the envelope, never the whole object.
    """
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise BadReview("not an AdmissionReview: the body must be a JSON object")
    if raw.get("apiVersion") != API_VERSION or raw.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} and kind AdmissionReview, got"
            f" {shorten(str(raw.get('apiVersion')))} {shorten(str(raw.get('kind')))}"
        )
    try:
        review = AdmissionReview.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadReview(f"not an AdmissionReview: {shorten(where)}: {first.get('msg')}") from exc
    return review.request


def to_request(req: AdmissionRequest) -> Request:
    """The request as the core reads it, its pod's template read once for every step that follows."""
    obj = req.object or {}
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}  # its shape is judged by the core, with a message
    resource, sub_resource = req.resource.resource, req.sub_resource
    return Request(
        uid=req.uid,
        kind=req.kind.kind,
        group=req.kind.group if not req.sub_resource else req.resource.group,
        resource=resource,
        sub_resource=sub_resource,
        operation=req.operation,
        namespace=req.namespace or str(meta.get("namespace") or ""),
        name=req.name or str(meta.get("name") or ""),
        obj=obj,
        old_obj=req.old_object or {},
        dry_run=req.dry_run,
        template=admission.pod_template(resource, sub_resource, req.operation, obj, req.namespace),
    )


def response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview response for a decision."""
    body: dict[str, Any] = {"uid": uid}
    match decision:
        case Allowed(warnings=warnings, patch=patch, would=would):
            body["allowed"] = True
            if patch:
                body["patchType"] = "JSONPatch"
                body["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
            if would is not None:  # the API server's audit log keeps them, prefixed with the webhook's name
                body["auditAnnotations"] = {"would-refuse": would.message, "enforcement": would.mode}
        case Denied(message=message, code=code):
            body["allowed"] = False
            body["status"] = {"code": code, "message": message, "reason": "Forbidden"}
            warnings = ()
    if warnings:
        body["warnings"] = list(warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body}
