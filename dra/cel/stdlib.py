"""CEL standard functions and the string extensions Kubernetes enables (cel-go ext.Strings v2).

Regular expressions run on RE2 (``regex``); ``matches`` is an unanchored search, as in cel-go.
"""

from __future__ import annotations

import math
import re

from dra.cel import cost, regex
from dra.cel.digits import bounded_int
from dra.cel.functions import Registry, error
from dra.cel.values import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    CelMap,
    ErrorValue,
    Result,
    Uint,
    Value,
    format_double,
    no_such_overload,
)

# Go's unicode.IsSpace, which strings.TrimSpace (CEL's trim()) uses; str.strip() differs.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
_GO_SPACE += "\u2028\u2029\u202f\u205f\u3000"
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_HEX_FLOAT = re.compile(r"[+-]?0[xX][0-9a-fA-F_]*\.?[0-9a-fA-F_]*[pP][+-]?[0-9_]+")
_TRUE_TEXT = frozenset(("1", "t", "T", "TRUE", "true", "True"))
_FALSE_TEXT = frozenset(("0", "f", "F", "FALSE", "false", "False"))


def _regex(pattern: str) -> regex.Pattern | ErrorValue:
    try:
        return regex.compile_regex(pattern)
    except regex.RegexError as exc:
        return error(f"invalid regular expression {pattern!r}: {exc}")


def _size(value: Value) -> Result:
    if isinstance(value, str | bytes | tuple | CelMap):
        return len(value)
    return no_such_overload("size", value)


def _matches(text: str, pattern: str) -> Result:
    compiled = _regex(pattern)
    if isinstance(compiled, ErrorValue):
        return compiled
    return regex.contains(compiled, text)


# -- conversions ---------------------------------------------------------------------------


def _to_int(value: Value) -> Result:
    match value:
        case bool():
            pass
        case int():
            return value
        case Uint():
            return value.value if value.value <= INT64_MAX else error("integer overflow")
        case float():
            if math.isnan(value) or not INT64_MIN < value < INT64_MAX:
                return error("integer overflow")
            return int(value)
        case str():
            if _INT_TEXT.fullmatch(value):
                magnitude = bounded_int(value.lstrip("+-"))
                number = -magnitude if value.startswith("-") else magnitude
                if INT64_MIN <= number <= INT64_MAX:
                    return number
            return error("type conversion error from 'string' to 'int'")
    return no_such_overload("int", value)


def _to_uint(value: Value) -> Result:
    match value:
        case bool():
            pass
        case int():
            return Uint(value) if value >= 0 else error("unsigned integer overflow")
        case Uint():
            return value
        case float():
            if math.isnan(value) or not 0 <= value < 2.0**64:
                return error("unsigned integer overflow")
            return Uint(int(value))
        case str():
            if value.isascii() and value.isdigit() and (number := bounded_int(value)) <= UINT64_MAX:
                return Uint(number)
            return error("type conversion error from 'string' to 'uint'")
    return no_such_overload("uint", value)


def _parse_double(text: str) -> float | None:
    """strconv.ParseFloat: no surrounding space, hex floats need a p exponent, overflow fails."""
    if text != text.strip():
        return None
    try:
        result = float.fromhex(text) if _HEX_FLOAT.fullmatch(text) else float(text)
    except (ValueError, OverflowError):
        return None
    if math.isinf(result) and "inf" not in text.lower():
        return None  # out of range; Go reports an error where Python rounds to infinity
    return result


def _to_double(value: Value) -> Result:
    match value:
        case bool():
            pass
        case int():
            return float(value)
        case Uint():
            return float(value.value)
        case float():
            return value
        case str():
            parsed = _parse_double(value)
            return parsed if parsed is not None else error("type conversion error from 'string' to 'double'")
    return no_such_overload("double", value)


def _to_string(value: Value) -> Result:
    match value:
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case Uint():
            return str(value.value)
        case float():
            return format_double(value)
        case str():
            return value
        case bytes():
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return error("invalid UTF-8 in bytes, cannot convert to string")
    return no_such_overload("string", value)


def _to_bool(value: Value) -> Result:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _TRUE_TEXT | _FALSE_TEXT:
        return value in _TRUE_TEXT
    if isinstance(value, str):
        return error("type conversion error from 'string' to 'bool'")
    return no_such_overload("bool", value)


def _to_bytes(value: Value) -> Result:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return no_such_overload("bytes", value)


# -- string extensions ---------------------------------------------------------------------


def _char_at(text: str, index: int) -> Result:
    if not 0 <= index <= len(text):
        return error(f"index out of range: {index}")
    return text[index : index + 1]


def _index_of(text: str, sub: str, offset: int = 0) -> Result:
    if sub == "":
        return offset
    if offset < 0:
        return error(f"index out of range: {offset}")
    return text.find(sub, offset) if offset < len(text) else -1


def _last_index_of(text: str, sub: str, offset: int | None = None) -> Result:
    if offset is None:
        if sub == "":
            return len(text)
        if len(text.encode()) < len(sub.encode()):
            return -1
        offset = len(text) - 1
    if sub == "":
        return offset
    if offset < 0:
        return error(f"index out of range: {offset}")
    # The match may start at `offset` at the latest.
    return text.rfind(sub, 0, offset + len(sub)) if offset < len(text) else -1


def _replace(text: str, old: str, new: str, limit: int = -1) -> Result:
    return text.replace(old, new, limit if limit >= 0 else -1)


def _split(text: str, separator: str, limit: int = -1) -> Result:
    # Go's strings.SplitN: limit 0 gives no parts, an empty separator splits into characters.
    if limit == 0:
        return ()
    if separator == "":
        parts = list(text)
        if 0 < limit < len(parts):
            parts[limit - 1 :] = ["".join(parts[limit - 1 :])]
        return tuple(parts)
    return tuple(text.split(separator, limit - 1 if limit > 0 else -1))


def _substring(text: str, start: int, end: int | None = None) -> Result:
    if end is None:
        end = len(text)
    elif start > end:
        return error(f"invalid substring range. start: {start}, end: {end}")
    for index in (start, end):
        if not 0 <= index <= len(text):
            return error(f"index out of range: {index}")
    return text[start:end]


def _join(items: tuple[Value, ...], separator: str = "") -> Result:
    if not all(isinstance(item, str) for item in items):
        return no_such_overload("join", items)
    return separator.join(item for item in items if isinstance(item, str))


def _find_all(text: str, pattern: str, limit: int = -1) -> Result:
    compiled = _regex(pattern)
    if isinstance(compiled, ErrorValue):
        return compiled
    found: list[Value] = []
    pos, previous_end = 0, -1
    while pos <= len(text) and (limit < 0 or len(found) < limit):
        span = regex.search(compiled, text, pos)
        if span is None:
            break
        start, end = span
        if start == end == previous_end:
            # Go ignores an empty match right after the previous match.
            pos = start + 1
            continue
        found.append(text[start:end])
        previous_end = end
        pos = end if end > start else end + 1
    return tuple(found)


def _find(text: str, pattern: str) -> Result:
    found = _find_all(text, pattern, 1)
    if not isinstance(found, tuple):
        return found
    return found[0] if found else ""


# -- costs (cel-go's runtimecost.go and Kubernetes' library/cost.go; see ``cost``) ------------


def _regex_cost(text: str, pattern: str, *_limit: int) -> int:
    return cost.regex(text, pattern)


def _contains_cost(text: str, sub: str) -> int:
    return cost.traversal(len(text)) * cost.traversal(len(sub))


def _replace_cost(text: str, old: str, new: str, limit: int = -1) -> int:
    # Kubernetes charges 0.2 per input character; the result is charged too, so that
    # "x".replace("", long) cannot build more than the budget pays for.
    count = len(text) + 1 if old == "" else text.count(old)
    if limit >= 0:
        count = min(count, limit)
    result = len(text) + count * (len(new) - len(old))
    return cost.traversal(len(text), 2 * cost.STRING_TRAVERSAL) + cost.traversal(result)


def _split_cost(text: str, separator: str, limit: int = -1) -> int:
    parts = len(text) + 1 if separator == "" else text.count(separator) + 1
    if limit >= 0:
        parts = min(parts, limit)
    return cost.traversal(len(text), 2 * cost.STRING_TRAVERSAL) + parts


def _join_cost(items: tuple[Value, ...], separator: str = "") -> int:
    result = sum(cost.size(item) for item in items) + len(separator) * max(0, len(items) - 1)
    return cost.traversal(result, 2 * cost.STRING_TRAVERSAL)


def register(registry: Registry) -> None:
    """Add the standard and string-extension functions to ``registry``, with their costs."""
    for member in (False, True):
        registry.add("size", (None,), _size, member=member)
        registry.add("matches", (str, str), _matches, member=member, cost=_regex_cost)
    registry.add("contains", (str, str), lambda s, sub: sub in s, member=True, cost=_contains_cost)
    registry.add(
        "startsWith",
        (str, str),
        lambda s, prefix: s.startswith(prefix),
        member=True,
        cost=cost.first_traversal,
    )
    registry.add(
        "endsWith", (str, str), lambda s, suffix: s.endswith(suffix), member=True, cost=cost.first_traversal
    )
    for name, convert in (
        ("int", _to_int),
        ("uint", _to_uint),
        ("double", _to_double),
        ("string", _to_string),
        ("bool", _to_bool),
        ("bytes", _to_bytes),
    ):
        registry.add(name, (None,), convert, member=False, cost=cost.first_traversal)
    registry.add("dyn", (None,), lambda value: value, member=False)

    registry.add("charAt", (str, int), _char_at, member=True)
    registry.add("indexOf", (str, str), _index_of, member=True, cost=cost.first_traversal)
    registry.add("indexOf", (str, str, int), _index_of, member=True, cost=cost.first_traversal)
    registry.add("lastIndexOf", (str, str), _last_index_of, member=True, cost=cost.first_traversal)
    registry.add("lastIndexOf", (str, str, int), _last_index_of, member=True, cost=cost.first_traversal)
    registry.add("lowerAscii", (str,), lambda s: s.translate(_LOWER), member=True, cost=cost.first_traversal)
    registry.add("upperAscii", (str,), lambda s: s.translate(_UPPER), member=True, cost=cost.first_traversal)
    registry.add("replace", (str, str, str), _replace, member=True, cost=_replace_cost)
    registry.add("replace", (str, str, str, int), _replace, member=True, cost=_replace_cost)
    registry.add("split", (str, str), _split, member=True, cost=_split_cost)
    registry.add("split", (str, str, int), _split, member=True, cost=_split_cost)
    registry.add("substring", (str, int), _substring, member=True, cost=cost.first_traversal)
    registry.add("substring", (str, int, int), _substring, member=True, cost=cost.first_traversal)
    registry.add("trim", (str,), lambda s: s.strip(_GO_SPACE), member=True, cost=cost.first_traversal)
    registry.add("join", (tuple,), _join, member=True, cost=_join_cost)
    registry.add("join", (tuple, str), _join, member=True, cost=_join_cost)
    registry.add("find", (str, str), _find, member=True, cost=_regex_cost)
    registry.add("findAll", (str, str), _find_all, member=True, cost=_regex_cost)
    registry.add("findAll", (str, str, int), _find_all, member=True, cost=_regex_cost)
