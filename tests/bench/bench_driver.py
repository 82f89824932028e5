"""Benchmark: driver start-up, NodePrepareResources latency and resident memory.

    python -m tests.bench.bench_driver [--claims 200] [--profile h100x8]

Starts the local cluster and the driver (a real process on fake GPUs), then,
as the kubelet would, calls NodePrepareResources and NodeUnprepareResources
over the driver's unix socket for 1-GPU claims whose allocations live on the
local API server. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import uuid
from pathlib import Path

import grpc
from localcluster.cluster import running_cluster
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc

DRIVER = "gpu.nvidia.com"


def _percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))
    return ordered[index]


def _rss_kib(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, peak


def _claims(
    kube: Kube,
    namespace: str,
    node: str,
    devices: list[str],
    count: int,
    driver: str = DRIVER,
    prefix: str = "bench",
    admin_access: bool = False,
) -> list[dict[str, object]]:
    """`count` 1-device claims allocated round-robin to `devices` of `driver` on the node's pool.

    With `admin_access` (the namespace needs the admin-access label) a device may be
    prepared for any number of them at once.
    """
    claims = []
    request: dict[str, object] = {"deviceClassName": driver}
    result: dict[str, object] = {"request": "gpu", "driver": driver, "pool": node}
    if admin_access:
        request["adminAccess"] = True
        result["adminAccess"] = True
    for i in range(count):
        claim = kube.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"{prefix}-{i}", "namespace": namespace},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
            }
        )
        claim["status"] = {
            "allocation": {"devices": {"results": [{**result, "device": devices[i % len(devices)]}]}}
        }
        claims.append(kube.replace_status(claim))
    return claims


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--profile", default="h100x8")
    args = parser.parse_args()

    with running_cluster() as cluster:
        kube = Kube(cluster.kubeconfig)
        # In the run directory: removed with the cluster.
        log = Path(cluster.run_dir) / "logs" / "dra-gpu.log"
        started = time.monotonic()
        driver = DriverProcess(cluster, args.profile, log).start()
        startup = time.monotonic() - started
        own = re.search(r"published \d+ devices in ([\d.]+)s", log.read_text())
        assert driver.proc is not None
        rss_idle, _ = _rss_kib(driver.proc.pid)

        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        slices = kube.list_objects(
            "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={DRIVER}"
        )
        devices = [d["name"] for s in slices for d in s["spec"]["devices"]]
        claims = _claims(kube, namespace, cluster.node_name, devices, args.claims)

        socket = driver.dra_socket
        prepare: list[float] = []
        unprepare: list[float] = []
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            for claim in claims:
                meta = claim["metadata"]
                assert isinstance(meta, dict)
                ref = dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
                t0 = time.perf_counter()
                answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref]))
                t1 = time.perf_counter()
                assert answer.claims[ref.uid].error == "", answer.claims[ref.uid].error
                stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))
                t2 = time.perf_counter()
                prepare.append((t1 - t0) * 1000)
                unprepare.append((t2 - t1) * 1000)
        rss, peak = _rss_kib(driver.proc.pid)
        driver.stop()
        kube.delete("v1", "Namespace", namespace)
        kube.close()

    print(f"driver start-up to registered and published: {startup:.2f} s (process start to /readyz)")
    if own:
        print(f"  of which the driver's own start (after Python imports): {float(own.group(1)):.2f} s")
    print(f"NodePrepareResources, 1-GPU claims, n={len(prepare)}:")
    p50, p99 = _percentile(prepare, 50), _percentile(prepare, 99)
    p90 = _percentile(prepare, 90)
    print(f"  p50 {p50:.2f} ms  p90 {p90:.2f} ms  p99 {p99:.2f} ms  (p99/p50 {p99 / p50:.1f}x)")
    print(f"  mean {statistics.fmean(prepare):.2f} ms  max {max(prepare):.2f} ms")
    u50, u99 = _percentile(unprepare, 50), _percentile(unprepare, 99)
    print(f"NodeUnprepareResources: p50 {u50:.2f} ms  p99 {u99:.2f} ms")
    print(
        f"resident memory: {rss_idle / 1024:.1f} MiB after start, {rss / 1024:.1f} MiB after the run, "
        f"peak {peak / 1024:.1f} MiB"
    )


if __name__ == "__main__":
    main()
