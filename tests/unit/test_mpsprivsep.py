"""MPS privilege separation: the serving plugin holds no CAP_SYS_ADMIN in any set; its launcher does.

The processes run under `setpriv` with the capabilities the chart gives the MPS plugin
container (CAP_SYS_ADMIN and CAP_SETPCAP, as uid 0, nothing else: no CAP_SYS_PTRACE), so
what the tests read is what the container's processes get.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dra.core import sharing
from dra.kubeletplugin import mpslaunch
from tests.skips import Lack, reason
from tests.unit.helpers import inventory, mps_root

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason=reason(Lack.ROOT, "the launcher's mount namespaces")),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason=reason(Lack.TOOL, "needs util-linux setpriv")),
]

REPO = Path(__file__).parents[2]
FAKE_MPS = [sys.executable, "-m", "dra.fakegpus.mpscontrol"]
#: The chart's MPS container: uid 0 with these capabilities only.
CHART_CAPS = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all,+sys_admin,+setpcap"]
SYS_ADMIN = 1 << mpslaunch.CAP_SYS_ADMIN


def _caps(status: str) -> dict[str, int]:
    """The capability sets and no_new_privs of a /proc/<pid>/status."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    sets = {k: int(fields[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    return {**sets, "NoNewPrivs": int(fields["NoNewPrivs"])}


_SEPARATED = """
import json, os, signal, subprocess, sys
from pathlib import Path
import anyio
from dra.core import sharing
from dra.daemon.bootstrap import StartupError
from dra.kubeletplugin import mpslaunch, mpsprivsep
from dra.kubeletplugin.mps import MpsDaemons

root, uuid = Path(sys.argv[1]), sys.argv[2]
fake = [sys.executable, "-m", "dra.fakegpus.mpscontrol"]
launcher = mpsprivsep.separate(root, fake, 10.0)
out = {"self": Path("/proc/self/status").read_text()}
out["launcher"] = Path(f"/proc/{launcher.pid}/status").read_text()
out["child"] = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
try:
    Path(f"/proc/{launcher.pid}/environ").read_bytes()
    out["reads_launcher"] = "yes"
except PermissionError as err:
    out["reads_launcher"] = str(err)
daemons = MpsDaemons(root, fake, launcher.start)
key = sharing.mps_key([uuid])
launcher.start([uuid], False)
pid = daemons.pid(key)
out["daemon"] = Path(f"/proc/{pid}/status").read_text()
daemons.stop(key)
stat = Path(f"/proc/{pid}/stat")
# Gone, or a zombie its new parent has not reaped yet.
out["stopped"] = (not stat.exists() or ") Z" in stat.read_text()) and daemons.daemons() == []
refused = []
for bad in (["../../etc"], [uuid, uuid], [uuid + ",GPU-other"], []):
    try:
        launcher.start(bad, False)
    except mpslaunch.LaunchError as err:
        refused.append(str(err))
out["refused"] = refused
os.kill(launcher.pid, signal.SIGKILL)
try:
    launcher.start([uuid], False)
except mpslaunch.LaunchError as err:
    out["after_kill"] = str(err)
try:
    anyio.run(launcher.watch)
except StartupError as err:
    out["watch"] = str(err)
print(json.dumps(out))
"""


def test_only_the_launcher_keeps_cap_sys_admin_and_daemons_start_and_stop_through_it(tmp_path: Path) -> None:
    gpu = inventory("h100x8").get("gpu-0")
    assert gpu is not None
    root = mps_root(tmp_path)
    try:
        done = subprocess.run(
            [*CHART_CAPS, sys.executable, "-c", _SEPARATED, str(root), gpu.uuid],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
            timeout=120,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # The plugin's side: nothing in any set, the bounding set included, and no_new_privs.
    assert _caps(out["self"]) == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0) | {
        "NoNewPrivs": 1
    }
    # What it execs as uid 0 gets nothing back.
    assert _caps(out["child"])["CapEff"] == 0
    assert _caps(out["child"])["CapBnd"] == 0
    # The launcher keeps it, and the plugin, without CAP_SYS_PTRACE, cannot read it (ptrace access check).
    assert _caps(out["launcher"])["CapEff"] & SYS_ADMIN
    assert _caps(out["launcher"])["NoNewPrivs"] == 1
    assert "Permission denied" in out["reads_launcher"]
    # The daemon it starts keeps nothing either, so the plugin can still find and stop it.
    assert _caps(out["daemon"])["CapBnd"] == 0
    assert out["stopped"] is True
    assert len(out["refused"]) == 4
    assert all("refused a request that is not 1 to 64 distinct GPU or MIG UUIDs" in r for r in out["refused"])
    assert "the MPS launcher (pid" in out["after_kill"]
    assert "is gone" in out["after_kill"]
    assert "exited (killed by signal 9); exiting for the kubelet to restart the plugin" in out["watch"]


_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def _wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(check) or not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_real_kubelet_plugin_serves_without_cap_sys_admin_and_its_children_get_none(
    tmp_path: Path,
) -> None:
    gpu = inventory("h100x8").get("gpu-0")
    assert gpu is not None
    # A short state directory: the daemon's socket paths must fit in 107 bytes.
    state = mps_root(tmp_path)
    daemons = state / "mps"
    # A control binary that records the capabilities of each run, then is the fake.
    probe = tmp_path / "probe"
    probe.write_text(
        "#!/bin/sh\n"
        f'grep -E "^(Cap|NoNewPrivs)" /proc/self/status > "{tmp_path}/run.$$"\n'
        f'exec {sys.executable} -m dra.fakegpus.mpscontrol "$@"\n'
    )
    probe.chmod(0o755)
    # A daemon left by an earlier plugin, which no recorded claim uses: the plugin stops it at start.
    start = (
        "from dra.kubeletplugin import mpslaunch\n"
        f"mpslaunch.start_daemon({str(daemons)!r}, {FAKE_MPS!r}, [{gpu.uuid!r}], False, 10.0)"
    )
    subprocess.run([*CHART_CAPS, sys.executable, "-c", start], check=True, cwd=REPO, timeout=60)
    key = sharing.mps_key([gpu.uuid])
    pid_file = Path(sharing.mps_dirs(str(daemons), key).pipe) / "nvidia-cuda-mps-control.pid"
    leftover = int(pid_file.read_text())
    (tmp_path / "kubeconfig").write_text(_KUBECONFIG)
    # Short: the plugin's socket paths must fit in 107 bytes.
    kubelet = Path(tempfile.mkdtemp(prefix="kubelet-"))
    plugin = subprocess.Popen(
        [
            *CHART_CAPS,
            sys.executable,
            "-m",
            "dra",
            "kubelet-plugin",
            "--fake-gpus=h100x8",
            "--node-name=node-a",
            f"--kubelet-root={kubelet}",
            f"--cdi-root={tmp_path / 'cdi'}",
            f"--state-dir={state}",
            "--http-address=",
            f"--kubeconfig={tmp_path / 'kubeconfig'}",
            f"--mps-control={probe}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "plugin.log").open("w"),
    )
    try:
        _wait_for("the leftover daemon to be stopped", lambda: not daemons.joinpath(key).exists())
        # Serving: its gRPC server's threads run.
        _wait_for("the registration socket", lambda: any((kubelet / "plugins_registry").glob("*.sock")))
        assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()
        # Every thread of it: capabilities are per thread.
        threads = [
            _caps(t.joinpath("status").read_text()) for t in Path(f"/proc/{plugin.pid}/task").iterdir()
        ]
        children = Path(f"/proc/{plugin.pid}/task/{plugin.pid}/children").read_text().split()
        launcher = _caps(Path(f"/proc/{children[0]}/status").read_text())
        # A launcher that dies takes the plugin down, for the kubelet to restart it with a new one.
        os.kill(int(children[0]), signal.SIGKILL)
        assert plugin.wait(timeout=30) == 1
    finally:
        plugin.terminate()
        plugin.wait(timeout=30)
        shutil.rmtree(kubelet)
        shutil.rmtree(state, ignore_errors=True)
    log = (tmp_path / "plugin.log").read_text()
    assert "CAP_SYS_ADMIN dropped for good" in log, log
    assert "exited (killed by signal 9); exiting for the kubelet to restart the plugin" in log, log
    assert len(threads) > 1
    for serving in threads:
        assert serving == dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0) | {
            "NoNewPrivs": 1
        }
    assert launcher["CapEff"] & SYS_ADMIN
    # `quit`, run by the serving plugin: its exec'd child has no capability in any set.
    runs = [_caps(p.read_text()) for p in tmp_path.glob("run.*")]
    assert runs
    assert all(r["CapEff"] == r["CapPrm"] == r["CapBnd"] == 0 for r in runs)
    stat = Path(f"/proc/{leftover}/stat")
    assert not stat.exists() or ") Z" in stat.read_text()


def test_cap_sys_admin_without_cap_setpcap_refuses_to_start_rather_than_keep_it_bounded(
    tmp_path: Path,
) -> None:
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dra.daemon.bootstrap import StartupError\n"
        "from dra.kubeletplugin import mpsprivsep\n"
        "try:\n"
        f"    mpsprivsep.separate(Path({str(tmp_path)!r}), ['true'], 10.0)\n"
        "except StartupError as err:\n"
        "    print(err)\n"
    )
    only_sys_admin = ["setpriv", "--inh-caps=-all", "--bounding-set=-all,+sys_admin"]
    done = subprocess.run(
        [*only_sys_admin, sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.stdout.strip() == (
        "cannot drop capability 21 from the bounding set: Operation not permitted: with CAP_SYS_ADMIN the "
        "kubelet plugin needs CAP_SETPCAP as well, to give it up for good (Helm chart: "
        "kubeletPlugin.mps.enabled=true adds both)"
    )
