"""Unix socket paths: the kernel's length limit, checked before a server tries to bind."""

from __future__ import annotations

from pathlib import Path

#: sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class SocketPathError(ValueError):
    """A socket path is too long for a unix socket; the message says which flag shortens it."""


def check_socket_path(path: Path, shorten_with: str) -> None:
    """Raise SocketPathError when `path` cannot be a unix socket."""
    length = len(str(path).encode())
    if length > MAX_SOCKET_PATH:
        raise SocketPathError(
            f"socket path {path} is {length} bytes; unix sockets allow {MAX_SOCKET_PATH}: "
            f"use a shorter {shorten_with}"
        )
