"""A certificate chain and its key, held in memory, loaded into an SSLContext.

ssl's load_cert_chain reads only files. Giving it paths to files it would open itself would
let OpenSSL read past every limit (a FIFO, /dev/zero) and load other bytes than those
compared for a change; instead the caller reads the files through the bounded reader and
the bytes reach OpenSSL through anonymous memory files (memfd), which never touch a disk.
"""

from __future__ import annotations

import os
import ssl


def _memory_file(data: bytes) -> int:
    fd = os.memfd_create("dra-gpu-tls", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return fd


def load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a PEM certificate chain and its private key; ssl.SSLError (or OSError) when they do not."""
    fds: list[int] = []
    try:
        fds = [_memory_file(cert), _memory_file(key)]
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
