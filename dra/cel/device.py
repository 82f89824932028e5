"""The ``device`` variable the Kubernetes scheduler gives DRA CEL selectors (1.34).

Mirrors k8s.io/dynamic-resource-allocation/cel (compile.go, ``DeviceMatches``):

* ``device.driver`` is the driver name;
* ``device.attributes`` and ``device.capacity`` are maps keyed by domain; a name without
  ``domain/`` belongs to the driver's own domain, so ``gpu.nvidia.com/brand`` and ``brand``
  published by driver ``gpu.nvidia.com`` are the same attribute;
* looking up a domain nobody published gives an empty map (so ``.x`` on it is a
  ``no such key`` error and ``has()`` is false), but ``"d" in device.attributes`` and
  iteration only see published domains;
* ``device.allowMultipleAllocations`` (DRAConsumableCapacity feature gate) defaults to false;
* a list-valued attribute (``ints``, ``bools``, ``strings``, ``versions``; DRAListTypeAttributes,
  1.37) is a CEL list of its values, taken before any scalar, as getAttributeValue does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra.cel.errors import CelEvaluationError
from dra.cel.semver import Semver, SemverError
from dra.cel.values import CelMap, Value
from dra.model.quantity import Quantity, QuantityError

# Known fields of `device`, by whether the DRAConsumableCapacity feature gate is on.
DEVICE_FIELDS = frozenset(("driver", "attributes", "capacity"))
DEVICE_FIELDS_CONSUMABLE_CAPACITY = DEVICE_FIELDS | {"allowMultipleAllocations"}

_EMPTY = CelMap()


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/id`` into (domain, id); a bare id belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


#: List-valued attributes (KEP-5491, DRAListTypeAttributes): field and element type.
_LIST_KINDS = (("ints", int), ("bools", bool), ("strings", str), ("versions", str))


def _list_value(name: str, kind: str, python_type: type, values: Any) -> Value:
    if not isinstance(values, list) or any(type(v) is not python_type for v in values):
        raise CelEvaluationError(f"attribute {name}: {kind} value {values!r} has the wrong type")
    if kind != "versions":
        return tuple(values)
    try:
        return tuple(Semver.parse(v) for v in values)
    except SemverError as exc:
        raise CelEvaluationError(f"attribute {name}: parse semantic version: {exc}") from exc


def _attribute_value(name: str, attribute: Mapping[str, Any]) -> Value:
    # Kubernetes takes the first value that is set: the lists, then the scalars, each in this order.
    for kind, python_type in _LIST_KINDS:
        if attribute.get(kind) is not None:
            return _list_value(name, kind, python_type, attribute[kind])
    for kind, python_type in (("int", int), ("bool", bool), ("string", str), ("version", str)):
        value = attribute.get(kind)
        if value is None:
            continue
        if type(value) is not python_type:
            raise CelEvaluationError(f"attribute {name}: {kind} value {value!r} has the wrong type")
        if kind == "version":
            try:
                return Semver.parse(str(value))
            except SemverError as exc:
                raise CelEvaluationError(f"attribute {name}: parse semantic version: {exc}") from exc
        result: Value = value
        return result
    raise CelEvaluationError(f"attribute {name}: unsupported attribute value")


def _capacity_value(name: str, capacity: Mapping[str, Any]) -> Quantity:
    value = capacity.get("value")
    try:
        # JSON carries quantities as strings; YAML may hand us a plain number.
        return Quantity.parse(value if isinstance(value, str) else str(value))
    except QuantityError as exc:
        raise CelEvaluationError(f"capacity {name}: {exc}") from exc


def _by_domain(entries: dict[str, dict[str, Value]]) -> CelMap:
    return CelMap(((domain, CelMap(values.items())) for domain, values in entries.items()), default=_EMPTY)


def device_variable(device: Mapping[str, Any], driver: str) -> CelMap:
    """Build ``device`` for one device of a ``resource.k8s.io/v1`` ResourceSlice.

    ``device`` is the slice's device object as JSON-decoded dicts, e.g.
    ``{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "8Gi"}}}``
    Raises CelEvaluationError for a value Kubernetes could not convert either (the
    scheduler then fails every selector on that device).
    """
    attributes: dict[str, dict[str, Value]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, attribute)
    capacity: dict[str, dict[str, Value]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        capacity.setdefault(domain, {})[ident] = _capacity_value(name, entry)
    return CelMap(
        (
            ("driver", driver),
            ("allowMultipleAllocations", bool(device.get("allowMultipleAllocations", False))),
            ("attributes", _by_domain(attributes)),
            ("capacity", _by_domain(capacity)),
        )
    )
