"""Benchmark: how fast the real kube-scheduler places GPU claims on this driver's slices, per layout.

    python -m tests.bench.bench_scheduler [--nodes 100 500] [--pods-per-node 4] [--layouts ...]

Starts a control plane without kubelets (kube-apiserver, etcd, controller
manager, scheduler on 127.0.0.1), creates Nodes that report Ready, and writes
for each the ResourceSlices the driver would publish for a fake 8-GPU node
(built by dra.core.slices from a fake profile, as the driver builds them).
Then, with the scheduler stopped (SIGSTOP), it creates one ResourceClaim and
one Pod per workload item, resumes the scheduler and times until every pod is
bound: pods/s is pure scheduling and allocation work, not API-object creation.

Layouts: `whole` (8 whole GPUs; whole-GPU claims only, the reference),
`static-mig` (4 whole GPUs + 4 pre-partitioned ones; the mixed workload) and
`dynamic-mig` (every GPU offers itself and every MIG profile at every
placement through shared counters; the same mixed workload) and
`dynamic-common` (the same with `--mig-profiles common`: 1g, 2g, 3g and 7g
profiles only), `dynamic-used` (only the workload's profiles) and
`dynamic-two` (common profiles on GPUs 0 and 1 only, the other six whole:
`--mig-mode whole,0=dynamic,1=dynamic`).

`nvidia-dynamic-mig` is NVIDIA's driver's dynamic MIG on the same fake 8-GPU
node: before the clusters of the runs, its gpu-kubelet-plugin (DynamicMIG on,
its chart's other settings; localcluster.nvidiadriver) runs once on a local
cluster over a fake node of the profile (fakenvml.node), and the slices it
publishes are captured and written for each benchmark node as ours are (its
node and pool names and owner replaced), for the same workload under the same
classes. Left out, with the reason, where NVIDIA's plugin cannot run.

Prints figures, the ratio of each layout's throughput to the reference, the
scheduler's CPU per bound pod (what a layout costs it where its API client's
rate limit caps the throughput) and, with both dynamic-MIG layouts, ours
beside NVIDIA's; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fakenvml.node import FakeNode
from localcluster.cluster import LocalCluster, running_cluster
from localcluster.driverprocess import free_port
from localcluster.gomodule import BuildError
from localcluster.kube import Kube, WaitTimeoutError, wait_for
from localcluster.kubereleases import api_limit_flags
from localcluster.nvidiadriver import NvidiaDriverProcess
from localcluster.workloads import published_slices

from dra.core import deviceentries, slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.migmode import DYNAMIC, STATIC, WHOLE, MigModes
from dra.model.migoffer import ALL, COMMON, MigOffer
from tests.bench import scheduler_profile
from tests.bench.bench_driver import cpu_seconds

DRIVER = "gpu.nvidia.com"
NAMESPACE = "default"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Layout:
    """A way to publish a node's GPUs, and the claims the workload makes of them."""

    name: str
    profile: str
    #: The device classes of the workload, in proportion: ("gpu", 0.5) is half the pods on whole GPUs.
    mix: tuple[tuple[str, float], ...]
    #: How the node's GPUs publish MIG (dra.model.migmode): static, dynamic or whole.
    mig_mode: str = STATIC
    #: Which MIG profiles a dynamic-MIG GPU offers (the items of --mig-profiles).
    offer: frozenset[str] = frozenset({ALL})
    #: GPUs whose mode differs from mig_mode, as (index, mode): the per-GPU part of --mig-mode.
    overrides: tuple[tuple[str, str], ...] = ()
    #: Whose slices: this driver's (built by dra.core.slices) or NVIDIA's (captured from its plugin).
    publisher: str = "dra-gpu"
    #: Every device shared by several claims (--consumable-shares), divided this way; None: exclusive.
    shares: deviceentries.ShareMode | None = None
    #: An experiment's change to each node's slices (scheduler_profile.VARIANTS); "": as published.
    variant: str = ""


WHOLE_ONLY = (("gpu", 1.0),)
MIXED = (("gpu", 0.5), ("1g.10gb", 0.35), ("2g.20gb", 0.15))
LAYOUTS = {
    "whole": Layout("whole", "h100x8", WHOLE_ONLY),
    "static-mig": Layout("static-mig", "h100x8-mig", MIXED),
    "dynamic-mig": Layout("dynamic-mig", "h100x8-dynamic-mig", MIXED, DYNAMIC),
    "dynamic-common": Layout("dynamic-common", "h100x8-dynamic-mig", MIXED, DYNAMIC, frozenset({COMMON})),
    # Only the profiles the workload asks for (--mig-profiles 1g.10gb,2g.20gb): 11 offers per H100.
    "dynamic-used": Layout(
        "dynamic-used", "h100x8-dynamic-mig", MIXED, DYNAMIC, frozenset({"1g.10gb", "2g.20gb"})
    ),
    # Dynamic MIG on two GPUs of each node (--mig-mode whole,0=dynamic,1=dynamic): 2 x 14 + 6 devices.
    "dynamic-two": Layout(
        "dynamic-two",
        "h100x8-dynamic-mig",
        MIXED,
        WHOLE,
        frozenset({COMMON}),
        (("0", DYNAMIC), ("1", DYNAMIC)),
    ),
    # NVIDIA's plugin with DynamicMIG: what it publishes for the profile, captured from a run of it.
    "nvidia-dynamic-mig": Layout("nvidia-dynamic-mig", "h100x8-dynamic-mig", MIXED, publisher="nvidia"),
}


#: Experiments (`--layouts`, not run by default): `dynamic-mig`, or NVIDIA's, with one thing changed in
#: its slices (scheduler_profile.VARIANTS), to attribute the scheduler's CPU per pod to what slices carry.
EXPERIMENTS = {
    f"{base}~{variant}": Layout(
        f"{base}~{variant}",
        LAYOUTS[base].profile,
        MIXED,
        LAYOUTS[base].mig_mode,
        publisher=LAYOUTS[base].publisher,
        variant=variant,
    )
    for base in ("dynamic-mig", "nvidia-dynamic-mig")
    for variant in scheduler_profile.VARIANTS
}
ALL_LAYOUTS = {**LAYOUTS, **EXPERIMENTS}


def device_classes() -> list[Obj]:
    """The DeviceClasses of whole GPUs and MIG devices, as the chart installs them."""

    def device_class(name: str, kind: str) -> Obj:
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    return [device_class("gpu.nvidia.com", "gpu"), device_class("mig.nvidia.com", "mig")]


def _node(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }


def _ready_status(node: Obj) -> Obj:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # Unconditional: the controller manager may have touched the Node since it was created.
    node["metadata"].pop("resourceVersion", None)
    node["status"] = {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "benchmark node without a kubelet",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }
    return node


def ready_nodes(kube: Kube, pool: ThreadPoolExecutor, names: Iterable[str]) -> list[Obj]:
    """Nodes of these names that report Ready and can take pods, without kubelets; as created."""
    names = list(names)
    created = _parallel(pool, kube.create, (_node(n) for n in names))
    _parallel(pool, kube.replace_status, (_ready_status(n) for n in created))
    # The API server taints new Nodes not-ready; the node lifecycle controller that would
    # lift it is off in the harness, so the benchmark lifts it as the harness does.
    list(pool.map(lambda n: kube.patch("v1", "Node", n, {"spec": {"taints": None}}), names))
    return created


def node_slices(
    layout: Layout, node: str, node_uid: str, features: ApiFeatures, order: slices.DeviceOrder = "packing"
) -> list[Obj]:
    """The slices the driver would publish for one node of this layout, on a server with `features`."""
    lib = FakeGpuLibrary(load_profile(layout.profile, node), node)
    modes = MigModes(default=layout.mig_mode, overrides=layout.overrides, offer=MigOffer(layout.offer))
    inventory = discover(lib, modes)
    shared = [d.name for d in inventory] if layout.shares is not None else []
    return slices.build_slices(
        inventory,
        DRIVER,
        node,
        node_uid,
        generation=1,
        features=features,
        shareable=shared,
        share_mode=layout.shares or "memory",
        order=order,
    )


def nvidia_slices(profile: str) -> list[Obj]:
    """The specs of the ResourceSlices NVIDIA's plugin publishes for one fake node of `profile`.

    Its plugin runs on a local cluster of its own over the fake node, with its chart's gates for the
    profile (DynamicMIG on a dynamic-MIG one), until its pool is complete; BuildError or OSError when
    it cannot run here (its fake node's device nodes need root).
    """
    with running_cluster() as cluster:
        node = FakeNode(Path(cluster.run_dir) / "fake-node", profile, cluster.node_name).build()
        driver = NvidiaDriverProcess(cluster, node, Path(cluster.log_path("nvidia-gpu-kubelet-plugin")))
        kube = Kube(cluster.kubeconfig)
        driver.start(timeout=120)
        try:
            wait_for(
                "NVIDIA's pool to be complete",
                lambda: pool_complete([s["spec"] for s in published_slices(kube, cluster)]),
                timeout=60,
            )
            return [s["spec"] for s in published_slices(kube, cluster)]
        finally:
            driver.stop()
            kube.close()


def pool_complete(specs: list[Obj]) -> bool:
    """Whether these slices are one whole pool: all of one generation, as many as each says it has."""
    generations = {s["pool"]["generation"] for s in specs}
    return len(generations) == 1 and all(s["pool"]["resourceSliceCount"] == len(specs) for s in specs)


def replicated(specs: list[Obj], node: str, node_uid: str) -> list[Obj]:
    """Captured slice specs as one more node would publish them: its node, its pool, owned by its Node."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{node}-{spec['driver']}-{index}",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
                ],
            },
            "spec": {**spec, "nodeName": node, "pool": {**spec["pool"], "name": node, "generation": 1}},
        }
        for index, spec in enumerate(specs)
    ]


def _claim(index: int, kind: str) -> Obj:
    request: Obj = {"name": "gpu"}
    if kind == "gpu":
        request["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
    else:
        expression = f'device.attributes["{DRIVER}"].profile == "{kind}"'
        request["exactly"] = {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": expression}}],
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{index}", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }


def _pod(index: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{index}", "namespace": NAMESPACE},
        "spec": {
            "containers": [{"name": "main", "image": "bench", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{index}"}],
        },
    }


def workload(layout: Layout, pods: int) -> list[str]:
    """The device class (or MIG profile) of each pod, interleaved so every prefix has the mix."""
    kinds: list[str] = []
    counts = dict.fromkeys((kind for kind, _ in layout.mix), 0)
    for index in range(pods):
        # The kind furthest behind its share goes next.
        kind = min(layout.mix, key=lambda km: counts[km[0]] - km[1] * (index + 1))[0]
        counts[kind] += 1
        kinds.append(kind)
    return kinds


def _parallel(pool: ThreadPoolExecutor, fn: Callable[[Obj], Obj], objs: Iterable[Obj]) -> list[Obj]:
    return list(pool.map(fn, objs))


@dataclass(frozen=True)
class Result:
    """One layout at one cluster size."""

    layout: str
    nodes: int
    devices: int
    slices: int
    pods: int
    bound: int
    seconds: float
    #: kube-scheduler's CPU (user + system) while it bound them.
    scheduler_cpu: float = 0.0

    @property
    def pods_per_second(self) -> float:
        """Bound pods per second of scheduling."""
        return self.bound / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_pod(self) -> float:
        """The scheduler's CPU per bound pod, in ms: what a layout costs it where the API limit hides it."""
        return self.scheduler_cpu * 1000 / self.bound if self.bound else 0.0


def run(
    layout: Layout,
    nodes: int,
    pods_per_node: float,
    timeout: float,
    scheduler_qps: int = 0,
    captured: list[Obj] | None = None,
    pprof: Path | None = None,
) -> Result:
    """One cluster, one layout: publish, create the workload, time the scheduler.

    `scheduler_qps`: the scheduler's API rate limit (burst twice it); 0 keeps its default, 50 with
    a burst of 100, which caps a layout that costs it little CPU (each pod: a claim and a binding).
    `captured`: NVIDIA's slices for one node (nvidia_slices), for a layout it publishes.
    `pprof`: a folder for the scheduler's CPU profiles while it binds the pods (scheduler_profile).
    """
    port = free_port() if pprof else 0
    profiling = scheduler_profile.pprof_flags(port) if pprof else ()
    cluster = LocalCluster(kubelet=False, scheduler_args=(*api_limit_flags(scheduler_qps), *profiling))
    info = cluster.start()
    kube = Kube(info.kubeconfig)
    try:
        with ThreadPoolExecutor(8) as pool:
            kube.create_all(device_classes())
            created = ready_nodes(kube, pool, (f"gpu-node-{i:04d}" for i in range(nodes)))
            # The harness turns on every gate the driver's features need.
            features = ApiFeatures(minor=int(cluster.version.split(".")[1]), partitionable_devices=True)

            def published(name: str, uid: str) -> list[Obj]:
                if layout.publisher == "nvidia":
                    assert captured is not None, "NVIDIA's layout needs its captured slices"
                    objs = replicated(captured, name, uid)
                else:
                    objs = node_slices(layout, name, uid, features)
                return scheduler_profile.apply(layout.variant, objs) if layout.variant else objs

            objs = [s for n in created for s in published(n["metadata"]["name"], n["metadata"]["uid"])]
            _parallel(pool, kube.create, objs)
            devices = sum(len(s["spec"].get("devices") or []) for s in objs)

            kinds = workload(layout, round(nodes * pods_per_node))
            scheduler = info.pids["kube-scheduler"]
            os.kill(scheduler, signal.SIGSTOP)
            try:
                _parallel(pool, kube.create, (_claim(i, k) for i, k in enumerate(kinds)))
                _parallel(pool, kube.create, (_pod(i) for i in range(len(kinds))))
            finally:
                cpu = cpu_seconds(scheduler)
                os.kill(scheduler, signal.SIGCONT)
        profiler = (
            scheduler_profile.SchedulerProfiler(port, pprof, f"{layout.name}-{nodes}") if pprof else None
        )
        if profiler:
            profiler.start()
        started = time.monotonic()
        pending = len(kinds)
        while pending and time.monotonic() - started < timeout:
            time.sleep(0.25)
            pending = len(kube.list_objects("v1", "Pod", NAMESPACE, field_selector="spec.nodeName="))
        seconds = time.monotonic() - started
        cpu = cpu_seconds(scheduler) - cpu
        if profiler:
            files = profiler.stop()
            print(f"  {layout.name}: {len(files)} CPU profiles in {pprof}", *profiler.errors[:1])
            print(scheduler_profile.top(files))
        if pending:
            stuck = kube.list_objects("v1", "Pod", NAMESPACE, field_selector="spec.nodeName=")[0]
            reasons = [c.get("message") for c in stuck["status"].get("conditions") or []]
            print(f"  {layout.name}: {pending} pods still pending after {timeout:.0f}s, e.g. {reasons}")
        return Result(layout.name, nodes, devices, len(objs), len(kinds), len(kinds) - pending, seconds, cpu)
    finally:
        kube.close()
        cluster.stop()


def main() -> None:
    """Run the layouts at each cluster size and print pods/s side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--pods-per-node", type=float, default=4.0)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(ALL_LAYOUTS))
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--scheduler-qps", type=int, default=0, help="the scheduler's API rate limit (0: its default, 50)"
    )
    parser.add_argument(
        "--pprof", type=Path, metavar="DIR", help="save the scheduler's CPU profiles of each run here"
    )
    parser.add_argument(
        "--nvidia-slices",
        type=Path,
        metavar="FILE",
        help="NVIDIA's captured slices: read from FILE where it exists, else captured and written there",
    )
    args = parser.parse_args()
    # dynamic-two's whole GPUs are in MIG mode in the fake profile, and discovery warns about each of
    # them on every node; an admin would turn MIG off there, which publishes the same single device.
    logging.getLogger("dra.gpu.discovery").setLevel(logging.ERROR)
    layouts = with_nvidia(args.layouts)
    captured: dict[str, list[Obj]] = {}
    for profile in {ALL_LAYOUTS[n].profile for n in layouts if ALL_LAYOUTS[n].publisher == "nvidia"}:
        try:
            captured[profile] = captured_slices(profile, args.nvidia_slices)
        except (BuildError, OSError, RuntimeError, WaitTimeoutError) as err:
            left_out = [
                n
                for n in layouts
                if ALL_LAYOUTS[n].publisher == "nvidia" and ALL_LAYOUTS[n].profile == profile
            ]
            print(f"{', '.join(left_out)} left out: NVIDIA's plugin could not publish its slices here: {err}")
            layouts = [n for n in layouts if n not in left_out]
    for nodes in args.nodes:
        reference: Result | None = None
        results: dict[str, Result] = {}
        for name in layouts:
            layout = ALL_LAYOUTS[name]
            # Printed as each layout ends: a 500-node run is long, and an interrupted one keeps its figures.
            r = run(
                layout,
                nodes,
                args.pods_per_node,
                args.timeout,
                args.scheduler_qps,
                captured.get(layout.profile) if layout.publisher == "nvidia" else None,
                args.pprof,
            )
            results[name] = r
            reference = reference or r
            ratio = r.pods_per_second / reference.pods_per_second if reference.pods_per_second else 0.0
            print(
                f"{r.nodes} nodes, {r.layout}: {r.devices} devices in {r.slices} slices; "
                f"{r.bound}/{r.pods} pods bound in {r.seconds:.1f} s = {r.pods_per_second:.1f} pods/s "
                f"({ratio:.2f}x of {reference.layout}); scheduler CPU {r.cpu_ms_per_pod:.1f} ms per pod",
                flush=True,
            )
            # Ours beside NVIDIA's latest run, NVIDIA's beside our latest: alternated runs pair up.
            if name in ("dynamic-mig", "nvidia-dynamic-mig") and {"dynamic-mig", "nvidia-dynamic-mig"} <= set(
                results
            ):
                print(beside_nvidia(results["dynamic-mig"], results["nvidia-dynamic-mig"]), flush=True)


def with_nvidia(layouts: list[str]) -> list[str]:
    """The layouts to run: with NVIDIA's right after our dynamic MIG where it was not asked for, so that
    ours is always measured beside NVIDIA's on the same offers."""
    layouts = list(layouts)
    if "dynamic-mig" in layouts and "nvidia-dynamic-mig" not in layouts:
        layouts.insert(layouts.index("dynamic-mig") + 1, "nvidia-dynamic-mig")
    return layouts


def captured_slices(profile: str, cache: Path | None) -> list[Obj]:
    """NVIDIA's slice specs for a node of `profile`: read from `cache` if it exists, else captured into it."""
    if cache is not None and cache.exists():
        specs: list[Obj] = json.loads(cache.read_text())
        return specs
    specs = nvidia_slices(profile)
    if cache is not None:
        cache.write_text(json.dumps(specs))
    return specs


def beside_nvidia(ours: Result, nvidia: Result) -> str:
    """Our dynamic MIG beside NVIDIA's at one node count: what each publishes, and the rates' ratio."""
    ratio = ours.pods_per_second / nvidia.pods_per_second if nvidia.pods_per_second else 0.0
    cpu = ours.cpu_ms_per_pod / nvidia.cpu_ms_per_pod if nvidia.cpu_ms_per_pod else 0.0
    return (
        f"{ours.nodes} nodes, dynamic MIG: dra-gpu {ours.devices} devices in {ours.slices} slices, "
        f"{ours.pods_per_second:.1f} pods/s; NVIDIA {nvidia.devices} devices in {nvidia.slices} slices, "
        f"{nvidia.pods_per_second:.1f} pods/s; ratio dra-gpu / NVIDIA {ratio:.2f}x, "
        f"scheduler CPU per pod {cpu:.2f}x"
    )


if __name__ == "__main__":
    main()
