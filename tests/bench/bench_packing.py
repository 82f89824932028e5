"""Benchmark: how tightly the real kube-scheduler packs claims on this driver's slices, per publishing order.

    python -m tests.bench.bench_packing [--seeds 5] [--workloads ...] [--orders packing discovery] [--nvidia]

The DRA allocator gives each request the first device in slice order that satisfies it, so the
order a driver publishes its devices in decides which of several fitting devices a claim gets
(dra.core.slices.DeviceOrder). For each workload (a node layout from the built-in fake profiles and
a mix of claims: lower bounds on memory and multiprocessors, exact MIG profiles, whole GPUs, shares
by memory and by count) and each seed, the pods arrive one at a time in a random order drawn from
the mix: each is created once the one before is bound, on a Node of its own without a kubelet (as
tests.bench.bench_scheduler makes them) holding the slices of one order, until the first pod the
scheduler finds unschedulable. It prints, per workload, the pods placed before that one and the GPUs
they are on, for each order and for the best packing the same devices allow for the same arrivals
(tests.bench.packing, computed offline): the most of them that fit at once, on the fewest GPUs.

`--nvidia` also captures the slices NVIDIA's DRA driver publishes for the same fake GPUs (its
gpu-kubelet-plugin over a fake node on a local cluster with a kubelet, as
tests/e2e/test_nvidia_differential.py runs it; needs root) and runs the workloads its release can
serve on them. Figures, not assertions: docs/mig.md, "Publishing order", has the last run's table.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from localcluster.cluster import LocalCluster
from localcluster.kube import Kube, Obj

from dra.core.slices import DEVICE_ORDERS, DeviceOrder
from dra.core.versions import ApiFeatures
from dra.model.migmode import DYNAMIC
from dra.model.migoffer import ALL, COMMON
from tests.bench.bench_scheduler import DRIVER, Layout, device_classes, node_slices, ready_nodes
from tests.bench.packing import Ask, Node, Packing

NAMESPACE = "default"
#: Where NVIDIA's driver's slices stand in for an order.
NVIDIA = "nvidia"

DYNAMIC_MIG = Layout("dynamic-mig", "h100x8-dynamic-mig", (), DYNAMIC, frozenset({COMMON}))
DYNAMIC_ALL = Layout("dynamic-all", "h100x8-dynamic-mig", (), DYNAMIC, frozenset({ALL}))
STATIC_MIG = Layout("static-mig", "h100x8-mig", ())
MIXED_GPUS = Layout("mixed", "mixed", ())
SHARES_MEMORY = Layout("shares-memory", "h100x8", (), shares="memory")
SHARES_COUNT = Layout("shares-count", "h100x8", (), shares=4)


def _memory_above(quantity: str, strictly: bool = False) -> str:
    return (
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{quantity}")) {">" if strictly else ">="} 0'
    )


def _profile(name: str) -> str:
    return f'device.attributes["{DRIVER}"].profile == "{name}"'


#: The claim NVIDIA's own test makes: a MIG device with more than 10 multiprocessors and 10Gi.
MIG_ABOVE_10GI = Ask(
    "mig >10 SMs >10Gi",
    "mig.nvidia.com",
    (f'device.capacity["{DRIVER}"].multiprocessors.asInteger() > 10 && {_memory_above("10Gi", True)}',),
)
MIG_8GI = Ask("mig >=8Gi", "mig.nvidia.com", (_memory_above("8Gi"),))
MIG_16GI = Ask("mig >=16Gi", "mig.nvidia.com", (_memory_above("16Gi"),))
MIG_32GI = Ask("mig >=32Gi", "mig.nvidia.com", (_memory_above("32Gi"),))
WHOLE = Ask("whole GPU", "gpu.nvidia.com")


#: 1.34's allocator checks a shared device's capacity at the request's index, not the candidate's, so
#: once the first shared GPU is full no share is allocated at all (kubernetes/kubernetes#133705,
#: fixed in 1.35; docs/kubernetes-versions.md).
SHARES_SINCE = 35


def _share(gib: int) -> Ask:
    return Ask(f"{gib}Gi share", "gpu.nvidia.com", capacity=(("memory", f"{gib}Gi"),))


def _shares(count: int) -> Ask:
    return Ask(f"{count} of 4 shares", "gpu.nvidia.com", capacity=(("shares", str(count)),))


@dataclass(frozen=True)
class Workload:
    """Pods of a mix of claims, arriving in a random order, on one node of a layout."""

    name: str
    layout: Layout
    #: The claims, each with its share of the pods.
    mix: tuple[tuple[Ask, float], ...]
    pods: int
    #: Whether NVIDIA's driver (the release localcluster builds) publishes what it needs.
    nvidia: bool = True
    #: The first Kubernetes minor release whose scheduler can serve it.
    since: int = 34

    @property
    def asks(self) -> list[Ask]:
        """The kinds of claims, in mix order."""
        return [ask for ask, _ in self.mix]

    def arrivals(self, seed: int) -> list[int]:
        """The kind of each pod in arrival order (indexes into `asks`): drawn from the mix, seeded."""
        rng = random.Random(f"{self.name}/{seed}")
        return rng.choices(range(len(self.mix)), weights=[share for _, share in self.mix], k=self.pods)


def _dynamic(label: str, layout: Layout, nvidia: bool) -> list[Workload]:
    exact = tuple(Ask(p, "mig.nvidia.com", (_profile(p),)) for p in ("1g.10gb", "2g.20gb", "3g.40gb"))
    return [
        # Eight of these take all eight GPUs where the first fitting device is a 7g.80gb.
        Workload(f"{label}: >10 SMs >10Gi", layout, ((MIG_ABOVE_10GI, 1.0),), 40, nvidia),
        Workload(f"{label}: 10 of >10Gi", layout, ((MIG_ABOVE_10GI, 1.0),), 10, nvidia),
        Workload(
            f"{label}: lower bounds", layout, ((MIG_8GI, 0.5), (MIG_16GI, 0.3), (MIG_32GI, 0.2)), 48, nvidia
        ),
        Workload(
            f"{label}: exact profiles", layout, tuple(zip(exact, (0.5, 0.3, 0.2), strict=True)), 48, nvidia
        ),
        Workload(
            f"{label}: whole and MIG", layout, ((WHOLE, 0.2), (MIG_8GI, 0.5), (MIG_16GI, 0.3)), 40, nvidia
        ),
    ]


WORKLOADS = {
    w.name: w
    for w in (
        *_dynamic("dynamic", DYNAMIC_MIG, nvidia=False),
        # NVIDIA's driver offers every profile: these compare the same offers.
        *_dynamic("dynamic, all profiles", DYNAMIC_ALL, nvidia=True),
        Workload("static MIG: lower bounds", STATIC_MIG, ((MIG_16GI, 0.6), (MIG_32GI, 0.4)), 12),
        Workload(
            "mixed GPUs: lower bounds",
            MIXED_GPUS,
            (
                (Ask("GPU >=12Gi", "gpu.nvidia.com", (_memory_above("12Gi"),)), 0.5),
                (Ask("GPU >=24Gi", "gpu.nvidia.com", (_memory_above("24Gi"),)), 0.5),
            ),
            8,
        ),
        Workload(
            "shares by memory",
            SHARES_MEMORY,
            ((_share(10), 0.4), (_share(20), 0.3), (_share(40), 0.2), (WHOLE, 0.1)),
            40,
            nvidia=False,
            since=SHARES_SINCE,
        ),
        Workload(
            "shares by count",
            SHARES_COUNT,
            ((_shares(1), 0.6), (_shares(2), 0.3), (_shares(4), 0.1)),
            40,
            nvidia=False,
            since=SHARES_SINCE,
        ),
    )
}


@dataclass(frozen=True)
class Outcome:
    """One run: the pods placed before the first unschedulable one, and the GPUs they are on."""

    placed: int
    gpus: int


def _pod(name: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            # By field, so that the scheduler filters this one node (NodeAffinity's PreFilter result).
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    }
                }
            },
            "containers": [{"name": "main", "image": "bench", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


def _scheduled(kube: Kube, name: str, timeout: float) -> bool:
    """True once the pod is bound, False once the scheduler finds it unschedulable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = kube.get("v1", "Pod", name, NAMESPACE)
        if pod["spec"].get("nodeName"):
            return True
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                if condition.get("reason") == "Unschedulable":
                    return False
                if condition.get("reason") == "SchedulerError":
                    raise RuntimeError(f"pod {name}: {condition.get('message')}")
        time.sleep(0.05)
    raise RuntimeError(f"pod {name} neither bound nor unschedulable after {timeout:.0f}s")


def place(kube: Kube, node: str, asks: Sequence[Ask], arrivals: Sequence[int], timeout: float) -> list[str]:
    """Create the pods one at a time on `node`, each once the one before is bound; the devices of those
    placed before the first unschedulable one (which is deleted, with its claim)."""
    devices = []
    for index, kind in enumerate(arrivals):
        name = f"{node}-{index}"
        kube.create(asks[kind].claim(name, NAMESPACE))
        kube.create(_pod(name, node))
        if not _scheduled(kube, name, timeout):
            kube.delete("v1", "Pod", name, NAMESPACE)
            kube.delete("resource.k8s.io/v1", "ResourceClaim", name, NAMESPACE)
            break
        claim = kube.get("resource.k8s.io/v1", "ResourceClaim", name, NAMESPACE)
        devices.append(claim["status"]["allocation"]["devices"]["results"][0]["device"])
    return devices


def retarget(captured: Sequence[Obj], node: str, node_uid: str) -> list[Obj]:
    """Slices published for another node, as if for `node`: its pool, owner and names (in the same order)."""
    return [
        {
            "apiVersion": s["apiVersion"],
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{node}-{s['metadata']['name']}",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
            },
            "spec": {**s["spec"], "nodeName": node, "pool": {**s["spec"]["pool"], "name": node}},
        }
        for s in captured
    ]


def nvidia_slices(profiles: Sequence[str]) -> dict[str, list[Obj]]:
    """What NVIDIA's driver publishes for each fake profile: its plugin over a fake node, in turn."""
    from fakenvml.node import FakeNode
    from localcluster.nvidiadriver import NvidiaDriverProcess
    from localcluster.workloads import published_slices

    root = Path(tempfile.mkdtemp(prefix="dra-packing-"))
    cluster = LocalCluster(runtime="fake")
    info = cluster.start()
    kube = Kube(info.kubeconfig)
    captured = {}
    try:
        for profile in profiles:
            node = FakeNode(root / f"{profile}-{uuid.uuid4().hex[:6]}", profile, info.node_name).build()
            driver = NvidiaDriverProcess(info, node, root / "nvidia.log").start(timeout=120)
            try:
                captured[profile] = _whole_pool(lambda: published_slices(kube, info))
            finally:
                driver.stop()
                for stale in published_slices(kube, info):
                    kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
    finally:
        kube.close()
        cluster.stop()
    return captured


def _whole_pool(read: Callable[[], list[Obj]]) -> list[Obj]:
    """The newest generation of a pool once all its slices are there."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        slices = read()
        if slices:
            newest = max(s["spec"]["pool"]["generation"] for s in slices)
            pool = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
            if len(pool) == pool[0]["spec"]["pool"]["resourceSliceCount"]:
                return pool
        time.sleep(0.5)
    raise RuntimeError("NVIDIA's driver did not publish a whole pool in 60 s")


@dataclass(frozen=True)
class Run:
    """One workload, one seed, one order (or NVIDIA's slices)."""

    workload: Workload
    seed: int
    order: str


def figures(outcomes: Sequence[Outcome | Packing]) -> str:
    """Pods placed and GPUs used, each the mean over the seeds: "23.7 on 8.0"; "-" without any."""
    if not outcomes:
        return "-"
    placed = sum(o.placed for o in outcomes) / len(outcomes)
    return f"{placed:.1f} on {sum(o.gpus for o in outcomes) / len(outcomes):.1f}"


def table(
    workloads: Sequence[Workload],
    columns: Sequence[str],
    results: dict[tuple[str, str], list[Outcome | Packing]],
) -> str:
    """A Markdown table: a row per workload, "placed on GPUs" per column (orders, best, NVIDIA's)."""
    header = ["workload", "pods", *columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for w in workloads:
        cells = [figures(results.get((w.name, c), [])) for c in columns]
        lines.append("| " + " | ".join([w.name, str(w.pods), *cells]) + " |")
    return "\n".join(lines)


def best_column(order: str) -> str:
    """The column of the best packing of the devices an order's slices hold."""
    return "best (NVIDIA's devices)" if order == NVIDIA else "best"


def run_all(
    workloads: Sequence[Workload],
    seeds: int,
    orders: Sequence[str],
    captured: dict[str, list[Obj]],
    parallel: int,
    timeout: float,
) -> dict[tuple[str, str], list[Outcome | Packing]]:
    """Every run on one control plane, `parallel` at a time, each on a node of its own; and the best
    packings, per workload and column ("best" or NVIDIA's), one per seed."""
    cluster = LocalCluster(kubelet=False)
    minor = int(cluster.version.split(".")[1])
    for w in workloads:
        if minor < w.since:
            print(f"  {w.name}: not run, the scheduler of 1.{minor} cannot serve it (1.{w.since} on)")
    runs = [
        Run(w, seed, order)
        for w in workloads
        for seed in range(seeds)
        for order in orders
        if minor >= w.since and (order != NVIDIA or (w.nvidia and w.layout.profile in captured))
    ]
    outcomes: dict[tuple[str, str], list[Outcome | Packing]] = {}
    bests: dict[tuple[str, str], dict[int, Packing]] = {}
    info = cluster.start()
    kube = Kube(info.kubeconfig)
    features = ApiFeatures(minor=minor, partitionable_devices=True, consumable_capacity=True)
    classes = device_classes()
    nodes: dict[tuple[str, str], Node] = {}

    def one(node: Obj, run: Run) -> tuple[Outcome, Packing]:
        name, uid = node["metadata"]["name"], node["metadata"]["uid"]
        if run.order == NVIDIA:
            published = retarget(captured[run.workload.layout.profile], name, uid)
        else:
            order: DeviceOrder = "packing" if run.order == "packing" else "discovery"
            published = node_slices(run.workload.layout, name, uid, features, order)
        kube.create_all(published)
        # The same devices whatever their order: one offline computation per workload and set of devices.
        key = (run.workload.name, best_column(run.order))
        offline = nodes.get(key) or nodes.setdefault(key, Node(published, classes, run.workload.asks))
        arrivals = run.workload.arrivals(run.seed)
        devices = place(kube, name, run.workload.asks, arrivals, timeout)
        return Outcome(len(devices), offline.gpus_used(devices)), offline.best(arrivals)

    try:
        kube.create_all(classes)
        with ThreadPoolExecutor(parallel) as pool:
            created = ready_nodes(kube, pool, (f"pk-{i:03d}" for i in range(len(runs))))
            for run, (outcome, best) in zip(runs, pool.map(one, created, runs), strict=True):
                outcomes.setdefault((run.workload.name, run.order), []).append(outcome)
                bests.setdefault((run.workload.name, best_column(run.order)), {})[run.seed] = best
                print(
                    f"  {run.workload.name}, seed {run.seed}, {run.order}: {outcome.placed} placed on "
                    f"{outcome.gpus} GPUs; best {best.placed} on {best.gpus}",
                    flush=True,
                )
    finally:
        kube.close()
        cluster.stop()
    return {**outcomes, **{key: list(by_seed.values()) for key, by_seed in bests.items()}}


@contextlib.contextmanager
def _quiet_discovery() -> Iterator[None]:
    logger = logging.getLogger("dra.gpu.discovery")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def main() -> None:
    """Run the workloads in each order (and on NVIDIA's slices) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="random arrival orders per workload")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--orders", nargs="+", default=list(DEVICE_ORDERS), choices=list(DEVICE_ORDERS))
    parser.add_argument("--nvidia", action="store_true", help="also run on NVIDIA's driver's slices (root)")
    parser.add_argument("--parallel", type=int, default=4, help="runs at once, each on a node of its own")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a pod may wait for the scheduler"
    )
    args = parser.parse_args()
    workloads = [WORKLOADS[name] for name in args.workloads]
    orders = list(args.orders)
    captured: dict[str, list[Obj]] = {}
    if args.nvidia:
        captured = nvidia_slices(sorted({w.layout.profile for w in workloads if w.nvidia}))
        orders.append(NVIDIA)
    with _quiet_discovery():
        results = run_all(workloads, args.seeds, orders, captured, args.parallel, args.timeout)
    columns = [*args.orders, "best"]
    if args.nvidia:
        columns += [NVIDIA, best_column(NVIDIA)]
    print(f"\npods placed before the first unschedulable one, on how many GPUs (mean of {args.seeds} seeds)")
    print(table(workloads, columns, results))


if __name__ == "__main__":
    main()
