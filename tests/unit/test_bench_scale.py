"""The node-scale benchmark's layout: 256 devices, and allocations the driver publishes devices for."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from dra.cli import main
from dra.cli.parser import parse_args
from tests.bench.bench_scale import (
    MIG_GPUS,
    SHARED_GPUS,
    SHARES,
    _flags,
    _mig_results,
    _profile,
    _share_results,
    visits,
)
from tests.bench.bench_scale_state import run_once


def test_the_layout_publishes_256_devices_and_every_allocated_placement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.yaml"
    _profile(profile)
    mig_mode = next(f for f in _flags() if f.startswith("--mig-mode="))
    assert main(["discover", "--node-name=n", f"--fake-gpus={profile}", mig_mode, "--output=json"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
    assert len(names) == 256
    assert {r["device"] for r in _mig_results()} <= names
    assert len(_mig_results()) == 7 * MIG_GPUS
    assert {f"gpu-{i}" for i in range(SHARED_GPUS)} <= names


def test_the_kubelet_plugin_takes_the_flags_and_shares_every_whole_gpu(tmp_path: Path) -> None:
    args = parse_args(["kubelet-plugin", "--node-name=n", f"--fake-gpus={tmp_path}/p.yaml", *_flags()])
    assert args.consumable_shares == SHARES


def test_shares_go_round_robin_each_with_its_own_share_id() -> None:
    results = list(itertools.islice(_share_results(), 2 * SHARED_GPUS))
    assert [r["device"] for r in results[:2]] == ["gpu-0", "gpu-1"]
    assert results[SHARED_GPUS]["device"] == "gpu-0"
    assert len({r["shareID"] for r in results}) == len(results)
    assert results[0]["consumedCapacity"] == {"memory": "0", "shares": "1"}


def test_the_state_alone_makes_and_destroys_its_probes_mig_devices() -> None:
    # run_once checks that each probe's prepare made its MIG device and its unprepare destroyed it.
    prepare, unprepare = run_once(held=20, probes=2)
    assert prepare > 0
    assert unprepare > 0


def test_levels_are_visited_up_then_down() -> None:
    assert visits((10, 1000), 2) == [10, 1000, 1000, 10]
    assert visits((10, 64, 1000), 3) == [10, 64, 1000, 1000, 64, 10, 10, 64, 1000]
    assert visits((10, 1000), 1) == [10, 1000]
