"""MPS control daemons, one per set of devices claims use with MPS, run as processes of the kubelet plugin.

Each daemon has its pipe, log and shm directories under <state dir>/mps/<key>/ and is started
through dra.kubeletplugin.mpslaunch; claims on the same devices join it, and the last one to be
unprepared stops it. A daemon outlives the driver by design: a restarted driver adopts the
daemon of each recorded claim and stops every other. The layout and the life cycle:
docs/sharing.md ("MPS").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dra.adapters import faults
from dra.core import sharing
from dra.kubeletplugin import mpslaunch
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)

#: The pid file the control daemon writes in its pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
#: Seconds a control command may take.
COMMAND_TIMEOUT = 10.0
#: Seconds a daemon is given to leave after `quit`, before it is killed.
STOP_TIMEOUT = 5.0


_SIZE = re.compile(r"^([0-9]+)([MG])$")


def _percentage(text: str) -> float | None:
    """An active thread percentage as the daemon answers it ("50.0"), or None."""
    try:
        return float(text)
    except ValueError:
        return None


def _bytes(size: str) -> tuple[int, int] | None:
    """A limit as the driver writes it ("8192M") or the daemon answers it ("8G"): its bytes and unit."""
    found = _SIZE.match(size)
    if found is None:
        return None
    unit = 1024 ** (3 if found.group(2) == "G" else 2)
    return int(found.group(1)) * unit, unit


def _holds(limit: str, answer: str) -> bool:
    """Whether the daemon's answer to get_default_device_pinned_mem_limit shows `limit` as set.

    It answers in a unit of its choosing, rounding down: "1536M" set reads "1G" while the server
    applies 1536 MiB (tests/data/real/h200-580/mps-control.txt). So the answer must be the limit
    rounded down to the answer's own unit.
    """
    wanted, shown = _bytes(limit), _bytes(answer)
    if wanted is None or shown is None:
        return False
    (size, _), (held, unit) = wanted, shown
    return size // unit * unit == held


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
    """Starts, joins, adopts and stops the MPS control daemons of claims: one per set of devices.

    A daemon is named by its devices (dra.core.sharing.mps_key); the claims it serves are
    those the checkpoint records with that set, so a kill -9 loses no count: the
    checkpoint is the count.
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
            pid = int((Path(pipe) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
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

    def _configure(self, key: str, claim: PreparedClaim) -> None:
        """Make the claim's limits the daemon's defaults; only for a daemon that serves it alone.

        The real daemon refuses nothing out loud (tests/data/real/h200-580/mps-control.txt): a
        percentage it rejects is answered with the one it keeps, and a pinned limit is answered with
        nothing, whatever it made of it ("2X" became 2 MiB). So each value is read back, and a
        daemon that holds another one refuses the claim.
        """
        if not sharing.mps_isolated(claim):
            return
        devices = sharing.mps_devices(claim)
        percentage = devices[0].mps_thread_percentage
        if percentage:
            command = f"set_default_active_thread_percentage {percentage}"
            answer = self._ask(key, command)
            self._expect(key, command, answer, _percentage(answer) == float(percentage))
        for index, device in enumerate(devices):
            if device.mps_pinned_limit:
                command = f"set_default_device_pinned_mem_limit {index} {device.mps_pinned_limit}"
                self._ask(key, command)
                held = self._ask(key, f"get_default_device_pinned_mem_limit {index}")
                self._expect(key, command, held, _holds(device.mps_pinned_limit, held))

    def _ask(self, key: str, command: str) -> str:
        """One command, one call: its answer (or error line) then belongs to it."""
        return self._run(key, [], command + "\n").strip()

    @staticmethod
    def _expect(key: str, command: str, answer: str, taken: bool) -> None:
        """MpsError, quoting the daemon's answer, unless it shows the command `taken`."""
        if not taken:
            said = f"it answered {answer!r}" if answer else "it answered nothing"
            raise MpsError(f"MPS control daemon {key} did not take {command!r}: {said}")

    def start(self, claim: PreparedClaim) -> None:
        """Start the daemon of the claim's devices, or join (or adopt) the running one; MpsError if not."""
        key = sharing.claim_mps_key(claim)
        if not key:
            return
        pid = self.pid(key)
        if pid is None:
            devices = sharing.mps_devices(claim)
            try:
                # multiUser: clients running as other users than the daemon's may connect (-M).
                self._launch([d.uuid for d in devices], devices[0].mps_multi_user)
            except mpslaunch.LaunchError as err:
                raise MpsError(str(err)) from None
            pid = self.pid(key)
            if pid is None:
                raise MpsError(f"the MPS control daemon {key} wrote no pid file in {self._dirs(key).pipe}")
            log.info("started MPS control daemon %d (%s) for claim %s", pid, key, claim.uid)
            faults.point("mps-daemon-started")
        else:
            log.info("claim %s uses MPS control daemon %d (%s)", claim.uid, pid, key)
        # Setting a limit again is harmless, and a crash may have come before the first time.
        self._configure(key, claim)

    def release(self, claim: PreparedClaim, others: Mapping[str, PreparedClaim]) -> None:
        """Stop the claim's daemon unless a claim of `others` (those staying prepared) still uses it."""
        key = sharing.claim_mps_key(claim)
        if not key:
            return
        users = [c.uid for c in sharing.mps_users(key, others)]
        if users:
            log.info("MPS control daemon %s stays for claims %s", key, ", ".join(users))
            return
        self.stop(key)

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

    def stop_others(self, prepared: Mapping[str, PreparedClaim]) -> None:
        """Stop the daemons no claim of `prepared` (the checkpoint's) uses: none outlives its claims."""
        keep = {sharing.claim_mps_key(c) for c in prepared.values()}
        for key in self.daemons():
            if key not in keep:
                log.info("stopping MPS control daemon %s, which no prepared claim uses", key)
                self.stop(key)
