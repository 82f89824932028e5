"""CEL operators on runtime values: arithmetic, negation, indexing, field selection, ``in``.

Integer arithmetic is 64-bit with overflow errors; division truncates toward zero like
Go.  Mixed-type arithmetic (``1 + 1u``) has no overload, as in CEL.
"""

from __future__ import annotations

import math

from dra.cel.values import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    CelMap,
    ErrorValue,
    Result,
    Uint,
    Value,
    key_text,
    list_contains,
    no_such_overload,
    type_name,
)


def _int_result(value: int) -> Result:
    return value if INT64_MIN <= value <= INT64_MAX else ErrorValue("integer overflow")


def _uint_result(value: int) -> Result:
    return Uint(value) if 0 <= value <= UINT64_MAX else ErrorValue("unsigned integer overflow")


def _truncated_division(a: int, b: int) -> tuple[int, int]:
    """Go's integer division and remainder (quotient rounded toward zero)."""
    quotient = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        quotient = -quotient
    return quotient, a - quotient * b


def _float_division(a: float, b: float) -> float:
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def arithmetic(op: str, left: Value, right: Value) -> Result:
    """``left op right`` for op in ``+ - * / %``."""
    if type(left) is not type(right):
        return no_such_overload(f"_{op}_", left, right)
    if isinstance(left, bool):
        return no_such_overload(f"_{op}_", left, right)
    if isinstance(left, int) and isinstance(right, int):
        return _int_arithmetic(op, left, right)
    if isinstance(left, Uint) and isinstance(right, Uint):
        return _uint_arithmetic(op, left.value, right.value)
    if isinstance(left, float) and isinstance(right, float):
        if op == "/":
            return _float_division(left, right)
        if op in "+-*":
            return {"+": left + right, "-": left - right, "*": left * right}[op]
    if op == "+" and isinstance(left, str | bytes | tuple) and isinstance(right, str | bytes | tuple):
        return left + right  # type: ignore[operator]  # same type, checked above
    return no_such_overload(f"_{op}_", left, right)


def _int_arithmetic(op: str, a: int, b: int) -> Result:
    if op in "/%" and b == 0:
        return ErrorValue("division by zero" if op == "/" else "modulus by zero")
    if op == "+":
        return _int_result(a + b)
    if op == "-":
        return _int_result(a - b)
    if op == "*":
        return _int_result(a * b)
    quotient, remainder = _truncated_division(a, b)
    if quotient > INT64_MAX:  # MinInt64 / -1 (and % -1, which Go also reports as overflow)
        return ErrorValue("integer overflow")
    return quotient if op == "/" else remainder


def _uint_arithmetic(op: str, a: int, b: int) -> Result:
    if op in "/%" and b == 0:
        return ErrorValue("division by zero" if op == "/" else "modulus by zero")
    results = {"+": a + b, "-": a - b, "*": a * b}
    if op in results:
        return _uint_result(results[op])
    return Uint(a // b if op == "/" else a % b)


def negate(value: Value) -> Result:
    """Unary minus."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_result(-value)
    if isinstance(value, float):
        return -value
    return no_such_overload("-_", value)


def logical_not(value: Value) -> Result:
    """``!value``."""
    return (not value) if isinstance(value, bool) else no_such_overload("!_", value)


def _list_position(index: Value) -> int | ErrorValue:
    match index:
        case bool():
            pass
        case int():
            return index
        case Uint() if index.value <= INT64_MAX:
            return index.value
        case float() if index.is_integer() and INT64_MIN <= index <= INT64_MAX:
            return int(index)
        case Uint() | float():
            return ErrorValue(f"unsupported index value {key_text(index)} in list")
    return ErrorValue(f"unsupported index type '{type_name(index)}' in list")


def index(container: Value, key: Value) -> Result:
    """``container[key]`` for lists and maps."""
    if isinstance(container, tuple):
        position = _list_position(key)
        if isinstance(position, ErrorValue):
            return position
        if not 0 <= position < len(container):
            return ErrorValue(f"index out of bounds: {position}")
        return container[position]
    if isinstance(container, CelMap):
        found, value = container.get(key)
        if found:
            return value
    return ErrorValue(f"no such key: {key_text(key)}")


def select(container: Value, field: str) -> Result:
    """``container.field``: a map lookup with a string key."""
    if isinstance(container, tuple):
        return ErrorValue("unsupported index type 'string' in list")
    return index(container, field)


def has_field(container: Value, field: str) -> Result:
    """``has(container.field)``: presence in a map; false for scalar values."""
    if isinstance(container, CelMap):
        return container.get(field)[0]
    if isinstance(container, tuple):
        return ErrorValue("unsupported index type 'string' in list")
    return False


def membership(needle: Value, container: Value) -> Result:
    """``needle in container`` for lists (equality) and maps (keys)."""
    if isinstance(container, tuple):
        return list_contains(container, needle)
    if isinstance(container, CelMap):
        return container.contains(needle)
    return no_such_overload("@in", needle, container)
