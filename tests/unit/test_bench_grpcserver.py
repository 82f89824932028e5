"""The gRPC server benchmark's prototype servers answer as the plugin does (a short run of each)."""

from __future__ import annotations

import pytest

from tests.bench.bench_grpcserver import BURST, MODES, _measure


# `aio` is the plugin as served, which tests/integration/test_grpc_prepare.py covers.
@pytest.mark.parametrize("mode", [m for m in MODES if m != "aio"])
def test_each_server_prepares_unprepares_and_takes_the_burst(mode: str) -> None:
    # _measure fails on any claim answered with an error, so the figures mean every call succeeded.
    figures = _measure(mode, claims=3, devices=BURST)
    assert set(figures) == {
        "empty p50",
        "prepare p50",
        "prepare p99",
        "unprepare p50",
        "CPU per prepare+unprepare",
        "burst wall",
    }
    assert figures["prepare p50"] > 0
    assert figures["burst wall"] > 0
