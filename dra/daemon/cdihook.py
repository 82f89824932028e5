"""NVIDIA's nvidia-cdi-hook on the host, for the CDI specs to run (docs/install.md, "What the node needs").

The specs run NVIDIA's container hooks (dra.core.cdi.driver_hooks) with NVIDIA's own program, which
the container runtime executes on the host, outside any container. Where it comes from, as NVIDIA's
DRA driver does it: the image ships the program (on PATH: /usr/bin/nvidia-cdi-hook), and at start
it is copied into the driver's plugin directory under the kubelet's root, a host path the runtime
(containerd as root on the node) can execute; or --nvidia-cdi-hook-path names the node's own (the
container toolkit's /usr/bin/nvidia-cdi-hook), which is then used as it is. A node with neither
gets the driver's files mounted, no hooks, and one warning at start saying what will not work.
"""

from __future__ import annotations

import filecmp
import functools
import logging
import os
import shutil
from pathlib import Path

from dra.adapters.nodefiles import write_atomic

log = logging.getLogger(__name__)

#: The program's name, as NVIDIA's container toolkit installs it and NVIDIA's image ships it.
PROGRAM = "nvidia-cdi-hook"

#: What a container misses without the hook: the warning's one line.
WITHOUT_HOOK = (
    "containers get the driver's files mounted but no loader cache entry for them (`ldconfig -p` lists "
    'no libcuda: Triton, torch.compile and vLLM fail with "libcuda.so cannot found"), no libcuda.so '
    "link, no CUDA forward compatibility (/usr/local/cuda/compat), and images whose loader does not "
    "search the mounted folders (distroless, RHEL-style) find no driver"
)


@functools.cache
def install(plugin_dir: Path, node_hook: Path | None = None, host_root: Path = Path("/")) -> str | None:
    """The host path of the hook the specs run, installed on first call; None without one.

    `node_hook`: the node's own hook (a host path, looked up under `host_root`), used in place.
    Otherwise the program found on PATH (the image's) is copied into `plugin_dir` (a host path the
    kubelet's root holds at the same place inside the container and out) unless an equal copy is
    there. Once per process: the warning when there is none is said once, at start.
    """
    if node_hook is not None:
        seen = host_root / str(node_hook).lstrip("/")
        if os.access(seen, os.X_OK) and seen.is_file():
            log.info("CDI specs run the node's %s", node_hook)
            return str(node_hook)
        log.warning("--nvidia-cdi-hook-path=%s: no executable file there; %s", node_hook, WITHOUT_HOOK)
        return None
    source = shutil.which(PROGRAM)
    if source is None:
        log.warning(
            "no %s (neither on PATH nor --nvidia-cdi-hook-path): %s; see docs/install.md",
            PROGRAM,
            WITHOUT_HOOK,
        )
        return None
    target = plugin_dir / PROGRAM
    try:
        # The program is megabytes: compared in chunks (sizes first), read whole only to be copied.
        if not (target.is_file() and filecmp.cmp(source, target, shallow=False)):
            write_atomic(target, Path(source).read_bytes(), mode=0o755)
    except OSError as err:
        log.warning("cannot copy %s to %s (%s): %s", source, target, err.strerror, WITHOUT_HOOK)
        return None
    log.info("CDI specs run %s (copied from %s)", target, source)
    return str(target)
