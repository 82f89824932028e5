"""Debian packages downloaded with ``apt-get download`` and unpacked with ``dpkg-deb -x``.

Nothing is installed on the machine: the packages' files land in a directory of the caller's
(an image's root filesystem, a tool's directory in the cache). apt-get resolves no dependencies
this way, so callers name every package they need.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from localcluster.gomodule import BuildError


def unpack(packages: Sequence[str], target: Path, what: str) -> list[str]:
    """Download `packages` (the candidate versions) and unpack them all into `target`.

    Returns the downloaded files' names (``<name>_<version>_<arch>.deb``), which say the
    versions. `what` names the purpose in errors.
    """
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise BuildError(f"apt-get and dpkg-deb (Debian or Ubuntu) are needed to fetch {what}")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-debs-") as tmp:
        fetched = subprocess.run(
            ["apt-get", "download", *packages], cwd=tmp, capture_output=True, text=True, check=False
        )
        debs = sorted(Path(tmp).glob("*.deb"))
        got = {deb.name.split("_", 1)[0] for deb in debs}
        missing = sorted(set(packages) - got)
        if fetched.returncode != 0 or missing:
            raise BuildError(
                f"apt-get download of {what} failed (missing: {', '.join(missing) or 'none'}; "
                f"`apt-get update` first?):\n{fetched.stderr.strip()}"
            )
        for deb in debs:
            unpacked = subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(target)], capture_output=True, text=True, check=False
            )
            if unpacked.returncode != 0:
                raise BuildError(f"dpkg-deb -x {deb.name} failed: {unpacked.stderr.strip()}")
        return [deb.name for deb in debs]
