"""Unix socket paths: the kernel's length limit, checked before a server tries to bind; per-instance names."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107
#: What gRPC serves on (and dials): its server refuses a path of 106 bytes or more, with "should not
#: have more than 107 characters" (grpcio 1.85.1, measured), though the kernel and the kubelet take 107.
MAX_GRPC_SOCKET_PATH = 105


class SocketPathError(ValueError):
    """A socket path is too long for a unix socket; the message says which flag shortens it."""


def check_socket_path(path: Path, shorten_with: str) -> None:
    """Raise SocketPathError when gRPC cannot serve on `path`."""
    length = len(str(path).encode())
    if length > MAX_GRPC_SOCKET_PATH:
        raise SocketPathError(
            f"socket path {path} is {length} bytes; gRPC serves unix sockets of at most "
            f"{MAX_GRPC_SOCKET_PATH}: use a shorter {shorten_with}"
        )


def instance_tag(instance_id: str, *sockets: Callable[[str], Path]) -> str:
    """The instance ID as it goes into socket names: itself, or a digest when a socket path would be too long.

    `sockets` build each socket path from a tag. The digest (16 characters of
    base64url SHA-256) keeps instances on one node apart all the same.
    """
    if all(len(str(build(instance_id)).encode()) <= MAX_GRPC_SOCKET_PATH for build in sockets):
        return instance_id
    digest = hashlib.sha256(instance_id.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()[:16]


def owner_only(path: Path) -> None:
    """Make a bound socket connectable by its owner only (the kubelet is root), whatever the umask.

    Called after the bind and before the server accepts: bind(2) gives the socket file the
    umask's mode, and under umask 000 any local user could connect.
    """
    os.chmod(path, 0o600)


def is_abandoned(path: Path) -> bool:
    """Whether `path` is a unix socket that nobody serves any more (its process ended without removing it)."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False
