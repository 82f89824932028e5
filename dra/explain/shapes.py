"""The fields of the API objects explain reads, with their types and the API server's checks.

Objects from files and the cluster are checked before the report reads them, so a wrong type is a
message with the field's path and never a crash inside the report; a claim's values are then
checked as the API server validates them (resource.k8s.io/v1, 1.34 to 1.37), so that explain never
reports on a claim the API server would not store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from dra.core.labels import MAX_DRIVER_NAME, is_dns_subdomain
from dra.model.quoting import cut, quote


class ExplainError(ValueError):
    """The inputs cannot be explained (missing class, invalid CEL); the message says which."""


class Required:
    """A field that must be present, of the shape it wraps."""

    def __init__(self, shape: object) -> None:
        self.shape = shape


class Most:
    """A list of at most `limit` items of the shape it wraps, as the API server allows.

    A file may hold more (YAML aliases make that cheap), and each one costs a pass over the devices.
    """

    def __init__(self, shape: list[object], limit: int) -> None:
        self.shape = shape
        self.limit = limit


# The API server's list limits (k8s.io/api resource/v1 types.go: DeviceRequestsMaxSize,
# DeviceConstraintsMaxSize, DeviceSelectorsMaxSize, FirstAvailableDeviceRequestMaxSize).
MAX_REQUESTS = 32
MAX_CONSTRAINTS = 32
MAX_SELECTORS = 32
MAX_SUBREQUESTS = 8
MAX_CONFIGS = 32
#: CELSelectorExpressionMaxLength, in bytes.
MAX_EXPRESSION_BYTES = 10 * 1024
#: A count is an int64: a larger number (or a fraction) does not decode, and the claim is refused.
MAX_COUNT = 2**63 - 1
ALLOCATION_MODES = ("All", "ExactCount")
#: DeviceMaxIDLength: the name part of a qualified attribute name.
MAX_IDENTIFIER = 32


#: A field the API knows whose value the report does not read: not looked into (a map of labels,
#: a timestamp, opaque parameters, a claim's status).
ANY = object()

# A selector's one field is required, as the API server requires it.
_SELECTORS = Most([{"cel": Required({"expression": Required(str)})}], MAX_SELECTORS)
_TOLERATIONS = [{"key": str, "operator": str, "value": str, "effect": str, "tolerationSeconds": ANY}]
# The fields of resource.k8s.io/v1's ExactDeviceRequest and DeviceSubRequest (1.34 to 1.37).
_SUBREQUEST = {
    "deviceClassName": str,
    "allocationMode": str,
    "count": ANY,  # count_of checks it, as the API server defaults it
    "selectors": _SELECTORS,
    "tolerations": _TOLERATIONS,
    "capacity": {"requests": ANY},
}
_OPAQUE = {"driver": str, "parameters": ANY}
_DEVICES = {
    "requests": Most(
        [
            {
                "name": Required(str),
                "exactly": {**_SUBREQUEST, "adminAccess": bool},
                "firstAvailable": Most([{**_SUBREQUEST, "name": Required(str)}], MAX_SUBREQUESTS),
            }
        ],
        MAX_REQUESTS,
    ),
    "constraints": Most(
        [{"requests": [str], "matchAttribute": str, "distinctAttribute": str}], MAX_CONSTRAINTS
    ),
    "config": Most([{"requests": [str], "opaque": _OPAQUE}], MAX_CONFIGS),
}
#: ObjectMeta, every field of it.
_METADATA = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "selfLink": str,
    "uid": str,
    "resourceVersion": str,
    "generation": ANY,
    "creationTimestamp": ANY,
    "deletionTimestamp": ANY,
    "deletionGracePeriodSeconds": ANY,
    "labels": ANY,
    "annotations": ANY,
    "ownerReferences": [
        {
            "apiVersion": str,
            "kind": str,
            "name": str,
            "uid": str,
            "controller": bool,
            "blockOwnerDeletion": bool,
        }
    ],
    "finalizers": [str],
    "managedFields": ANY,
}
_TYPE = {"apiVersion": ANY, "kind": ANY}
#: Each kind's fields, every one of resource.k8s.io/v1 (1.34 to 1.37), with the types of those the
#: report reads; an unknown one is refused as kubectl's strict validation refuses it.
SHAPES: dict[str, object] = {
    "ResourceClaim": {
        **_TYPE,
        "metadata": _METADATA,
        "spec": {"devices": _DEVICES},
        "status": {"allocation": ANY, "devices": ANY, "reservedFor": ANY},
    },
    "ResourceClaimTemplate": {
        **_TYPE,
        "metadata": _METADATA,
        "spec": {"metadata": _METADATA, "spec": {"devices": _DEVICES}},
    },
    "DeviceClass": {
        **_TYPE,
        "metadata": Required({**_METADATA, "name": Required(str)}),
        "spec": {
            "selectors": _SELECTORS,
            "config": Most([{"opaque": _OPAQUE}], MAX_CONFIGS),
            "extendedResourceName": str,
        },
    },
}
_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


def check_shape(obj: object, kind: str, strict: bool = False) -> None:
    """ExplainError naming the first field the report reads whose type is wrong (or that is missing),
    then, for a claim, the first value the API server would refuse.

    For example ``spec.devices.requests[0].exactly.adminAccess: expected true or false, got a
    string``, or ``spec.devices.requests[0].exactly.allocationMode: 'Bogus' is not one of All,
    ExactCount``. `strict` (a manifest, not an object the API server gave): a field the kind does
    not have is refused too, as kubectl's strict validation refuses it: ``unknown field
    "spec.devices.bogus"``.
    """
    _check_types(obj, kind, strict)
    if kind != "DeviceClass" and isinstance(obj, Mapping):
        spec = obj.get("spec") or {}
        path = "spec.devices"
        if kind == "ResourceClaimTemplate":
            spec, path = spec.get("spec") or {}, "spec.spec.devices"
        check_devices(spec.get("devices") or {}, path)


def _check_types(obj: object, kind: str, strict: bool) -> None:
    pending: list[tuple[object, object, str]] = [(obj, SHAPES[kind], "")]
    while pending:
        value, shape, path = pending.pop()
        if isinstance(shape, Required):
            if value is None:
                raise ExplainError(f"{path}: required")
            shape = shape.shape
        if value is None or shape is ANY:
            continue
        if isinstance(shape, Most):
            if isinstance(value, list) and len(value) > shape.limit:
                raise ExplainError(f"{path}: must have at most {shape.limit} items, has {len(value)}")
            shape = shape.shape
        expected = dict if isinstance(shape, dict) else list if isinstance(shape, list) else shape
        assert isinstance(expected, type)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            got = _NAMES.get(type(value), type(value).__name__)
            raise ExplainError(f"{path or kind}: expected {_NAMES[expected]}, got {got}")
        # Pushed in reverse, so that the first wrong field in the file's order is the one reported.
        if isinstance(shape, dict) and isinstance(value, dict):
            unknown = next((k for k in value if k not in shape), None) if strict else None
            if unknown is not None:
                # The path whole (a few levels), the name cut: a 100,000-character key is no message.
                name = cut(str(unknown))
                raise ExplainError(f"unknown field {json.dumps(f'{path}.{name}' if path else name)}")
            fields = [(value.get(k), v, f"{path}.{k}" if path else k) for k, v in shape.items()]
            pending.extend(reversed(fields))
        elif isinstance(shape, list) and isinstance(value, list):
            # A list's items are never optional: a null among them is as wrong as a number.
            items = [(item, Required(shape[0]), f"{path}[{i}]") for i, item in enumerate(value)]
            pending.extend(reversed(items))


_DNS_LABEL = "a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit)"
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _label(value: str, path: str) -> None:
    if "." in value or not is_dns_subdomain(value, 63):
        raise ExplainError(f"{path}: {quote(value)} is not {_DNS_LABEL} of at most 63 characters")


def count_of(request: Mapping[str, object], path: str) -> int | None:
    """The devices an exact or sub request asks for, as the API server defaults and checks it.

    None for allocationMode All; 1 for no count (or 0, which the API server defaults to 1).
    """
    mode = request.get("allocationMode") or "ExactCount"
    if mode not in ALLOCATION_MODES:
        raise ExplainError(
            f"{path}.allocationMode: {quote(mode)} is not one of {', '.join(ALLOCATION_MODES)}"
        )
    count = request.get("count")
    if mode == "All":
        if count not in (None, 0):
            raise ExplainError(f"{path}.count: must not be given with allocationMode All, got {quote(count)}")
        return None
    if count is None or count == 0:
        return 1
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ExplainError(f"{path}.count: expected an integer from 1 to {MAX_COUNT}, got {quote(count)}")
    return count


def _check_request(request: Mapping[str, object], path: str) -> None:
    """One exact request or subrequest: its class, selectors and count."""
    device_class = request.get("deviceClassName")
    if not device_class:
        raise ExplainError(f"{path}.deviceClassName: required")
    assert isinstance(device_class, str)
    if not is_dns_subdomain(device_class):
        raise ExplainError(
            f"{path}.deviceClassName: {quote(device_class)} is not a DeviceClass name: a DNS subdomain "
            "(lowercase letters, digits, '-' and '.') of at most 253 characters"
        )
    for i, selector in enumerate(_items(request.get("selectors"))):
        cel = selector.get("cel")
        expression = str(cel.get("expression", "")) if isinstance(cel, Mapping) else ""
        size = len(expression.encode())
        if size > MAX_EXPRESSION_BYTES:
            raise ExplainError(
                f"{path}.selectors[{i}].cel.expression: at most {MAX_EXPRESSION_BYTES} bytes, has {size}"
            )
    count_of(request, path)


def _items(value: object) -> list[Mapping[str, object]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _names(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _unique(names: Sequence[str], path: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ExplainError(f"{path}[{i}]{what}: {quote(name)} is given twice")
        seen.add(name)


def _request_names(requests: Sequence[Mapping[str, object]]) -> set[str]:
    """What a constraint or config may name: each request, and each `request/subrequest`."""
    names: set[str] = set()
    for request in requests:
        name = str(request.get("name"))
        names.add(name)
        names.update(f"{name}/{sub.get('name')}" for sub in _items(request.get("firstAvailable")))
    return names


def _check_references(entries: Sequence[Mapping[str, object]], path: str, names: set[str]) -> None:
    """Each entry's `requests` names requests (or subrequests) of the claim, each once."""
    for i, entry in enumerate(entries):
        where = f"{path}[{i}].requests"
        listed = _names(entry.get("requests"))
        _unique(listed, where, "")
        for j, name in enumerate(listed):
            if name not in names:
                raise ExplainError(
                    f"{where}[{j}]: {quote(name)} is not a request of this claim: name a request, or a "
                    f"request and its subrequest joined by '/' (the claim has {', '.join(sorted(names))})"
                )


def _check_attribute_name(name: str, path: str) -> None:
    """A fully qualified attribute name: a domain (a DNS subdomain of at most 63) and a C identifier."""
    domain, slash, identifier = name.partition("/")
    if (
        not slash
        or not is_dns_subdomain(domain, MAX_DRIVER_NAME)
        or len(identifier) > MAX_IDENTIFIER
        or not _C_IDENTIFIER.fullmatch(identifier)
    ):
        raise ExplainError(
            f"{path}: {quote(name)} is not a fully qualified attribute name: a domain (a DNS subdomain of at "
            f"most {MAX_DRIVER_NAME} characters), '/' and a C identifier of at most {MAX_IDENTIFIER} "
            "(such as gpu.nvidia.com/uuid)"
        )


def check_devices(devices: Mapping[str, object], path: str = "spec.devices") -> None:
    """ExplainError naming the first value of a claim's `devices` the API server would refuse.

    Only after check_shape's types: requests and subrequests named by DNS labels, once each, with
    exactly one of `exactly` and `firstAvailable`, a DeviceClass name, a known allocation mode and
    a count within an int64; constraints of exactly one attribute that name requests of the claim;
    configs that name requests of the claim. A claim with no request is valid (it gets no device).
    """
    requests = _items(devices.get("requests"))
    _unique([str(r.get("name")) for r in requests], f"{path}.requests", ".name")
    for i, request in enumerate(requests):
        where = f"{path}.requests[{i}]"
        _label(str(request.get("name")), f"{where}.name")
        subrequests = _items(request.get("firstAvailable"))
        exact = request.get("exactly")
        if (exact is None) == (not subrequests):
            given = "both are given" if subrequests else "neither is given"
            raise ExplainError(f"{where}: exactly one of exactly and firstAvailable is required; {given}")
        if isinstance(exact, Mapping):
            _check_request(exact, f"{where}.exactly")
        _unique([str(sub.get("name")) for sub in subrequests], f"{where}.firstAvailable", ".name")
        for j, sub in enumerate(subrequests):
            _label(str(sub.get("name")), f"{where}.firstAvailable[{j}].name")
            _check_request(sub, f"{where}.firstAvailable[{j}]")
    names = _request_names(requests)
    constraints = _items(devices.get("constraints"))
    _check_references(constraints, f"{path}.constraints", names)
    for i, constraint in enumerate(constraints):
        where = f"{path}.constraints[{i}]"
        keys = [key for key in ("matchAttribute", "distinctAttribute") if constraint.get(key) is not None]
        if len(keys) != 1:
            state = "both are given" if keys else "neither is given"
            raise ExplainError(
                f"{where}: exactly one of matchAttribute and distinctAttribute is required; {state}"
            )
        _check_attribute_name(str(constraint[keys[0]]), f"{where}.{keys[0]}")
    _check_references(_items(devices.get("config")), f"{path}.config", names)
