"""Strict decoding of JSON objects into the API's dataclasses, and their JSON Schema, from one description.

A type's dataclass fields are the API: the JSON name is the field name in
camelCase, the annotation says what may appear, and `spec(...)` metadata adds a
description and integer bounds. `decode` and `schema_of` both read that, so the
decoder and the published schema cannot disagree.

Decoding is as strict as Kubernetes' strict JSON decoding of NVIDIA's types:
unknown or mis-cased fields and wrong types are errors, each naming its path.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import re
import types
import typing
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, Literal, TypeVar, get_args, get_origin

from dra.model.quantity import ERR_FORMAT_WRONG, Quantity, QuantityError
from dra.model.quoting import cut

T = TypeVar("T")

#: The pattern every quantity string must match (Kubernetes' resource.ParseQuantity's first check).
QUANTITY_PATTERN = ERR_FORMAT_WRONG.split("'")[1]


class DuplicatedKeys(dict[str, Any]):
    """A decoded JSON or YAML object whose text gave some keys more than once (the last value kept).

    Readers of other objects take it for the dict it is; `decode` refuses it, as the strict decoder
    NVIDIA's driver decodes opaque parameters with refuses a duplicate field.
    """

    def __init__(self, items: Mapping[str, Any], duplicates: tuple[str, ...]) -> None:
        super().__init__(items)
        #: The keys given more than once, in the order of their first repetition.
        self.duplicates = duplicates


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: the object, a DuplicatedKeys when a key came more than once."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated: dict[str, None] = {}
    for key, _ in pairs:
        if key in seen:
            repeated[key] = None
        seen.add(key)
    return DuplicatedKeys(obj, tuple(repeated))


def check_unique(raw: Mapping[Any, Any], path: tuple[str, ...], *, keys: bool = False) -> None:
    """FieldError naming the first key an object's text gave more than once.

    `keys`: the object is a map (its keys are data, named "[key]"), not an object of fields.
    """
    duplicates = getattr(raw, "duplicates", ())
    if duplicates:
        first = str(duplicates[0])
        raise FieldError((*path, f"[{first}]" if keys else first), "given more than once; give each once")


class FieldError(ValueError):
    """A field of the parameters is wrong; `path` leads to it from the parameters object."""

    def __init__(self, path: tuple[str, ...], detail: str) -> None:
        super().__init__(detail)
        self.path = path
        self.detail = detail

    def at(self, root: str) -> str:
        """The message with the path spelled from `root` (e.g. "GpuConfig" or "spec.config[0]...")."""
        return f"{join(root, self.path)}: {self.detail}"

    def __str__(self) -> str:
        return self.at("parameters")


def join(root: str, path: tuple[str, ...]) -> str:
    """root.a.b[key]: map keys are kept as "[key]" segments."""
    text = root
    for segment in path:
        text += segment if segment.startswith("[") else f".{segment}"
    return text


def spec(
    doc: str, *, minimum: int | None = None, maximum: int | None = None, name: str = ""
) -> dict[str, Any]:
    """Field metadata: its description, for integers inclusive bounds, and a JSON name json_name cannot spell.

    `name` is for NVIDIA's names with an acronym in them (enableAPIDevice), which camelCase misses.
    """
    return {"doc": doc, "minimum": minimum, "maximum": maximum, "name": name}


def json_name(name: str) -> str:
    """default_active_thread_percentage -> defaultActiveThreadPercentage."""
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def field_name(f: dataclasses.Field[Any]) -> str:
    """The JSON name of a dataclass field: its spec's `name`, else its name in camelCase."""
    return f.metadata.get("name") or json_name(f.name)


def show(value: object) -> str:
    """A JSON value as the user wrote it (cut to QUOTE_CHARS), for messages."""
    if isinstance(value, str | int | float | bool) or value is None:
        return cut(json.dumps(value))
    return kind(value)


def nesting_depth(value: object, limit: int) -> int:
    """How deep decoded JSON nests (a scalar is 1), counted without recursion up to limit + 1."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


#: An escaped character (a string's only use of a backslash), and then a string, or the rest of
#: the text after an unterminated one: patterns that match once where they start, never retried.
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"?')
#: Brackets as bytes ( and ), everything else deleted.
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_RUNS = re.compile(rb"\(+|\)+")
#: Rounds of taking out the innermost pairs: the depth then counted is at most this much short.
_PAIR_ROUNDS = 8


def json_text_deeper_than(text: str, limit: int) -> bool:
    """Whether JSON text surely nests its arrays and objects more than `limit` deep, from the text alone.

    json's decoder recurses once per level: this is asked before it is given text, so that a
    document of 100,000 brackets is refused by its depth, never by a RecursionError. False
    means at most `limit` + 8 levels, which the decoder takes (a decoded value's exact depth
    is nesting_depth's). Linear and in C throughout; brackets in strings do not count. Of text
    that is no JSON it may say anything, but the decoder fails there before it goes deep.
    """
    unquoted = _STRING.sub("", _ESCAPE.sub("", text))
    brackets = unquoted.encode(errors="replace").translate(_BRACKETS, _NOT_BRACKETS)
    if brackets.count(b"(") <= limit:
        return False
    # A round lowers the deepest point by at most one, and leaves fewer runs of brackets to count
    # (`[]` a million times is two million runs): rounds while they take out a quarter or more.
    for _ in range(_PAIR_ROUNDS):
        inner = brackets.replace(b"()", b"")
        shrunk = len(inner) * 4 <= len(brackets) * 3
        brackets = inner
        if not shrunk:
            break
    runs = list(map(len, _RUNS.findall(brackets)))
    # The depth after each run of opening brackets: all opened so far less all closed before it.
    closing_first = brackets.startswith(b")")
    opened = accumulate(runs[closing_first::2])
    closed = accumulate(runs[not closing_first :: 2], initial=None if closing_first else 0)
    return max(map(operator.sub, opened, closed), default=0) > limit


def kind(value: object) -> str:
    """The JSON type of a decoded value, for "expected ..., got ..." messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null"


def _optional(annotation: Any) -> Any:
    """X for X | None, else None."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return None


#: Each type's fields with their resolved annotations: resolving them was most of a decode's time.
_FIELDS: dict[type, list[tuple[dataclasses.Field[Any], Any]]] = {}


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELDS[cls] = [(f, hints[f.name]) for f in dataclasses.fields(cls)]
    return found


def decode(cls: type[T], raw: object, path: tuple[str, ...] = ()) -> T:
    """An instance of the dataclass `cls` from a JSON object; FieldError naming the first bad field."""
    if not isinstance(raw, Mapping):
        raise FieldError(path, f"expected an object, got {kind(raw)}")
    check_unique(raw, path)
    fields = _fields(cls)
    known = {field_name(f): (f, annotation) for f, annotation in fields}
    for key in raw:
        if key not in known:
            raise FieldError((*path, str(key)), f"unknown field; known: {', '.join(known)}")
    values: dict[str, Any] = {}
    for name, (f, annotation) in known.items():
        if name in raw and raw[name] is not None:
            values[f.name] = _value(annotation, raw[name], (*path, name), f.metadata)
    return cls(**values)


def _value(annotation: Any, raw: object, path: tuple[str, ...], meta: Mapping[str, Any]) -> Any:
    inner = _optional(annotation)
    if inner is not None:
        return _value(inner, raw, path, meta)
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        if raw not in choices or not isinstance(raw, str):
            raise FieldError(path, f"{show(raw)} is not one of {json.dumps(list(choices))}")
        return raw
    if annotation is bool:
        if not isinstance(raw, bool):
            raise FieldError(path, f"expected true or false, got {kind(raw)} {show(raw)}")
        return raw
    if annotation is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise FieldError(path, f"expected an integer, got {kind(raw)} {show(raw)}")
        low, high = meta.get("minimum"), meta.get("maximum")
        if (low is not None and raw < low) or (high is not None and raw > high):
            raise FieldError(path, f"{raw} is outside {low}-{high}")
        return raw
    if annotation is Quantity:
        return _quantity(raw, path, meta)
    if get_origin(annotation) is Mapping:
        if not isinstance(raw, Mapping):
            raise FieldError(path, f"expected an object, got {kind(raw)}")
        check_unique(raw, path, keys=True)
        _, item = get_args(annotation)
        return {str(k): _value(item, v, (*path, f"[{k}]"), meta) for k, v in raw.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return decode(annotation, raw, path)
    raise TypeError(f"{annotation!r} has no JSON form")  # a programming error in a type of dra.api


def _quantity(raw: object, path: tuple[str, ...], meta: Mapping[str, Any]) -> Quantity:
    # Kubernetes' Quantity also unmarshals from a bare JSON number.
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise FieldError(path, f'expected a quantity (such as "4Gi"), got {kind(raw)}')
    try:
        quantity = Quantity.parse(str(raw))
    except (QuantityError, ValueError, OverflowError) as err:
        raise FieldError(path, f"{show(raw)} is not a quantity: {err}") from None
    if quantity.sign() <= 0:
        raise FieldError(path, f"{show(raw)} must be positive")
    low, high = meta.get("minimum"), meta.get("maximum")
    if (low is not None and quantity.exact() < low) or (high is not None and quantity.exact() > high):
        shown = [str(Quantity.binary(bound)) if bound is not None else "" for bound in (low, high)]
        raise FieldError(path, f"{show(raw)} is outside {shown[0]} to {shown[1]}")
    return quantity


def schema_of(cls: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a dataclass, from its fields."""
    properties: dict[str, Any] = {}
    for f, annotation in _fields(cls):
        node = _schema(annotation, f.metadata)
        if f.metadata.get("doc"):
            node = {"description": f.metadata["doc"], **node}
        if f.default is not dataclasses.MISSING and f.default is not None:
            node["default"] = f.default
        properties[field_name(f)] = node
    return {"type": "object", "additionalProperties": False, "properties": properties}


def _schema(annotation: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
    inner = _optional(annotation)
    if inner is not None:
        return _schema(inner, meta)
    if get_origin(annotation) is Literal:
        return {"type": "string", "enum": list(get_args(annotation))}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        bounds = {k: meta[k] for k in ("minimum", "maximum") if meta.get(k) is not None}
        return {"type": "integer", **bounds}
    if annotation is Quantity:
        return {"type": ["string", "number"], "pattern": QUANTITY_PATTERN}
    if get_origin(annotation) is Mapping:
        return {"type": "object", "additionalProperties": _schema(get_args(annotation)[1], {})}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return schema_of(annotation)
    raise TypeError(f"{annotation!r} has no JSON form")
