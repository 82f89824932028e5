"""One MPS control daemon per claim that asks MPS, run as a process of the kubelet plugin.

Each daemon gets its own directories under <state dir>/mps/<claim UID>/
(dra.core.sharing.mps_dirs): `pipe` (CUDA_MPS_PIPE_DIRECTORY, bind-mounted
into the claim's containers at /tmp/nvidia-mps), `log`
(CUDA_MPS_LOG_DIRECTORY) and `shm` (the containers' /dev/shm), and
CUDA_VISIBLE_DEVICES set to the claim's devices. It is started with
`nvidia-cuda-mps-control -d` and told its limits by piping commands into
the control binary; `quit` stops it.

The daemon is started detached (-d), so it outlives the driver by design:
a restarted driver adopts the daemon of each recorded claim (its pid file
names a live process started with the claim's pipe directory) instead of
starting it again, and stops every daemon whose claim the checkpoint does
not hold.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from dra.core import sharing
from dra.model.prepared import PreparedClaim

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
    """Starts, adopts and stops the MPS control daemons of claims."""

    def __init__(self, root: Path, command: Sequence[str]) -> None:
        #: <state dir>/mps: one directory per claim with a daemon.
        self.root = root
        self._command = list(command)

    def _dirs(self, uid: str) -> sharing.MpsDirs:
        return sharing.mps_dirs(str(self.root), uid)

    def _env(self, uid: str, uuids: Sequence[str] = ()) -> dict[str, str]:
        dirs = self._dirs(uid)
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=dirs.pipe, CUDA_MPS_LOG_DIRECTORY=dirs.log)
        if uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def pid(self, uid: str) -> int | None:
        """The pid of claim `uid`'s daemon when it runs, else None.

        The pid file outlives a reboot (the state directory is on the host), and its
        pid may then be another process's: only a live process started with this
        claim's pipe directory in its environment counts.
        """
        pipe = self._dirs(uid).pipe
        try:
            pid = int((Path(pipe) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) and _serves(pid, pipe) else None

    def _run(self, uid: str, args: Sequence[str], stdin: str = "", uuids: Sequence[str] = ()) -> str:
        command = [*self._command, *args]
        try:
            done = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(uid, uuids),
                timeout=COMMAND_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise MpsError(f"{' '.join(command)}: {err}") from None
        if done.returncode != 0:
            output = done.stderr.strip() or done.stdout.strip() or "no output"
            raise MpsError(f"{' '.join(command)} exited with {done.returncode}: {output}")
        return done.stdout

    def _configure(self, claim: PreparedClaim) -> None:
        devices = sharing.mps_devices(claim)
        commands = []
        if devices[0].mps_thread_percentage:
            commands.append(f"set_default_active_thread_percentage {devices[0].mps_thread_percentage}")
        commands += [
            f"set_default_device_pinned_mem_limit {i} {d.mps_pinned_limit}"
            for i, d in enumerate(devices)
            if d.mps_pinned_limit
        ]
        for command in commands:
            # One command per call: each answer (or error line) then belongs to its command.
            answer = self._run(claim.uid, [], command + "\n").strip()
            if answer.startswith(("Invalid", "Unrecognized", "Error")):
                raise MpsError(f"MPS control daemon of claim {claim.uid} refused {command!r}: {answer}")

    def start(self, claim: PreparedClaim) -> None:
        """Start (or adopt) the claim's daemon and set its limits; MpsError when that fails."""
        devices = sharing.mps_devices(claim)
        if not devices:
            return
        pid = self.pid(claim.uid)
        if pid is None:
            dirs = self._dirs(claim.uid)
            for path in (dirs.pipe, dirs.log, dirs.shm):
                Path(path).mkdir(parents=True, exist_ok=True)
            self._run(claim.uid, ["-d"], uuids=[d.uuid for d in devices])
            pid = self.pid(claim.uid)
            if pid is None:
                raise MpsError(
                    f"the MPS control daemon of claim {claim.uid} wrote no pid file in {dirs.pipe}"
                )
            log.info("started MPS control daemon %d for claim %s", pid, claim.uid)
        else:
            log.info("adopted MPS control daemon %d of claim %s", pid, claim.uid)
        # Setting a limit again is harmless, and a crash may have come before the first time.
        self._configure(claim)

    def stop(self, uid: str) -> None:
        """Stop the claim's daemon (quit, else kill) and remove its directories; no daemon is fine."""
        pid = self.pid(uid)
        if pid is not None:
            try:
                self._run(uid, [], "quit\n")
            except MpsError as err:
                log.warning("%s; killing it", err)
            deadline = time.monotonic() + STOP_TIMEOUT
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            log.info("stopped MPS control daemon %d of claim %s", pid, uid)
        shutil.rmtree(self._dirs(uid).root, ignore_errors=True)

    def claims(self) -> list[str]:
        """UIDs of the claims with daemon directories."""
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    def stop_others(self, keep: Collection[str]) -> None:
        """Stop the daemons of claims not in `keep` (the checkpoint's): none outlives its claim."""
        for uid in self.claims():
            if uid not in keep:
                log.info("stopping the MPS control daemon of claim %s, which is not prepared", uid)
                self.stop(uid)
