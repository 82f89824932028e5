"""Devices and generated selectors for the differential CEL tests.

The devices are what the driver publishes for three fake profiles (full GPUs, MIG
devices, several products and architectures), plus one bool attribute in a foreign
domain on full GPUs, so that selectors meet every attribute kind and several domains.

The selectors are drawn by a seeded generator, so a failing case reproduces from its
seed and position: comparisons, ``in``, ``has()``, ``&&``/``||``/``!``, ternaries,
``matches``/``startsWith``/``endsWith``/``contains``, ``size``, list macros and a map
macro over one domain's attribute names; a few mix static types in a list literal, which
the API server rejects at write time.  Left out on purpose: capacities and version
attributes (quantity and semver are Kubernetes libraries the second oracle lacks), and
``"<domain>" in device.attributes`` for a domain only some devices publish (the oracle
cannot hold both the Kubernetes empty-map default and real membership), and ``join`` over
attribute values, whose estimated cost makes the API server reject the selector.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra.cel.device import split_qualified_name
from dra.core.slices import build_slices
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover

Obj = dict[str, Any]

PROFILES = {"h100": "h100x8-mig", "a100": "a100x4-mig", "mixed": "mixed"}
FOREIGN_DOMAIN = "example.com"
UNPUBLISHED_DOMAIN = "other.example.com"
_REGEXES = (
    "^NVIDIA",
    "H100|A100",
    "[0-9]g\\.[0-9]+gb$",
    "^GPU-[0-9a-f]{8}-",
    "Lovelace$",
    "^(gpu|mig)$",
    # where RE2 and Python's re part: POSIX classes, quoting, code points, inline flags
    "^[[:upper:]]{3}",
    "\\QH100\\E",
    "\\x{4e}V",
    "(?i)nvidia h",
    "a(?i)DA",
    # exponential for a backtracking engine, linear for RE2 (issue 26): same verdicts, in time
    "^(.*)*(.*)*(.*)*(.*)*(.*)*$x",
    "^([A-Za-z0-9 ]+)+$",
)
_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


def devices(driver: str, tags: tuple[str, ...] = tuple(PROFILES), *, lists: bool = False) -> list[Obj]:
    """The devices of the profiles (by tag) as one pool's slice entries, named ``<tag>-<device>``.

    ``lists``: full GPUs also carry list-valued attributes (KEP-5491) in the foreign domain,
    ints and strings of one to three elements.
    """
    found: list[Obj] = []
    for tag in tags:
        profile = PROFILES[tag]
        inventory = discover(FakeGpuLibrary(load_profile(profile), "node"))
        for entry in build_slices(inventory, driver, "node", None, 1)[0]["spec"]["devices"]:
            entry["name"] = f"{tag}-{entry['name']}"
            attributes = entry["attributes"]
            if "index" in attributes:
                index = attributes["index"]["int"]
                attributes[f"{FOREIGN_DOMAIN}/fast"] = {"bool": index % 2 == 0}
                if lists:
                    attributes[f"{FOREIGN_DOMAIN}/links"] = {
                        "ints": list(range(index, index + 1 + index % 3))
                    }
                    attributes[f"{FOREIGN_DOMAIN}/zones"] = {"strings": ["a", "b", "c"][: 1 + index % 3]}
            found.append(entry)
    return found


@dataclass(frozen=True)
class _Attribute:
    domain: str
    name: str
    kind: str  # "string", "int", "bool", or a list of them: "ints", "strings"
    values: tuple[Any, ...]

    @property
    def path(self) -> str:
        return f'device.attributes["{self.domain}"].{self.name}'


def _catalog(published: list[Obj], driver: str) -> list[_Attribute]:
    values: dict[tuple[str, str, str], set[Any]] = {}
    for device in published:
        for qualified, attribute in device["attributes"].items():
            kind, value = next(iter(attribute.items()))
            domain, name = split_qualified_name(qualified, driver)
            if kind in ("string", "int", "bool"):
                values.setdefault((domain, name, kind), set()).add(value)
            elif kind in ("ints", "strings"):
                values.setdefault((domain, name, kind), set()).update(value)
    return [
        _Attribute(domain, name, kind, tuple(sorted(seen)))
        for (domain, name, kind), seen in sorted(values.items())
    ]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SelectorGenerator:
    """Draws boolean selectors over the attributes the given devices publish."""

    def __init__(self, published: list[Obj], driver: str, seed: int) -> None:
        self.random = random.Random(seed)
        self.driver = driver
        self.attributes = _catalog(published, driver)

    def selectors(self, count: int) -> list[str]:
        """``count`` selectors; the same seed and devices give the same list."""
        return [self.expression(depth=2) for _ in range(count)]

    def expression(self, depth: int) -> str:
        """An atom, or a combination of up to ``depth`` levels of sub-expressions."""
        if depth == 0 or self.random.random() < 0.35:
            return self.atom()
        pick = self.random.random()
        if pick < 0.35:
            return f"({self.expression(depth - 1)}) && ({self.expression(depth - 1)})"
        if pick < 0.7:
            return f"({self.expression(depth - 1)}) || ({self.expression(depth - 1)})"
        if pick < 0.85:
            return f"!({self.expression(depth - 1)})"
        condition, then, otherwise = (self.expression(depth - 1) for _ in range(3))
        return f"({condition}) ? ({then}) : ({otherwise})"

    def atom(self) -> str:
        """One test on one attribute (or on the driver, or on an unpublished domain)."""
        roll = self.random.random()
        if roll < 0.04:
            return f"device.driver == {_quote(self.random.choice([self.driver, 'other.example.com']))}"
        if roll < 0.1:
            name = self.random.choice(["index", "fast", "type"])
            access = f'device.attributes["{UNPUBLISHED_DOMAIN}"].{name}'
            return f"has({access})" if self.random.random() < 0.7 else f"{access} == 1"
        if roll < 0.16:
            domain = self.random.choice(sorted({a.domain for a in self.attributes}))
            prefix = _quote(self.random.choice(["parent", "p", "in", "cuda", "x"]))
            macro = self.random.choice(["exists", "all", "exists_one"])
            return f'device.attributes["{domain}"].{macro}(k, k.startsWith({prefix}))'
        attribute = self.random.choice(self.attributes)
        kinds = {
            "string": self._string,
            "int": self._int,
            "bool": self._bool,
            "ints": self._list,
            "strings": self._list,
        }
        test = kinds[attribute.kind](attribute)
        guard = self.random.random()
        if guard < 0.2:
            return f"has({attribute.path})"
        if guard < 0.45:
            return f"has({attribute.path}) && {test}"
        return test

    def _value(self, attribute: _Attribute, miss: Any) -> Any:
        return self.random.choice([*attribute.values, miss])

    def _string(self, attribute: _Attribute) -> str:
        path = attribute.path
        value: str = self._value(attribute, "nope")
        other: str = self._value(attribute, "")
        forms: list[Callable[[], str]] = [
            lambda: f"{path} == {_quote(value)}",
            lambda: f"{path} != {_quote(value)}",
            lambda: f"{path} in [{_quote(value)}, {_quote(other)}]",
            lambda: f"{path}.matches({_quote(self.random.choice(_REGEXES))})",
            lambda: f"{path}.startsWith({_quote(value[: self.random.randint(0, 6)])})",
            lambda: f"{path}.endsWith({_quote(value[-self.random.randint(1, 4) :])})",
            lambda: f"{path}.contains({_quote(value[1:4])})",
            lambda: f"size({path}) {self.random.choice(_COMPARISONS)} {self.random.randint(2, 20)}",
            lambda: f"[{_quote(value)}, {_quote(other)}].exists(x, {path} == x)",
            lambda: f"{path}.lowerAscii() == {_quote(value.lower())}",
            lambda: f"{path}.indexOf({_quote(value[2:4])}) {self.random.choice(_COMPARISONS)} 1",
            lambda: f"{path}.split({_quote(self.random.choice(['-', ' ', '.']))}).size() > 2",
            lambda: f"{path}.substring(0, {self.random.randint(0, 2)}) == {_quote(value[:2])}",
            lambda: f"{path}.trim() + {_quote(other)} == {_quote(value + other)}",
            lambda: f"int({path}) > 0",  # a runtime error unless the string is a number
            lambda: f"{path} < {self.random.randint(0, 3)}",  # a type mismatch: a runtime error
        ]
        return self.random.choice(forms)()

    def _int(self, attribute: _Attribute) -> str:
        path = attribute.path
        value: int = self._value(attribute, -1)
        other: int = self._value(attribute, 100)
        forms: list[Callable[[], str]] = [
            lambda: f"{path} {self.random.choice(_COMPARISONS)} {value}",
            lambda: f"{path} in [{value}, {other}]",
            lambda: f"[{value}, {other}].all(x, {path} != x)",
            lambda: f"[{value}, {other}].exists_one(x, {path} >= x)",
            lambda: f"[{value}, {other}].map(x, x + 1).exists(x, {path} == x)",
            lambda: f"[{value}, {other}, int({path})].filter(x, x > {value}).size() > 0",
            # `any` beside `int` in one literal: Kubernetes rejects the selector at write time
            lambda: f"[{value}, {path}].exists(x, x == {other})",
            lambda: f"{path} % 2 == {self.random.randint(0, 1)}",
            lambda: f'{path} == "{value}"',  # another type: simply unequal
            lambda: f'string({path}) + "x" == "{value}x"',
            lambda: f"{path} - {value} + 9223372036854775807 > 0",  # overflows where path > value
            lambda: f"{path} / ({path} - {value}) >= 0",  # divides by zero where path == value
        ]
        return self.random.choice(forms)()

    def _list(self, attribute: _Attribute) -> str:
        path = attribute.path
        miss: Any = -1 if attribute.kind == "ints" else "nope"
        value = self._value(attribute, miss)
        literal = _quote(value) if isinstance(value, str) else str(value)
        forms: list[Callable[[], str]] = [
            lambda: f"{literal} in {path}",
            lambda: f"{path}.exists(x, x == {literal})",
            lambda: f"{path}.all(x, x != {literal})",
            lambda: f"{path}.exists_one(x, x == {literal})",
            lambda: f"size({path}) {self.random.choice(_COMPARISONS)} {self.random.randint(1, 3)}",
            lambda: f"{path}[0] == {literal}",
            lambda: f"{path}[{self.random.randint(1, 3)}] == {literal}",  # past the end: a runtime error
            lambda: f"{path} == [{literal}]",
            lambda: f"{path} == {literal}",  # a list against a scalar: simply unequal
            lambda: f"{path}.filter(x, x != {literal}).size() > 0",
            lambda: f"{path}.map(x, x == {literal}).exists(b, b)",
        ]
        return self.random.choice(forms)()

    def _bool(self, attribute: _Attribute) -> str:
        path = attribute.path
        forms = [path, f"!{path}", f"{path} == {self.random.choice(['true', 'false'])}", f"{path} != 1"]
        return self.random.choice(forms)
