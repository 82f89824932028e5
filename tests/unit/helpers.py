"""Helpers shared by the unit tests: inventories from fake-GPU profiles, and a fake host with /dev nodes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.library import GpuLibraryError
from dra.gpu.nvml import NvmlLibrary
from dra.gpu.nvmlstandin import NvmlStandIn, host_tree
from dra.gpu.profiles import Profile, load_profile, parse_profile
from dra.model.devices import Inventory

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def profile(*gpus: Mapping[str, Any], **top: Any) -> Profile:
    """A validated profile from GPU entries written as in a profile file."""
    return parse_profile({"gpus": [dict(g) for g in gpus], **top}, "test-profile")


def inventory(source: str | Profile = "h100x8", node: str = NODE) -> Inventory:
    """What discovery finds on fake GPUs: a built-in profile name or a Profile."""
    resolved = load_profile(source) if isinstance(source, str) else source
    return discover(FakeGpuLibrary(resolved, node))


class HostGpuLibrary(FakeGpuLibrary):
    """Fake GPUs on a host that has device nodes (all of them, or only `existing`) and MIG capabilities."""

    def __init__(
        self,
        source: Profile,
        node_name: str = NODE,
        existing: Iterable[str] | None = None,
        caps: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(source, node_name)
        self.existing = None if existing is None else set(existing)
        self.caps = dict(caps or {})

    def path_exists(self, path: str) -> bool:
        """Every path exists unless a list was given."""
        return self.existing is None or path in self.existing

    def mig_capability_minors(self) -> dict[str, int]:
        """The capability minors this host was given."""
        return dict(self.caps)


def write_kubeconfig(path: Path, server: str = "https://127.0.0.1:1") -> Path:
    """A kubeconfig with a token, for an API server that need not exist."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@contextmanager
def real_or_standin_nvml(host: Path, profile_name: str) -> Iterator[NvmlLibrary]:
    """NVML on this machine's GPUs; where it has none, the real adapter over the NVML stand-in.

    The stand-in serves the fake GPUs of `profile_name` on a fake host under
    `host`: their sysfs and procfs facts (host_tree) and their device nodes
    (empty files: the adapter only asks whether they exist).
    """
    lib = NvmlLibrary()
    try:
        lib.init()
    except GpuLibraryError:
        fake = FakeGpuLibrary(load_profile(profile_name), NODE, root=host)
        (host / "dev").mkdir(parents=True, exist_ok=True)
        for node in ("nvidiactl", *(f"nvidia{i}" for i in range(fake.device_count()))):
            (host / "dev" / node).touch()
        sysfs, procfs = host_tree(fake, host)
        lib = NvmlLibrary(sysfs=sysfs, procfs=procfs, dev=host, library=NvmlStandIn(fake))
        lib.init()
    try:
        yield lib
    finally:
        lib.shutdown()
