"""CEL runtime values and the type-independent operations on them.

CEL values map onto Python like this: null -> None, bool, int (int64), ``Uint`` (uint64),
float (double), str, bytes, tuple (list), ``CelMap`` (map), ``Quantity`` and ``Semver``.
Errors are values too (``ErrorValue``): CEL's ``&&``/``||`` must be able to absorb them.
"""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

from dra.cel.semver import Semver
from dra.model.quantity import Quantity

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Uint:
    """A CEL ``uint``; kept apart from int because ``1 + 1u`` is an error in CEL."""

    value: int


@dataclass(frozen=True, slots=True)
class ErrorValue:
    """A runtime error travelling as a value; ``node_id`` is where it arose (for explain)."""

    message: str
    node_id: int | None = None


class CelMap:
    """An immutable CEL map that keeps insertion order (so iteration is deterministic).

    ``default`` reproduces the DRA ``device.attributes``/``device.capacity`` maps: a lookup
    of an unknown domain yields an empty map, while ``in`` and iteration only see the
    domains that exist.
    """

    __slots__ = ("_default", "_entries")

    def __init__(self, entries: Iterable[tuple[Value, Value]] = (), *, default: CelMap | None = None) -> None:
        self._entries: dict[tuple[str, object], tuple[Value, Value]] = {}
        for key, value in entries:
            normalized = _map_key(key)
            if normalized is None:
                raise TypeError(f"unsupported map key type: {type_name(key)}")
            self._entries[normalized] = (key, value)
        self._default = default

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Value]:
        return (key for key, _ in self._entries.values())

    def items(self) -> Iterator[tuple[Value, Value]]:
        """(key, value) pairs in insertion order."""
        return iter(self._entries.values())

    def _find(self, key: Value) -> tuple[Value, Value] | None:
        for candidate in _lookup_keys(key):
            entry = self._entries.get(candidate)
            if entry is not None:
                return entry
        return None

    def get(self, key: Value) -> tuple[bool, Value]:
        """(found, value) for ``m[key]`` and ``m.key``; numeric keys match across int/uint/double."""
        entry = self._find(key)
        if entry is not None:
            return True, entry[1]
        if self._default is not None:
            return True, self._default
        return False, None

    def contains(self, key: Value) -> bool:
        """``key in m``: only keys that are really present, never the default."""
        return self._find(key) is not None

    def __eq__(self, other: object) -> bool:
        # CEL equality, so that maps from the evaluator compare naturally in Python too.
        return isinstance(other, CelMap) and equals(self, other) is True

    __hash__ = None  # type: ignore[assignment]  # like dict

    def __repr__(self) -> str:
        return f"CelMap({display(self)})"


Value: TypeAlias = (
    bool | int | float | str | bytes | Uint | tuple["Value", ...] | CelMap | Quantity | Semver | None
)
Result: TypeAlias = Value | ErrorValue


def _map_key(key: Value) -> tuple[str, object] | None:
    if isinstance(key, bool):
        return ("bool", key)
    if isinstance(key, int):
        return ("int", key)
    if isinstance(key, Uint):
        return ("uint", key.value)
    if isinstance(key, str):
        return ("string", key)
    if isinstance(key, float) and not math.isnan(key):
        # cel-go stores double keys but never converts int or uint lookups to them.
        return ("double", key)
    return None


def _lookup_keys(key: Value) -> list[tuple[str, object]]:
    exact = _map_key(key)
    keys = [] if exact is None else [exact]
    if isinstance(key, bool):
        return keys
    if isinstance(key, int) and key >= 0:
        keys.append(("uint", key))
    elif isinstance(key, Uint) and key.value <= INT64_MAX:
        keys.append(("int", key.value))
    elif isinstance(key, float) and key.is_integer():
        if INT64_MIN <= key <= INT64_MAX:
            keys.append(("int", int(key)))
        if 0 <= key <= UINT64_MAX:
            keys.append(("uint", int(key)))
    return keys


def type_name(value: Result) -> str:
    """The CEL type name used in messages: int, uint, double, string, list, map, ..."""
    match value:
        case None:
            return "null_type"
        case bool():
            return "bool"
        case int():
            return "int"
        case Uint():
            return "uint"
        case float():
            return "double"
        case str():
            return "string"
        case bytes():
            return "bytes"
        case tuple():
            return "list"
        case CelMap():
            return "map"
        case Quantity():
            return "kubernetes.Quantity"
        case Semver():
            return "kubernetes.Semver"
        case ErrorValue():
            return "error"
    raise TypeError(f"not a CEL value: {value!r}")


def no_such_overload(function: str, *args: Result) -> ErrorValue:
    """The error for a function or operator applied to argument types it does not support."""
    return ErrorValue(f"no such overload: {function}({', '.join(type_name(a) for a in args)})")


def _is_number(value: Result) -> bool:
    """int, uint or double (bool is not a number in CEL)."""
    return isinstance(value, int | float | Uint) and not isinstance(value, bool)


def _numeric(value: Value) -> int | float:
    return value.value if isinstance(value, Uint) else value  # type: ignore[return-value]


def equals(left: Value, right: Value) -> bool | ErrorValue:
    """CEL ``==``: heterogeneous values are unequal, numbers compare across int/uint/double."""
    if left is None or right is None:
        return left is None and right is None
    if _is_number(left) and _is_number(right):
        return _numeric(left) == _numeric(right)  # NaN is unequal to everything, as in CEL
    if isinstance(left, Quantity | Semver):
        # The Kubernetes types only define equality with their own type (else: an error).
        if type(left) is not type(right):
            return no_such_overload("_==_", left, right)
        return left.compare(right) == 0  # type: ignore[arg-type]
    if isinstance(left, tuple):
        if not isinstance(right, tuple) or len(left) != len(right):
            return False
        # cel-go only lets an explicit `false` decide: element errors count as equal.
        return all(equals(a, b) is not False for a, b in zip(left, right, strict=True))
    if isinstance(left, CelMap):
        if not isinstance(right, CelMap) or len(left) != len(right):
            return False
        for key, value in left.items():
            found, other = right.get(key)
            if not found or equals(value, other) is False:
                return False
        return True
    return type(left) is type(right) and left == right


def compare(function: str, left: Value, right: Value) -> int | ErrorValue:
    """Ordering for ``<``, ``<=``, ``>``, ``>=``: -1, 0 or 1, or an error."""
    if _is_number(left) and _is_number(right):
        a, b = _numeric(left), _numeric(right)
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            return ErrorValue("NaN values cannot be ordered")
        return (a > b) - (a < b)
    for kind in (str, bytes, bool):
        if isinstance(left, kind) and isinstance(right, kind) and type(left) is type(right):
            return (left > right) - (left < right)  # type: ignore[operator]
    return no_such_overload(function, left, right)


def format_double(value: float) -> str:
    """A double as Go's ``%g`` prints it (what CEL's ``string(double)`` returns)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    # repr() gives the shortest round-tripping digits, the same ones Go picks.
    digits_tuple, exponent = decimal.Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    point = len(digits) + int(exponent)  # position of the decimal point
    if point - 1 < -4 or point - 1 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if point - 1 < 0 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def key_text(value: Value) -> str:
    """A value as Go's ``%v`` prints it in messages such as ``no such key: model``."""
    match value:
        case bool():
            return "true" if value else "false"
        case str():
            return value
        case float():
            return format_double(value)
        case Uint():
            return str(value.value)
    return display(value)


def display(value: Result, limit: int = 0) -> str:
    """A value written like a CEL literal, for explanations; ``limit`` > 0 truncates."""
    text = _display(value)
    if limit and len(text) > limit:
        return text[: limit - 3] + "..."
    return text


def _display(value: Result) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case Uint():
            return f"{value.value}u"
        case float():
            text = repr(value)
            return text if text not in ("inf", "-inf", "nan") else format_double(value)
        case str():
            return json.dumps(value, ensure_ascii=False)
        case bytes():
            return repr(value)  # b'..' with \x escapes is also a valid CEL bytes literal
        case tuple():
            return "[" + ", ".join(_display(item) for item in value) + "]"
        case CelMap():
            return "{" + ", ".join(f"{_display(k)}: {_display(v)}" for k, v in value.items()) + "}"
        case Quantity() | Semver():
            return str(value)
        case ErrorValue():
            return f"error({value.message})"
    raise TypeError(f"not a CEL value: {value!r}")


def list_contains(items: tuple[Value, ...], needle: Value) -> bool:
    """``needle in items``: only a definite ``true`` equality counts, errors do not."""
    return any(equals(needle, item) is True for item in items)
