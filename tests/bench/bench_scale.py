"""Benchmark: is the driver flat at node scale? Prepare, unprepare and RSS with 10 and 1,000 claims held.

    python -m tests.bench.bench_scale [--runs 3] [--held 10,1000] [--probes 40] [--repeats 25] [--passes 2]

The driver runs as a real process on the local cluster with 256 devices: 32 whole H100s
shared by count (--consumable-shares 32: each claim takes one of a GPU's 32 shares) and 16
H100s with dynamic MIG (--mig-mode dynamic for them, the common profiles: each offers itself
and 13 placements). Claims are allocated by hand as the scheduler would allocate them (a share
with its shareID and consumed capacity; a 1g.10gb placement of its own), and the benchmark
plays the kubelet on the driver's DRA socket, one claim per call. CDI specs go to tmpfs, as to
/var/run/cdi on a node and as in bench_compare.

For each level of held claims (prepared and left prepared: about a tenth on MIG placements,
the rest shares), it times --probes claims (half shares, half MIG placements), each prepared
and then unprepared --repeats times (an unprepared claim is prepared afresh: the claim read, a
MIG device made again), and reads the driver's RSS. The probes are made once untimed first
(the driver's first calls are slower), then the levels are visited up and back down, --passes
times in all (10, 1000, 1000, 10: held claims unprepared to go down), so that a drift over the
run falls on every level alike; a level's figures pool its visits. A tail figure needs the
calls: the p99 of 40 calls is their worst, and on a 2-core machine the cluster's own components
(the API server answering the claim read, etcd, an fsync) stall a call by 20 to 90 ms a few
times a minute at any level (docs/testing.md). Each run starts the driver afresh; the report
gives each figure's median and range over the runs and the ratio of the highest level to the
lowest (1.00x is flat). Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import itertools
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import yaml
from localcluster.cluster import running_cluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench.bench_compare import FAKE_MODEL, Spread, _described, cdi_dirs, parse_levels, spread
from tests.bench.bench_driver import DRIVER, _percentile, _rss_kib, cpu_seconds

#: Whole GPUs shared by count, and GPUs with dynamic MIG (after them in index order).
SHARED_GPUS, MIG_GPUS, SHARES = 32, 16, 32
#: 1g.10gb placements of an H100 (7 one-slice placements at starts 0 to 6).
ONE_G_PLACEMENTS = 7
#: The probes' kinds, in the order they alternate.
KINDS = ("share", "MIG")


def _profile(path: Path) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"model": FAKE_MODEL, "count": SHARED_GPUS},
                    {"model": FAKE_MODEL, "count": MIG_GPUS, "mig": []},
                ]
            }
        )
    )


#: --mig-mode: the shared GPUs whole, the others in dynamic MIG mode.
MIG_MODE = "whole," + ",".join(f"{i}=dynamic" for i in range(SHARED_GPUS, SHARED_GPUS + MIG_GPUS))


def _flags() -> tuple[str, ...]:
    return (
        f"--mig-mode={MIG_MODE}",
        f"--consumable-shares={SHARES}",
        f"--shareable-gpus={','.join(str(i) for i in range(SHARED_GPUS))}",
    )


def _share_results() -> Iterator[Obj]:
    """Allocation results on the shared GPUs, round-robin: one share each, a shareID of its own."""
    for index in itertools.cycle(range(SHARED_GPUS)):
        yield {
            "device": f"gpu-{index}",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "0", "shares": "1"},
        }


def _mig_results() -> list[Obj]:
    """Every 1g.10gb placement of the dynamic-MIG GPUs, as an allocation result."""
    return [
        {"device": f"gpu-{gpu}-mig-1g10gb-at{start}"}
        for start in range(ONE_G_PLACEMENTS)
        for gpu in range(SHARED_GPUS, SHARED_GPUS + MIG_GPUS)
    ]


def _claim(kube: Kube, namespace: str, node: str, name: str, result: Obj) -> dra_pb2.Claim:
    """A 1-device claim allocated this result on the node's pool; its reference for the kubelet's calls."""
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        }
    )
    allocation = {"request": "gpu", "driver": DRIVER, "pool": node, **result}
    claim["status"] = {"allocation": {"devices": {"results": [allocation]}}}
    claim = kube.replace_status(claim)
    meta = claim["metadata"]
    return dra_pb2.Claim(namespace=namespace, name=meta["name"], uid=meta["uid"])


def _call(stub: dra_pb2_grpc.DRAPluginStub, ref: dra_pb2.Claim, prepare: bool) -> float:
    """Milliseconds of one NodePrepareResources or NodeUnprepareResources; a claim's error ends the run."""
    started = time.perf_counter()
    if prepare:
        error = (
            stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref])).claims[ref.uid].error
        )
    else:
        error = (
            stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))
            .claims[ref.uid]
            .error
        )
    elapsed = (time.perf_counter() - started) * 1000
    if error:
        raise RuntimeError(f"{'prepare' if prepare else 'unprepare'} {ref.name}: {error}")
    return elapsed


#: A driver is settled when it spends less than this CPU in SETTLE_WINDOW seconds (the status
#: writes a burst of prepares defers to the kubelet's next pause are done), or after SETTLE_LIMIT.
SETTLE_CPU, SETTLE_WINDOW, SETTLE_LIMIT = 0.005, 0.5, 60.0


def _settle(pid: int) -> float:
    """Wait until the driver is idle; seconds waited.

    Each level is timed in its steady state: right after holding 1,000 claims the driver still
    writes their status.devices, and timing then would charge that to the claims held.
    """
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_LIMIT:
        before = cpu_seconds(pid)
        time.sleep(SETTLE_WINDOW)
        if cpu_seconds(pid) - before < SETTLE_CPU:
            break
    return time.monotonic() - started


def visits(levels: tuple[int, ...], passes: int) -> list[int]:
    """The order the levels are timed in: up, then back down, `passes` times in all.

    Up and down, each level's visits are on average at the middle of the run, so a drift
    over the run (faster as caches warm, or slower) leans on no level.
    """
    return [level for turn in range(passes) for level in (levels if turn % 2 == 0 else levels[::-1])]


def run_once(
    cluster: ClusterInfo,
    kube: Kube,
    levels: tuple[int, ...],
    probes: int,
    number: int,
    cdi: Path,
    repeats: int,
    passes: int,
) -> dict[str, float]:
    """One run: a fresh driver, claims held to each level in turn, probes timed there; figure -> value."""
    mig_free = ONE_G_PLACEMENTS * MIG_GPUS
    mig_held = min(max(levels) // 10, mig_free - probes // 2)
    shares_held = max(levels) - mig_held
    if shares_held + probes // 2 > SHARED_GPUS * SHARES or mig_held < 0:
        raise SystemExit(
            f"{max(levels)} claims and {probes} probes do not fit {SHARED_GPUS} x {SHARES} shares"
        )
    run = Path(cluster.run_dir)
    profile = run / "bench-scale-profile.yaml"
    _profile(profile)
    driver = DriverProcess(
        cluster,
        str(profile),
        run / "logs" / f"bench-scale-{number}.log",
        extra_args=_flags(),
        cdi_root=str(cdi),
    )
    namespace = f"bench-scale-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    node = cluster.node_name
    shares = _share_results()
    migs = _mig_results()
    # Held claims interleave shares and placements as pods would come; probe placements are the last.
    held_results = [next(shares) for _ in range(shares_held)]
    for position, mig in enumerate(migs[:mig_held]):
        held_results.insert(position * len(held_results) // max(1, mig_held), mig)
    probe_results = [
        r
        for pair in zip(
            (next(shares) for _ in range(probes // 2)), migs[mig_held : mig_held + probes // 2], strict=True
        )
        for r in pair
    ]
    with ThreadPoolExecutor(8) as pool:
        held = list(
            pool.map(
                lambda ir: _claim(kube, namespace, node, f"held-{ir[0]}", ir[1]), enumerate(held_results)
            )
        )
        probe_refs = list(
            pool.map(
                lambda ir: _claim(kube, namespace, node, f"probe-{ir[0]}", ir[1]), enumerate(probe_results)
            )
        )
    figures: dict[str, float] = {}
    driver.start(timeout=60)
    try:
        assert driver.proc is not None
        with grpc.insecure_channel(f"unix://{driver.dra_socket}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            prepared = 0
            # Per level and kind: prepare and unprepare milliseconds of every visit.
            timed: dict[tuple[int, str], tuple[list[float], list[float]]] = {
                (level, kind): ([], []) for level in levels for kind in KINDS
            }
            for ref in probe_refs:
                _call(stub, ref, prepare=True)
                _call(stub, ref, prepare=False)
            for level in visits(levels, passes):
                for ref in held[prepared:level]:
                    _call(stub, ref, prepare=True)
                for ref in held[level:prepared]:
                    _call(stub, ref, prepare=False)
                prepared = level
                _settle(driver.proc.pid)
                for _ in range(repeats):
                    # Probes alternate: shares at even positions, MIG placements at odd ones.
                    for position, ref in enumerate(probe_refs):
                        prepare, unprepare = timed[(level, KINDS[position % 2])]
                        prepare.append(_call(stub, ref, prepare=True))
                        unprepare.append(_call(stub, ref, prepare=False))
                # The first visit's: memory taken for 1,000 claims is not all given back when they go.
                figures.setdefault(f"RSS with {level} held", _rss_kib(driver.proc.pid)[0] / 1024)
            for (level, kind), (prepare, unprepare) in timed.items():
                for call, samples in (("prepare", prepare), ("unprepare", unprepare)):
                    for pct in (50, 99):
                        figures[f"{kind} {call} p{pct} with {level} held"] = _percentile(samples, pct)
    finally:
        driver.stop()
        # The next run starts without the checkpoint, CDI specs and MIG devices this one left.
        driver.checkpoint.unlink(missing_ok=True)
        for spec in Path(driver.cdi_root).glob("*"):
            spec.unlink()
        kube.delete("v1", "Namespace", namespace)
    return figures


def main() -> None:
    """Run the driver afresh --runs times, time the probes at each level, print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--held", type=parse_levels, default=(10, 1000), help="claims held, e.g. 10,1000")
    parser.add_argument("--probes", type=int, default=40, help="claims timed at each level (even)")
    parser.add_argument("--repeats", type=int, default=25, help="times each probe is prepared at a visit")
    parser.add_argument(
        "--passes", type=int, default=2, help="visits of every level, up then down (even: drift falls evenly)"
    )
    args = parser.parse_args()
    if args.repeats < 1 or args.passes < 1 or args.probes < 2 or args.probes % 2:
        parser.error("--repeats and --passes must be at least 1, --probes an even number of at least 2")
    runs: list[dict[str, float]] = []
    with running_cluster() as cluster, cdi_dirs("cdi") as (cdi,):
        kube = Kube(cluster.kubeconfig)
        for number in range(1, args.runs + 1):
            print(f"run {number}/{args.runs}", flush=True)
            runs.append(
                run_once(cluster, kube, args.held, args.probes, number, cdi, args.repeats, args.passes)
            )
        kube.close()
    print(
        f"dra-gpu at node scale: {SHARED_GPUS} shared GPUs ({SHARES} shares each) and {MIG_GPUS} dynamic-MIG "
        f"GPUs, 256 devices; {args.probes} probes prepared {args.repeats} times at each of {args.passes} "
        f"visits per level ({args.probes // 2 * args.repeats * args.passes} calls of each kind and level); "
        f"median (range) over {args.runs} runs"
    )
    for what, unit in [
        *(
            (f"{kind} {call} p{pct}", "ms")
            for kind in KINDS
            for call in ("prepare", "unprepare")
            for pct in (50, 99)
        ),
        ("RSS", "MiB"),
    ]:
        at = {level: [r[f"{what} with {level} held"] for r in runs] for level in args.held}
        print_levels(what, unit, at)


def print_levels(what: str, unit: str, by_level: dict[int, list[float]]) -> None:
    """One figure's line: its median (range) at each level of claims held, and highest / lowest."""
    at: dict[int, Spread] = {level: spread(values) for level, values in by_level.items()}
    low, high = min(at), max(at)
    levels = ", ".join(f"{level} held {_described(s, unit)}" for level, s in at.items())
    print(f"{what}: {levels}, ratio {high}/{low} {at[high].median / at[low].median:.2f}x")


if __name__ == "__main__":
    main()
