"""Semantic versions (semver 2.0.0) as Kubernetes' CEL library parses and orders them.

Kubernetes uses github.com/blang/semver/v4: strict ``MAJOR.MINOR.PATCH[-PRE][+BUILD]``
with no leading zeros and no ``v`` prefix.  ``semver(str, true)`` first normalizes the
string (drops one ``v``, strips leading zeros, pads ``1.2`` to ``1.2.0``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dra.cel.digits import bounded_int

_DIGITS = frozenset("0123456789")
_ALPHANUM = _DIGITS | frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    """A string that is not a valid semantic version; the message is blang/semver's."""


def _only(text: str, allowed: frozenset[str]) -> bool:
    return all(char in allowed for char in text)


def _parse_uint(text: str) -> int:
    # strconv.ParseUint(text, 10, 64), with Go's error texts.
    if not text or not _only(text, _DIGITS):
        raise SemverError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    value = bounded_int(text)
    if value > _UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


def _number(text: str, what: str) -> int:
    if not _only(text, _DIGITS):
        raise SemverError(f'Invalid character(s) found in {what} number "{text}"')
    if len(text) > 1 and text[0] == "0":
        raise SemverError(f'{what.capitalize()} number must not contain leading zeroes "{text}"')
    return _parse_uint(text)


def _prerelease(text: str) -> int | str:
    if not text:
        raise SemverError("Prerelease is empty")
    if _only(text, _DIGITS):
        if len(text) > 1 and text[0] == "0":
            raise SemverError(f'Numeric PreRelease version must not contain leading zeroes "{text}"')
        return _parse_uint(text)
    if not _only(text, _ALPHANUM):
        raise SemverError(f'Invalid character(s) found in prerelease "{text}"')
    return text


def _compare_identifiers(a: int | str, b: int | str) -> int:
    # Numeric identifiers sort before alphanumeric ones (which are ASCII, so str order is byte order).
    if isinstance(a, int) and isinstance(b, int):
        return (a > b) - (a < b)
    if isinstance(a, int) or isinstance(b, int):
        return -1 if isinstance(a, int) else 1
    return (a > b) - (a < b)


@dataclass(frozen=True)
class Semver:
    """A parsed semantic version; ``Semver.parse("550.54.15")``.

    Equality and ordering follow semver precedence: build metadata is ignored and a
    prerelease sorts before its release.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str) -> Semver:
        """Strict parse (blang/semver Parse); raises SemverError."""
        return _parse(text)

    @staticmethod
    def parse_normalized(text: str) -> Semver:
        """Parse after Kubernetes' normalization: ``v1.02`` becomes ``1.2.0``."""
        if text.startswith("v"):
            text = text[1:]
        parts = text.split(".", 2)
        for i, part in enumerate(parts):
            if len(part) > 1:
                part = part.lstrip("0")
                if not part or part[0] not in _DIGITS:
                    part = "0" + part
                parts[i] = part
        if len(parts) < 3:
            if "+" in parts[-1] or "-" in parts[-1]:
                raise SemverError("short version cannot contain PreRelease/Build meta data")
            parts.extend(["0"] * (3 - len(parts)))
        return _parse(".".join(parts))

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver precedence."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return 1 if mine > theirs else -1
        if not self.prerelease or not other.prerelease:
            # A version without prerelease is greater than one with.
            return (not self.prerelease) - (not other.prerelease)
        for a, b in zip(self.prerelease, other.prerelease, strict=False):
            result = _compare_identifiers(a, b)
            if result:
                return result
        return (len(self.prerelease) > len(other.prerelease)) - (len(self.prerelease) < len(other.prerelease))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __lt__(self, other: Semver) -> bool:
        return self.compare(other) < 0

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(str(part) for part in self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Semver:
    if not text:
        raise SemverError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise SemverError("No Major.Minor.Patch elements found")
    major = _number(parts[0], "major")
    minor = _number(parts[1], "minor")
    patch_text = parts[2]
    build: list[str] = []
    prerelease: list[str] = []
    if "+" in patch_text:
        patch_text, build_text = patch_text.split("+", 1)
        build = build_text.split(".")
    if "-" in patch_text:
        patch_text, prerelease_text = patch_text.split("-", 1)
        prerelease = prerelease_text.split(".")
    patch = _number(patch_text, "patch")
    pre = tuple(_prerelease(part) for part in prerelease)
    for part in build:
        if not part:
            raise SemverError("Build meta data is empty")
        if not _only(part, _ALPHANUM):
            raise SemverError(f'Invalid character(s) found in build meta data "{part}"')
    return Semver(major, minor, patch, pre, tuple(build))
