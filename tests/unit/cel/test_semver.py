"""Semantic versions as Kubernetes' CEL semver library (blang/semver v4) handles them."""

from __future__ import annotations

import itertools
import re

import pytest

from dra.cel.semver import Semver, SemverError


@pytest.mark.parametrize(
    ("text", "major", "minor", "patch", "prerelease", "build"),
    [
        ("550.54.15", 550, 54, 15, (), ()),
        ("0.0.0", 0, 0, 0, (), ()),
        ("1.2.3-alpha.1", 1, 2, 3, ("alpha", 1), ()),
        ("1.2.3-x-y", 1, 2, 3, ("x-y",), ()),
        ("1.2.3+build.001", 1, 2, 3, (), ("build", "001")),
        ("1.2.3-rc.1+b", 1, 2, 3, ("rc", 1), ("b",)),
        ("18446744073709551615.0.0", 2**64 - 1, 0, 0, (), ()),
    ],
)
def test_parse(
    text: str, major: int, minor: int, patch: int, prerelease: tuple[int | str, ...], build: tuple[str, ...]
) -> None:
    version = Semver.parse(text)
    assert (version.major, version.minor, version.patch) == (major, minor, patch)
    assert version.prerelease == prerelease
    assert version.build == build
    assert str(version) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Version string empty"),
        ("1.2", "No Major.Minor.Patch elements found"),
        ("v1.2.3", 'Invalid character(s) found in major number "v1"'),
        ("01.2.3", 'Major number must not contain leading zeroes "01"'),
        ("1.02.3", 'Minor number must not contain leading zeroes "02"'),
        ("535.104.05", 'Patch number must not contain leading zeroes "05"'),
        ("1.2.3.4", 'Invalid character(s) found in patch number "3.4"'),
        ("1..3", 'strconv.ParseUint: parsing "": invalid syntax'),
        ("18446744073709551616.0.0", 'strconv.ParseUint: parsing "18446744073709551616": value out of range'),
        ("1.2.3-", "Prerelease is empty"),
        ("1.2.3-a..b", "Prerelease is empty"),
        ("1.2.3-01", 'Numeric PreRelease version must not contain leading zeroes "01"'),
        ("1.2.3-a_b", 'Invalid character(s) found in prerelease "a_b"'),
        ("1.2.3+", "Build meta data is empty"),
        ("1.2.3+a_b", 'Invalid character(s) found in build meta data "a_b"'),
        ("1.2.٣", 'Invalid character(s) found in patch number "٣"'),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SemverError) as raised:
        Semver.parse(text)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("v1.2.3", "1.2.3"),
        ("v01.02.03", "1.2.3"),
        ("1", "1.0.0"),
        ("v1.2", "1.2.0"),
        ("1.0.00-rc", "1.0.0-rc"),
        ("1.0.0-0rc", "1.0.0-0rc"),
        ("535.104.05", "535.104.5"),
    ],
)
def test_parse_normalized(text: str, normalized: str) -> None:
    assert str(Semver.parse_normalized(text)) == normalized


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.2-rc", "short version cannot contain PreRelease/Build meta data"),
        ("vv1.0.0", 'Invalid character(s) found in major number "0v1"'),  # as odd as in Kubernetes
        ("1.2.3-", "Prerelease is empty"),
    ],
)
def test_parse_normalized_errors(text: str, message: str) -> None:
    with pytest.raises(SemverError, match=re.escape(message)):
        Semver.parse_normalized(text)


# Each version is lower than the next (the semver 2.0.0 specification's example chain).
ORDERED = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.1.0",
    "2.0.0",
    "535.0.0",
    "550.54.15",
]


@pytest.mark.parametrize(("lower", "higher"), list(itertools.pairwise(ORDERED)))
def test_precedence(lower: str, higher: str) -> None:
    a, b = Semver.parse(lower), Semver.parse(higher)
    assert a.compare(b) == -1
    assert b.compare(a) == 1
    assert a < b


def test_build_metadata_is_ignored() -> None:
    plain, built = Semver.parse("1.2.3"), Semver.parse("1.2.3+build.7")
    assert plain.compare(built) == 0
    assert plain == built
    assert hash(plain) == hash(built)
