"""Benchmark: driver start-up, NodePrepareResources latency and resident memory.

    python -m tests.bench.bench_driver [--claims 200] [--profile h100x8] [--pile-up 1000]

Starts the local cluster and the driver (a real process on fake GPUs), then,
as the kubelet would, calls NodePrepareResources and NodeUnprepareResources
over the driver's unix socket for 1-GPU claims whose allocations live on the
local API server: one claim per call, sequential (first prepare, the same
claim again, unprepare); 32 fresh claims from 8 concurrent callers; and
prepares as prepared claims pile up (admin-access claims, which share
devices). Prints one line per figure; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
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
from tests.bench import burstclient

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


#: The kind of a process CPU clock that counts all of its run time (linux/posix-timers.h).
_CPUCLOCK_SCHED = 2


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads (those ended too), in nanoseconds' detail.

    Read from the process's CPU clock, as clock_getcpuclockid(3) names it on Linux (the pid, bit-
    inverted, shifted by 3, with CPUCLOCK_SCHED): the kernel's own sum of run time. proc(5)'s utime
    and stime count clock ticks of 10 ms, a tenth of a millisecond per prepare over 100 prepares,
    which hid levers of a few percent (issue 44); they remain where the clock cannot be read.
    """
    with contextlib.suppress(OSError):
        return time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name, field 3 (state) is fields[0]: utime and stime are fields[11:13].
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


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


def _ref(claim: dict[str, object]) -> dra_pb2.Claim:
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _prepare(stub: dra_pb2_grpc.DRAPluginStub, ref: dra_pb2.Claim) -> float:
    """One NodePrepareResources call for one claim; its milliseconds."""
    t0 = time.perf_counter()
    answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref]))
    elapsed = (time.perf_counter() - t0) * 1000
    assert answer.claims[ref.uid].error == "", answer.claims[ref.uid].error
    return elapsed


def _unprepare(stub: dra_pb2_grpc.DRAPluginStub, ref: dra_pb2.Claim) -> float:
    t0 = time.perf_counter()
    answer = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))
    elapsed = (time.perf_counter() - t0) * 1000
    assert answer.claims[ref.uid].error == "", answer.claims[ref.uid].error
    return elapsed


def main() -> None:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--profile", default="h100x8")
    parser.add_argument("--pile-up", type=int, default=1000, help="the most claims prepared at once")
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

        assert driver.proc is not None
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        slices = kube.list_objects(
            "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={DRIVER}"
        )
        devices = [d["name"] for s in slices for d in s["spec"]["devices"]]
        claims = _claims(kube, namespace, cluster.node_name, devices, args.claims)
        kube.patch(
            "v1",
            "Namespace",
            namespace,
            {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
        )
        burst = _claims(kube, namespace, cluster.node_name, devices, 32, prefix="burst", admin_access=True)
        levels = sorted({0, 64, args.pile_up})
        probes = _claims(kube, namespace, cluster.node_name, devices, 20 * len(levels), prefix="probe")
        pile = _claims(
            kube, namespace, cluster.node_name, devices, max(levels), prefix="pile", admin_access=True
        )

        prepare: list[float] = []
        repeat: list[float] = []
        unprepare: list[float] = []
        piled: dict[int, list[float]] = {}
        with grpc.insecure_channel(f"unix://{driver.dra_socket}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            for claim in claims:
                ref = _ref(claim)
                prepare.append(_prepare(stub, ref))
                repeat.append(_prepare(stub, ref))
                unprepare.append(_unprepare(stub, ref))
            burst_refs = [_ref(c) for c in burst]
            unprepare_all = lambda batch: [_unprepare(stub, ref) for ref in batch]  # noqa: E731
            (timed,) = burstclient.bursts(f"unix://{driver.dra_socket}", [burst_refs], 8, unprepare_all)
            wall, burst_each = timed.wall, timed.each
            prepared = 0
            cpu_before = cpu_seconds(driver.proc.pid)
            for level in levels:
                for claim in pile[prepared:level]:
                    _prepare(stub, _ref(claim))
                if level == max(levels):
                    cpu_per_prepare = (cpu_seconds(driver.proc.pid) - cpu_before) / max(1, level) * 1000
                prepared = level
                samples = piled.setdefault(level, [])
                for claim in probes[:20]:
                    ref = _ref(claim)
                    samples.append(_prepare(stub, ref))
                    _unprepare(stub, ref)
                probes = probes[20:]
        rss, peak = _rss_kib(driver.proc.pid)
        driver.stop()
        kube.delete("v1", "Namespace", namespace)
        kube.close()

    print(f"driver start-up to registered and published: {startup:.2f} s (process start to /readyz)")
    if own:
        print(f"  of which the driver's own start (after Python imports): {float(own.group(1)):.2f} s")
    p50, p99 = _percentile(prepare, 50), _percentile(prepare, 99)
    print(f"first prepare, 1-GPU claim, sequential, n={len(prepare)}: p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    print(f"first prepare mean {statistics.fmean(prepare):.2f} ms  max {max(prepare):.2f} ms")
    print(f"repeat prepare p50: {_percentile(repeat, 50):.2f} ms  p99 {_percentile(repeat, 99):.2f} ms")
    u50, u99 = _percentile(unprepare, 50), _percentile(unprepare, 99)
    print(f"unprepare p50: {u50:.2f} ms  p99 {u99:.2f} ms")
    print(
        f"32 fresh claims from 8 concurrent callers: wall {wall:.1f} ms  "
        f"p99 {_percentile(burst_each, 99):.2f} ms"
    )
    for level, samples in piled.items():
        print(f"prepare p50 with {level} claims already prepared: {_percentile(samples, 50):.2f} ms")
    print(f"driver CPU per first prepare: {cpu_per_prepare:.2f} ms (over {max(levels)} prepares)")
    print(
        f"resident memory: {rss_idle / 1024:.1f} MiB after start, {rss / 1024:.1f} MiB after the run, "
        f"peak {peak / 1024:.1f} MiB"
    )


if __name__ == "__main__":
    main()
