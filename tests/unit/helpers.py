"""Helpers shared by the unit tests: inventories from fake-GPU profiles, and a fake host with /dev nodes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import Profile, load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.gpu.driverfiles import nvml_library
from dra.gpu.library import GpuLibraryError
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.mps import MpsDaemons
from dra.model.devices import Inventory

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def profile(*gpus: Mapping[str, Any], **top: Any) -> Profile:
    """A validated profile from GPU entries written as in a profile file."""
    return parse_profile({"gpus": [dict(g) for g in gpus], **top}, "test-profile")


def named(source: Profile, product_name: str) -> Profile:
    """The profile's GPUs under another product name, as NVML may report one (up to 96 characters)
    longer than a profile may give (64, what the attribute holds)."""
    return dataclasses.replace(
        source,
        gpus=tuple(
            dataclasses.replace(gpu, model=dataclasses.replace(gpu.model, product_name=product_name))
            for gpu in source.gpus
        ),
    )


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
    """NVML on this machine's GPUs; where it has none, the real adapter over the fake NVML library.

    The fake serves the GPUs of `profile_name` on a fake host under `host`: their sysfs and procfs
    facts (host_tree) and their device nodes (empty files: the adapter only asks whether they exist).
    The driver's library is loaded by its path, as the daemon loads a driver root's: by name, the
    dynamic loader would give this process the fake one once a test loaded it.
    """
    driver = nvml_library(Path("/"))
    lib: NvmlLibrary | None = None
    if driver is not None:
        lib = NvmlLibrary(library=driver)
        try:
            lib.init()
        except GpuLibraryError:
            lib = None
    if lib is None:
        lib = standin_nvml(FakeGpuLibrary(load_profile(profile_name), NODE, root=host), host)
    try:
        yield lib
    finally:
        lib.shutdown()


def standin_nvml(fake: FakeGpuLibrary, host: Path) -> NvmlLibrary:
    """The real adapter, initialised, over the fake NVML answering for `fake`, on a fake host under `host`."""
    # Imported here: the daemons' tests import these helpers in processes without the local tooling.
    from fakenvml.adapter import over
    from fakenvml.host import host_tree
    from fakenvml.standin import NvmlStandIn

    (host / "dev").mkdir(parents=True, exist_ok=True)
    for node in ("nvidiactl", *(f"nvidia{i}" for i in range(fake.device_count()))):
        (host / "dev" / node).touch()
    sysfs, procfs = host_tree(fake, host)
    lib = over(NvmlStandIn(fake), sysfs=sysfs, procfs=procfs, dev=host)
    lib.init()
    return lib


#: The fake MPS control binary (dra.fakegpus.mpscontrol) as the driver runs it.
FAKE_MPS = [sys.executable, "-m", "dra.fakegpus.mpscontrol"]
#: The MPS control binary of the daemon tests: the fake, or the real one where
#: DRA_GPU_TEST_MPS_CONTROL names it (tests/gpu/check.sh on a GPU machine).
MPS_CONTROL = (
    [os.environ["DRA_GPU_TEST_MPS_CONTROL"]] if os.environ.get("DRA_GPU_TEST_MPS_CONTROL") else FAKE_MPS
)


def mps_ask(pipe: str, command: str) -> str:
    """The answer of the MPS control daemon of pipe directory `pipe` to one command, as a client gets it.

    Tests read a daemon's settings back this way rather than from its log, whose wording is the
    real daemon's own (tests/data/real/h200-580/mps-control.txt).
    """
    done = subprocess.run(
        MPS_CONTROL,
        input=command + "\n",
        capture_output=True,
        text=True,
        env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe),
        timeout=10,
        check=True,
    )
    return done.stdout.strip()


def process_environ(pid: int) -> list[str]:
    """A process's environment, as /proc shows it."""
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def daemon_devices(pid: int) -> str:
    """The devices an MPS control daemon was started on: its CUDA_VISIBLE_DEVICES, or, where
    tests/gpu/mps-control-on-this-gpu.sh pointed the real daemon at this machine's GPU, the ones asked."""
    found = dict(line.split("=", 1) for line in process_environ(pid) if "=" in line)
    return found.get("DRA_GPU_TEST_ASKED_DEVICES", found.get("CUDA_VISIBLE_DEVICES", ""))


def process_argv(pid: int) -> list[str]:
    """A process's command line, as /proc shows it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def mps_root(state: Path) -> Path:
    """A short MPS root for a test state directory: pytest's own paths leave the real daemon too few of
    the 107 bytes its sockets' paths may have (dra.kubeletplugin.mpslaunch.MAX_SOCKET_PATH). The same
    state directory gets the same root, in this process and its children."""
    root = Path("/tmp") / f"dra-mps-{hashlib.sha256(str(state).encode()).hexdigest()[:10]}"
    root.mkdir(exist_ok=True)
    return root


def stop_mps_daemons(daemons: MpsDaemons) -> None:
    """Stop every MPS control daemon under the root of `daemons`, as a start-up without claims does."""
    for key in daemons.daemons():
        daemons.stop(key)


class RecordingRunner:
    """A runner of dra.core's programs that runs nothing: each step called is recorded in `calls` with
    its arguments, and answered by `answer(name, args)` (an exception it returns is raised)."""

    def __init__(self, answer: Callable[[str, tuple[Any, ...]], object]) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._answer = answer

    def __getattr__(self, name: str) -> Any:
        # Any: the recorder stands in for every runner protocol.
        def step(*args: Any, **kwargs: Any) -> object:
            self.calls.append((name, args, kwargs))
            answer = self._answer(name, args)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return step

    def trace(self) -> list[str]:
        """Each step as "name" or "name@point" (a mark's point is its argument)."""
        return [
            name + (f"@{point}" if (point := args[0] if name == "mark" else kwargs.get("point")) else "")
            for name, args, kwargs in self.calls
        ]

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The arguments of each call of the step `name`."""
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]
