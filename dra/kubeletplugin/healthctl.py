"""The admin's way to clear a device's unhealthy mark (and so its taint) in a running driver.

`dra-gpu taint clear --device gpu-3`, run where the driver runs (kubectl exec
into its pod on that node), talks to the driver over a Unix socket in the
driver's state directory: one JSON line asks, one JSON line answers. A socket
rather than an annotation the driver watches, because the answer comes back at
once, refusal reason included, and because who may clear is who may exec into
the driver's pod, not who may edit Nodes; the taint itself stays the driver's
to write.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from dra.daemon.health import ClearRefusedError, HealthTracker, gpu_failure
from dra.daemon.sockets import check_socket_path
from dra.gpu.library import GpuLibrary

log = logging.getLogger(__name__)

SOCKET_NAME = "health.sock"
#: A request is one short line; anything longer is not one.
MAX_REQUEST = 4096
#: How long the client waits for the driver's answer.
ANSWER_TIMEOUT_S = 10.0


class HealthControlError(Exception):
    """The driver could not be asked, or it refused; the message says why."""


def socket_path(state_dir: Path) -> Path:
    """The control socket in the driver's state directory."""
    return state_dir / SOCKET_NAME


class HealthControl:
    """Serves clear requests for one tracker until cancelled."""

    def __init__(
        self,
        path: Path,
        tracker: HealthTracker,
        lib: GpuLibrary,
        quiet: float,
        on_change: Callable[[list[str]], None],
    ) -> None:
        check_socket_path(path, "--state-dir")
        self.path = path
        self._tracker = tracker
        self._lib = lib
        self._quiet = quiet
        self._on_change = on_change

    async def run(self) -> None:
        """Listen until cancelled; the socket is removed when it ends."""
        self.path.unlink(missing_ok=True)
        listener = await anyio.create_unix_listener(self.path)
        # Only root (the driver's user) may clear a device.
        self.path.chmod(0o600)
        try:
            await listener.serve(self._handle)
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
            self.path.unlink(missing_ok=True)

    def answer(self, request: bytes) -> dict[str, object]:
        """The answer to one request line."""
        try:
            name = json.loads(request).get("clear")
        except (ValueError, AttributeError):
            name = None
        if not isinstance(name, str):
            return {"ok": False, "message": 'expected {"clear": "<device name>"}'}
        try:
            message = self._tracker.clear(name, self._quiet, lambda d: gpu_failure(self._lib, d))
        except ClearRefusedError as err:
            log.warning("clearing the unhealthy mark of %s refused: %s", name, err)
            return {"ok": False, "message": str(err)}
        self._on_change([name])
        return {"ok": True, "message": message}

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = b""
            with anyio.move_on_after(ANSWER_TIMEOUT_S):
                while b"\n" not in request and len(request) < MAX_REQUEST:
                    try:
                        request += await stream.receive()
                    except anyio.EndOfStream:
                        break
            await stream.send(json.dumps(self.answer(request.split(b"\n", 1)[0])).encode() + b"\n")


async def clear(path: Path, device: str) -> str:
    """Ask the driver behind `path` to clear `device`; its message, or HealthControlError."""
    try:
        with anyio.fail_after(ANSWER_TIMEOUT_S):
            async with await anyio.connect_unix(path) as stream:
                await stream.send(json.dumps({"clear": device}).encode() + b"\n")
                answer = b""
                while b"\n" not in answer:
                    answer += await stream.receive()
    except (OSError, anyio.EndOfStream, TimeoutError) as err:
        raise HealthControlError(
            f"cannot ask the driver through {path} ({err or type(err).__name__}); is the kubelet-plugin "
            "running on this node, with this --state-dir?"
        ) from None
    try:
        reply = json.loads(answer)
    except ValueError:
        raise HealthControlError(f"the answer through {path} is not the driver's: {answer[:100]!r}") from None
    if not reply.get("ok"):
        raise HealthControlError(str(reply.get("message")))
    return str(reply.get("message"))
