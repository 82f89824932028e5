"""Privilege separation for MPS: a launcher process keeps CAP_SYS_ADMIN, the plugin keeps none.

Forked at start, before anything else and while the plugin is single-threaded, the launcher
serves one request over a socketpair: "start the control daemon of these device UUIDs". The
UUIDs are checked for their form, and everything else (the MPS root, the control binary, the
directories, the environment) was fixed at the fork, so the plugin cannot make it run anything
else. The plugin then drops CAP_SYS_ADMIN from all its sets, the bounding set included, and sets
no_new_privs (mpslaunch.drop_sys_admin): nothing it runs gets the capability back, and without
CAP_SYS_PTRACE it cannot trace the launcher or read its memory, which hold more capabilities.
A launcher that dies cannot be forked again by the plugin, which no longer holds the
capability: the claims that need it fail, and the plugin exits for the kubelet to restart the
container. Why: docs/sharing.md ("Which process holds which capability").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import anyio

from dra.daemon.bootstrap import StartupError
from dra.kubeletplugin import mpslaunch

#: The form of a GPU or MIG device UUID (MIG-GPU-<uuid>/<gi>/<ci> on drivers before R470).
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]{1,80}")
#: Devices one daemon may serve: more than any node has.
MAX_DEVICES = 64
#: Bytes of a request or an answer; longer ones are cut (SOCK_SEQPACKET) and then refused.
MESSAGE_LIMIT = 16384
#: Seconds the launcher's death is looked for.
WATCH_INTERVAL = 1.0


def _devices(request: bytes) -> tuple[list[str], bool]:
    """The UUIDs of a start request and whether its daemon is multi-user; LaunchError for anything else."""
    try:
        body = json.loads(request)
    except ValueError:
        body = None
    fields = isinstance(body, dict) and body.keys() == {"start", "multiUser"}
    uuids = body.get("start") if fields else None
    multi_user = body.get("multiUser") if fields else None
    if (
        not isinstance(multi_user, bool)
        or not isinstance(uuids, list)
        or not 0 < len(uuids) <= MAX_DEVICES
        or len(set(uuids)) != len(uuids)
        or not all(isinstance(u, str) and _UUID.fullmatch(u) for u in uuids)
    ):
        raise mpslaunch.LaunchError(
            f"the MPS launcher refused a request that is not 1 to {MAX_DEVICES} distinct GPU or MIG UUIDs "
            "and whether the daemon is multi-user"
        )
    return uuids, multi_user


def _serve(channel: socket.socket, root: str, control: Sequence[str], timeout: float) -> None:
    """Answer start requests on `channel` until the plugin's end closes."""
    while request := channel.recv(MESSAGE_LIMIT):
        try:
            uuids, multi_user = _devices(request)
            mpslaunch.start_daemon(root, control, uuids, multi_user, timeout)
            answer = {}
        except mpslaunch.LaunchError as err:
            answer = {"error": str(err)[: MESSAGE_LIMIT // 2]}
        channel.sendall(json.dumps(answer).encode())


class Launcher:
    """The plugin's end of the launcher: starts daemons through it, and notices its death."""

    def __init__(self, pid: int, channel: socket.socket, timeout: float) -> None:
        #: The launcher's process id.
        self.pid = pid
        self._channel = channel
        # Its own timeout is on the control binary; this one is for a launcher that hangs.
        self._channel.settimeout(timeout + 5)
        self._lock = threading.Lock()

    def _gone(self) -> mpslaunch.LaunchError:
        return mpslaunch.LaunchError(
            f"the MPS launcher (pid {self.pid}) is gone, and only it may start MPS control daemons; "
            f"the kubelet plugin exits for the kubelet to restart it"
        )

    def start(self, uuids: Sequence[str], multi_user: bool) -> None:
        """Start the control daemon of `uuids` (mpslaunch.start_daemon's contract); LaunchError if not."""
        with self._lock:
            try:
                self._channel.sendall(json.dumps({"start": list(uuids), "multiUser": multi_user}).encode())
                answer = self._channel.recv(MESSAGE_LIMIT)
            except TimeoutError:
                # A late answer would be taken for the next request's: this launcher is done.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                raise self._gone() from None
            except OSError:
                raise self._gone() from None
        if not answer:
            raise self._gone()
        error = json.loads(answer).get("error")
        if error:
            raise mpslaunch.LaunchError(error)

    async def watch(self) -> None:
        """Return never: StartupError, which ends the plugin, once the launcher has exited."""
        while True:
            # WNOHANG does not block.
            pid, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222
            if pid:
                break
            await anyio.sleep(WATCH_INTERVAL)
        raise StartupError(
            f"the MPS launcher (pid {self.pid}) exited ({_how(status)}); exiting for the kubelet to "
            f"restart the plugin: only a plugin just started holds CAP_SYS_ADMIN to fork another"
        )


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"status {os.waitstatus_to_exitcode(status)}"


def separate(root: Path, control: Sequence[str], timeout: float) -> Launcher | None:
    """Fork the launcher, then drop CAP_SYS_ADMIN here for good; None when this process has none to drop.

    Call first, while single-threaded: the fork copies only this thread, and the drop
    reaches only this thread and those it starts later. StartupError when the drop fails.
    """
    if not mpslaunch.holds_sys_admin():
        return None
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        # Capabilities are per thread: the others would keep CAP_SYS_ADMIN.
        raise StartupError(f"the MPS launcher must be forked while single-threaded; {threads} threads run")
    try:
        # For both sides: the launcher keeps its capabilities across its execs, and gains none.
        mpslaunch.set_no_new_privs()
    except mpslaunch.LaunchError as err:
        raise StartupError(str(err)) from None
    plugin, launcher = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        plugin.close()
        # A Ctrl-C meant for the plugin: the launcher goes when the plugin's end closes.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        status = 1
        try:
            _serve(launcher, str(root), control, timeout)
            status = 0
        finally:
            os._exit(status)
    launcher.close()
    try:
        mpslaunch.drop_sys_admin()
    except mpslaunch.LaunchError as err:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise StartupError(
            f"{err}: with CAP_SYS_ADMIN the kubelet plugin needs CAP_SETPCAP as well, to give it up "
            f"for good (Helm chart: {mpslaunch.CHART_VALUE} adds both)"
        ) from None
    return Launcher(pid, plugin, timeout)
