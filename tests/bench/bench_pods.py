"""Benchmark: pod create -> Running through DRA (dra-gpu, NVIDIA's, the Go test driver) and the device plugin.

    python -m tests.bench.bench_pods [--rounds 3] [--singles 8] [--burst 32] [--gpus 32]
        [--controller-manager-qps N] [--kubelet-qps N] [--no-nvidia] [--nvidia-qps N]

One local cluster (real kube-apiserver, scheduler, controller manager and kubelet on the
fake runtime, or containerd and runc with CONTAINER_RUNTIME=containerd) serves four ways to
give a pod one GPU, side by side and alternated:

- `dra-gpu`: a pod with a ResourceClaimTemplate of the chart's `gpu.nvidia.com` class,
  served by `dra-gpu kubelet-plugin`;
- `device plugin`: a pod with `nvidia.com/gpu: 1` in its limits, served by `dra-gpu
  device-plugin`;
- `go driver`: a pod with a ResourceClaimTemplate of Kubernetes' DRA test driver
  (k8s.io/kubernetes/test/e2e/dra/test-driver, built as bench_compare builds it);
- `nvidia`: the same pod as dra-gpu's, served by NVIDIA's gpu-kubelet-plugin
  (localcluster.nvidiadriver: its chart's settings and API client limits, and its chart's default
  feature gates, none, since a whole GPU needs none) over a fake node of
  --gpus GPUs (fakenvml.node). It has dra-gpu's driver name, so it runs in dra-gpu's place: each
  round stops dra-gpu's kubelet plugin, times NVIDIA's singles and burst, and starts dra-gpu again,
  NVIDIA's block first in every other round. `--no-nvidia` leaves it out, and so does a run
  without root (its fake node's device nodes need mknod), saying so.

The fake profile has 2 x --gpus GPUs, split as an admin splits a node (--dra-gpus and
--device-plugin-gpus): the first half through DRA, the second through the device plugin,
so both daemons run the whole time; the Go driver publishes --gpus devices of its own. Each
round times --singles pods one at a time (the paths in turn, pod by pod) and then --burst pods
created at once per path; every pod is deleted, and gone, and its claim unprepared by its driver
(the kubelet's unprepare calls counted on its metrics) before the next sample.

A pod's time runs from just before its create request to the moment a watch on the API
server reports it Running (client clock, milliseconds). The same watches time the stages
before the kubelet: the pod's claim created by the controller manager and allocated by the
scheduler (DRA), the pod bound to the node. The kubelet's log and metrics time its own steps
(tests.bench.podphases): its sync loop's first sight of the pod, SyncPod's sandbox step, its
NodePrepareResources call to the driver, the runtime's sandbox and container, the first
lifecycle event; each is printed as a phase, p50 and p99 per path. A pod's first lifecycle
event waits for the kubelet's PLEG, which relists the runtime once a second: a single pod is
created at a random moment of that second (a uniform wait of 0 to 1 s before it), so the
relist's phase falls alike on every path rather than on the benchmark's cadence.
--controller-manager-qps and --kubelet-qps raise those components' API rate limits
(Kubernetes' defaults otherwise), to show the limits' share. Prints figures and ratios;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from fakenvml.node import FakeNode
from kubernetes.watch.watch import iter_resp_lines
from localcluster.binaries import ensure_go_dra_driver
from localcluster.cluster import running_cluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess
from localcluster.gomodule import BuildError
from localcluster.kube import Kube, Obj, wait_for
from localcluster.kubereleases import api_burst, api_limit_flags, kubelet_api_limit
from localcluster.nvidiadriver import NvidiaDriverProcess
from localcluster.workloads import (
    DRIVER,
    claim_template,
    committed_device_classes,
    node_resources,
    published_slices,
)
from urllib3.exceptions import ProtocolError

from tests.bench.bench_compare import FAKE_MODEL, GO_DRIVER, NVIDIA_GATES, _go, nvidia_limits
from tests.bench.bench_driver import _percentile
from tests.bench.podphases import (
    DRA_GPU_PREPARE,
    KUBELET_LOGGING,
    NVIDIA_PREPARE,
    UNPREPARE,
    histograms,
    kubelet_histograms,
    kubelet_log_stages,
    metric_name,
    phase_table,
)

DRA_GPU, DEVICE_PLUGIN, GO, NVIDIA = "dra-gpu", "device plugin", "go driver", "nvidia"
GPU = "nvidia.com/gpu"
#: The kubelet's PLEG relist period (its generic PLEG's, fixed at a second).
PLEG_PERIOD = 1.0


@dataclass
class Route:
    """One way to give a pod a GPU: how its pods are made, and what was measured of them."""

    label: str
    pod: Callable[[str], Obj]
    #: The DRA driver that serves its pods ("" for the device plugin's): each sample waits for the
    #: kubelet's unprepare calls to it before the next.
    driver: str = ""
    #: The driver's own /metrics page, read around each sample for the series of its own prepare time
    #: (podphases.DRA_GPU_PREPARE, NVIDIA_PREPARE); None where there is none to read.
    driver_metrics: Callable[[], str] | None = None
    driver_series: tuple[tuple[str, str], ...] = ()
    #: "1 pod" / "32 pods" -> each pod's create -> Running, in milliseconds.
    samples: dict[str, list[float]] = field(default_factory=dict)
    #: figure -> pod -> its milestones (podphases.STAGES) in milliseconds from its create.
    pods: dict[str, dict[str, dict[str, float]]] = field(default_factory=lambda: defaultdict(dict))
    #: figure -> kubelet series -> milliseconds per call, one value a sample (one pod's own, or a
    #: burst's mean), from the series' sum and count read around the sample.
    calls: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )


def _claim_pod(name: str, template: str, image: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": image, "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def _limits_pod(name: str, image: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": image, "resources": {"limits": {GPU: "1"}}}],
        },
    }


class Watches:
    """Watches on the namespace's pods and claims: when each pod reached each stage (perf_counter)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.seen: dict[str, dict[str, float]] = defaultdict(dict)
        #: A claim's UID -> its pod, to read the kubelet's prepare calls, which name claims by UID.
        self.claims: dict[str, str] = {}
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(f"/api/v1/namespaces/{namespace}/pods", self._pod)),
            threading.Thread(
                target=self._run,
                args=(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", self._claim),
            ),
        ]
        for thread in self.threads:
            thread.daemon = True
            thread.start()

    def _run(self, path: str, handle: Callable[[Obj], None]) -> None:
        # A raw stream, one JSON event a line: the typed watch's model decoding would be the slowest
        # part of the timing loop.
        response = self.kube.api_client.call_api(
            path,
            "GET",
            query_params=[("watch", "true")],
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED"):
                    handle(event["object"])
        except ProtocolError:
            return  # the API server stopped at the end of the run

    def _mark(self, pod: str, stage: str) -> None:
        now = time.perf_counter()
        with self.lock:
            self.seen[pod].setdefault(stage, now)

    def _pod(self, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):
            self._mark(name, "bound")
        if pod.get("status", {}).get("phase") == "Running":
            self._mark(name, "running")

    def _claim(self, claim: Obj) -> None:
        owners = claim["metadata"].get("ownerReferences") or []
        pod = next((o["name"] for o in owners if o.get("kind") == "Pod"), None)
        if pod is None:
            return
        with self.lock:
            self.claims[claim["metadata"]["uid"]] = pod
        self._mark(pod, "claim created")
        if claim.get("status", {}).get("allocation"):
            self._mark(pod, "claim allocated")

    def at(self, pod: str) -> dict[str, float]:
        """The stages this pod has reached so far."""
        with self.lock:
            return dict(self.seen.get(pod, {}))


class Bench:
    """The cluster's namespace where pods are timed, and what each pod reached when."""

    def __init__(self, kube: Kube, cluster: ClusterInfo, namespace: str) -> None:
        self.kube = kube
        self.cluster = cluster
        self.namespace = namespace
        self.watches = Watches(kube, namespace)
        self.counter = 0
        #: Pod -> (its path, its figure, perf_counter just before its create request).
        self.created: dict[str, tuple[Route, str, float]] = {}

    def _delete_all(self, path: Route, pods: int) -> None:
        """Delete the sample's pods and wait for them, their claims, and the driver's unprepare calls.

        The API server forgets a pod deleted at once before the kubelet has unprepared its claim, and
        the scheduler may give the next pod the same device: a driver that refuses a device its
        checkpoint still holds (NVIDIA's does) would answer the next prepare with an error and the
        kubelet retry after a back-off of seconds, a cost of the benchmark's pace, not of a pod start.
        """
        key = (*UNPREPARE[0], path.driver)

        def unprepared() -> float:
            return kubelet_histograms(self.cluster, UNPREPARE).get(key, (0.0, 0.0))[1]

        released = unprepared()
        for pod in self.kube.list_objects("v1", "Pod", namespace=self.namespace):
            self.kube.delete("v1", "Pod", pod["metadata"]["name"], self.namespace, grace_period=0)

        def gone() -> bool:
            return not self.kube.list_objects("v1", "Pod", namespace=self.namespace) and not (
                self.kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=self.namespace)
            )

        wait_for("pods and their claims to be gone", gone, timeout=60)
        if path.driver:
            wait_for(
                f"the kubelet to unprepare {path.label}'s claims",
                lambda: unprepared() >= released + pods,
                timeout=60,
            )

    def sample(self, path: Route, pods: int, figure: str) -> None:
        """Create `pods` pods of `path` at once and time each to Running; then delete them."""
        before = self._histograms(path)
        names = [f"{path.label.replace(' ', '-')}-{self.counter + i}" for i in range(pods)]
        self.counter += pods
        created: dict[str, float] = {}

        def create(name: str) -> None:
            created[name] = time.perf_counter()
            self.kube.create(path.pod(name), namespace=self.namespace)

        if pods == 1:
            time.sleep(random.uniform(0, PLEG_PERIOD))
        with ThreadPoolExecutor(min(pods, 8)) as pool:
            list(pool.map(create, names))
        deadline = time.monotonic() + 120
        while not all("running" in self.watches.at(n) for n in names):
            if time.monotonic() > deadline:
                late = [n for n in names if "running" not in self.watches.at(n)]
                raise RuntimeError(f"{path.label}: {len(late)} pods not Running after 120s, e.g. {late[0]}")
            time.sleep(0.005)
        for name in names:
            self.created[name] = (path, figure, created[name])
            seen = self.watches.at(name)
            path.samples.setdefault(figure, []).append((seen["running"] - created[name]) * 1000)
            path.pods[figure][name] = {stage: (at - created[name]) * 1000 for stage, at in seen.items()}
        after = self._histograms(path)
        for key, (seconds, count) in after.items():
            old_seconds, old_count = before.get(key, (0.0, 0.0))
            if count > old_count:
                per_call = (seconds - old_seconds) / (count - old_count) * 1000
                path.calls[figure][metric_name(key)].append(per_call)
        self._delete_all(path, pods)

    def _histograms(self, path: Route) -> dict[tuple[str, str, str], tuple[float, float]]:
        """The kubelet's series, and the path's driver's own prepare time where it has a page."""
        found = kubelet_histograms(self.cluster)
        if path.driver_metrics is not None:
            found |= histograms(path.driver_metrics(), path.driver_series)
        return found

    def kubelet_stages(self) -> None:
        """Add the milestones the kubelet's log times (its wall clock, turned into perf_counter's)."""
        offset = time.time() - time.perf_counter()
        text = Path(self.cluster.log_path("kubelet")).read_text(errors="replace")
        with self.watches.lock:
            claims = dict(self.watches.claims)
        for (pod, stage), wall in kubelet_log_stages(text, time.localtime().tm_year, claims).items():
            if pod in self.created:
                path, figure, created = self.created[pod]
                path.pods[figure][pod][stage] = (wall - offset - created) * 1000


def _ms(values: list[float], pct: float) -> str:
    return f"{_percentile(values, pct):.0f} ms" if values else "-"


def report(paths: list[Route], burst: int) -> list[str]:
    """The figures: p50 and p99 per path and figure with dra-gpu's ratios, then the breakdowns."""
    by = {p.label: p for p in paths}
    lines = []
    for figure in ("1 pod", f"{burst} pods"):
        for pct in (50, 99):
            parts = [f"{p.label} {_ms(p.samples.get(figure, []), pct)}" for p in paths]
            ratios = []
            ours = by[DRA_GPU].samples.get(figure, [])
            for other, short in ((DEVICE_PLUGIN, "dp"), (GO, "go"), (NVIDIA, "nvidia")):
                theirs = by[other].samples.get(figure, []) if other in by else []
                if ours and theirs:
                    ratios.append(f"dra/{short} {_percentile(ours, pct) / _percentile(theirs, pct):.2f}x")
            lines.append(f"{figure} p{pct}: {', '.join(parts)}, ratio {', '.join(ratios)}")
    for figure in ("1 pod", f"{burst} pods"):
        per_call = "the pod's own" if figure == "1 pod" else "each burst's mean per call"
        lines.append(f"where the time goes, {figure} (the kubelet's metrics: {per_call}):")
        lines += phase_table(
            [p.label for p in paths],
            {p.label: list(p.pods[figure].values()) for p in paths},
            {p.label: p.calls[figure] for p in paths},
        )
    return lines


@contextmanager
def _go_driver(cluster: ClusterInfo, kube: Kube, gpus: int) -> Iterator[bool]:
    """Kubernetes' DRA test driver on the node with its own DeviceClass; False when it cannot be built."""
    try:
        binary = ensure_go_dra_driver()
    except BuildError as err:
        print(f"the Go test driver could not be built, so it is left out: {err}")
        yield False
        return
    contender = _go(cluster, binary, gpus, Path(cluster.cdi_dir))
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": GO_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GO_DRIVER}"'}}]},
        }
    )
    with open(contender.log, "ab") as log:
        proc = subprocess.Popen(contender.args, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            "the Go driver's devices",
            lambda: (
                sum(
                    len(s["spec"].get("devices") or [])
                    for s in kube.list_objects(
                        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={GO_DRIVER}"
                    )
                )
                >= gpus
            ),
            timeout=60,
        )
        yield True
    finally:
        proc.terminate()
        proc.wait(15)


def _nvidia_driver(cluster: ClusterInfo, gpus: int, qps: int) -> NvidiaDriverProcess | None:
    """NVIDIA's plugin over a fake node of `gpus` GPUs, not started; None (and why) without root.

    Its fake node's device nodes are made with mknod, which needs root: only that leaves it out. A
    plugin that fails to build or start fails the run, as the other paths do.
    """
    if os.geteuid() != 0:
        print(
            "NVIDIA's driver is left out: its fake node's device nodes need root (mknod); "
            "run `make bench-pods` as root to time it"
        )
        return None
    run = Path(cluster.run_dir)
    profile = run / "bench-pods-nvidia-profile.yaml"
    profile.write_text(yaml.safe_dump({"gpus": [{"model": FAKE_MODEL, "count": gpus}]}))
    node = FakeNode(run / "bench-pods-fake-node", str(profile), cluster.node_name).build()
    # Its chart's default gates, none: a pod of a whole GPU needs none.
    process = NvidiaDriverProcess(cluster, node, run / "logs" / "bench-pods-nvidia.log", gates=NVIDIA_GATES)
    if qps > 0:
        process.env |= {"KUBE_API_QPS": str(qps), "KUBE_API_BURST": str(api_burst(qps))}
    return process


@contextmanager
def _in_place_of(ours: DriverProcess, theirs: NvidiaDriverProcess, kube: Kube) -> Iterator[None]:
    """NVIDIA's plugin serving the node's claims under the driver name they share, then dra-gpu again.

    Both keep their checkpoint in the same file of the same plugin directory, each in its own format
    (one refuses the other's), so dra-gpu's is set aside while NVIDIA's plugin runs, and NVIDIA's,
    which holds no claim once its pods are gone, is removed after it.
    """
    ours.stop()
    aside = ours.checkpoint.with_name(f"{ours.checkpoint.name}.dra-gpu")
    if ours.checkpoint.exists():
        ours.checkpoint.replace(aside)
    # The kubelet would wipe a gone driver's slices only after some 30 s; each starts on its own.
    for stale in published_slices(kube, ours.cluster):
        kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
    try:
        theirs.start(timeout=120)
        yield
    finally:
        theirs.stop()
        ours.checkpoint.unlink(missing_ok=True)
        if aside.exists():
            aside.replace(ours.checkpoint)
        for stale in published_slices(kube, ours.cluster):
            kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
        ours.start()


def _limit(qps: int, default: str) -> str:
    """How a run's API rate limit reads in the report."""
    return f"{qps} requests/s, burst {api_burst(qps)}" if qps > 0 else f"the default ({default})"


def main() -> None:
    """Start the cluster and the three paths, time pods in turns, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of singles and bursts per path")
    parser.add_argument("--singles", type=int, default=8, help="pods timed one at a time per path and round")
    parser.add_argument("--burst", type=int, default=32, help="pods created at once per path and round")
    parser.add_argument("--gpus", type=int, default=32, help="GPUs of each path (at least --burst)")
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        default=0,
        help="the controller manager's API rate limit (--kube-api-qps, burst twice it); 0: its default, "
        "20 with a burst of 30 (its resourceclaim controller writes a claim and a pod status per pod)",
    )
    parser.add_argument(
        "--kubelet-qps",
        type=int,
        default=0,
        help="the kubelet's API rate limit (kubeAPIQPS, burst twice it); 0: its default, 50, burst 100",
    )
    parser.add_argument("--no-nvidia", action="store_true", help="leave out NVIDIA's driver")
    parser.add_argument(
        "--nvidia-qps",
        type=int,
        default=0,
        help="NVIDIA's plugin's API rate limit (burst twice it); 0: as its chart leaves it (5, burst 10)",
    )
    args = parser.parse_args()
    if args.gpus < args.burst:
        parser.error(f"--gpus ({args.gpus}) must be at least --burst ({args.burst}): a burst runs at once")
    if args.nvidia_qps < 0:
        parser.error(f"--nvidia-qps must be 0 (its chart's) or more, not {args.nvidia_qps}")

    qps, kubelet_qps = args.controller_manager_qps, args.kubelet_qps
    with running_cluster(
        controller_manager_args=api_limit_flags(qps),
        kubelet_config={**kubelet_api_limit(kubelet_qps), **KUBELET_LOGGING},
    ) as cluster:
        kube = Kube(cluster.kubeconfig)
        run = Path(cluster.run_dir)
        profile = run / "bench-pods-profile.yaml"
        profile.write_text(yaml.safe_dump({"gpus": [{"model": FAKE_MODEL, "count": 2 * args.gpus}]}))
        split = (
            f"--dra-gpus={','.join(str(i) for i in range(args.gpus))}",
            f"--device-plugin-gpus={','.join(str(i) for i in range(args.gpus, 2 * args.gpus))}",
        )
        driver = DriverProcess(cluster, str(profile), run / "logs" / "bench-dra-gpu.log", extra_args=split)
        plugin_dir = run / "bench-device-plugin"
        plugin_dir.mkdir()
        plugin = DevicePluginProcess(cluster, str(profile), plugin_dir, split, with_driver=True)
        namespace = f"bench-pods-{uuid.uuid4().hex[:6]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kube.create_all(committed_device_classes())
        claim_template(kube, namespace, "dra-gpu")
        claim_template(kube, namespace, "go-driver", device_class=GO_DRIVER)
        driver.start()
        plugin.start()
        try:
            wait_for(
                "the device plugin's GPUs",
                lambda: node_resources(kube, cluster, "allocatable").get(GPU) == str(args.gpus),
                timeout=60,
            )
            # Kubernetes' pause image, as the runtime has it: the fake one takes any name, containerd
            # the one the cluster imported.
            image = cluster.pause_image
            with _go_driver(cluster, kube, args.gpus) as have_go:
                paths = [
                    Route(
                        DRA_GPU,
                        lambda n: _claim_pod(n, "dra-gpu", image),
                        DRIVER,
                        driver.metrics,
                        DRA_GPU_PREPARE,
                    ),
                    Route(DEVICE_PLUGIN, lambda n: _limits_pod(n, image)),
                ]
                if have_go:
                    paths.append(Route(GO, lambda n: _claim_pod(n, "go-driver", image), GO_DRIVER))
                nvidia = None if args.no_nvidia else _nvidia_driver(cluster, args.gpus, args.nvidia_qps)
                # The same pod as dra-gpu's: the chart's class selects either driver's GPUs.
                theirs = Route(
                    NVIDIA,
                    lambda n: _claim_pod(n, "dra-gpu", image),
                    DRIVER,
                    None if nvidia is None else nvidia.metrics,
                    NVIDIA_PREPARE,
                )
                # The watches' threads are daemons: their streams end with the API server.
                bench = Bench(kube, cluster, namespace)

                def each(routes: list[Route]) -> None:
                    for _ in range(args.singles):
                        for path in routes:
                            bench.sample(path, 1, "1 pod")
                    for path in routes:
                        bench.sample(path, args.burst, f"{args.burst} pods")

                for number in range(1, args.rounds + 1):
                    print(f"round {number}/{args.rounds}", flush=True)
                    if nvidia is not None and number % 2 == 0:
                        with _in_place_of(driver, nvidia, kube):
                            each([theirs])
                    each(paths)
                    if nvidia is not None and number % 2 == 1:
                        with _in_place_of(driver, nvidia, kube):
                            each([theirs])
                if nvidia is not None:
                    paths.append(theirs)
                bench.kubelet_stages()
        finally:
            plugin.stop()
            driver.stop()
            kube.close()
    print(
        f"pod create -> Running on the local cluster ({cluster.kubernetes_version}, "
        f"{cluster.container_runtime} runtime), "
        f"{args.rounds} rounds alternating the paths; {args.rounds * args.singles} single pods and "
        f"{args.rounds} bursts of {args.burst} per path; controller manager's API limit "
        f"{_limit(qps, '20 requests/s, burst 30')}; the kubelet's {_limit(kubelet_qps, '50, burst 100')}; "
        f"NVIDIA's plugin's {nvidia_limits(args.nvidia_qps)}, no feature gate (its chart's default); "
        "dra-gpu has no client-side limit"
    )
    for line in report(paths, args.burst):
        print(line)


if __name__ == "__main__":
    main()
