"""The release's binaries know the harness's gates; `make cluster-up`, `make demo` and
`make cluster-down` leave nothing running, however they end.

The cluster's processes run in process groups of their own, so a signal to the command
that started them reaches only that command: it must stop them itself, and
`cluster-down` must find a demo's cluster when the demo was killed outright. Each test
runs the real command on a real cluster in a directory of its own (DRA_GPU_CLUSTER_DIR).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.binaries import KUBERNETES, ensure_cluster_binaries, kubernetes_version
from localcluster.kubereleases import default_feature_gates

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = {"etcd", "fakeruntime", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    """Where the commands under test keep their clusters: short, for the kubelet's and the driver's
    socket paths (pytest's own temporary directories are longer under pytest-xdist)."""
    parent = Path(tempfile.mkdtemp(prefix="dra-lc-", dir="/tmp"))
    try:
        yield parent / "up"
    finally:
        # A failed test must not leave a cluster behind for the next one.
        _command("down", cluster_dir=parent / "up")
        shutil.rmtree(parent, ignore_errors=True)


def _env(cluster_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(KUBERNETES.directory.parent)]),
        "DRA_GPU_CLUSTER_DIR": str(cluster_dir),
        **extra,
    }


def _command(*args: str, cluster_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localcluster", *args],
        env=_env(cluster_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _pids(run_dir: Path) -> dict[str, int]:
    try:
        pids: dict[str, int] = json.loads((run_dir / "cluster.json").read_text())["pids"]
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return pids


def _wait_for(what: str, check: object, timeout: float = 120) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _assert_gone(pids: dict[str, int], run_dir: Path) -> None:
    # A stopped component may linger a moment as a zombie of the command's own children.
    _wait_for(
        "the processes to end",
        lambda: not [n for n, pid in pids.items() if _running(pid)],
        timeout=30,
    )
    assert not run_dir.exists(), f"{run_dir} is left behind"
    assert str(run_dir) not in Path("/proc/mounts").read_text()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _demo(cluster_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localcluster.demo"],
        env=_env(cluster_dir, DEMO_KEEP="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


def _wait_kept(demo: subprocess.Popen[str]) -> str:
    """The demo's output up to the line saying the cluster stays up."""
    assert demo.stdout is not None
    lines = []
    for line in demo.stdout:
        lines.append(line)
        if "Ctrl-C (or SIGTERM, SIGHUP) to stop" in line:
            return "".join(lines)
    raise AssertionError("the demo ended before keeping the cluster up:\n" + "".join(lines))


def test_every_gate_the_harness_sets_is_an_alpha_or_beta_gate_of_the_release() -> None:
    """A gate the release removed fails the components' start, and a GA one only warns:
    --help lists exactly the gates that are neither."""
    apiserver = ensure_cluster_binaries() / "kube-apiserver"
    text = subprocess.run([apiserver, "--help"], capture_output=True, text=True, check=False).stdout
    listed = dict(re.findall(r"kube:(\w+)=true\|false \((ALPHA|BETA) - default=", text))
    assert listed, f"{apiserver} --help lists no feature gates"
    for name in default_feature_gates():
        assert name in listed, f"Kubernetes {kubernetes_version()} has no alpha or beta gate {name}"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_while_cluster_up_starts_stops_what_it_started(
    cluster_dir: Path, stop: signal.Signals
) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "localcluster", "up"],
        env=_env(cluster_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for("the API server to start", lambda: "kube-apiserver" in _pids(cluster_dir))
    pids = _pids(cluster_dir)
    up.send_signal(stop)
    _, err = up.communicate(timeout=60)
    assert up.returncode == 128 + stop
    assert f"stopped by {stop.name}: stopped everything it had started" in err
    _assert_gone(pids, cluster_dir)


def test_a_kept_demo_stops_everything_on_sighup(cluster_dir: Path) -> None:
    demo = _demo(cluster_dir)
    try:
        kept = _wait_kept(demo)
        run_dir = cluster_dir.with_name("up-demo")
        pids = _pids(run_dir)
        assert set(pids) == COMPONENTS | {"dra-gpu"}
        # A closed terminal: the demo gets SIGHUP, its cluster's process groups do not.
        demo.send_signal(signal.SIGHUP)
        try:
            out, _ = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo did not stop within 60 s of SIGHUP; its run:\n{kept}") from None
    finally:
        demo.kill()
    # The whole run: a failing exit status is a pod's row marked "!".
    assert demo.returncode == 0, kept + out
    assert "stopped the driver and the cluster; nothing is left behind" in out
    _assert_gone(pids, run_dir)


def test_cluster_down_stops_a_killed_demos_cluster(cluster_dir: Path) -> None:
    demo = _demo(cluster_dir)
    try:
        _wait_kept(demo)
    finally:
        demo.kill()
        demo.wait()
    run_dir = cluster_dir.with_name("up-demo")
    pids = _pids(run_dir)
    assert all(_running(pid) for pid in pids.values()), "SIGKILL left no chance to clean up"
    down = _command("down", cluster_dir=cluster_dir)
    assert down.returncode == 0, down.stderr
    assert f"stopped the cluster in {run_dir}" in down.stderr
    _assert_gone(pids, run_dir)
