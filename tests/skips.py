"""What a skip may name: something this machine lacks, never something the project failed to build or start.

Every skip's reason starts with the kind of lack in brackets (`[root] ...`): tests/conftest.py counts the
skips by reason at the end of every run, and where DRA_GPU_ALLOWED_SKIPS names the kinds a machine may
lack (`make test-matrix`, the CI, sets `gpu,release`), a skip of any other kind fails the run: a CI
machine runs as root with the tools `make venv` installs, so only a GPU and a Kubernetes release the
test is not for may be missing there.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum

import pytest

#: The kinds a run may skip for (comma-separated); unset: any, counted but not failed.
ALLOWED_ENV = "DRA_GPU_ALLOWED_SKIPS"


class Lack(StrEnum):
    """What the machine lacks."""

    GPU = "gpu"  # a real GPU (or one of the kind the test is for), or leave to change it
    RELEASE = "release"  # a Kubernetes release (or its gates) the test is for
    ROOT = "root"  # uid 0: namespaces, mounts, mknod, containerd, chroot
    TOOL = "tool"  # a program or kernel facility of the machine (unshare, setpriv, a tmpfs)
    PYTHON = "python"  # the Python the driver's image is built with
    HISTORY = "history"  # the git history (a shallow clone): the previous release is built from it


def reason(lack: Lack, detail: str) -> str:
    """A skip's reason: its kind, then what exactly is missing."""
    return f"[{lack}] {detail}"  # pytest.skip(reason(...)) in the test: the report names its line


def kind(text: str) -> str | None:
    """The kind a skip's reason names, or None where it names none."""
    match = re.match(r"(?:Skipped: )?\[(\w+)\] ", text)
    return match.group(1) if match else None


def allowed() -> frozenset[str] | None:
    """The kinds this run may skip for; None: any."""
    value = os.environ.get(ALLOWED_ENV)
    if value is None:
        return None
    return frozenset(item.strip() for item in value.split(",") if item.strip())


#: The commonest: the test makes namespaces, mounts or device nodes.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason=reason(Lack.ROOT, "makes namespaces, mounts or device nodes: run as root")
)
