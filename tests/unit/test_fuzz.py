"""A few seconds of every fuzz target (tests/fuzz), its committed corpus replayed first.

``make fuzz`` runs them for longer (FUZZ_SECONDS) and adds what they find to the corpus.
"""

from __future__ import annotations

import os

import pytest

from tests.fuzz import run

SECONDS = int(os.environ.get("FUZZ_TEST_SECONDS", "3"))


@pytest.mark.parametrize("target", run.targets())
def test_fuzz_target_finds_nothing_in_a_short_run(target: str) -> None:
    result = run.run(target, SECONDS)
    assert result.ok, result.output
