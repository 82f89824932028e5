"""Reads docs/cel-cookbook.md into test cases: the YAML of each example and where it must land.

The page is the source of truth; the tests run exactly what it shows. An
expectation line reads, after "**Lands on:**" (optionally "**With `x` and `y`
busy, lands on:**"), one of:

    one of `a`, `b`.                 exactly one device, any of these
    `a` and `b`, or `c` and `d`.     exactly one of these device sets
    `a`, first of `a`, `b`.          `a`, the first in publishing order of the devices that match
    nothing; the pod stays Pending with `message`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from localcluster.kube import Obj

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cel-cookbook.md"

_EXPECT = re.compile(r"^\*\*(?:With (?P<busy>.+?) busy, lands on|Lands on):\*\*\s*(?P<what>.+)$")
_NAME = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Expectation:
    """Where a claim may land: alternatives of exact device sets, or nowhere with a message."""

    alternatives: tuple[frozenset[str], ...]
    pending_message: str | None = None
    #: Every device that matches, where the page names them besides the one the claim lands on.
    matching: frozenset[str] | None = None

    def allows(self, devices: list[str]) -> bool:
        """Whether an allocation is one the page promises."""
        return frozenset(devices) in self.alternatives and len(devices) == len(set(devices))

    @property
    def candidates(self) -> frozenset[str]:
        """Every device that matches: those the page names as matching, else every one that may be chosen."""
        if self.matching is not None:
            return self.matching
        return frozenset().union(*self.alternatives) if self.alternatives else frozenset()


@dataclass(frozen=True)
class Case:
    """One example under one condition."""

    title: str
    objects: tuple[Obj, ...]
    expectation: Expectation
    busy: tuple[str, ...] = ()

    @property
    def template(self) -> Obj:
        """The example's ResourceClaimTemplate."""
        return next(o for o in self.objects if o["kind"] == "ResourceClaimTemplate")

    @property
    def device_classes(self) -> list[Obj]:
        """DeviceClasses the example defines."""
        return [o for o in self.objects if o["kind"] == "DeviceClass"]

    @property
    def foreign_slices(self) -> list[Obj]:
        """ResourceSlices of another driver the example publishes on the node (placeholder node name)."""
        return [o for o in self.objects if o["kind"] == "ResourceSlice"]

    @property
    def id(self) -> str:
        """A test id."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")
        return slug + ("-busy" if self.busy else "")


def parse_expectation(text: str) -> Expectation:
    """Parse the words after "Lands on:"."""
    if text.startswith("nothing"):
        message = _NAME.search(text)
        return Expectation(alternatives=(), pending_message=message.group(1) if message else None)
    if " first of " in text:
        landing, matching = text.split(" first of ", 1)
        return Expectation((frozenset(_NAME.findall(landing)),), matching=frozenset(_NAME.findall(matching)))
    if text.startswith("one of "):
        return Expectation(alternatives=tuple(frozenset({d}) for d in _NAME.findall(text)))
    return Expectation(alternatives=tuple(frozenset(_NAME.findall(part)) for part in text.split(", or ")))


@dataclass
class _Section:
    title: str
    objects: list[Obj] = field(default_factory=list)


def load_cases(page: Path = PAGE) -> list[Case]:
    """Every (example, expectation) pair of the page, in page order."""
    cases: list[Case] = []
    section = _Section("intro")
    in_yaml = False
    block: list[str] = []
    for line in page.read_text().splitlines():
        if in_yaml:
            if line.startswith("```"):
                in_yaml = False
                section.objects = [o for o in yaml.safe_load_all("\n".join(block)) if o]
            else:
                block.append(line)
            continue
        if line.startswith("```yaml"):
            in_yaml, block = True, []
        elif line.startswith("#"):
            section = _Section(line.lstrip("#").strip())
        elif match := _EXPECT.match(line):
            busy = tuple(_NAME.findall(match.group("busy") or ""))
            cases.append(
                Case(section.title, tuple(section.objects), parse_expectation(match.group("what")), busy)
            )
    return cases
