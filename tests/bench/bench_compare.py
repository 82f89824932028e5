"""Benchmark: the driver beside Kubernetes' own DRA test driver (Go), alternating runs on one cluster.

    python -m tests.bench.bench_compare [--runs 3] [--devices 128] [--claims 100] [--pileup 0,64,1000]
        [--no-go] [--no-floor] [--no-nvidia] [--nvidia-lifted-qps N] [--reference-alone] [--baseline DIR]

Kubernetes' DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver at the cluster's
release, built into the cache on first use from deploy/local/gobench) is the reference:
a kubelet plugin on the same helper library as real Go drivers, writing one CDI file per
claim. Both run in turns (dra-gpu, Go, dra-gpu, Go, ...) as real processes on the same
local cluster, each with the same number of devices and the same claims (1-device claims
allocated to its own driver name and devices), and the benchmark plays the kubelet:
NodePrepareResources and NodeUnprepareResources over each driver's DRA socket. Both write
their CDI specs to tmpfs (/dev/shm), as to /var/run/cdi on a node. Every run
starts its driver afresh (no checkpoint, CDI specs or ResourceSlices left from the last run).

Two floors run in the same turns: a DRA server that does no work, in Python (tests/bench/grpcfloor.py:
grpcio's synchronous server, the server dra-gpu runs) and in Go (deploy/local/floorbin, on the test
driver's grpc-go and protobuf), timed by the same client on the rows that need no cluster. No
driver goes under its runtime's floor, so the floors say how much of a ratio is the runtime's.

NVIDIA's own driver takes turns too (issue 41): its gpu-kubelet-plugin (localcluster.nvidiadriver)
as its chart's defaults leave it, no feature gate on (the rows prepare whole GPUs with no opaque
config: none needs a gate) and its API client at client-go's 5 requests/s, burst 10; and again, in
a second column, with that limit lifted (--kube-api-qps/--kube-api-burst, `--nvidia-lifted-qps`),
so that its rows show its own work as well as what a default install does. It runs over a fake
node of the same 128 GPUs (fakenvml.node: the fake libnvidia-ml.so.1 in a driver root), beside
dra-gpu started over the same fake node (--driver-root: NVML through the same library), the same
client and claims, without the pile-up rows. The fake NVML answers from a Python stand-in, so
NVIDIA's Go process carries an interpreter, and its unprepare runs nvidia-smi, a Python process on
the fake node: each of its runs also measures those apart (tests/bench/nvmlstart.c makes its
start-up NVML calls from a program of no Python), and the report prints those parts beside its
rows; it subtracts nothing (medians taken apart do not subtract: one came out above the row).
`--no-nvidia` leaves it out.

`--baseline DIR` runs dra-gpu a second time in the same turns, from another checkout of the
tree (a git worktree of main, its dra/pb generated, on this interpreter), and prints this tree's
figures beside it: a change's before and after under the same load, in one invocation.

Each figure is taken once per run; the report gives the median and range over the runs of
each driver and the ratio of the medians (dra-gpu / Go: below 1x dra-gpu is ahead). Prints
figures; asserts nothing about speed. When the Go driver cannot be built or started the
benchmark says why and prints dra-gpu's figures alone; so for NVIDIA's column.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import glob
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from fakenvml.library import nvml_header
from fakenvml.node import FakeNode
from localcluster.binaries import NVIDIA, ensure_go_dra_driver, ensure_grpc_floor, kubernetes_version
from localcluster.cluster import running_cluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.gomodule import BuildError
from localcluster.kube import Kube, WaitTimeoutError, wait_for
from localcluster.kubereleases import api_burst
from localcluster.nvidiadriver import DRIVER as NVIDIA_DRIVER
from localcluster.nvidiadriver import NvidiaDriverProcess

from dra.adapters.nodefiles import is_tmpfs
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench import burstclient
from tests.bench.bench_driver import _claims, _percentile, _rss_kib, cpu_seconds

#: The Go driver's name (its default) and how it names its devices (its --num-devices of them).
GO_DRIVER = "test-driver.cdi.k8s.io"
DRA_GPU = "dra-gpu"
GO = "go reference"
#: Fake GPU model of the dra-gpu profile that matches the Go driver's device count.
FAKE_MODEL = "h100-sxm5-80gb"
#: How often start-up is polled for: registered with the kubelet and every device published.
POLL = 0.02
#: Concurrent callers and claims of the burst figure, and bursts per run: one burst is 32 calls, and
#: its wall time alone moved by half between runs (issue 47), so a run's figure is the median of five.
CALLERS, BURST, BURSTS = 8, 32, 5
#: Seconds a run's namespace (and its claims) may take to be deleted before the next run starts.
NAMESPACE_DELETION = 300.0
#: Seconds after the first prepares for the work they leave (claim status writes) to be done.
LATER_WORK = 2.0
#: Calls of the empty-request figure, and fresh claims measured at each pile-up level.
EMPTY_CALLS, PILEUP_SAMPLES = 200, 20


@dataclass(frozen=True)
class Spread:
    """One figure over several runs: the median of the runs and their range."""

    median: float
    low: float
    high: float


def spread(values: Sequence[float]) -> Spread:
    """The median and range of one figure's per-run values."""
    if not values:
        raise ValueError("no runs to summarise")
    return Spread(statistics.median(values), min(values), max(values))


def _amount(value: float, unit: str) -> str:
    # Three significant figures or so: 1.21 ms, 46.9 MiB, 158 ms.
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{decimals}f} {unit}"


def _described(what: Spread, unit: str) -> str:
    if what.low == what.high:
        return _amount(what.median, unit)
    low, high = _amount(what.low, unit).split()[0], _amount(what.high, unit)
    return f"{_amount(what.median, unit)} ({low}-{high})"


def figure_line(
    name: str,
    unit: str,
    ours: Sequence[float],
    theirs: Sequence[float],
    labels: tuple[str, str] = (DRA_GPU, GO),
) -> str:
    """One figure on one line: each contender's median (and range over runs), then the ratio of medians.

    figure_line("first prepare p50", "ms", [1.1, 1.3, 1.2], [1.6]) ->
    "first prepare p50: dra-gpu 1.20 ms (1.10-1.30 ms), go reference 1.60 ms, ratio 0.75x"
    """
    line = f"{name}: {labels[0]} {_described(spread(ours), unit)}"
    if not theirs:
        return line
    go = spread(theirs)
    line += f", {labels[1]} {_described(go, unit)}"
    if go.median > 0:
        line += f", ratio {spread(ours).median / go.median:.2f}x"
    return line


def parse_levels(text: str) -> tuple[int, ...]:
    """Pile-up levels from "0,64,1000": distinct, non-negative, ascending."""
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"pile-up levels must be whole numbers, e.g. 0,64,1000: {text!r}"
        ) from None
    if not levels or levels[0] < 0:
        raise argparse.ArgumentTypeError(f"pile-up levels must be 0 or more, e.g. 0,64,1000: {text!r}")
    return tuple(levels)


@dataclass
class Contender:
    """One driver as the benchmark runs it: its command line, socket and driver name."""

    label: str
    driver: str
    args: list[str]
    dra_socket: Path
    log: Path
    #: Figure name -> one value per run.
    figures: dict[str, list[float]] = field(default_factory=dict)
    #: Directories whose contents a run leaves (checkpoint, CDI specs), emptied before the next one.
    state: tuple[Path, ...] = ()
    #: A floor (a DRA server doing no work): no cluster, only the calls (`_run_floor`).
    floor: bool = False
    #: Whether its runs hold claims prepared by the hundred (the pile-up rows) after the common rows.
    pileup: bool = True
    #: The Go reference timed alone by bench_reference's minimal client, in these turns (issue 47).
    alone: bool = False
    #: Its environment, over this process's.
    env: dict[str, str] = field(default_factory=dict)
    #: Called before each start, once `state` is emptied: NVIDIA's plugin copies its CDI hook into its
    #: plugin directory, which a run of dra-gpu (the same driver name, the same directory) empties.
    setup: Callable[[], object] | None = None
    #: The directory it starts in: another checkout of the tree runs its own `python -m dra` there.
    cwd: Path | None = None

    def record(self, name: str, value: float) -> None:
        """Add one run's value of a figure."""
        self.figures.setdefault(name, []).append(value)


def _profile(cluster: ClusterInfo, devices: int) -> Path:
    profile = Path(cluster.run_dir) / "bench-profile.yaml"
    profile.write_text(yaml.safe_dump({"gpus": [{"model": FAKE_MODEL, "count": devices}]}))
    return profile


def _dra_gpu(
    cluster: ClusterInfo, devices: int, cdi: Path, label: str = DRA_GPU, tree: Path | None = None
) -> Contender:
    """dra-gpu on fake GPUs; from the checkout `tree` (its `python -m dra`) when given, else this one."""
    log = Path(cluster.log_path("bench-dra-gpu" if tree is None else "bench-dra-gpu-baseline"))
    profile = str(_profile(cluster, devices))
    process = DriverProcess(cluster, profile, log, instance_id="bench", cdi_root=str(cdi))
    state = (process.checkpoint.parent, cdi)
    return Contender(
        label, process.driver_name, process.args(), process.dra_socket, log, state=state, cwd=tree
    )


BASELINE = "baseline"
#: This checkout, whose dra-gpu the benchmark runs.
REPO = Path(__file__).resolve().parents[2]


def compile_tree(tree: Path) -> None:
    """Compile a checkout's dra package ahead, as pip does when it installs the image's wheel.

    With PYTHONDONTWRITEBYTECODE set (the image's ENV, and shells that keep worktrees free of
    __pycache__) an editable checkout is never compiled for good: every start of the driver
    compiled its 160-odd modules again, 0.3 s and more of the start-up row (issue 44).
    """
    compileall.compile_dir(tree / "dra", quiet=1)


def baseline_tree(path: Path) -> str:
    """The checkout `--baseline` names, described for the report; ValueError when it cannot run."""
    if not (path / "dra" / "__main__.py").is_file():
        raise ValueError(f"{path} is not a checkout of dra-gpu (no dra/__main__.py)")
    if not (path / "dra" / "pb").is_dir():
        raise ValueError(f"{path} has no generated dra/pb: run `python proto/generate.py` there")
    describe = ["git", "-C", str(path), "describe", "--always", "--dirty"]
    done = subprocess.run(describe, capture_output=True, text=True, check=False)
    return f"{path} at {done.stdout.strip() or 'an unknown commit'}"


DRA_GPU_NVML, NVIDIA_LABEL, NVIDIA_LIFTED = "dra-gpu, fake NVML", "nvidia", "nvidia, API limit lifted"
#: NVIDIA's feature gates in the benchmark: its chart's default, none. No row needs one (whole GPUs,
#: no opaque config); TimeSlicingSettings and MPSSupport would serve only a claim that configures sharing.
NVIDIA_GATES: dict[str, bool] = {}
#: The lifted column's API client limit, as the Go reference's: no client-side limit in effect.
NVIDIA_LIFTED_QPS = 100000


def _fake_node(cluster: ClusterInfo, devices: int) -> FakeNode | None:
    """One fake node of the benchmark's GPUs for NVIDIA's plugin and dra-gpu alike, or None and why."""
    try:
        root = Path(cluster.run_dir) / "bench-fake-node"
        return FakeNode(root, str(_profile(cluster, devices)), cluster.node_name).build()
    except (BuildError, OSError) as err:
        # Its device nodes need mknod, so root.
        print(f"no fake node to run NVIDIA's plugin on, so its column is left out: {err}")
        return None


def _dra_gpu_nvml(cluster: ClusterInfo, node: FakeNode, cdi: Path) -> Contender:
    """dra-gpu reading the fake node's GPUs through NVML (the fake library), as NVIDIA's plugin does."""
    log = Path(cluster.log_path("bench-dra-gpu-nvml"))
    process = DriverProcess(cluster, node, log, instance_id="bench-nvml", cdi_root=str(cdi))
    state = (process.checkpoint.parent, cdi)
    return Contender(
        DRA_GPU_NVML, process.driver_name, process.args(), process.dra_socket, log, state=state, pileup=False
    )


def nvidia_limits(qps: int) -> str:
    """How NVIDIA's plugin's API client is limited: as its chart leaves it (its defaults), or at `qps`."""
    if qps > 0:
        return f"--kube-api-qps {qps}, --kube-api-burst {api_burst(qps)} (lifted, not its chart's)"
    return "as its chart leaves them: its defaults, --kube-api-qps 5, --kube-api-burst 10"


def _nvidia(cluster: ClusterInfo, node: FakeNode, cdi: Path, qps: int = 0) -> Contender | None:
    """NVIDIA's gpu-kubelet-plugin as its chart's defaults run it (no feature gate), over the fake node,
    its API client limit lifted to `qps` if not 0; None (and why) if it cannot be built."""
    label = NVIDIA_LIFTED if qps > 0 else NVIDIA_LABEL
    log = Path(cluster.log_path("bench-nvidia-lifted" if qps > 0 else "bench-nvidia"))
    try:
        process = NvidiaDriverProcess(cluster, node, log, gates=NVIDIA_GATES)
    except BuildError as err:
        print(f"NVIDIA's plugin could not be built, so its column is left out: {err}")
        return None
    env = {**process.env, "CDI_ROOT": str(cdi)}
    if qps > 0:
        env |= {"KUBE_API_QPS": str(qps), "KUBE_API_BURST": str(api_burst(qps))}
    plugin = Path(cluster.plugins_dir) / NVIDIA_DRIVER
    return Contender(
        label,
        NVIDIA_DRIVER,
        process.args(),
        plugin / "dra.sock",
        log,
        state=(plugin, cdi),
        pileup=False,
        env=env,
        setup=process.args,
    )


def _go(cluster: ClusterInfo, binary: Path, devices: int, cdi: Path) -> Contender:
    plugins = Path(cluster.plugins_dir)
    # It makes the parent of its socket directory, not the directory.
    (plugins / GO_DRIVER).mkdir(parents=True, exist_ok=True)
    args = [
        str(binary),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--drivername={GO_DRIVER}",
        # Lifted: the figures are the driver's own, not client-go's default 50 QPS.
        "--kube-api-qps=100000",
        "--kube-api-burst=100000",
        "kubelet-plugin",
        f"--node-name={cluster.node_name}",
        f"--num-devices={devices}",
        f"--datadir={plugins}",
        f"--plugin-registration-path={cluster.plugins_registry}",
        f"--cdi-dir={cdi}",
    ]
    log = Path(cluster.log_path("bench-go-driver"))
    return Contender(GO, GO_DRIVER, args, plugins / GO_DRIVER / "dra.sock", log, state=(cdi,))


def _devices(kube: Kube, driver: str, node: str) -> list[str]:
    slices = kube.list_objects("resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={driver}")
    # Once each: while a driver replaces a slice, both generations can be listed, and a device named
    # twice would be allocated to two claims of the round robin.
    mine = [s["spec"] for s in slices if s["spec"].get("nodeName") == node]
    return sorted({d["name"] for spec in mine for d in spec.get("devices") or []})


class _KubeletLog:
    """Watches the kubelet's log for it connecting to a driver's DRA socket after registering it.

    Each look reads only what the kubelet wrote since the last one: the log at -v=2 grows by
    megabytes over a benchmark, and re-reading it all every 20 ms took CPU from the driver
    being started.
    """

    def __init__(self, path: Path, driver: str) -> None:
        name = re.escape(driver)
        self._pattern = re.compile(rf'"Connection changed" .*driverName="{name}" .*connected=true')
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        # Connections logged before this run are the last run's.
        self._file.seek(0, os.SEEK_END)
        self._partial = b""

    def connected(self) -> bool:
        """Whether a connection has been logged since the watch began."""
        lines = (self._partial + self._file.read()).split(b"\n")
        self._partial = lines.pop()
        return any(self._pattern.search(line.decode(errors="replace")) for line in lines)

    def close(self) -> None:
        """Stop watching."""
        self._file.close()


@contextmanager
def _running(
    contender: Contender, cluster: ClusterInfo, kube: Kube, devices: int
) -> Iterator[tuple[int, float]]:
    """The driver started afresh: its pid and seconds from spawn to registered and every device published."""
    # What the last run left prepared is not unprepared (1000 claims take minutes): its files go.
    for directory in contender.state:
        for leftover in directory.glob("*"):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
    if contender.setup is not None:
        contender.setup()
    for stale in kube.list_objects(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={contender.driver}"
    ):
        kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
    kubelet_log = _KubeletLog(Path(cluster.log_path("kubelet")), contender.driver)
    registry = Path(cluster.plugins_registry)
    with open(contender.log, "ab") as log:
        spawned = time.time()
        started = time.monotonic()
        proc = subprocess.Popen(
            contender.args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **contender.env},
            cwd=contender.cwd,
        )
    try:
        deadline = started + 60
        registered = published = False
        served: float | None = None
        while not (registered and published):
            if proc.poll() is not None:
                raise RuntimeError(f"{contender.label} exited with {proc.returncode}: see {contender.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{contender.label} not registered and published after 60s: see {contender.log}"
                )
            if served is None and _socket_served(registry, contender.driver, spawned):
                served = time.monotonic() - started
            registered = registered or kubelet_log.connected()
            # Counted once the kubelet has it: until then the wipe the kubelet scheduled 30 s after
            # the last instance of the same driver name went away (docs/operations.md) may still
            # delete what this one published, which it then publishes again (its watch).
            published = registered and len(_devices(kube, contender.driver, cluster.node_name)) >= devices
            if not (registered and published):
                time.sleep(POLL)
        if served is not None:
            contender.record(SOCKET, served)
        yield proc.pid, time.monotonic() - started
    finally:
        kubelet_log.close()
        proc.terminate()
        _reap(proc)


def _socket_served(registry: Path, driver: str, since: float) -> bool:
    """Whether the driver's registration socket was made in the kubelet's registry after `since` (wall clock).

    Every driver here names it after itself (dra-gpu adds its instance). The driver's own part of the
    start: the kubelet finds a socket on its plugin manager's one-second loop.
    """
    for path in registry.glob(f"{glob.escape(driver)}*reg.sock"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime >= since:
                return True
    return False


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a process told to stop; killed if it has not within 15 s."""
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _ref(claim: dict[str, object]) -> dra_pb2.Claim:
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


class _Kubelet:
    """The kubelet's side of the DRA socket: timed prepare and unprepare calls, one claim each."""

    def __init__(self, target: str, stub: dra_pb2_grpc.DRAPluginStub, label: str) -> None:
        #: The driver's address, for the burst's own client (tests/bench/burstclient).
        self.target = target
        self.stub = stub
        self.label = label

    def prepare(self, ref: dra_pb2.Claim) -> float:
        """Milliseconds of one NodePrepareResources; a per-claim error ends the benchmark."""
        t0 = time.perf_counter()
        answer = self.stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref]))
        elapsed = (time.perf_counter() - t0) * 1000
        error = answer.claims[ref.uid].error
        if error:
            raise RuntimeError(f"{self.label} failed to prepare {ref.namespace}/{ref.name}: {error}")
        return elapsed

    def unprepare(self, ref: dra_pb2.Claim) -> float:
        """Milliseconds of one NodeUnprepareResources."""
        t0 = time.perf_counter()
        answer = self.stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))
        elapsed = (time.perf_counter() - t0) * 1000
        error = answer.claims[ref.uid].error
        if error:
            raise RuntimeError(f"{self.label} failed to unprepare {ref.namespace}/{ref.name}: {error}")
        return elapsed

    def empty(self) -> float:
        """Milliseconds of a NodePrepareResources with no claims: the gRPC round trip and no work."""
        t0 = time.perf_counter()
        self.stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[]))
        return (time.perf_counter() - t0) * 1000


def _make_claims(
    kube: Kube, namespace: str, node: str, contender: Contender, devices: list[str], batches: dict[str, int]
) -> dict[str, list[dra_pb2.Claim]]:
    """Claims for each batch (name -> count), made in parallel; "pileup" ones with admin access."""

    def batch(name: str) -> list[dra_pb2.Claim]:
        made = _claims(
            kube,
            namespace,
            node,
            devices,
            batches[name],
            contender.driver,
            name,
            admin_access=name == "pileup",
        )
        return [_ref(claim) for claim in made]

    with ThreadPoolExecutor(len(batches)) as pool:
        return dict(zip(batches, pool.map(batch, batches), strict=True))


def _calls(
    kubelet: _Kubelet,
    contender: Contender,
    pid: int,
    first: Sequence[dra_pb2.Claim],
    burst: Sequence[dra_pb2.Claim],
    later_work: bool,
) -> None:
    """The rows every contender has: empty calls, `first` prepared, again, unprepared, then the bursts.

    `burst` holds BURSTS batches of BURST fresh claims, each prepared with CALLERS calls in flight
    (tests/bench/burstclient: grpc.aio, the least a Python client adds) and then unprepared.
    """
    empty = [kubelet.empty() for _ in range(EMPTY_CALLS)]
    contender.record("empty NodePrepareResources p50", _percentile(empty, 50))

    before = cpu_seconds(pid)
    timed = [kubelet.prepare(ref) for ref in first]
    cpu = cpu_seconds(pid) - before
    contender.record("first prepare p50", _percentile(timed, 50))
    contender.record("first prepare p99", _percentile(timed, 99))
    contender.record("CPU per first prepare", cpu * 1000 / len(first))
    if later_work:
        # What a prepare leaves for later counts too: dra-gpu writes each claim's status.devices
        # once the kubelet's calls pause (at most a second later); the Go driver writes none.
        time.sleep(LATER_WORK)
        cpu = cpu_seconds(pid) - before
        contender.record("CPU per first prepare, later work included", cpu * 1000 / len(first))
    repeat = [kubelet.prepare(ref) for ref in first]
    contender.record("repeat prepare p50", _percentile(repeat, 50))
    unprepare = [kubelet.unprepare(ref) for ref in first]
    contender.record("unprepare p50", _percentile(unprepare, 50))

    batches = [burst[start : start + BURST] for start in range(0, len(burst), BURST)]
    unprepare_all = lambda batch: [*map(kubelet.unprepare, batch)]  # noqa: E731
    bursts = burstclient.bursts(kubelet.target, batches, CALLERS, unprepare_all)
    walls = [one.wall for one in bursts]
    timings = [ms for one in bursts for ms in one.each]
    contender.record(f"{BURST} fresh claims from {CALLERS} callers, wall", statistics.median(walls))
    contender.record(f"{BURST} fresh claims from {CALLERS} callers, p99", _percentile(timings, 99))
    # What a harness that times one burst per run sees: the driver's first after its start (issue 57).
    contender.record(f"the first of the {BURSTS} bursts, wall", walls[0])
    # Before the pile-up, whose thousand prepares grow the Go test driver by its own bookkeeping:
    # it keeps every gRPC call it served, request and response, for its e2e tests (issue 47).
    contender.record(RSS_CALLS, _rss_kib(pid)[0] / 1024)


def _run(contender: Contender, cluster: ClusterInfo, kube: Kube, args: argparse.Namespace) -> None:
    """One run of one driver: every figure once."""
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    # Admin access lets the pile-up claims share devices, so 1000 of them fit on 128 devices.
    label = {"resource.kubernetes.io/admin-access": "true"}
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": label}})
    levels: tuple[int, ...] = args.pileup if contender.pileup else ()
    samples = PILEUP_SAMPLES * len(levels)
    with _running(contender, cluster, kube, args.devices) as (pid, startup):
        contender.record(START, startup)
        devices = _devices(kube, contender.driver, cluster.node_name)
        claims = _make_claims(
            kube,
            namespace,
            cluster.node_name,
            contender,
            devices,
            {
                "first": args.claims,
                "burst": BURST * BURSTS,
                "sample": samples,
                "pileup": max(levels, default=0),
            },
        )
        target = f"unix://{contender.dra_socket}"
        with grpc.insecure_channel(target) as channel:
            kubelet = _Kubelet(target, dra_pb2_grpc.DRAPluginStub(channel), contender.label)
            _calls(kubelet, contender, pid, claims["first"], claims["burst"], later_work=True)
            piled = iter(claims["pileup"])
            fresh = iter(claims["sample"])
            held: list[dra_pb2.Claim] = []
            for level in levels:
                while len(held) < level:
                    ref = next(piled)
                    kubelet.prepare(ref)
                    held.append(ref)
                timed = []
                for _ in range(PILEUP_SAMPLES):
                    ref = next(fresh)
                    timed.append(kubelet.prepare(ref))
                    kubelet.unprepare(ref)
                contender.record(f"prepare p50 with {level} claims prepared", _percentile(timed, 50))
        if levels:
            contender.record(RSS_RUN, _rss_kib(pid)[0] / 1024)
    kube.delete("v1", "Namespace", namespace)
    # The namespace controller deletes the run's claims (over 1,000 with the default pile-up) one
    # by one: waited for here, or the API server and etcd do that work during the next run's
    # measurements, which were always the Go driver's (it runs second) and never dra-gpu's first.
    wait_for(
        f"namespace {namespace} to be deleted",
        lambda: kube.get_or_none("v1", "Namespace", namespace) is None,
        timeout=NAMESPACE_DELETION,
    )


def _run_floor(floor: Contender, args: argparse.Namespace) -> None:
    """One run of a floor: the rows of `_run` that need no cluster, on fresh claims it never reads."""

    def fresh(count: int) -> list[dra_pb2.Claim]:
        uids = (str(uuid.uuid4()) for _ in range(count))
        return [dra_pb2.Claim(namespace="floor", name=f"floor-{uid[:8]}", uid=uid) for uid in uids]

    floor.dra_socket.unlink(missing_ok=True)
    with open(floor.log, "ab") as log:
        proc = subprocess.Popen(floor.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"{floor.label} did not start: see {floor.log}")
        target = f"unix://{floor.dra_socket}"
        with grpc.insecure_channel(target) as channel:
            kubelet = _Kubelet(target, dra_pb2_grpc.DRAPluginStub(channel), floor.label)
            _calls(kubelet, floor, proc.pid, fresh(args.claims), fresh(BURST * BURSTS), later_work=False)
    finally:
        # Its cue to stop.
        proc.stdin.close()
        _reap(proc)


#: Resident memory after the rows every contender has, and after the pile-up too.
RSS_CALLS, RSS_RUN = "RSS after the calls", "RSS after the run"
START = "start -> registered + slices published"
#: The driver's own part of the start: the kubelet registers a socket up to a second after it appears.
SOCKET = "start -> registration socket served"
#: Figure name -> unit; any figure not listed is in milliseconds.
UNITS = {START: "s", SOCKET: "s", RSS_CALLS: "MiB", RSS_RUN: "MiB"}


def report(ours: Contender, theirs: Contender | None) -> list[str]:
    """Every figure dra-gpu has, one line each, beside the Go driver's where it has it."""
    lines = []
    for name, values in ours.figures.items():
        reference = theirs.figures.get(name, []) if theirs is not None else []
        lines.append(figure_line(name, UNITS.get(name, "ms"), values, reference))
    return lines


PYTHON_FLOOR, GO_FLOOR = "python floor", "go floor"


def pair_report(left: Contender, right: Contender) -> list[str]:
    """The figures both contenders have, one line each: left's, right's, the ratio left / right.

    Under the names of the drivers' rows: the floors (Python's beside Go's), NVIDIA's plugin beside
    dra-gpu over the same fake NVML, the Go reference in make bench's turns beside it timed alone.
    """
    labels = (left.label, right.label)
    return [
        figure_line(name, UNITS.get(name, "ms"), values, right.figures[name], labels)
        for name, values in left.figures.items()
        if name in right.figures
    ]


def above_floor(driver: Contender, floor: Contender, name: str) -> list[float]:
    """A row's per-run values less its runtime's floor in the same run (the runs alternate)."""
    return [value - under for value, under in zip(driver.figures[name], floor.figures[name], strict=False)]


def floor_report(
    ours: Contender,
    theirs: Contender,
    python_floor: Contender,
    go_floor: Contender,
    others: Sequence[Contender],
) -> list[str]:
    """What each driver adds above its runtime's floor, per millisecond row all four have: the medians
    over the runs, their ratio (the goal of issue 57), and the per-run ratios' range (the noise).

    `others` are further dra-gpu runs (the baseline) shown beside, against the same Go figure."""
    lines = []
    for name in ours.figures:
        if UNITS.get(name, "ms") != "ms" or not all(
            name in c.figures for c in (theirs, python_floor, go_floor)
        ):
            continue
        go = above_floor(theirs, go_floor, name)
        parts = []
        for driver in (ours, *(o for o in others if name in o.figures)):
            added = above_floor(driver, python_floor, name)
            part = f"{driver.label} +{_amount(statistics.median(added), 'ms')}"
            per_run = [a / g for a, g in zip(added, go, strict=False) if g > 0]
            if statistics.median(go) > 0:
                part += f" ({statistics.median(added) / statistics.median(go):.2f}x"
                part += f", per run {min(per_run):.2f}-{max(per_run):.2f}x)" if per_run else ")"
            parts.append(part)
        lines.append(
            f"{name}: " + ", ".join(parts) + f"; {theirs.label} +{_amount(statistics.median(go), 'ms')}"
        )
    return lines


#: What the fakes cost NVIDIA's plugin here, measured apart in each of its runs.
FAKE_NVML_START = "the fake NVML alone: NVIDIA's start-up NVML calls"
FAKE_NVML_RSS = "the fake NVML alone: peak RSS"
FAKE_SMI = "the fake nvidia-smi: the two calls of NVIDIA's unprepare"
UNITS |= {FAKE_NVML_START: "s", FAKE_NVML_RSS: "MiB"}
#: Tries of each fake's cost per run, the figure their median.
FAKES_TIMED = 5
#: NVIDIA's rows that the fakes weigh on, and what of them each is.
FAKES_IN = {START: FAKE_NVML_START, RSS_CALLS: FAKE_NVML_RSS, "unprepare p50": FAKE_SMI}
#: The program of no Python that loads the fake NVML and makes NVIDIA's start-up calls.
NVML_START_SOURCE = Path(__file__).with_name("nvmlstart.c")


def build_nvml_start(directory: Path) -> Path | None:
    """tests/bench/nvmlstart.c compiled against the fake NVML's nvml.h; None (and why) if it cannot be."""
    program = directory / "nvmlstart"
    try:
        include = nvml_header().parent
    except BuildError as err:
        print(f"the fake NVML's cost cannot be measured apart: {err}")
        return None
    done = subprocess.run(
        ["gcc", "-O2", "-Wall", "-I", str(include), "-o", str(program), str(NVML_START_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        print(f"the fake NVML's cost cannot be measured apart: gcc failed:\n{done.stderr}")
        return None
    return program


def fakes_cost(nvidia: Contender, node: FakeNode, program: Path) -> None:
    """Measure what the fakes cost NVIDIA's plugin, apart from its rows.

    The fake NVML answers from a Python stand-in, so NVIDIA's Go process carries an interpreter: a
    program of no Python making the plugin's start-up calls over the same node measures its time and
    memory. Its unprepare runs nvidia-smi twice, which on the fake node is a Python process each:
    they are run here as the plugin runs them (the fake NVML preloaded). Each is the median of
    FAKES_TIMED tries. They are printed beside the rows, never subtracted from them: measured apart,
    the fake nvidia-smi's median once came out above the unprepare's (a negative difference).
    """
    starts, peaks, smis = [], [], []
    fake = node.config.fake_gpus()
    gpu = fake.uuid(fake.device_by_index(0))
    smi = node.driver_root / "usr/bin/nvidia-smi"
    env = {**os.environ, "LD_PRELOAD": str(node.library)}
    for _ in range(FAKES_TIMED):
        started = time.monotonic()
        done = subprocess.run(
            [str(program), str(node.library)], capture_output=True, text=True, timeout=300, check=True
        )
        starts.append(time.monotonic() - started)
        peaks.append(int(done.stdout.split()[2]) / 1024)
        started = time.monotonic()
        for args in (["-i", gpu, "-c", "DEFAULT"], ["compute-policy", "-i", gpu, "--set-timeslice", "0"]):
            subprocess.run([str(smi), *args], env=env, capture_output=True, timeout=60, check=True)
        smis.append((time.monotonic() - started) * 1000)
    nvidia.record(FAKE_NVML_START, statistics.median(starts))
    nvidia.record(FAKE_NVML_RSS, statistics.median(peaks))
    nvidia.record(FAKE_SMI, statistics.median(smis))


def fakes_report(nvidia: Contender) -> list[str]:
    """Each row the fakes weigh on, NVIDIA's figure and, beside it, the fakes' part measured apart.

    The parts, not a difference: two medians taken apart do not subtract (one such difference came
    out at -24.7 ms), so what the plugin itself spends lies between 0 and its row's figure.
    """
    lines = []
    for row, part in FAKES_IN.items():
        if row in nvidia.figures and part in nvidia.figures:
            unit = UNITS.get(row, "ms")
            whole, fakes = spread(nvidia.figures[row]), spread(nvidia.figures[part])
            line = (
                f"{row}: {nvidia.label} {_described(whole, unit)}; the fakes measured apart "
                f"{_described(fakes, UNITS.get(part, 'ms'))} ({part})"
            )
            if fakes.median > whole.median:
                # At its chart's defaults (no TimeSlicingSettings) its unprepare runs no nvidia-smi.
                line += ": more than the row, so not all of it is in the row"
            lines.append(line)
    return lines


def nvidia_report(ours: Contender, nvidia: Contender, lifted: Contender | None) -> list[str]:
    """Each row both drivers have: dra-gpu's, NVIDIA's at its chart's defaults (and the ratio), and
    NVIDIA's with its API client limit lifted (and that ratio) where that column ran."""
    lines = []
    for line in pair_report(ours, nvidia):
        name = line.split(": ", 1)[0]
        if lifted is not None and name in lifted.figures:
            other = spread(lifted.figures[name])
            line += f"; {lifted.label} {_described(other, UNITS.get(name, 'ms'))}"
            if other.median > 0:
                line += f", ratio {spread(ours.figures[name]).median / other.median:.2f}x"
        lines.append(line)
    return lines


def interpreter() -> str:
    """The Python the driver runs under (DriverProcess starts it with this one): version and path."""
    return f"Python {platform.python_version()} ({sys.executable})"


def _go_contender(cluster: ClusterInfo, devices: int, cdi: Path) -> Contender | None:
    try:
        binary = ensure_go_dra_driver()
    except BuildError as err:
        print(f"the Go reference driver could not be built, so dra-gpu's figures stand alone: {err}")
        return None
    return _go(cluster, binary, devices, cdi)


@contextmanager
def cdi_dirs(*names: str) -> Iterator[tuple[Path, ...]]:
    """A CDI directory per name on tmpfs, as /var/run/cdi is on a node (dra-gpu skips fsync there)."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and is_tmpfs(shm) else None
    if base is None:
        print("no tmpfs at /dev/shm: CDI specs go to the disk, and dra-gpu fsyncs them there")
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-", dir=base) as tmp:
        dirs = tuple(Path(tmp, name) for name in names)
        for directory in dirs:
            directory.mkdir()
        yield dirs


def alternate(contenders: list[Contender], runs: int, run: Callable[[Contender], None]) -> list[Contender]:
    """Run each contender `runs` times in turns, every other run backwards; one that fails is dropped."""
    for number in range(1, runs + 1):
        # Every other run in the reverse order, so that no contender always follows the same one.
        for contender in list(contenders if number % 2 else reversed(contenders)):
            print(f"run {number}/{runs}: {contender.label}", flush=True)
            try:
                run(contender)
            except (RuntimeError, OSError, grpc.RpcError, WaitTimeoutError) as err:
                if contender.label == DRA_GPU:
                    raise
                print(f"  {contender.label} dropped from the comparison: {err}", flush=True)
                contenders.remove(contender)
    return contenders


def _floors(directory: Path) -> tuple[Contender, Contender] | None:
    """The Python and Go floors, or None (and why) when the Go floor cannot be built."""
    try:
        go = ensure_grpc_floor()
    except BuildError as err:
        print(f"the Go floor could not be built, so the floors are left out: {err}")
        return None
    python_socket, go_socket = directory / "python-floor.sock", directory / "go-floor.sock"
    python_args = [sys.executable, "-m", "tests.bench.grpcfloor", "sync", str(python_socket)]
    return (
        Contender(PYTHON_FLOOR, "", python_args, python_socket, directory / "python-floor.log", floor=True),
        Contender(GO_FLOOR, "", [str(go), str(go_socket)], go_socket, directory / "go-floor.log", floor=True),
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        type=int,
        default=int(os.environ.get("BENCH_RUNS", "3")),
        help="runs of each driver ($BENCH_RUNS)",
    )
    parser.add_argument(
        "--devices", type=int, default=128, help="devices of each driver (fake GPUs for dra-gpu)"
    )
    parser.add_argument(
        "--claims", type=int, default=100, help="claims prepared one by one and held (at most --devices)"
    )
    parser.add_argument(
        "--pileup", type=parse_levels, default=(0, 64, 1000), help="prepared claims, e.g. 0,64,1000"
    )
    parser.add_argument("--no-go", action="store_true", help="leave out the Go reference and the floors")
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the floors (a DRA server doing no work, Python and Go)",
    )
    parser.add_argument(
        "--no-nvidia",
        action="store_true",
        help="leave out NVIDIA's plugin and dra-gpu over the fake NVML beside it",
    )
    parser.add_argument(
        "--nvidia-lifted-qps",
        type=int,
        default=NVIDIA_LIFTED_QPS,
        help="the API rate limit of NVIDIA's second column (burst twice it); 0 leaves that column out "
        "(its first column is always at its chart's 5, burst 10)",
    )
    parser.add_argument(
        "--reference-alone",
        action="store_true",
        help="also time the Go reference alone by a minimal client (tests/bench/bench_reference.py) "
        "in the same turns, and print its figures beside make bench's (issue 47)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run dra-gpu from this checkout (e.g. a git worktree of main with dra/pb generated) in "
        "the same turns, and print this tree's figures beside it",
    )
    args = parser.parse_args()
    if not 0 < args.claims <= args.devices:
        # They are held prepared together, one device each (dra-gpu refuses a device twice).
        parser.error(f"--claims must be 1 to --devices ({args.devices}), not {args.claims}")
    if args.reference_alone and args.no_go:
        parser.error("--reference-alone times the Go reference: it cannot go with --no-go")
    if args.nvidia_lifted_qps < 0:
        parser.error(
            f"--nvidia-lifted-qps must be 0 (no lifted column) or more, not {args.nvidia_lifted_qps}"
        )
    if args.baseline is not None:
        try:
            args.baseline_tree = baseline_tree(args.baseline.resolve())
        except ValueError as err:
            parser.error(f"--baseline: {err}")
    return args


def _still(contender: Contender | None, contenders: list[Contender]) -> Contender | None:
    """The contender if it was not dropped from the comparison."""
    return contender if any(c is contender for c in contenders) else None


def main() -> None:
    """Run the comparison and print the figures."""
    args = _arguments()
    # Here, not at the top: it builds on this module.
    from tests.bench.bench_reference import alone, time_alone

    node: FakeNode | None = None
    nvml_start: Path | None = None
    #: The 1-minute load average as each run began: every figure carries the machine's load.
    loads: list[float] = []

    def run(contender: Contender) -> None:
        loads.append(os.getloadavg()[0])
        print(f"  load average {loads[-1]:.2f}", flush=True)
        if contender.floor:
            _run_floor(contender, args)
        elif contender.alone:
            time_alone(contender, cluster, kube, args.claims, args.devices)
        else:
            _run(contender, cluster, kube, args)
            if contender.label == NVIDIA_LABEL and node is not None and nvml_start is not None:
                fakes_cost(contender, node, nvml_start)

    for tree in (REPO, *([args.baseline] if args.baseline is not None else [])):
        compile_tree(tree)
    with (
        running_cluster() as cluster,
        cdi_dirs("cdi", "cdi-go", "cdi-alone", "cdi-nvml", "cdi-nvidia", "cdi-baseline") as dirs,
    ):
        cdi, cdi_go, cdi_alone, cdi_nvml, cdi_nvidia, cdi_baseline = dirs
        kube = Kube(cluster.kubeconfig)
        ours = _dra_gpu(cluster, args.devices, cdi)
        theirs = None if args.no_go else _go_contender(cluster, args.devices, cdi_go)
        floors = None if args.no_floor or args.no_go else _floors(cdi.parent)
        baseline = None
        if args.baseline is not None:
            baseline = _dra_gpu(cluster, args.devices, cdi_baseline, BASELINE, args.baseline.resolve())
        by_itself = None
        if theirs is not None and args.reference_alone:
            by_itself = alone(cluster, Path(theirs.args[0]), args.devices, cdi_alone)
        ours_nvml = nvidia = lifted = None
        node = None if args.no_nvidia else _fake_node(cluster, args.devices)
        if node is not None:
            nvidia = _nvidia(cluster, node, cdi_nvidia)
            if nvidia is not None and args.nvidia_lifted_qps > 0:
                lifted = _nvidia(cluster, node, cdi_nvidia, args.nvidia_lifted_qps)
            ours_nvml = _dra_gpu_nvml(cluster, node, cdi_nvml) if nvidia is not None else None
            nvml_start = build_nvml_start(Path(cluster.run_dir)) if nvidia is not None else None
        contenders = alternate(
            [
                c
                for c in (ours, baseline, theirs, ours_nvml, nvidia, lifted, *(floors or ()), by_itself)
                if c is not None
            ],
            args.runs,
            run,
        )
        kube.close()
    theirs, by_itself, nvidia, lifted, baseline = (
        _still(c, contenders) for c in (theirs, by_itself, nvidia, lifted, baseline)
    )
    if floors is not None and not all(_still(f, contenders) for f in floors):
        floors = None
    print(
        f"dra-gpu beside Kubernetes' DRA test driver ({kubernetes_version()}), {args.devices} devices each, "
        f"{args.runs} alternating runs, median (range) of the per-run figures; ratio = dra-gpu / go"
    )
    # How the interpreter was built moves every dra-gpu row (docs/testing.md, seventh round).
    print(f"dra-gpu ran on {interpreter()}")
    if loads:
        load = spread(loads)
        print(
            f"load average (1 min) as each run began: median {load.median:.2f}, "
            f"{load.low:.2f} to {load.high:.2f}"
        )
    print(
        "API client limits: dra-gpu none (it has no client-side limit); go reference lifted "
        "(--kube-api-qps=100000 --kube-api-burst=100000)"
    )
    for line in report(ours, theirs):
        print(line)
    if floors is not None:
        print(
            "the floor: a DRA server that does no work, on each runtime (tests/bench/grpcfloor.py on "
            "grpcio's synchronous server; deploy/local/floorbin in Go), the same client, "
            f"{args.runs} alternating runs; no driver goes under its runtime's floor"
        )
        for line in pair_report(*floors):
            print(line)
        if theirs is not None:
            print(
                "above the floor: each row less its runtime's floor in the same run, median over the runs; "
                "ratio = dra-gpu's / the Go driver's (per run: the range of each run's ratio)"
            )
            for line in floor_report(ours, theirs, *floors, [baseline] if baseline is not None else []):
                print(line)
    if ours_nvml is not None and nvidia is not None:
        print(
            f"NVIDIA's gpu-kubelet-plugin ({NVIDIA.version()}) beside dra-gpu, both over the fake NVML of "
            f"one fake node ({args.devices} {FAKE_MODEL}), the same client and claims, {args.runs} "
            "alternating runs, no pile-up; ratio = dra-gpu / nvidia. NVIDIA's feature gates: none, its "
            "chart's default (no row needs one: whole GPUs, no opaque config). Its API client limits: "
            f"'{NVIDIA_LABEL}' {nvidia_limits(0)}"
            + (f"; '{NVIDIA_LIFTED}' {nvidia_limits(args.nvidia_lifted_qps)}" if lifted is not None else "")
        )
        for line in nvidia_report(ours_nvml, nvidia, lifted):
            print(line)
        print(
            "what the fakes cost NVIDIA's plugin here, measured apart in each of its runs: the fake NVML "
            "answers from a Python stand-in, so its Go process carries an interpreter (tests/bench/"
            "nvmlstart.c makes its start-up NVML calls over the same node from a program of no Python); "
            "its unprepare runs nvidia-smi twice, a Python process each on the fake node. Printed as "
            "parts, never subtracted: medians taken apart do not subtract"
        )
        for line in fakes_report(nvidia):
            print(line)
    if baseline is not None:
        print(
            f"dra-gpu from this tree beside the baseline, {args.baseline_tree}, both in these turns, "
            f"{args.runs} alternating runs; ratio = this tree / baseline"
        )
        for line in pair_report(ours, baseline):
            print(line)
    if theirs is not None and by_itself is not None:
        print(
            "the go reference in these turns beside the same driver timed alone by a minimal client "
            "(tests/bench/bench_reference.py: its own claims and client, no pile-up), "
            f"{args.runs} alternating runs; ratio = make bench / alone (issue 47)"
        )
        for line in pair_report(theirs, by_itself):
            print(line)


if __name__ == "__main__":
    main()
