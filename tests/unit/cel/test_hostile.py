"""The reproducers of issue 26, each in a child process under CPU and memory limits (tests/hostile.py).

Each must end within 2 s of CPU and 200 MB of RSS with its expected one-line outcome; a
regression is killed at 3 s of CPU (or 1 GiB of address space) and fails instead of hanging.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import hostile

EXPECTED = {
    "regex-explain": "0 device(s) match, 1 needed: cannot be allocated",
    "regex-literal": "result: False",
    "nested-binds": "error: operation cancelled: actual cost limit exceeded",
    "twenty-selectors": "dra-gpu: error: explain's CEL budget of 125,000 cost units per run is spent, by ",
    "ten-megabytes": "expression is 10485764 bytes long; the API server accepts at most 10240 bytes",
    "long-int-literal": "error: ERROR: <input>:1:1: invalid int literal",
    "long-semver": ": value out of range",
    "long-quantity": "error: quantity is 4301 characters long, more than 1000",
    "long-quantity-config": "is not a quantity: quantity is 4301 characters long, more than 1000",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reproducer_ends_quickly_and_small_with_a_one_line_outcome(name: str, tmp_path: Path) -> None:
    outcome = hostile.run_case(hostile.cases(tmp_path)[name], cpu_s=3, wall_s=60)
    assert "Traceback" not in outcome.stderr, outcome.stderr[-2000:]
    assert outcome.returncode in (0, 1), outcome.stderr[-2000:]
    assert EXPECTED[name] in outcome.stdout + outcome.stderr
    assert len(outcome.stderr.strip().splitlines()) <= 1, outcome.stderr
    assert outcome.cpu_s < 2.0, f"{outcome.cpu_s:.2f} s of CPU"
    assert outcome.max_rss_mb < 200, f"{outcome.max_rss_mb:.0f} MB"
