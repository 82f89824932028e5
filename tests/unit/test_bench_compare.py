"""The comparison benchmark's pure parts: how figures are summarised and printed, what it builds.

No cluster and no build here: the module that builds the Go reference driver must pin the
release the cluster runs, with the same staging modules, or the two would not be comparable.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from localcluster.binaries import go_dra_driver_module, kubernetes_module, supported_kubernetes_versions
from localcluster.gomodule import BuildError, GoModule

from tests.bench.bench_compare import (
    NVIDIA_GATES,
    RSS_CALLS,
    Contender,
    _arguments,
    _floors,
    _KubeletLog,
    _run_floor,
    _socket_served,
    alternate,
    baseline_tree,
    build_nvml_start,
    compile_tree,
    fakes_report,
    figure_line,
    floor_report,
    nvidia_limits,
    nvidia_report,
    pair_report,
    parse_levels,
    report,
    spread,
)
from tests.bench.bench_driver import cpu_seconds


def test_a_figure_is_the_median_of_the_runs_with_their_range() -> None:
    assert spread([3.0, 1.0, 2.0]) == (spread([2.0, 1.0, 3.0]))
    summary = spread([3.0, 1.0, 2.0, 10.0])
    assert (summary.median, summary.low, summary.high) == (2.5, 1.0, 10.0)
    with pytest.raises(ValueError, match="no runs"):
        spread([])


def test_a_figure_line_gives_both_drivers_and_the_ratio_of_medians() -> None:
    line = figure_line("first prepare p50", "ms", [1.1, 1.3, 1.2], [1.6, 1.5, 1.7])
    assert line == (
        "first prepare p50: dra-gpu 1.20 ms (1.10-1.30 ms), go reference 1.60 ms (1.50-1.70 ms), ratio 0.75x"
    )


def test_one_run_prints_no_range_and_about_three_significant_figures() -> None:
    assert figure_line("RSS after the run", "MiB", [98.42], [46.88]) == (
        "RSS after the run: dra-gpu 98.4 MiB, go reference 46.9 MiB, ratio 2.10x"
    )
    assert figure_line("burst wall", "ms", [158.4], [22.0]) == (
        "burst wall: dra-gpu 158 ms, go reference 22.0 ms, ratio 7.20x"
    )


def test_the_floors_print_pythons_beside_gos_under_the_drivers_row_names() -> None:
    python = Contender("python floor", "", [], Path("p.sock"), Path("p.log"), floor=True)
    go = Contender("go floor", "", [], Path("g.sock"), Path("g.log"), floor=True)
    for value in (0.4, 0.5):
        python.record("unprepare p50", value)
        python.record("RSS after the calls", 39.4)
    go.record("unprepare p50", 0.2)
    go.record("RSS after the calls", 15.8)
    assert pair_report(python, go) == [
        "unprepare p50: python floor 0.45 ms (0.40-0.50 ms), go floor 0.20 ms, ratio 2.25x",
        "RSS after the calls: python floor 39.4 MiB, go floor 15.8 MiB, ratio 2.49x",
    ]


def test_above_the_floor_each_run_is_less_its_runtimes_floor_and_the_ratio_is_of_the_medians() -> None:
    def contender(label: str, burst: list[float], rss: float) -> Contender:
        made = Contender(label, "", [], Path(f"{label}.sock"), Path(f"{label}.log"))
        made.figures = {"burst": burst, RSS_CALLS: [rss] * len(burst)}
        return made

    ours = contender("dra-gpu", [60.0, 70.0, 80.0], 60)
    base = contender("baseline", [70.0, 80.0, 90.0], 60)
    go = contender("go reference", [30.0, 35.0, 40.0], 40)
    python_floor, go_floor = (
        contender("python floor", [10.0, 20.0, 20.0], 40),
        contender("go floor", [5.0] * 3, 15),
    )
    # dra-gpu adds 50, 50, 60 (median 50); Go 25, 30, 35 (median 30): 1.67x, per run 2.00, 1.67, 1.71.
    assert floor_report(ours, go, python_floor, go_floor, [base]) == [
        "burst: dra-gpu +50.0 ms (1.67x, per run 1.67-2.00x), "
        "baseline +60.0 ms (2.00x, per run 2.00-2.40x); go reference +30.0 ms"
    ]


def test_a_pair_prints_only_the_rows_both_have() -> None:
    go = Contender("go reference", "test-driver.cdi.k8s.io", [], Path("go.sock"), Path("go.log"))
    by_itself = Contender("go reference, alone", "test-driver.cdi.k8s.io", [], Path("go.sock"), Path("a.log"))
    go.record("prepare p50 with 1000 claims prepared", 1.3)
    go.record("RSS after the run", 53.8)
    for contender, value in ((go, 0.26), (by_itself, 0.25)):
        contender.record("empty NodePrepareResources p50", value)
    assert pair_report(go, by_itself) == [
        "empty NodePrepareResources p50: go reference 0.26 ms, go reference, alone 0.25 ms, ratio 1.04x"
    ]


def test_a_floor_run_times_the_rows_that_need_no_cluster_in_python_and_go(tmp_path: Path) -> None:
    # The Go floor is built from deploy/local/floorbin on first use (seconds, with the modules the
    # cluster's build downloaded). A claim answered with an error would fail the run.
    floors = _floors(tmp_path)
    assert floors is not None
    for floor in floors:
        _run_floor(floor, argparse.Namespace(claims=3))
    python, go = floors
    assert set(python.figures) == set(go.figures)
    assert "unprepare p50" in python.figures
    assert "CPU per first prepare, later work included" not in python.figures
    # CPU over three calls may round to no clock tick; the times may not.
    assert all(len(values) == 1 and values[0] >= 0 for values in python.figures.values())
    assert python.figures["unprepare p50"][0] > 0
    lines = pair_report(python, go)
    assert lines[0].startswith("empty NodePrepareResources p50: python floor ")
    assert ", go floor " in lines[-1]
    assert lines[-1].startswith("RSS after the calls: ")


def test_without_the_go_driver_the_line_has_dra_gpus_figure_alone() -> None:
    assert figure_line("unprepare p50", "ms", [3.5], []) == "unprepare p50: dra-gpu 3.50 ms"


def test_the_report_has_a_line_per_figure_of_dra_gpu_in_its_unit() -> None:
    ours = Contender("dra-gpu", "gpu.nvidia.com", [], Path("dra.sock"), Path("dra-gpu.log"))
    theirs = Contender("go reference", "test-driver.cdi.k8s.io", [], Path("dra.sock"), Path("go.log"))
    ours.record("start -> registered + slices published", 0.8)
    ours.record("first prepare p50", 2.0)
    theirs.record("first prepare p50", 1.0)
    assert report(ours, theirs) == [
        "start -> registered + slices published: dra-gpu 0.80 s",
        "first prepare p50: dra-gpu 2.00 ms, go reference 1.00 ms, ratio 2.00x",
    ]
    assert report(ours, None)[1] == "first prepare p50: dra-gpu 2.00 ms"


def test_pileup_levels_are_parsed_sorted_and_checked() -> None:
    assert parse_levels("1000, 0,64,64") == (0, 64, 1000)
    with pytest.raises(argparse.ArgumentTypeError, match="whole numbers"):
        parse_levels("0,many")
    with pytest.raises(argparse.ArgumentTypeError, match="0 or more"):
        parse_levels("-1,5")


def test_cpu_time_of_this_process_is_read_from_proc() -> None:
    used = os.times()
    measured = cpu_seconds(os.getpid())
    # Clock ticks: the kernel's figure rounds to 1/CLK_TCK of what os.times() reports.
    assert abs(measured - (used.user + used.system)) < 0.1


def _replaced(module: GoModule) -> set[tuple[str, str]]:
    text = module.go_mod.read_text()
    return set(re.findall(r"^\s*(k8s\.io/\S+) => k8s\.io/\S+ (v\S+)$", text, re.M))


def test_the_go_reference_pins_each_release_the_cluster_runs_with_its_staging_modules() -> None:
    for version in supported_kubernetes_versions():
        ours, cluster = go_dra_driver_module(version), kubernetes_module(version)
        assert ours.version() == cluster.version() == version
        assert ours.go_mod.with_suffix(".sum").is_file(), f"{ours.go_mod}: commit its .sum"

        assert _replaced(ours) == _replaced(cluster)
        assert "k8s.io/kubernetes/test/e2e/dra/test-driver" in ours.go_mod.read_text()


def test_a_release_without_a_go_reference_modfile_says_which_file_is_missing() -> None:
    with pytest.raises(BuildError, match=r"has no versions/v1\.99\.0\.mod"):
        go_dra_driver_module("v1.99.0")


def test_a_go_driver_that_fails_is_dropped_with_the_reason_and_dra_gpu_runs_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ours = Contender("dra-gpu", "gpu.nvidia.com", [], Path("dra.sock"), Path("dra-gpu.log"))
    theirs = Contender("go reference", "test-driver.cdi.k8s.io", [], Path("dra.sock"), Path("go.log"))

    def run(contender: Contender) -> None:
        if contender is theirs:
            raise RuntimeError("go reference exited with 1: see go.log")
        contender.record("first prepare p50", 2.0)

    left = alternate([ours, theirs], 2, run)
    assert left == [ours]
    assert ours.figures == {"first prepare p50": [2.0, 2.0]}
    out = capsys.readouterr().out
    assert "go reference dropped from the comparison: go reference exited with 1: see go.log" in out


def test_every_other_run_takes_the_turns_backwards(capsys: pytest.CaptureFixture[str]) -> None:
    # So that no contender always follows the same one (issue 47: the Go driver always came right
    # after dra-gpu's run, whatever that run left behind).
    contenders = [Contender(label, "", [], Path(f"{label}.sock"), Path(f"{label}.log")) for label in "abc"]
    turns: list[str] = []
    assert alternate(contenders, 3, lambda c: turns.append(c.label)) == contenders
    assert "".join(turns) == "abccbaabc"
    assert capsys.readouterr().out.splitlines()[3] == "run 2/3: c"


def test_a_failing_dra_gpu_run_ends_the_benchmark() -> None:
    ours = Contender("dra-gpu", "gpu.nvidia.com", [], Path("dra.sock"), Path("dra-gpu.log"))

    def run(contender: Contender) -> None:
        raise RuntimeError("dra-gpu failed to prepare ns/first-0: no such device")

    with pytest.raises(RuntimeError, match="no such device"):
        alternate([ours], 1, run)


def test_the_kubelet_log_is_read_from_where_the_last_look_stopped(tmp_path: Path) -> None:
    line = 'I1126 "Connection changed" driverName="gpu.example.com" connected=true\n'
    log = tmp_path / "kubelet.log"
    log.write_text("before " + line)
    watch = _KubeletLog(log, "gpu.example.com")
    try:
        # The last run's connection is not this one's.
        assert not watch.connected()
        with log.open("a") as kubelet:
            kubelet.write(line.replace("gpu.example.com", "other.example.com"))
            kubelet.write(line[:20])
            kubelet.flush()
            # Half a line is read again whole at the next look.
            assert not watch.connected()
            kubelet.write(line[20:])
        assert watch.connected()
    finally:
        watch.close()


def test_nvidias_rows_are_printed_with_the_fakes_part_beside_them_never_subtracted() -> None:
    nvidia = Contender("nvidia", "gpu.nvidia.com", [], Path("n.sock"), Path("n.log"))
    for unprepare, smi in ((450.0, 440.0), (430.0, 460.0)):
        nvidia.record("unprepare p50", unprepare)
        # Measured apart, the fake's median can come out above the row's: no difference is printed.
        nvidia.record("the fake nvidia-smi: the two calls of NVIDIA's unprepare", smi)
    nvidia.record("start -> registered + slices published", 6.0)
    nvidia.record("the fake NVML alone: NVIDIA's start-up NVML calls", 0.5)
    lines = fakes_report(nvidia)
    assert lines == [
        "start -> registered + slices published: nvidia 6.00 s; the fakes measured apart 0.50 s "
        "(the fake NVML alone: NVIDIA's start-up NVML calls)",
        "unprepare p50: nvidia 440 ms (430-450 ms); the fakes measured apart 450 ms (440-460 ms) "
        "(the fake nvidia-smi: the two calls of NVIDIA's unprepare): more than the row, so not all of "
        "it is in the row",
    ]
    assert not any(f" -{digit}" in line for line in lines for digit in "0123456789")  # no negative figure


def test_nvidias_second_column_is_its_run_with_the_api_limit_lifted() -> None:
    ours = Contender("dra-gpu, fake NVML", "gpu.nvidia.com", [], Path("a.sock"), Path("a.log"))
    nvidia = Contender("nvidia", "gpu.nvidia.com", [], Path("n.sock"), Path("n.log"))
    lifted = Contender("nvidia, API limit lifted", "gpu.nvidia.com", [], Path("l.sock"), Path("l.log"))
    ours.record("first prepare p50", 1.0)
    nvidia.record("first prepare p50", 200.0)
    lifted.record("first prepare p50", 4.0)
    assert nvidia_report(ours, nvidia, lifted) == [
        "first prepare p50: dra-gpu, fake NVML 1.00 ms, nvidia 200 ms, ratio 0.01x; "
        "nvidia, API limit lifted 4.00 ms, ratio 0.25x"
    ]
    assert nvidia_report(ours, nvidia, None) == [
        "first prepare p50: dra-gpu, fake NVML 1.00 ms, nvidia 200 ms, ratio 0.01x"
    ]


def test_nvidia_runs_at_its_charts_default_gates_none() -> None:
    assert NVIDIA_GATES == {}


def test_nvidias_api_limits_are_its_charts_unless_lifted() -> None:
    assert nvidia_limits(0) == "as its chart leaves them: its defaults, --kube-api-qps 5, --kube-api-burst 10"
    assert nvidia_limits(500) == "--kube-api-qps 500, --kube-api-burst 1000 (lifted, not its chart's)"


def test_nvml_start_makes_nvidias_start_up_calls_from_a_program_of_no_python(tmp_path: Path) -> None:
    from fakenvml.node import FakeNode

    from tests.unit.helpers import NODE

    program = build_nvml_start(tmp_path)
    assert program is not None
    node = FakeNode(tmp_path / "node", "h100x8", NODE).build()
    done = subprocess.run([str(program), str(node.library)], capture_output=True, text=True, check=True)
    made, failed, peak_kib = map(int, done.stdout.split())
    # Per GPU as NVIDIA's plugin v0.4.1 over 128 GPUs: 56 calls, the 10 GPU instance profiles an
    # H100 lacks refused; the embedded interpreter is most of the memory.
    assert (made, failed) == (3 + 8 * 56, 8 * 10)
    assert peak_kib > 10_000


def test_a_negative_nvidia_qps_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_compare", "--nvidia-lifted-qps=-1"])
    with pytest.raises(SystemExit):
        _arguments()
    assert "--nvidia-lifted-qps must be 0 (no lifted column) or more, not -1" in capsys.readouterr().err


def test_a_baseline_must_be_a_checkout_with_its_generated_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_compare", f"--baseline={tmp_path}"])
    with pytest.raises(SystemExit):
        _arguments()
    assert f"--baseline: {tmp_path} is not a checkout of dra-gpu" in capsys.readouterr().err
    (tmp_path / "dra").mkdir()
    (tmp_path / "dra" / "__main__.py").touch()
    with pytest.raises(ValueError, match=r"no generated dra/pb: run `python proto/generate.py` there"):
        baseline_tree(tmp_path)


def test_the_baseline_is_this_checkout_described_by_its_commit() -> None:
    repo = Path(__file__).resolve().parents[2]
    described = baseline_tree(repo)
    assert described.startswith(f"{repo} at ")
    assert described != f"{repo} at an unknown commit"


def test_a_tree_is_compiled_ahead_even_where_bytecode_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (tmp_path / "dra").mkdir()
    (tmp_path / "dra" / "module.py").write_text("VALUE = 1\n")
    compile_tree(tmp_path)
    assert [p.name.split(".")[0] for p in (tmp_path / "dra" / "__pycache__").iterdir()] == ["module"]


def test_a_registration_socket_counts_once_made_after_the_spawn(tmp_path: Path) -> None:
    old = tmp_path / "gpu.nvidia.com-bench-reg.sock"
    old.touch()
    os.utime(old, (1.0, 1.0))
    (tmp_path / "other.example.com-reg.sock").touch()
    spawned = old.stat().st_mtime + 1
    assert not _socket_served(tmp_path, "gpu.nvidia.com", spawned)
    (tmp_path / "gpu.nvidia.com-reg.sock").touch()
    assert _socket_served(tmp_path, "gpu.nvidia.com", spawned)
