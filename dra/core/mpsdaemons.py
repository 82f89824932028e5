"""Claims' MPS control daemons started, joined, configured and stopped, as programs of steps.

One daemon serves each set of devices claims use with MPS (dra.core.sharing.mps_key): a claim
starts it or joins the one running (a restarted driver adopts it); a daemon that serves one claim
alone takes that claim's limits as its defaults, each read back; the last claim to go stops it,
and at start-up every daemon no prepared claim uses is stopped. The checkpoint is the count, so a
kill -9 loses none. The processes, pid files and control pipe are dra.kubeletplugin.mps's; the
life cycle: docs/sharing.md ("MPS").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

from dra.core import sharing
from dra.core.runner import Logs
from dra.model.node import StepError
from dra.model.prepared import PreparedClaim

_SIZE = re.compile(r"^([0-9]+)([MG])$")


class MpsRunner(Logs, Protocol):
    """What runs the MPS daemons' steps (dra.kubeletplugin.devicesteps): one method per kind.

    A step is a call of its kind's method, which raises StepError when it fails.
    """

    def mps_daemon_pid(self, key: str) -> int | None:
        """The pid of MPS control daemon `key` (dra.core.sharing.mps_key) when it runs, else None."""

    def list_mps_daemons(self) -> tuple[str, ...]:
        """The keys of the MPS control daemons with directories (running, or left behind), sorted."""

    def launch_mps(self, uuids: tuple[str, ...], multi_user: bool, *, point: str = "") -> int:
        """Start the MPS control daemon of these device UUIDs, multi-user (-M) or not; its pid."""

    def ask_mps(self, key: str, command: str) -> str:
        """One command to MPS control daemon `key`, in a call of its own; its answer, stripped."""

    def stop_mps(self, key: str) -> None:
        """Stop MPS control daemon `key` (quit, else kill) and remove its directories; none is fine."""


def start(steps: MpsRunner, claim: PreparedClaim) -> None:
    """Start the daemon of the claim's devices, or join (or adopt) the running one; StepError if not."""
    key = sharing.claim_mps_key(claim)
    if not key:
        return
    pid = steps.mps_daemon_pid(key)
    if pid is None:
        devices = sharing.mps_devices(claim)
        # multiUser: clients running as other users than the daemon's may connect (-M).
        pid = steps.launch_mps(
            tuple(d.uuid for d in devices), devices[0].mps_multi_user, point="mps-daemon-started"
        )
        steps.log("info", f"started MPS control daemon {pid} ({key}) for claim {claim.uid}")
    else:
        steps.log("info", f"claim {claim.uid} uses MPS control daemon {pid} ({key})")
    # Setting a limit again is harmless, and a crash may have come before the first time.
    _configure(steps, key, claim)


def _configure(steps: MpsRunner, key: str, claim: PreparedClaim) -> None:
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
        answer = steps.ask_mps(key, command)
        _expect(key, command, answer, _percentage(answer) == float(percentage))
    for index, device in enumerate(devices):
        if device.mps_pinned_limit:
            command = f"set_default_device_pinned_mem_limit {index} {device.mps_pinned_limit}"
            steps.ask_mps(key, command)
            held = steps.ask_mps(key, f"get_default_device_pinned_mem_limit {index}")
            _expect(key, command, held, _holds(device.mps_pinned_limit, held))


def _expect(key: str, command: str, answer: str, taken: bool) -> None:
    """StepError, quoting the daemon's answer, unless it shows the command `taken`: the daemon failed it."""
    if not taken:
        said = f"it answered {answer!r}" if answer else "it answered nothing"
        raise StepError(f"MPS control daemon {key} did not take {command!r}: {said}")


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


def release(steps: MpsRunner, claim: PreparedClaim, others: Mapping[str, PreparedClaim]) -> None:
    """Stop the claim's daemon unless a claim of `others` (those staying prepared) still uses it."""
    key = sharing.claim_mps_key(claim)
    if not key:
        return
    users = [c.uid for c in sharing.mps_users(key, others)]
    if users:
        steps.log("info", f"MPS control daemon {key} stays for claims {', '.join(users)}")
        return
    steps.stop_mps(key)


def stop_others(steps: MpsRunner, prepared: Mapping[str, PreparedClaim]) -> None:
    """Stop the daemons no claim of `prepared` (the checkpoint's) uses: none outlives its claims."""
    keep = {sharing.claim_mps_key(c) for c in prepared.values()}
    for key in steps.list_mps_daemons():
        if key not in keep:
            steps.log("info", f"stopping MPS control daemon {key}, which no prepared claim uses")
            steps.stop_mps(key)
