"""The gRPC server benchmark's servers answer as the plugin does (a short run of each), floors included."""

from __future__ import annotations

import argparse
import re

import pytest
from localcluster.binaries import FLOOR, GOBENCH

from tests.bench.bench_grpcserver import BURST, FLOORS, MODES, _measure, _modes

FIGURES = {
    "empty p50",
    "prepare p50",
    "prepare p99",
    "unprepare p50",
    "CPU per prepare+unprepare",
    "burst wall",
    "burst wall, grpcio futures client",
    "RSS",
}


# floor-go is built from deploy/local/floorbin on first use (seconds, with the modules of the
# cluster's build).
@pytest.mark.parametrize("mode", MODES + FLOORS)
def test_each_server_prepares_unprepares_and_takes_the_burst(mode: str) -> None:
    # _measure fails on any claim answered with an error, so the figures mean every call succeeded.
    figures = _measure(mode, claims=3, devices=BURST)
    assert set(figures) == FIGURES
    assert figures["prepare p50"] > 0
    assert figures["burst wall"] > 0
    assert figures["RSS"] > 1


def test_the_go_floor_runs_on_the_go_references_grpc_and_protobuf() -> None:
    # Otherwise the floor would not be the Go reference's: its transport and codec, nothing else.
    def required(go_mod: str, module: str) -> str:
        found = re.search(rf"^\s*{re.escape(module)} (v\S+)", go_mod, re.MULTILINE)
        assert found is not None, module
        return found.group(1)

    floor, reference = FLOOR.go_mod.read_text(), GOBENCH.go_mod.read_text()
    for module in (
        "google.golang.org/grpc",
        "google.golang.org/protobuf",
        "k8s.io/kubelet",
        "golang.org/x/net",
    ):
        assert required(floor, module) == required(reference, module), module


def test_unknown_modes_are_refused_by_name() -> None:
    assert _modes("plugin,floor-go") == ("plugin", "floor-go")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown fast; known: plugin"):
        _modes("plugin,fast")
