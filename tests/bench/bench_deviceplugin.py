"""Benchmark: the device plugin's start-up, re-registration after kubelet restarts, and its calls.

    python -m tests.bench.bench_deviceplugin [--restarts 5] [--calls 2000]

Starts the local cluster and `dra-gpu device-plugin` (a real process on fake
GPUs, h100x8-mig), then restarts only the kubelet a few times and reads from
the plugin's call log how long after the new kubelet.sock appeared the plugin
was registered again. Then calls GetPreferredAllocation and Allocate over the
plugin's socket as the kubelet would, and times the pure preferred-allocation
function on its own. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import grpc
from localcluster.cluster import LocalCluster
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import wait_for

from dra.deviceplugin.preferred import preferred_allocation
from dra.deviceplugin.resources import placements, resources
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc
from tests.bench.bench_driver import _percentile, _rss_kib

PROFILE = "h100x8-mig"


def _ms(samples: list[float]) -> str:
    return (
        f"p50 {_percentile(samples, 50):.2f} ms  p99 {_percentile(samples, 99):.2f} ms  "
        f"max {max(samples):.2f} ms"
    )


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    cluster = LocalCluster()
    info = cluster.start()
    workdir = Path(tempfile.mkdtemp(prefix="dp-bench-"))
    plugin = DevicePluginProcess(info, PROFILE, workdir)
    try:
        started = time.monotonic()
        plugin.start()
        startup = time.monotonic() - started
        assert plugin.proc is not None
        resource_count = len(plugin.calls("Register"))

        kubelet_sock = Path(info.device_plugin_dir) / "kubelet.sock"
        delays: list[float] = []
        for n in range(2, args.restarts + 2):
            cluster.restart_kubelet()
            created = kubelet_sock.stat().st_ctime

            def registered(n: int = n) -> bool:
                return len([c for c in plugin.calls("Register") if c["n"] == n]) == resource_count

            wait_for(f"registration {n}", registered, timeout=30)
            last = max(c["time"] for c in plugin.calls("Register") if c["n"] == n)
            delays.append((last - created) * 1000)

        preferred: list[float] = []
        allocate: list[float] = []
        socket = Path(info.device_plugin_dir) / "dra-gpu-nvidia.com-gpu.sock"
        [listed] = [c for c in plugin.calls("ListAndWatch") if c["resource"] == "nvidia.com/gpu"][:1]
        uuids = [d["id"] for d in listed["devices"]]
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pb_grpc.DevicePluginStub(channel)
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=uuids, allocation_size=2)
                ]
            )
            for _ in range(args.calls):
                t0 = time.perf_counter()
                answer = stub.GetPreferredAllocation(request)
                t1 = time.perf_counter()
                ids = list(answer.container_responses[0].deviceIDs)
                stub.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
                )
                t2 = time.perf_counter()
                preferred.append((t1 - t0) * 1000)
                allocate.append((t2 - t1) * 1000)
        rss, peak = _rss_kib(plugin.proc.pid)
    finally:
        plugin.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    inventory = discover(FakeGpuLibrary(load_profile("a100x4-mig"), "bench"))
    small = next(r for r in resources(inventory) if r.name == "nvidia.com/mig-1g.5gb")
    table = placements(small.devices)
    ids = [d.uuid for d in small.devices]
    pure: list[float] = []
    for _ in range(200):
        t0 = time.perf_counter()
        preferred_allocation(ids, [], 4, table)
        pure.append((time.perf_counter() - t0) * 1000)

    print(
        f"device plugin start-up to every resource registered ({resource_count} resources): {startup:.2f} s"
    )
    print(
        f"kubelet restarts: {len(delays)}; re-registered every resource after the new kubelet.sock appeared:"
    )
    print(
        f"  median {statistics.median(delays):.0f} ms, max {max(delays):.0f} ms (the plugin checks every 1 s)"
    )
    print(f"GetPreferredAllocation over the socket, 2 of 4 GPUs, n={len(preferred)}: {_ms(preferred)}")
    print(f"Allocate over the socket, 2 GPUs, cdi-cri, n={len(allocate)}: {_ms(allocate)}")
    print(
        f"preferred_allocation alone, 4 of {len(ids)} MIG devices (a100x4-mig 1g.5gb): "
        f"median {statistics.median(pure):.2f} ms"
    )
    print(f"resident memory after the run: {rss / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
