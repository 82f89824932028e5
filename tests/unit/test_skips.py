"""tests/skips.py and the skip accounting in tests/conftest.py."""

from __future__ import annotations

from collections import Counter

import pytest

from tests import skips
from tests.conftest import _disallowed
from tests.skips import Lack, reason


def test_a_reason_names_its_kind_first() -> None:
    assert reason(Lack.ROOT, "mounts") == "[root] mounts"
    assert skips.kind("[root] mounts") == "root"
    assert skips.kind("Skipped: [gpu] no GPU in MIG mode") == "gpu"
    assert skips.kind("containerd cannot run here") is None


def test_without_the_variable_every_skip_is_counted_and_none_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(skips.ALLOWED_ENV, raising=False)
    assert skips.allowed() is None
    assert _disallowed(Counter({"[root] mounts": 2, "plain": 1})) == Counter()


def test_where_the_ci_names_the_kinds_any_other_skip_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skips.ALLOWED_ENV, "gpu, release")
    assert skips.allowed() == frozenset({"gpu", "release"})
    reasons = Counter({"[gpu] no GPU": 3, "[release] 1.36 on": 1, "[root] mounts": 2, "no kind": 1})
    assert _disallowed(reasons) == Counter({"[root] mounts": 2, "no kind": 1})
