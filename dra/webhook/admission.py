"""AdmissionReview (admission.k8s.io/v1) for ResourceClaims, ResourceClaimTemplates and DeviceClasses.

Each opaque config addressed to this driver is decoded as prepare decodes it; the first
problem of each is reported with its field path in the object, e.g.
``spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: ...``.
Configs for other drivers are left alone. Checks that need the allocated devices (memory,
MPS capability, per-device keys) cannot run here: no device is allocated at admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra.api import opaque
from dra.api.fields import FieldError

REVIEW_VERSION = "admission.k8s.io/v1"

#: Where each kind (resource.k8s.io/v1) keeps its configs.
CONFIG_PATHS = {
    "ResourceClaim": ("spec", "devices", "config"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "config"),
    "DeviceClass": ("spec", "config"),
}


class ReviewError(ValueError):
    """The request is not an AdmissionReview this webhook can answer (HTTP 400)."""


@dataclass(frozen=True)
class Verdict:
    """The answer for one object: allowed, or the problems that deny it."""

    kind: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        """Whether the object is admitted."""
        return not self.problems


def _config_problem(parameters: Mapping[str, Any], where: str) -> str | None:
    try:
        opaque.decode(parameters)
    except FieldError as err:
        return err.at(where)
    return None


def problems(obj: Mapping[str, Any], kind: str, driver: str) -> list[str]:
    """The problems of the configs addressed to `driver` in an object of one of CONFIG_PATHS' kinds."""
    node: Any = obj
    for key in CONFIG_PATHS[kind]:
        node = node.get(key) if isinstance(node, Mapping) else None
    found: list[str] = []
    base = ".".join(CONFIG_PATHS[kind])
    for index, entry in enumerate(node if isinstance(node, list) else []):
        config = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(config, Mapping) or config.get("driver") != driver:
            continue
        where = f"{base}[{index}].opaque.parameters"
        parameters = config.get("parameters")
        if not isinstance(parameters, Mapping):
            found.append(f"{where}: expected an object with apiVersion and kind")
            continue
        problem = _config_problem(parameters, where)
        if problem is not None:
            found.append(problem)
    return found


def judge(request: Mapping[str, Any], driver: str) -> Verdict:
    """The verdict on one AdmissionRequest; ReviewError when a field it reads has the wrong type."""
    group_kind = request.get("kind") or {}
    kind = group_kind.get("kind", "") if isinstance(group_kind, Mapping) else None
    if not isinstance(kind, str):
        raise ReviewError("request.kind: expected an object with a string kind, as {group, version, kind}")
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        # DELETE carries no object; nothing to check.
        return Verdict(kind)
    if kind not in CONFIG_PATHS:
        return Verdict(kind, warnings=(f"dra-gpu webhook does not check {kind or 'this kind'}; admitted",))
    return Verdict(kind, problems=tuple(problems(obj, kind, driver)))


def review(body: object, driver: str) -> tuple[dict[str, Any], Verdict]:
    """The AdmissionReview response to a request body (decoded JSON); ReviewError when it is none."""
    if not isinstance(body, Mapping) or body.get("apiVersion") != REVIEW_VERSION:
        raise ReviewError(f"expected an AdmissionReview of {REVIEW_VERSION}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not request.get("uid") or not isinstance(request["uid"], str):
        raise ReviewError("the AdmissionReview has no request with a string uid")
    verdict = judge(request, driver)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": 422,
            "reason": "Invalid",
            "message": f"invalid {driver} configuration: " + "; ".join(verdict.problems),
        }
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}, verdict
