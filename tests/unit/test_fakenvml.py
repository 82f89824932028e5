"""The fake NVML as a shared library: what any process that loads libnvidia-ml.so.1 from it gets.

The stand-in's answers are test_nvml_standin.py's and test_nvml_differential.py's; these are the
library's own: every function of nvml.h exported, a process without Python (NVIDIA's plugin is a
Go program) served from the configuration beside the library, the codes of a library with no
stand-in and of a function the stand-in lacks, the daemon finding NVML in its driver root or by
name, and the nvidia-smi commands drivers run on the fake node.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakenvml import abi, cabi
from fakenvml.library import ensure_library, function_names, nvml_header
from fakenvml.node import CONF, FakeNode, NodeConfig
from fakenvml.standin import NvmlStandIn

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.node import FAKE_GPU_STATE
from dra.fakegpus.profiles import load_profile
from tests.skips import Lack, reason
from tests.unit.helpers import NODE

#: A fake node's device nodes are mknod'ed and its sysfs mounted in a namespace of its own, as on a node.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason=reason(Lack.ROOT, "a fake node makes character devices (mknod) and mounts")
)

#: nvml.h's codes, as a caller sees them.
NOT_SUPPORTED, DRIVER_NOT_LOADED, FUNCTION_NOT_FOUND = 3, 9, 13

# A C program of no Python: what NVIDIA's plugin does first, through dlopen as go-nvml does.
_CALLER = r"""
#include <dlfcn.h>
#include <stdio.h>
typedef int (*init_t)(void);
typedef int (*count_t)(unsigned *);
typedef int (*handle_t)(unsigned, void **);
typedef int (*name_t)(void *, char *, unsigned);
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
    unsigned count = 0;
    void *gpu = 0;
    char name[96] = "";
    int init = ((init_t)dlsym(lib, "nvmlInit_v2"))();
    int counted = ((count_t)dlsym(lib, "nvmlDeviceGetCount_v2"))(&count);
    ((handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"))(count - 1, &gpu);
    ((name_t)dlsym(lib, "nvmlDeviceGetName"))(gpu, name, sizeof name);
    int power = ((count_t)dlsym(lib, "nvmlDeviceGetPowerUsage"))(&count);
    printf("%d %d %u %s %d\n", init, counted, count, name, power);
    return 0;
}
"""


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_the_library_exports_every_function_of_nvml_h_as_libnvidia_ml_so_1() -> None:
    names = function_names(nvml_header().read_text())
    path = ensure_library(log=False)
    assert len(names) > 350
    assert cabi.names(path) == names
    lib = ctypes.CDLL(str(path))
    assert all(hasattr(lib, name) for name in names)
    soname = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    assert "Library soname: [libnvidia-ml.so.1]" in soname.stdout


@needs_root
def test_a_program_without_python_gets_the_fake_node_s_gpus(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", "mixed", NODE).build()
    source = tmp_path / "caller.c"
    source.write_text(_CALLER)
    subprocess.run(["gcc", "-o", str(tmp_path / "caller"), str(source), "-ldl"], check=True)
    done = subprocess.run(
        [str(tmp_path / "caller"), str(node.library)], capture_output=True, text=True, timeout=60, check=True
    )
    fake = FakeGpuLibrary(load_profile("mixed", NODE), NODE)
    last = fake.name(fake.device_by_index(fake.device_count() - 1))
    assert done.stdout == f"0 0 {fake.device_count()} {last} {NOT_SUPPORTED}\n"
    # Each function the stand-in does not implement says so once, on the process's stderr.
    assert done.stderr.count("nvmlDeviceGetPowerUsage is not implemented by the NVML stand-in") == 1
    # ... and is recorded beside the library, under the program's name, for a test to read.
    assert node.unsupported_calls("caller") == {"nvmlDeviceGetPowerUsage"}
    assert node.unsupported_calls("gpu-kubelet-plugin") == set()


def test_without_a_stand_in_every_call_answers_driver_not_loaded() -> None:
    # A fresh process: this one's library may have a stand-in installed by another test.
    done = _python(
        "import ctypes, sys; from fakenvml.library import ensure_library;"
        "lib = ctypes.CDLL(str(ensure_library(log=False)));"
        "print(lib.nvmlInit_v2(), ctypes.string_at(ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int)"
        "(('nvmlErrorString', lib))(9)).decode())",
        env={"PYTHONPATH": f"{os.getcwd()}:{os.getcwd()}/deploy/local"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == [
        str(DRIVER_NOT_LOADED),
        "Unknown Error (the fake NVML has no stand-in)\n",
    ]


@needs_root
def test_a_function_the_stand_in_is_told_the_driver_lacks_is_not_found_through_the_library(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path / "node", "h100x8", NODE, lacks={"nvmlDeviceGetBrand"}).build()
    assert NodeConfig.read(node.library.parent / CONF).lacks == {"nvmlDeviceGetBrand"}
    done = _python(
        f"import ctypes; lib = ctypes.CDLL({str(node.library)!r}); lib.nvmlInit_v2();"
        "handle = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle));"
        "brand = ctypes.c_uint(); print(lib.nvmlDeviceGetBrand(handle, ctypes.byref(brand)),"
        "lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(brand)), brand.value)"
    )
    assert done.stdout.split() == [str(FUNCTION_NOT_FOUND), "0", "0"], done.stderr


def _discover(*args: str, wrap: FakeNode | None = None, env: dict[str, str] | None = None) -> object:
    command = [sys.executable, "-m", "dra", "discover", f"--node-name={NODE}", "--output=json", *args]
    done = subprocess.run(
        wrap.wrap(command) if wrap else command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_root
@pytest.mark.parametrize("profile", ["h100x8-mig", "a100x4-dynamic-mig", "mixed"])
def test_discover_on_a_fake_node_through_nvml_publishes_what_the_profile_does(
    tmp_path: Path, profile: str
) -> None:
    node = FakeNode(tmp_path / "node", profile, NODE).build()
    modes = ["--mig-mode=dynamic"] if "dynamic" in profile else []
    through_nvml = _discover(f"--driver-root={node.driver_root}", *modes, wrap=node)
    assert through_nvml == _discover(f"--fake-gpus={profile}", *modes)


@needs_root
def test_pynvml_finds_the_library_by_name_as_on_a_node_with_a_container_toolkit(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", "h100x8-mig", NODE).build()
    # No --driver-root: pynvml's own CDLL("libnvidia-ml.so.1") through the loader's search path.
    by_name = _discover(wrap=node, env={"LD_LIBRARY_PATH": str(node.library.parent)})
    assert by_name == _discover("--fake-gpus=h100x8-mig")


@needs_root
def test_nvidia_smi_on_the_fake_node_sets_what_the_fake_gpus_keep(tmp_path: Path) -> None:
    node = FakeNode(tmp_path / "node", "h100x8", NODE).build()
    smi = str(node.driver_root / "usr/bin/nvidia-smi")
    fake = node.config.fake_gpus()
    uuid = fake.uuid(fake.device_by_index(3))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=60, check=False)

    assert run("compute-policy", "-i", uuid, "--set-timeslice", "2").returncode == 0
    assert fake.time_slice(fake.device_by_index(3)) == 2
    assert run("-i", uuid, "-c", "EXCLUSIVE_PROCESS").returncode == 0
    state = json.loads((node.config.state_dir / FAKE_GPU_STATE).read_text())
    assert state[uuid] == {"computeMode": 3, "timeSlice": 2}
    refused = run("compute-policy", "-i", uuid, "--set-timeslice", "7")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "nvidia-smi (fake): invalid time slice 7; valid: 0-3",
    )
    unknown = run("-q")
    assert unknown.returncode == 2
    assert "not implemented by the fake nvidia-smi: -q" in unknown.stderr


def test_the_node_config_round_trips(tmp_path: Path) -> None:
    config = NodeConfig(
        profile="mixed",
        node_name=NODE,
        root=tmp_path,
        events=tmp_path / "events",
        lacks=frozenset({"nvmlDeviceGetBrand", "nvmlEventSetFree"}),
        reset_required=frozenset({0, 2}),
        lost=frozenset({1}),
    )
    config.write(tmp_path / CONF)
    assert NodeConfig.read(tmp_path / CONF) == config
    fields = dict(line.split("=", 1) for line in (tmp_path / CONF).read_text().splitlines())
    assert Path(fields["libpython"]).is_file()
    assert fields["pythonpath"].split(":")[:2] == [str(Path.cwd()), str(Path.cwd() / "deploy/local")]


def test_the_calls_nvidias_plugin_makes_answer_as_nvml_h_says(tmp_path: Path) -> None:
    """Through the library, as go-nvml calls them: the versions nvml.h maps the plain names to."""
    path = ensure_library(log=False)
    fake = FakeGpuLibrary(load_profile("h100x8-mig", NODE), NODE)
    cabi.install(NvmlStandIn(fake), path)
    lib = ctypes.CDLL(str(path))
    assert lib.nvmlInit_v2() == 0
    try:
        uint, handle, mig = ctypes.c_uint(), ctypes.c_void_p(), ctypes.c_void_p()
        version = ctypes.c_int()
        assert lib.nvmlSystemGetCudaDriverVersion(ctypes.byref(version)) == 0
        assert version.value == fake.cuda_driver_version()
        gpu = fake.device_by_index(5)
        assert lib.nvmlDeviceGetHandleByUUID(fake.uuid(gpu).encode(), ctypes.byref(handle)) == 0
        assert lib.nvmlDeviceGetIndex(handle, ctypes.byref(uint)) == 0
        assert uint.value == 5
        by_bus = ctypes.c_void_p()
        bus_id = fake.pci_bus_id(gpu).upper().replace("0000:", "00000000:", 1)
        assert lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(by_bus)) == 0
        assert by_bus.value == handle.value
        assert lib.nvmlDeviceGetVirtualizationMode(handle, ctypes.byref(uint)) == 0
        assert uint.value == 0  # NVML_GPU_VIRTUALIZATION_MODE_NONE: bare metal
        assert lib.nvmlDeviceIsMigDeviceHandle(handle, ctypes.byref(uint)) == 0
        assert uint.value == 0
        assert lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0, ctypes.byref(mig)) == 0
        assert lib.nvmlDeviceIsMigDeviceHandle(mig, ctypes.byref(uint)) == 0
        assert uint.value == 1
        parent = ctypes.c_void_p()
        assert lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, ctypes.byref(parent)) == 0
        assert parent.value == handle.value
        assert lib.nvmlDeviceGetIndex(mig, ctypes.byref(uint)) == 0
        assert uint.value == 0
        # The unversioned profile structures (no version field, no name), as go-nvml passes them.
        gi_info = abi.GpuInstanceProfileInfo()
        assert lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0, ctypes.byref(gi_info)) == 0
        assert (gi_info.id, gi_info.sliceCount, gi_info.memorySizeMB) == (19, 1, 9856)
        gi, ci, ci_id = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint()
        assert lib.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(uint)) == 0
        assert lib.nvmlDeviceGetGpuInstanceById(handle, uint, ctypes.byref(gi)) == 0
        assert lib.nvmlDeviceGetComputeInstanceId(mig, ctypes.byref(ci_id)) == 0
        assert lib.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, ctypes.byref(ci)) == 0
        assert lib.nvmlGpuInstanceGetComputeInstanceById(gi, 7, ctypes.byref(ci)) == 6  # NOT_FOUND
        ci_info = abi.ComputeInstanceProfileInfo()
        assert lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 0, 0, ctypes.byref(ci_info)) == 0
        assert (ci_info.id, ci_info.sliceCount) == (0, 1)
    finally:
        assert lib.nvmlShutdown() == 0
