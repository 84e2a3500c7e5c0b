"""The admission chain the chart registers, run offline: which of its webhooks a write is sent to
(their ``rules`` and ``matchConditions``, as ``helm template`` renders them, evaluated by a CEL
runtime), what its ValidatingAdmissionPolicies say of it, and what the webhook itself answers
(``admission.mutate`` and ``validate``): what the API server would let a tenant write."""

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonpatch
from cel_expr_python import cel

from tests.builders import request
from tests.e2e.registration import render
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.model.verdicts import Allowed

TEMPLATES = ("templates/webhooks.yaml", "templates/policy.yaml")
WEBHOOK_USER = "system:serviceaccount:card-quota:cq"  # the chart's user for release cq in card-quota
GROUPS = {"pods": "", "replicasets": "apps", "deployments": "apps", "statefulsets": "apps"}
GROUPS |= {"podgroups": "scheduling.volcano.sh", "queues": "scheduling.volcano.sh"}


@functools.cache
def _env() -> Any:
    from cel_expr_python.ext import ext_strings  # Kubernetes' CEL has the strings library (join)

    variables = {n: cel.Type.DYN for n in ("object", "oldObject", "request", "variables")}
    return cel.NewEnv(variables=variables, extensions=[ext_strings.ExtStrings()])


def _compile(text: str) -> Any:
    return _env().compile(text)


def _matches(rules: Sequence[dict[str, Any]], group: str, resource: str, operation: str) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and (operation in r["operations"] or "*" in r["operations"])
        for r in rules
    )


@dataclass
class Hook:
    name: str
    path: str  # /validate or /mutate
    rules: list[dict[str, Any]]
    conditions: list[Any]


@dataclass
class Policy:
    name: str
    rules: list[dict[str, Any]]
    conditions: list[Any]
    variables: list[tuple[str, Any]]
    validations: list[tuple[Any, Any]]  # (expression, messageExpression)


@functools.cache
def chart(*flags: str) -> tuple[list[Hook], list[Policy]]:
    hooks, policies = [], []
    for doc in render(flags, TEMPLATES):
        if doc["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
            for hook in doc["webhooks"]:
                path = "/validate" if doc["kind"].startswith("Validating") else "/mutate"
                conditions = [_compile(c["expression"]) for c in hook.get("matchConditions", [])]
                hooks.append(Hook(hook["name"], path, hook["rules"], conditions))
        elif doc["kind"] == "ValidatingAdmissionPolicy":
            spec = doc["spec"]
            policies.append(
                Policy(
                    doc["metadata"]["name"],
                    spec["matchConstraints"]["resourceRules"],
                    [_compile(c["expression"]) for c in spec.get("matchConditions", [])],
                    [(v["name"], _compile(v["expression"])) for v in spec.get("variables", [])],
                    [
                        (
                            _compile(v["expression"]),
                            _compile(v["messageExpression"]) if "messageExpression" in v else None,
                        )
                        for v in spec["validations"]
                    ],
                )
            )
    return hooks, policies


def _value(program: Any, data: dict[str, Any]) -> Any:
    """The plain value of an expression; an evaluation error fails the test (the API server would
    apply the failure policy: never a silent pass)."""
    result = program.eval(data=data)
    assert result.type().name() != "ERROR", result.value()
    return result.plain_value()


@dataclass
class Outcome:
    allowed: bool
    obj: dict[str, Any]  # as it is stored (mutated) when allowed
    why: str = ""


def write(
    state: ClusterState,
    resource: str,
    operation: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = "alice",
    now: float = 0.0,
) -> Outcome:
    """A write by ``user`` through the chart's admission chain and the webhook: mutating webhooks,
    then the policies and the validating webhooks, as the API server runs them."""
    group = GROUPS[resource]
    obj = copy.deepcopy(obj)
    review = {
        "resource": {"group": group, "version": "v1", "resource": resource},
        "subResource": "",
        "operation": operation,
        "userInfo": {"username": user},
        "namespace": obj["metadata"].get("namespace", ""),
    }
    hooks, policies = chart()

    def sent(hook: Hook, path: str) -> bool:
        if hook.path != path or not _matches(hook.rules, group, resource, operation):
            return False
        data = {"object": obj, "oldObject": old, "request": review, "variables": {}}
        return all(_value(c, data) for c in hook.conditions)

    for hook in hooks:
        if sent(hook, "/mutate"):
            decision = admission.mutate(
                state, request(obj, resource=resource, operation=operation, old=old, group=group), now=now
            )
            if not isinstance(decision, Allowed):
                return Outcome(False, obj, f"{hook.name}: {decision.message}")
            obj = jsonpatch.apply_patch(obj, [dict(op) for op in decision.patch])
    for policy in policies:
        if not _matches(policy.rules, group, resource, operation):
            continue
        data: dict[str, Any] = {"object": obj, "oldObject": old, "request": review, "variables": {}}
        if not all(_value(c, data) for c in policy.conditions):
            continue
        for name, program in policy.variables:
            data["variables"] = {**data["variables"], name: _value(program, data)}
        for check, message in policy.validations:
            if not _value(check, data):
                return Outcome(False, obj, f"{policy.name}: {_value(message, data) if message else ''}")
    for hook in hooks:
        if sent(hook, "/validate"):
            review_request = request(obj, resource=resource, operation=operation, old=old, group=group)
            decision = admission.validate(state, review_request, now)
            admission.admit(state, review_request, decision, now)
            if not isinstance(decision, Allowed):
                return Outcome(False, obj, f"{hook.name}: {decision.message}")
    return Outcome(True, obj)
