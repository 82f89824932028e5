"""The fields of the API objects explain reads, with their types and the API server's list limits.

Objects from files and the cluster are checked before the report reads them, so a wrong type is a
message with the field's path and never a crash inside the report.
"""

from __future__ import annotations


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


# A selector's one field is required, as the API server requires it.
_SELECTORS = Most([{"cel": Required({"expression": Required(str)})}], MAX_SELECTORS)
_SUBREQUEST = {
    "deviceClassName": str,
    "allocationMode": str,
    "adminAccess": bool,
    "selectors": _SELECTORS,
}
_DEVICES = {
    "requests": Most(
        [
            {
                "name": Required(str),
                "exactly": _SUBREQUEST,
                "firstAvailable": Most([{**_SUBREQUEST, "name": Required(str)}], MAX_SUBREQUESTS),
            }
        ],
        MAX_REQUESTS,
    ),
    "constraints": Most([{"requests": [str], "matchAttribute": str}], MAX_CONSTRAINTS),
}
_METADATA = {"name": str, "namespace": str, "uid": str}
#: The fields of each kind that the report reads, with their types; the others are not looked at.
SHAPES: dict[str, object] = {
    "ResourceClaim": {"metadata": _METADATA, "spec": {"devices": _DEVICES}},
    "ResourceClaimTemplate": {"metadata": _METADATA, "spec": {"spec": {"devices": _DEVICES}}},
    "DeviceClass": {"metadata": Required({"name": Required(str)}), "spec": {"selectors": _SELECTORS}},
}
_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


def check_shape(obj: object, kind: str) -> None:
    """ExplainError naming the first field the report reads whose type is wrong (or that is missing).

    For example ``spec.devices.requests[0].exactly.adminAccess: expected true or false, got a
    string``. (``count`` is not here: the report checks it, with its own message.)
    """
    pending: list[tuple[object, object, str]] = [(obj, SHAPES[kind], "")]
    while pending:
        value, shape, path = pending.pop()
        if isinstance(shape, Required):
            if value is None:
                raise ExplainError(f"{path}: required")
            shape = shape.shape
        if value is None:
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
            fields = [(value.get(k), v, f"{path}.{k}" if path else k) for k, v in shape.items()]
            pending.extend(reversed(fields))
        elif isinstance(shape, list) and isinstance(value, list):
            # A list's items are never optional: a null among them is as wrong as a number.
            items = [(item, Required(shape[0]), f"{path}[{i}]") for i, item in enumerate(value)]
            pending.extend(reversed(items))
