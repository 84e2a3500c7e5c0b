"""``admission.k8s.io/v1`` AdmissionReview, as pydantic models, and its translation to core values."""

import base64
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.core.verdicts import Allowed, Decision, Denied, Request
from webhook.errors import BadReview


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Model):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(_Model):
    uid: str
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
    api_version: str = Field("admission.k8s.io/v1", alias="apiVersion")
    kind: str = "AdmissionReview"
    request: AdmissionRequest


def parse_review(body: bytes | str) -> AdmissionRequest:
    """Parse an AdmissionReview; raise :class:`BadReview` saying what is wrong."""
    try:
        review = AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadReview(f"not an AdmissionReview: {where}: {first.get('msg')}") from exc
    if review.kind != "AdmissionReview":
        raise BadReview(f"expected kind AdmissionReview, got {review.kind!r}")
    return review.request


def to_request(req: AdmissionRequest) -> Request:
    obj = req.object or {}
    meta = obj.get("metadata") or {}
    return Request(
        uid=req.uid,
        kind=req.kind.kind,
        group=req.kind.group if not req.sub_resource else req.resource.group,
        resource=req.resource.resource,
        sub_resource=req.sub_resource,
        operation=req.operation,
        namespace=req.namespace or str(meta.get("namespace") or ""),
        name=req.name or str(meta.get("name") or ""),
        obj=obj,
        old_obj=req.old_object or {},
        dry_run=req.dry_run,
    )


def response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview response for a decision."""
    body: dict[str, Any] = {"uid": uid}
    match decision:
        case Allowed(warnings=warnings, patch=patch):
            body["allowed"] = True
            if patch:
                body["patchType"] = "JSONPatch"
                body["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
        case Denied(message=message, code=code):
            body["allowed"] = False
            body["status"] = {"code": code, "message": message, "reason": "Forbidden"}
            warnings = ()
    if warnings:
        body["warnings"] = list(warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": body}
