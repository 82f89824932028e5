"""Benchmark: what usage sampling costs the kubelet plugin, per 100 prepared claims.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_usage [--claims 100] [--samples 30]

Fake h100x8 with `--claims` claims spread over its 8 GPUs as shares, one pod and container
each, every container with one fake process (memory and duty), attributed per process through
a fake /proc (the most work a sample does: processes, cgroups, pods). Runs the sampler as
the daemon does, over the fake GPUs directly and over the NVML stand-in through pynvml (the
real adapter's code path, ctypes included; the stand-in's own work counts too, so it is an
upper bound), and once with no claim for the baseline. Prints
CPU per sample, the CPU share at the default 10 s interval, the memory the series and the
sampler's state hold (tracemalloc: Python's heap; VmRSS: coarser, the allocator's arenas), and
the scrape's cost and size; asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import anyio
from fakenvml.adapter import over
from fakenvml.host import host_tree
from fakenvml.standin import NvmlStandIn
from prometheus_client import generate_latest

from dra.core.devicestatus import Consumer, DeviceIdentity, identities
from dra.daemon import metrics
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.processes import FakeProcess
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.gpu.library import GpuLibrary
from dra.kubeletplugin.usage import DeviceReader, ProcessOwners, UsageSampler
from dra.model.prepared import PreparedClaim, PreparedDevice

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"


def _node(claims: int, root: Path) -> tuple[FakeGpuLibrary, list[dict[str, Any]], Any, list[Consumer]]:
    fake = FakeGpuLibrary(load_profile("h100x8"), NODE)
    inventory = discover(fake)
    pods: list[dict[str, Any]] = []
    prepared: dict[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]] = {}
    consumers, processes = [], []
    for index in range(claims):
        gpu = inventory.gpus[index % len(inventory.gpus)]
        name, uid, cid = f"claim-{index}", str(uuid.uuid4()), uuid.uuid4().hex * 2
        entry = PreparedDevice(("gpu",), NODE, gpu.name, (), uuid=gpu.uuid, share_id=str(uuid.uuid4()))
        claim = PreparedClaim(f"uid-{index}", "bench", name, (entry,))
        prepared[claim.uid] = (claim, identities(claim, inventory))
        consumers.append(Consumer("bench", f"pod-{index}", "main", "bench", name, gpu.name))
        status = {"containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}]}
        pods.append(
            {"metadata": {"namespace": "bench", "name": f"pod-{index}", "uid": uid}, "status": status}
        )
        pid = 10_000 + index
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{cid}\n")
        processes.append(FakeProcess(pid, gpu.uuid, (index + 1) << 20, (index % 10) / 20))
    fake.processes.set(processes)
    return fake, pods, (inventory, prepared), consumers


class _Replay:
    """The fake's answers, each computed once and then replayed: what is left is the sampler's own work.

    (The fake computes in this process what NVML's driver computes in the kernel.)
    """

    def __init__(self, lib: GpuLibrary) -> None:
        self._lib = lib
        self._answers: dict[tuple[str, tuple[object, ...]], object] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._lib, name)

        def replayed(*args: object) -> object:
            # By the device alone: a per-process read's "since" changes every sample, its answer not.
            key = (name, args[:1])
            if key not in self._answers:
                self._answers[key] = method(*args)
            return self._answers[key]

        return replayed


def _rss() -> int:
    """This process's resident memory in bytes (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _run(claims: int, samples: int, standin: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fake, pods, (inventory, prepared), consumers = _node(claims, root)
        lib: Any = _Replay(fake)
        if standin:
            sysfs, procfs = host_tree(fake, root / "host")
            nvml = over(NvmlStandIn(fake), sysfs=sysfs, procfs=procfs, dev=root / "host")
            nvml.init()
            lib = nvml

        async def list_pods() -> list[dict[str, Any]]:
            return pods

        metrics.USAGE.set({}, {}, {})
        DeviceReader(lib, True).read(inventory)  # the replayed answers are the fake's, not the sampler's
        rss = _rss()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        sampler = UsageSampler(lib, ProcessOwners(root / "proc", list_pods), claims + 1)

        async def sample_all() -> float:
            await sampler.sample(inventory, prepared, consumers)  # the first lists the pods
            started = time.process_time()
            for _ in range(samples):
                await sampler.sample(inventory, prepared, consumers)
            return (time.process_time() - started) / samples

        cpu = anyio.run(sample_all)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        grown = _rss() - rss
        started = time.process_time()
        text = generate_latest(metrics.REGISTRY)
        scrape = time.process_time() - started
        sampler.close()
        if standin:
            nvml.shutdown()
        return {"cpu": cpu, "memory": held, "rss": grown, "scrape": scrape, "bytes": len(text)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print what it costs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()} on {platform.machine()}, {args.claims} claims on 8 fake H100s")
    for standin in (False, True):
        side = (
            "through pynvml and the NVML stand-in (an upper bound: the stand-in's own work included)"
            if standin
            else "the sampler's own work (the fake's answers replayed)"
        )
        _run(1, 2, standin)  # one-time costs (imports, the worker thread) out of the figures
        base = _run(0, args.samples, standin)
        full = _run(args.claims, args.samples, standin)
        per = 100 / args.claims
        cpu = (full["cpu"] - base["cpu"]) * per
        print(f"{side}:")
        print(f"  sample, no claim:           {base['cpu'] * 1000:7.2f} ms CPU")
        print(f"  sample, {args.claims} claims:        {full['cpu'] * 1000:7.2f} ms CPU")
        share = f"{cpu / 10:.3%} of a core at 10 s"
        print(f"  per 100 claims:             {cpu * 1000:7.2f} ms CPU a sample, {share}")
        heap, rss = (full["memory"] - base["memory"]) * per, (full["rss"] - base["rss"]) * per
        print(f"  memory per 100 claims:      {heap / 1024:7.1f} KiB (Python heap)")
        print(f"  RSS per 100 claims:         {rss / 1024:7.1f} KiB (VmRSS, coarse)")
        print(
            f"  scrape per 100 claims:      {(full['scrape'] - base['scrape']) * per * 1000:7.2f} ms CPU, "
            f"{(full['bytes'] - base['bytes']) * per / 1024:.1f} KiB more text"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
