"""The local cluster's Kubernetes releases: choosing one, caching its binaries, its gates and APIs.

No cluster here: these check what the harness would run, and how it cleans up after a
cluster whose owner is gone (with stand-in processes).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localcluster import binaries, gomodule
from localcluster.binaries import (
    KUBERNETES,
    VERSIONS_DIR,
    default_kubernetes_version,
    kubernetes_module,
    kubernetes_version,
    supported_kubernetes_versions,
)
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterError, ClusterInfo
from localcluster.gomodule import BuildError, GoModule
from localcluster.kubereleases import RELEASES, parse_gates, release
from localcluster.processes import Stopped, stop_on_signals, stop_run_dir
from localcluster.workloads import committed_device_classes, device_classes

#: Gates that are GA in a release: setting them warns, and setting a locked one to false fails.
GA_IN = {"1.37": {"DRADeviceTaints", "DRAExtendedResource", "DynamicResourceAllocation"}}


def test_the_default_release_is_the_one_go_mod_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_VERSION", raising=False)
    pinned = re.search(r"k8s\.io/kubernetes (v\S+)", (KUBERNETES.directory / "go.mod").read_text())
    assert pinned is not None
    assert kubernetes_version() == default_kubernetes_version() == pinned.group(1)
    assert kubernetes_module() is KUBERNETES


@pytest.mark.parametrize("wanted", ["v1.37.2", "1.37.2"])
def test_kubernetes_version_picks_a_supported_release(monkeypatch: pytest.MonkeyPatch, wanted: str) -> None:
    monkeypatch.setenv("KUBERNETES_VERSION", wanted)
    assert kubernetes_version() == "v1.37.2"
    module = kubernetes_module()
    assert module.modfile == VERSIONS_DIR / "v1.37.2.mod"
    assert module.version() == "v1.37.2"
    assert module.bin_dir().name.startswith("v1.37.2-")


def test_an_unsupported_release_is_refused_with_the_supported_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_VERSION", "v1.36.0")
    with pytest.raises(BuildError) as raised:
        kubernetes_version()
    message = str(raised.value)
    assert "KUBERNETES_VERSION=v1.36.0 is not a supported release" in message
    assert "v1.34.12, v1.37.2" in message
    assert "versions/v1.36.0.mod" in message


def test_every_release_pins_every_staging_module_to_its_own_version() -> None:
    for version in supported_kubernetes_versions()[1:]:
        modfile = VERSIONS_DIR / f"{version}.mod"
        assert modfile.with_suffix(".sum").is_file(), f"{modfile}: commit its .sum (go mod tidy -modfile)"
        staging = "v0." + version.split(".", 1)[1]
        replaced = re.findall(r"^\s*(k8s\.io/\S+) => (k8s\.io/\S+) (v\S+)$", modfile.read_text(), re.M)
        assert replaced, f"{modfile} replaces no staging module"
        for source, target, pin in replaced:
            assert (source, pin) == (target, staging), f"{modfile}: {source} => {target} {pin}"


def _copy_module(tmp_path: Path) -> Path:
    copy = tmp_path / "k8sbin"
    shutil.copytree(KUBERNETES.directory, copy)
    return copy


def test_binaries_are_cached_per_release_and_the_default_key_ignores_other_releases(
    tmp_path: Path,
) -> None:
    copy = _copy_module(tmp_path)
    default = GoModule("k8s", copy, KUBERNETES.pinned, KUBERNETES.packages, KUBERNETES.ldflags)
    assert default.source_hash() == KUBERNETES.source_hash()
    other = GoModule(
        "k8s", copy, KUBERNETES.pinned, KUBERNETES.packages, KUBERNETES.ldflags, copy / "versions/v1.37.2.mod"
    )
    before = other.source_hash()
    assert other.bin_dir().parent == default.bin_dir().parent
    assert other.bin_dir() != default.bin_dir()
    # A new dependency pin for 1.37 rebuilds 1.37 only.
    (copy / "versions/v1.37.2.sum").write_text("changed\n")
    assert other.source_hash() != before
    assert default.source_hash() == KUBERNETES.source_hash()


def test_a_cluster_builds_neither_helm_nor_kubectl() -> None:
    assert "kubectl" not in binaries.CLUSTER_COMMANDS
    assert set(binaries.CLUSTER_COMMANDS) < set(KUBERNETES.commands)


def test_every_supported_release_has_its_gates_and_apis() -> None:
    for version in supported_kubernetes_versions():
        assert release(version) is RELEASES[".".join(version[1:].split(".")[:2])]


def test_release_134_turns_on_the_alpha_gates_and_apis_the_features_use() -> None:
    wanted = {
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRAConsumableCapacity",
        "DRAExtendedResource",
        "ResourceHealthStatus",
    }
    gates = parse_gates("", "v1.34.12")
    assert {name for name, on in gates.items() if on} == wanted
    assert "resource.k8s.io/v1alpha3" in release("v1.34.12").runtime_config


def test_release_137_sets_no_ga_gate_and_no_extra_api() -> None:
    gates = parse_gates("", "v1.37.2")
    assert not set(gates) & GA_IN["1.37"]
    assert all(gates.values())
    assert release("v1.37.2").runtime_config == ()


def test_gate_overrides_apply_on_top_of_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_VERSION", "v1.37.2")
    assert parse_gates("DRAConsumableCapacity=false")["DRAConsumableCapacity"] is False
    with pytest.raises(ValueError, match="expected Name=true or Name=false"):
        parse_gates("DRAConsumableCapacity")


def test_an_unknown_minor_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match=r"knows the feature gates of 1\.34, 1\.37 only"):
        LocalCluster(run_dir=tmp_path, version="v1.99.0")


def _signal_then_clean_up(log: list[str]) -> None:
    with stop_on_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            log.append("cleaned up")


def test_a_stop_signal_raises_stopped_and_a_second_cannot_cut_the_clean_up_short() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    log: list[str] = []
    with pytest.raises(Stopped) as raised:
        _signal_then_clean_up(log)
    assert log == ["cleaned up"]
    assert raised.value.exit_status == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_signal_ignored_at_start_stays_ignored() -> None:
    script = (
        "import os, signal, time\n"
        "from localcluster.processes import stop_on_signals\n"
        "with stop_on_signals():\n"
        "    os.kill(os.getpid(), signal.SIGHUP)\n"
        "    time.sleep(0.2)\n"
        "print('still here')\n"
    )
    # nohup's way: SIGHUP ignored before the program starts.
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(KUBERNETES.directory.parent)},
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        check=False,
    )
    assert result.stdout == "still here\n", result.stderr


def _sleeper(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *args], start_new_session=True
    )


def test_stop_run_dir_ends_the_processes_of_that_run_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mine, other = _sleeper(f"--data-dir={run_dir}/etcd"), _sleeper("--unrelated")
    try:
        info = ClusterInfo(
            run_dir=str(run_dir),
            kubeconfig="",
            kubelet_root="",
            device_plugin_dir="",
            cdi_dir="",
            runtime_records="",
            node_name="n",
            api_server="",
            feature_gates={},
            # "etcd" a stale entry whose PID now belongs to another program
            pids={"kube-apiserver": mine.pid, "etcd": other.pid},
        )
        info.save()
        assert stop_run_dir(run_dir)
        assert mine.wait(5) is not None
        assert other.poll() is None, "a process that does not name the run was stopped"
        assert not run_dir.exists()
        assert not stop_run_dir(run_dir)
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()


#: A stand-in `go`: downloads and compiles for a while, then writes one file per package.
FAKE_GO = """#!/bin/sh
echo "$@" >> "$GO_CALLS"
echo "go: downloading k8s.io/kubernetes v1.34.12"
echo "k8s.io/apimachinery/pkg/util/sets"
sleep 0.5
echo "k8s.io/kubernetes/pkg/kubelet"
[ -n "$GO_FAIL" ] && { echo "pkg/x.go:1:1: undefined: y"; exit 1; }
while [ "$1" != "-o" ]; do shift; done
out=$2; shift 2
for package in "$@"; do echo "#!/bin/sh" > "$out/${package##*/}"; chmod +x "$out/${package##*/}"; done
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`go` on PATH is FAKE_GO; returns the file it logs its command lines to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    calls = tmp_path / "go-calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GO_CALLS", str(calls))
    monkeypatch.setenv("DRA_GPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KUBERNETES_VERSION", raising=False)
    monkeypatch.setattr(gomodule, "PROGRESS_EVERY", 0.2)
    return calls


def test_a_cluster_build_compiles_only_what_a_cluster_starts_and_says_how_far_it_got(
    fake_go: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = binaries.ensure_cluster_binaries()
    assert sorted(path.name for path in target.iterdir()) == sorted(binaries.CLUSTER_COMMANDS)
    # One multi-call binary, linked once, serves every command under its own name.
    assert len({(target / name).stat().st_ino for name in binaries.CLUSTER_COMMANDS}) == 1
    (call,) = fake_go.read_text().splitlines()
    assert call.endswith(" ./hyperkube")
    assert "-modfile" not in call
    assert "kubectl" not in call
    assert "helm" not in call
    err = capsys.readouterr().err
    assert "building etcd, fakeruntime, kube-apiserver" in err
    assert "modules downloaded" in err
    assert "packages compiled" in err
    # kubectl comes later, on its own, into the same directory.
    assert binaries.ensure_binary("kubectl", log=False) == target / "kubectl"
    assert fake_go.read_text().splitlines()[1].endswith("k8s.io/kubernetes/cmd/kubectl")
    assert (target / "kubectl").stat().st_ino != (target / "kubelet").stat().st_ino
    binaries.ensure_cluster_binaries()
    assert len(fake_go.read_text().splitlines()) == 2


def test_another_release_builds_with_its_modfile(fake_go: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_VERSION", "v1.37.2")
    target = binaries.ensure_cluster_binaries(log=False)
    assert target.name.startswith("v1.37.2-")
    (call,) = fake_go.read_text().splitlines()
    assert f"-modfile={VERSIONS_DIR / 'v1.37.2.mod'}" in call
    assert "gitVersion=v1.37.2" in call
    assert "gitMinor=37" in call


def test_a_failed_build_shows_the_compiler_errors_and_caches_nothing(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GO_FAIL", "1")
    with pytest.raises(BuildError) as raised:
        binaries.ensure_cluster_binaries(log=False)
    assert "pkg/x.go:1:1: undefined: y" in str(raised.value)
    assert "k8s.io/kubernetes/pkg/kubelet" not in str(raised.value)
    assert binaries.kubernetes_module().missing() == KUBERNETES.commands


def test_the_demo_creates_the_charts_device_classes_without_helm() -> None:
    assert committed_device_classes() == device_classes()
