"""The newest-Python build's checks: a pinned source only, and only the bytes its digest names."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from localcluster import cpython
from localcluster.gomodule import BuildError


def test_a_version_without_a_pinned_source_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_GPU_CACHE_DIR", str(tmp_path))
    with pytest.raises(BuildError, match=r"no source is pinned for Python 3\.99\.0; known: 3\.13\.5"):
        cpython.ensure_cpython("3.99.0")


def test_a_download_is_kept_only_when_its_digest_matches(tmp_path: Path) -> None:
    source = tmp_path / "Python-3.13.5.tar.xz"
    source.write_bytes(b"not the release")
    url = source.as_uri()
    into = tmp_path / "into"
    into.mkdir()
    assert cpython._fetch(url, hashlib.sha256(b"not the release").hexdigest(), into).read_bytes() == (
        b"not the release"
    )
    with pytest.raises(BuildError, match=r"SHA-256 [0-9a-f]+, expected 00"):
        cpython._fetch(url, "00" * 32, into)


def test_an_unreachable_source_says_which(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="cannot download the Python source file:"):
        cpython._fetch((tmp_path / "absent.tar.xz").as_uri(), "00" * 32, tmp_path)


def test_every_pinned_source_is_debians_copy_of_the_release() -> None:
    for version, (url, sha256) in cpython.SOURCES.items():
        assert url.startswith("http://deb.debian.org/debian/pool/main/p/python")
        assert url.endswith(f"_{version}.orig.tar.xz")
        assert len(sha256) == 64
