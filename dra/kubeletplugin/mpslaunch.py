"""Run a command with a directory over its /dev/shm: `python -m dra.kubeletplugin.mpslaunch DIR -- CMD...`.

An MPS control daemon must share /dev/shm with its clients, the claim's containers: it starts
in a mount namespace of its own (propagation made slave first) with DIR bind-mounted over
/dev/shm, and keeps it when it detaches. A separate single-threaded process, since
unshare(CLONE_NEWNS) fails in a multithreaded one. It gives up CAP_SYS_ADMIN before the exec,
so the daemon and the MPS server it spawns hold none. start_daemon runs it for the daemon of a
set of devices; in the kubelet plugin, only its launcher process does (dra.kubeletplugin.mpsprivsep).
Why and how: docs/sharing.md ("Shared memory: a mount namespace per daemon").
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dra.core import sharing

# <sched.h> and <sys/mount.h> (Linux UAPI values, the same on every architecture).
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000

#: <linux/capability.h>: the capability the namespace and the bind mount take, the one that
#: shrinks the bounding set, and capget/capset's ABI.
CAP_SYS_ADMIN = 21
CAP_SETPCAP = 8
_CAPABILITY_VERSION_3 = 0x20080522
#: <linux/prctl.h>
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

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


def _plain(result: int, what: str) -> None:
    if result != 0:
        raise LaunchError(f"cannot {what}: {os.strerror(ctypes.get_errno())}")


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def holds_sys_admin() -> bool:
    """Whether this process has CAP_SYS_ADMIN in its permitted set."""
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc().capget(ctypes.byref(header), data) != 0:
        return False
    word, bit = divmod(CAP_SYS_ADMIN, 32)
    return bool(data[word].permitted & (1 << bit))


def drop_sys_admin() -> None:
    """Lose CAP_SYS_ADMIN and CAP_SETPCAP for good: from every set, the bounding set included.

    With no_new_privs on as well, nothing this process execs gets either back, not even as
    uid 0 from a file capability. Takes CAP_SETPCAP (to shrink the bounding set), which goes
    last; a process that does not hold CAP_SYS_ADMIN loses nothing it had.
    """
    libc = _libc()
    for cap in (CAP_SYS_ADMIN, CAP_SETPCAP):
        # EINVAL would be a kernel without the capability; it has been there since 2.6.
        if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1:
            _plain(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap} from the bounding set")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _plain(libc.capget(ctypes.byref(header), data), "read this process's capabilities")
    for cap in (CAP_SYS_ADMIN, CAP_SETPCAP):
        word, bit = divmod(cap, 32)
        keep = ~(1 << bit) & 0xFFFFFFFF
        data[word].effective &= keep
        data[word].permitted &= keep
        data[word].inheritable &= keep
    _plain(libc.capset(ctypes.byref(header), data), "drop CAP_SYS_ADMIN and CAP_SETPCAP")
    _plain(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient capabilities")
    set_no_new_privs()


def set_no_new_privs() -> None:
    """Set no_new_privs: nothing this process execs gains a capability or uid it does not hold."""
    _plain(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def enter(shm: str) -> None:
    """Move this (single-threaded) process into a new mount namespace with `shm` over /dev/shm."""
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "make a mount namespace for the MPS control daemon")
    _check(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "make / a slave mount")
    _check(libc.mount(shm.encode(), SHM.encode(), None, MS_BIND, None), f"bind-mount {shm} over {SHM}")


def command(shm: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` with `shm` over its /dev/shm, with this Python."""
    return [sys.executable, "-m", "dra.kubeletplugin.mpslaunch", shm, "--", *argv]


def environment(dirs: sharing.MpsDirs, uuids: Sequence[str] = ()) -> dict[str, str]:
    """The environment of the control binary for the daemon of `dirs`; `uuids`: the devices it starts on."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=dirs.pipe, CUDA_MPS_LOG_DIRECTORY=dirs.log)
    if uuids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    return env


#: How the real control daemon (binary version 13000) exits, silently and before it logs anything, when
#: CUDA_VISIBLE_DEVICES names a device it cannot find (tests/data/real/README.md).
EXIT_DEVICE_NOT_FOUND = 100
#: The longest socket name the real control daemon makes in its pipe directory (it binds absolute paths).
LONGEST_SOCKET = "control_privileged"
#: sun_path holds 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107


def start_daemon(
    root: str, control: Sequence[str], uuids: Sequence[str], multi_user: bool, timeout: float
) -> None:
    """Start the control daemon of devices `uuids` under MPS root `root` (`control` -d, with -M for
    clients of several users); LaunchError if not.

    Everything else follows from the UUIDs: the daemon's directories (dra.core.sharing.mps_dirs
    of their key), its environment and its /dev/shm.
    """
    dirs = sharing.mps_dirs(root, sharing.mps_key(uuids))
    argv = [*control, "-d", "-M"] if multi_user else [*control, "-d"]
    longest = f"{dirs.pipe}/{LONGEST_SOCKET}"
    length = len(longest.encode())
    if length > MAX_SOCKET_PATH:
        raise LaunchError(
            f"cannot start the MPS control daemon: its socket {longest} would be {length} "
            f"bytes long, over the {MAX_SOCKET_PATH} a Unix socket's path may have; give the plugin a "
            "shorter --state-dir"
        )
    log = Path(dirs.log) / "control.log"
    try:
        for path in (dirs.pipe, dirs.log, dirs.shm):
            Path(path).mkdir(parents=True, exist_ok=True)
        # Only what this start writes to the log explains its failure: an earlier daemon's lines stay.
        logged = log.stat().st_size if log.exists() else 0
        done = subprocess.run(
            command(dirs.shm, argv),
            capture_output=True,
            text=True,
            env=environment(dirs, uuids),
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"{' '.join(argv)}: {err}") from None
    if done.returncode == EXIT_NO_NAMESPACE:
        raise LaunchError(f"cannot start the MPS control daemon: {done.stderr.strip()}")
    if done.returncode != 0:
        # The real daemon says nothing when it fails to start; its log may.
        output = done.stderr.strip() or done.stdout.strip() or _log_tail(log, logged) or "no output"
        if done.returncode == EXIT_DEVICE_NOT_FOUND and output == "no output":
            output = (
                f"no output, as when a device of CUDA_VISIBLE_DEVICES={','.join(uuids)} is not on this "
                "node (a GPU replaced, a MIG device gone)"
            )
        raise LaunchError(f"{' '.join(argv)} exited with {done.returncode}: {output}")


def _log_tail(log: Path, offset: int, lines: int = 3) -> str:
    """The last lines the daemon wrote to its control.log from `offset` on, joined; "" when none."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read(64 * 1024).decode(errors="replace")
    except OSError:
        return ""
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return f"its control.log ends: {' | '.join(tail)}" if tail else ""


def main(argv: Sequence[str] | None = None) -> int:
    """Enter the namespace and exec the command; a status and a message on stderr when that fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m dra.kubeletplugin.mpslaunch SHM-DIR -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    shm, program = args[0], args[2:]
    try:
        enter(shm)
        # The daemon and the MPS server it spawns serve the claims' containers: they keep neither.
        drop_sys_admin()
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
