"""The usage sampler on a real GPU under a real CUDA load: `python -m tests.gpu.usage_under_load`.

The kubelet plugin's DeviceReader (dra/kubeletplugin/usage.py) reads GPU 0 idle, three times while
a PyTorch process holds 10 GiB and multiplies matrices, and after it exits; with GPM's graphics
activity and the raw NVML process lists beside each read. Prints JSON (needs PyTorch; tests/gpu/check.sh
runs it where python3 has it). Changes nothing on the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from dra.gpu.discovery import discover
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.usage import DeviceReader
from tests.gpu.record import answer, gpm_utilization

LOAD = """
import torch, time
held = torch.empty(10 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
t = time.time()
while time.time() - t < 14:
    a @ a
    torch.cuda.synchronize()
"""


def main() -> None:
    """Read, load, read, print."""
    lib = NvmlLibrary()
    lib.init()
    inv = discover(lib)
    reader = DeviceReader(lib, processes=True)
    gpu = lib.device_by_index(0)
    out: dict[str, Any] = {"idle": [repr(x) for x in reader.read(inv)]}
    out["gpm_idle"] = answer(lambda: gpm_utilization(lib, gpu))
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
    out["load_pid"] = load.pid
    assert load.stdout is not None
    out["ready"] = load.stdout.readline().strip()
    time.sleep(2)
    for i in range(3):
        started = time.perf_counter()
        out[f"load{i}"] = [repr(x) for x in reader.read(inv)]
        out[f"load{i}_ms"] = round((time.perf_counter() - started) * 1000, 2)
        out[f"gpm{i}"] = answer(lambda: gpm_utilization(lib, gpu))
        out[f"raw_processes{i}"] = answer(lambda: lib.running_processes(gpu))
        out[f"raw_util{i}"] = answer(lambda: lib.process_utilization(gpu, 0))
        time.sleep(1)
    load.wait()
    out["after"] = [repr(x) for x in reader.read(inv)]
    lib.shutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
