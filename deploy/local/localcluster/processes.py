"""The processes of a local cluster: stopped in order, on signals, or those of a run whose owner died.

Each component runs in a process group of its own (so a terminal's signals do not reach it);
`stop_on_signals` turns SIGINT, SIGTERM and SIGHUP into an exception so that whoever started a
cluster stops it in its `finally`, and `stop_run_dir` (`make cluster-down`) ends the processes a
run's cluster.json names.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from localcluster import containerd, nodenet
from localcluster.clusterinfo import ClusterInfo

_STOP_ORDER = (
    "kubelet",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
    "fakeruntime",
)


def stop_run_dir(run_dir: Path) -> bool:
    """Stop the processes cluster.json in run_dir names and remove run_dir; False if none ran there.

    For a cluster whose owner is gone (`make cluster-up` returned, or a demo was killed):
    a process is stopped only while its command line still names run_dir, so a stale
    cluster.json never ends an unrelated process that reuses a PID.
    """
    try:
        info = ClusterInfo.load(run_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        shutil.rmtree(run_dir, ignore_errors=True)
        return False
    stop_processes({name: pid for name, pid in info.pids.items() if _runs_in(pid, run_dir)})
    containerd.stop_leftovers(run_dir)
    nodenet.destroy(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _runs_in(pid: int, run_dir: Path) -> bool:
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(run_dir).encode() in command_line


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt: only `finally` sees it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """The shell's convention for death by this signal: 128 + its number."""
        return 128 + self.signum


#: The signals that end a foreground run: Ctrl-C, kill, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Raise Stopped in the main thread on SIGINT, SIGTERM or SIGHUP while the block runs.

    A signal that was ignored when the process started stays ignored: nohup ignores SIGHUP
    and a shell ignores SIGINT for background jobs on purpose. After the first signal the
    others are ignored, so a second Ctrl-C cannot interrupt the clean-up it started.
    """

    def handler(signum: int, frame: object) -> None:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    handled = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, handler) for sig in handled}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def stop_processes(pids: Mapping[str, int], grace: float = 10.0) -> None:
    """SIGTERM each component in dependency order, SIGKILL what outlives the grace period."""
    for name in sorted(pids, key=lambda n: _STOP_ORDER.index(n) if n in _STOP_ORDER else -1):
        pid = pids[name]
        _signal(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.05)
        _signal(pid, signal.SIGKILL)
        _reap(pid)


def _signal(pid: int, sig: int) -> None:
    """Signal the process group a component leads, or the process alone if it leads none
    (the demo's driver shares the demo's group)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, change time) of a file, or None: tells a re-created file from the old one."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def log_tail(path: str, lines: int = 30) -> str:
    """The last lines of a component's log, for an error message."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"
