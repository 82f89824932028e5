"""MPS control daemons, one per set of devices claims use with MPS, run as processes of the kubelet plugin.

Each daemon has its pipe, log and shm directories under <state dir>/mps/<key>/ and is started
through dra.kubeletplugin.mpslaunch. Which daemon starts, which a claim joins, what it is told and
when it stops are dra.core.mpsdaemons' programs; here are the processes, their pid files and the
control pipe the steps of those programs use. A daemon outlives the driver by design. The layout
and the life cycle: docs/sharing.md ("MPS").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dra import documents
from dra.core import sharing
from dra.kubeletplugin import mpslaunch

log = logging.getLogger(__name__)

#: The pid file the control daemon writes in its pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
#: Seconds a control command may take.
COMMAND_TIMEOUT = 10.0
#: Seconds a daemon is given to leave after `quit`, before it is killed.
STOP_TIMEOUT = 5.0


class MpsError(Exception):
    """An MPS control daemon could not be started or configured; the message says what it answered."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent's wait is missing.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def _serves(pid: int, pipe: str) -> bool:
    """Whether process `pid` was started with CUDA_MPS_PIPE_DIRECTORY=`pipe`."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except PermissionError:
        # Not ours to read: the driver runs as root, so this is not a daemon it started.
        return False
    except OSError:
        return False
    return f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ


class MpsDaemons:
    """The MPS control daemons of claims, one per set of devices: started, asked, found and stopped.

    A daemon is named by its devices (dra.core.sharing.mps_key).
    """

    def __init__(
        self, root: Path, command: Sequence[str], launch: Callable[[Sequence[str], bool], None] | None = None
    ) -> None:
        #: <state dir>/mps: one directory per daemon.
        self.root = root
        self._command = list(command)
        #: Starts the daemon of these device UUIDs, multi-user or not (mpslaunch.start_daemon's contract);
        #: by default from this process, in the plugin from the privileged launcher (mpsprivsep).
        self._launch = launch or functools.partial(
            mpslaunch.start_daemon, str(root), self._command, timeout=COMMAND_TIMEOUT
        )

    def _dirs(self, key: str) -> sharing.MpsDirs:
        return sharing.mps_dirs(str(self.root), key)

    def pid(self, key: str) -> int | None:
        """The pid of daemon `key` when it runs, else None.

        The pid file outlives a reboot (the state directory is on the host), and its
        pid may then be another process's: only a live process started with this
        daemon's pipe directory in its environment counts.
        """
        pipe = self._dirs(key).pipe
        try:
            # Bounded: a pid is a few digits, and the file may be anything a restore left there.
            pid = int(documents.read_text(Path(pipe) / PID_FILE, "MPS pid file", 64).strip())
        except ValueError:
            return None
        return pid if _alive(pid) and _serves(pid, pipe) else None

    def _run(self, key: str, args: Sequence[str], stdin: str = "") -> str:
        command = [*self._command, *args]
        try:
            done = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                env=mpslaunch.environment(self._dirs(key)),
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise MpsError(f"{' '.join(command)}: {err}") from None
        if done.returncode != 0:
            output = done.stderr.strip() or done.stdout.strip() or "no output"
            raise MpsError(f"{' '.join(command)} exited with {done.returncode}: {output}")
        return done.stdout

    def launch(self, uuids: Sequence[str], multi_user: bool) -> int:
        """Start the daemon of these device UUIDs, multi-user or not; its pid. MpsError if it fails."""
        key = sharing.mps_key(uuids)
        try:
            self._launch(list(uuids), multi_user)
        except mpslaunch.LaunchError as err:
            raise MpsError(str(err)) from None
        pid = self.pid(key)
        if pid is None:
            raise MpsError(f"the MPS control daemon {key} wrote no pid file in {self._dirs(key).pipe}")
        return pid

    def ask(self, key: str, command: str) -> str:
        """One command, one call: its answer (or error line) then belongs to it. MpsError if it fails."""
        return self._run(key, [], command + "\n").strip()

    def stop(self, key: str) -> None:
        """Stop daemon `key` (quit, else kill) and remove its directories; no daemon is fine."""
        pid = self.pid(key)
        if pid is not None:
            try:
                self._run(key, [], "quit\n")
            except MpsError as err:
                log.warning("%s; killing it", err)
            deadline = time.monotonic() + STOP_TIMEOUT
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log.info("stopped MPS control daemon %d (%s)", pid, key)
        shutil.rmtree(self._dirs(key).root, ignore_errors=True)

    def daemons(self) -> list[str]:
        """Keys of the daemons with directories."""
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []
