"""Run a command with a directory over its /dev/shm: `python -m dra.kubeletplugin.mpslaunch DIR -- CMD...`.

An MPS control daemon must share /dev/shm with its clients, the claim's containers: it starts
in a mount namespace of its own (propagation made slave first) with DIR bind-mounted over
/dev/shm, and keeps it when it detaches. A separate single-threaded process, since
unshare(CLONE_NEWNS) fails in a multithreaded one. Why and how: docs/sharing.md ("Shared
memory: a mount namespace per daemon").
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Sequence

# <sched.h> and <sys/mount.h> (Linux UAPI values, the same on every architecture).
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000

#: <linux/capability.h>: the capability the namespace and the bind mount take, and capget/capset's ABI.
CAP_SYS_ADMIN = 21
_CAPABILITY_VERSION_3 = 0x20080522

#: Exit status when the namespace cannot be made; the driver reads the message on stderr.
EXIT_NO_NAMESPACE = 3
#: Where the daemon expects POSIX shared memory.
SHM = "/dev/shm"
#: The chart value that gives the plugin container CAP_SYS_ADMIN.
CHART_VALUE = "kubeletPlugin.mps.enabled=true"


class LaunchError(Exception):
    """The namespace or the bind mount could not be made; the message says which and why."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result == 0:
        return
    code = ctypes.get_errno()
    reason = os.strerror(code)
    if code == errno.EPERM:
        reason += (
            f"; the MPS control daemon needs a mount namespace of its own, which takes CAP_SYS_ADMIN "
            f"in the kubelet plugin's container (Helm chart: {CHART_VALUE})"
        )
    elif code == errno.EACCES:
        reason += (
            "; an AppArmor or SELinux policy forbids it to the kubelet plugin's container "
            f"(the Helm chart runs it unconfined with {CHART_VALUE})"
        )
    raise LaunchError(f"cannot {what}: {reason}")


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def give_up_sys_admin() -> bool:
    """Drop CAP_SYS_ADMIN from this thread's effective, permitted and inheritable sets; whether it had it.

    The plugin calls this before it starts any thread (threads inherit the caller's sets), so
    the process that serves the kubelet holds no CAP_SYS_ADMIN. The launcher gets it back: it
    is exec'd as uid 0, which takes the bounding set (the container's capabilities) as permitted.
    """
    libc = _libc()
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    word, bit = divmod(CAP_SYS_ADMIN, 32)
    held = bool(data[word].permitted & (1 << bit))
    keep = ~(1 << bit) & 0xFFFFFFFF
    data[word].effective &= keep
    data[word].permitted &= keep
    data[word].inheritable &= keep
    _check(libc.capset(ctypes.byref(header), data), "drop CAP_SYS_ADMIN")
    return held


def enter(shm: str) -> None:
    """Move this (single-threaded) process into a new mount namespace with `shm` over /dev/shm."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "make a mount namespace for the MPS control daemon")
    _check(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "make / a slave mount")
    _check(libc.mount(shm.encode(), SHM.encode(), None, MS_BIND, None), f"bind-mount {shm} over {SHM}")


def command(shm: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` with `shm` over its /dev/shm, with this Python."""
    return [sys.executable, "-m", "dra.kubeletplugin.mpslaunch", shm, "--", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    """Enter the namespace and exec the command; a status and a message on stderr when that fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m dra.kubeletplugin.mpslaunch SHM-DIR -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    shm, program = args[0], args[2:]
    try:
        enter(shm)
    except LaunchError as err:
        print(err, file=sys.stderr)
        return EXIT_NO_NAMESPACE
    try:
        os.execvp(program[0], program)
    except OSError as err:
        print(f"cannot run {program[0]}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
