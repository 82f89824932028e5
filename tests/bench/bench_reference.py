"""Kubernetes' Go DRA test driver timed alone by a minimal client: the figure `make bench` must match.

    python -m tests.bench.bench_reference [--runs 3] [--devices 128] [--claims 100]

Issue 47: an independent harness once timed the Go reference a quarter faster than `make bench`
did on the same machine, which would make every ratio `make bench` prints flatter than it is. This
is the minimal setup to hold `make bench` to: the local cluster with the Go test driver and nothing
else (no dra-gpu, no floors, no pile-up claims), only the claims its rows need, and a client written
apart from bench_compare's: one grpcio channel, plain blocking calls, each figure the median of
its calls (of its bursts for the burst; the bursts from tests/bench/burstclient, as bench_compare's).
Each run starts the driver afresh with bench_compare's command line and its CDI specs on tmpfs,
where the driver is at its best (on this machine's ext4 its first prepare and burst took a tenth
longer, measured side by side: docs/testing.md, issue 47).

`python -m tests.bench.bench_compare --reference-alone` times the driver this way in `make bench`'s
own turns, so that both figures come from one invocation under one load. Prints figures; asserts
nothing about speed.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import grpc
from localcluster.binaries import ensure_go_dra_driver, kubernetes_version
from localcluster.cluster import running_cluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, wait_for

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench import burstclient
from tests.bench.bench_compare import (
    BURST,
    BURSTS,
    CALLERS,
    EMPTY_CALLS,
    NAMESPACE_DELETION,
    RSS_CALLS,
    UNITS,
    Contender,
    _devices,
    _go,
    _ref,
    _running,
    cdi_dirs,
    figure_line,
)
from tests.bench.bench_driver import _claims, _rss_kib

ALONE = "go reference, alone"
Request = TypeVar("Request")


def _prepare(ref: dra_pb2.Claim) -> dra_pb2.NodePrepareResourcesRequest:
    return dra_pb2.NodePrepareResourcesRequest(claims=[ref])


def _ms(call: Callable[[Request], object], request: Request) -> float:
    started = time.perf_counter()
    call(request)
    return (time.perf_counter() - started) * 1000


def minimal_calls(
    target: str,
    stub: dra_pb2_grpc.DRAPluginStub,
    first: Sequence[dra_pb2.Claim],
    burst: Sequence[dra_pb2.Claim],
) -> dict[str, float]:
    """The rows, under bench_compare's names: empty calls, `first` prepared, again, unprepared, the bursts.

    `burst` holds BURSTS batches of BURST fresh claims, each prepared with CALLERS calls in flight.
    """
    prepare, unprepare = stub.NodePrepareResources, stub.NodeUnprepareResources
    empty = [_ms(prepare, dra_pb2.NodePrepareResourcesRequest()) for _ in range(EMPTY_CALLS)]
    firsts = [_ms(prepare, _prepare(ref)) for ref in first]
    repeats = [_ms(prepare, _prepare(ref)) for ref in first]
    unprepares = [_ms(unprepare, dra_pb2.NodeUnprepareResourcesRequest(claims=[ref])) for ref in first]
    batches = [burst[start : start + BURST] for start in range(0, len(burst), BURST)]

    def unprepare_all(batch: Sequence[dra_pb2.Claim]) -> None:
        for ref in batch:
            unprepare(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))

    walls = [one.wall for one in burstclient.bursts(target, batches, CALLERS, unprepare_all)]
    return {
        "empty NodePrepareResources p50": statistics.median(empty),
        "first prepare p50": statistics.median(firsts),
        "repeat prepare p50": statistics.median(repeats),
        "unprepare p50": statistics.median(unprepares),
        f"{BURST} fresh claims from {CALLERS} callers, wall": statistics.median(walls),
    }


def time_alone(contender: Contender, cluster: ClusterInfo, kube: Kube, claims: int, devices: int) -> None:
    """One run: the driver started afresh, its claims made, the rows timed by the minimal client."""
    namespace = f"alone-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    with _running(contender, cluster, kube, devices) as (pid, _):
        names = _devices(kube, contender.driver, cluster.node_name)
        node = cluster.node_name
        driver = contender.driver
        first = [_ref(c) for c in _claims(kube, namespace, node, names, claims, driver, "first")]
        burst = [_ref(c) for c in _claims(kube, namespace, node, names, BURST * BURSTS, driver, "burst")]
        target = f"unix://{contender.dra_socket}"
        with grpc.insecure_channel(target) as channel:
            figures = minimal_calls(target, dra_pb2_grpc.DRAPluginStub(channel), first, burst)
        figures[RSS_CALLS] = _rss_kib(pid)[0] / 1024
    for name, value in figures.items():
        contender.record(name, value)
    kube.delete("v1", "Namespace", namespace)
    wait_for(
        f"namespace {namespace} to be deleted",
        lambda: kube.get_or_none("v1", "Namespace", namespace) is None,
        timeout=NAMESPACE_DELETION,
    )


def alone(cluster: ClusterInfo, binary: Path, devices: int, cdi: Path) -> Contender:
    """The Go reference with make bench's command line, to be timed alone."""
    contender = _go(cluster, binary, devices, cdi)
    contender.label, contender.alone, contender.log = ALONE, True, Path(cluster.log_path("bench-go-alone"))
    return contender


def main() -> None:
    """Time the Go reference alone, --runs times, and print each figure's median and range."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, each with the driver started afresh")
    parser.add_argument("--devices", type=int, default=128, help="the driver's devices")
    parser.add_argument("--claims", type=int, default=100, help="claims prepared one by one (<= --devices)")
    args = parser.parse_args()
    if not 0 < args.claims <= args.devices:
        parser.error(f"--claims must be 1 to --devices ({args.devices}), not {args.claims}")
    binary = ensure_go_dra_driver()
    with running_cluster() as cluster, cdi_dirs("cdi-go-alone") as (cdi,):
        kube = Kube(cluster.kubeconfig)
        contender = alone(cluster, binary, args.devices, cdi)
        for number in range(1, args.runs + 1):
            print(f"run {number}/{args.runs}", flush=True)
            time_alone(contender, cluster, kube, args.claims, args.devices)
        kube.close()
    print(
        f"Kubernetes' DRA test driver ({kubernetes_version()}) alone, {args.devices} devices, "
        f"{args.runs} runs, median (range) of the per-run figures"
    )
    for name, values in contender.figures.items():
        print(figure_line(name, UNITS.get(name, "ms"), values, [], (ALONE, "")))


if __name__ == "__main__":
    main()
