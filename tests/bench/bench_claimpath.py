"""The claim path's CPU against the real API server, this tree beside a baseline checkout (issue 44).

    python -m tests.bench.bench_claimpath --baseline DIR [--rounds 6] [--claims 100]

What `make bench`'s CPU rows hold apart from gRPC: each round starts a process per checkout (this
one and DIR, a git worktree with dra/pb generated, in turns that alternate), which builds the
plugin's DraService over the real DeviceState (checkpoint on disk, CDI specs on tmpfs, 128 fake
GPUs), the real KubeClient to the local cluster's API server, the claim-status writer on its
thread and the plugin's logging, and calls it directly: `--claims` fresh claims prepared one by
one (CPU per prepare, then with the status writes of the lull after them), unprepared one by
one, then 32 fresh claims from 8 threads at once (wall, CPU and thread switches per claim: under
the GIL every system call in a burst can be one). Medians over the rounds, the range, and this
tree / baseline.

CPU is the process's, in nanoseconds (time.process_time). This machine's figures wander by a
factor of two between runs minutes apart; a lever of a few percent needs many rounds, and the
burst rows are the steadiest.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localcluster.kube import Kube

DRIVER = "bench.dra-gpu.test"
DEVICES = 128
#: Claims prepared before the measurements (imports, first connections, caches).
WARM = 10
CALLERS, BURST = 8, 32
#: Seconds for the claim-status writer's lull and writes after the sequential prepares.
LATER = 1.5
FIGURES = {
    "prepare": "CPU per prepare (ms)",
    "later": "CPU per prepare, status writes included (ms)",
    "unprepare": "CPU per unprepare (ms)",
    "burst_wall": f"{BURST} claims from {CALLERS} threads, wall (ms)",
    "burst_cpu": f"{BURST} claims from {CALLERS} threads, CPU (ms)",
    "burst_switches": f"{BURST} claims from {CALLERS} threads, thread switches per claim",
}
REPO = Path(__file__).resolve().parents[2]


def _switches() -> int:
    """Context switches of this process's threads so far, voluntary and not (proc(5))."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        # A thread may end between the listing and the read.
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/self/task/{task}/status").read_text().splitlines():
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
    return total


class _Profiles:
    """Per-thread cProfile on each thread's own CPU clock (time.thread_time), merged per phase.

    A thread's waits (the API server's answer, the fsync, the GIL) cost it no CPU, so what the
    profile shows is where the process's CPU went, by function. The profiler's own calls roughly
    double the CPU; the figures of a profiled round are not the benchmark's.
    """

    def __init__(self, directory: str | None) -> None:
        self._directory = Path(directory) if directory else None
        self._by_thread: dict[int, cProfile.Profile] = {}

    def run(self, call: Callable[[Any], None], arg: Any) -> None:
        """`call(arg)` under the calling thread's profiler (a plain call without --profile)."""
        if self._directory is None:
            call(arg)
            return
        profile = self._by_thread.setdefault(threading.get_ident(), cProfile.Profile(time.thread_time))
        profile.runcall(call, arg)

    def dump(self, phase: str) -> None:
        """Write the phase's profile (all threads') to DIR/<phase>.pstats, and start afresh."""
        if self._directory is None or not self._by_thread:
            return
        profiles = list(self._by_thread.values())
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        stats.dump_stats(self._directory / f"{phase}.pstats")
        self._by_thread.clear()


def child(
    kubeconfig: str, namespace: str, node: str, uids: list[str], profile_dir: str | None = None
) -> dict[str, float]:
    """One checkout's figures (run with the checkout as the working directory: its dra); with
    `profile_dir`, each phase's profile there (prepare, unprepare, burst)."""
    # The state's directory and the CDI directory (tmpfs, as on a node) go with the round.
    with (
        tempfile.TemporaryDirectory(prefix="bench-claimpath-") as root,
        tempfile.TemporaryDirectory(prefix="bench-claimpath-", dir="/dev/shm") as cdi,
    ):
        return _measured(kubeconfig, namespace, node, uids, profile_dir, Path(root), Path(cdi))


def _measured(
    kubeconfig: str,
    namespace: str,
    node: str,
    uids: list[str],
    profile_dir: str | None,
    root: Path,
    cdi: Path,
) -> dict[str, float]:
    sys.path.insert(0, os.getcwd())
    from dra.adapters.checkpoint import CheckpointStore
    from dra.adapters.kube import KubeClient
    from dra.adapters.nodefiles import CdiStore
    from dra.daemon import logs
    from dra.fakegpus.library import FakeGpuLibrary
    from dra.fakegpus.profiles import parse_profile
    from dra.gpu.discovery import discover
    from dra.kubeletplugin.claimstatus import ClaimStatusWriter
    from dra.kubeletplugin.service import DraService
    from dra.kubeletplugin.state import DeviceState
    from dra.pb.dra.v1 import dra_pb2

    # As the plugin logs, to stderr (a pipe to the parent): a prepare's line is part of its cost.
    logs.setup("info", "text")
    profile = parse_profile({"gpus": [{"model": "h100-sxm5-80gb", "count": DEVICES}]}, "bench")
    inventory = discover(FakeGpuLibrary(profile, node))
    state = DeviceState(
        DRIVER, node, inventory, CdiStore(cdi, DRIVER), CheckpointStore(root / "checkpoint.json")
    )
    kube = KubeClient(kubeconfig)
    status = ClaimStatusWriter(kube, DRIVER, node)
    threading.Thread(target=status._work, daemon=True).start()
    service = DraService(DRIVER, node, state, kube, status)
    # The service reads nothing of the gRPC context.
    context: Any = None
    refs = [dra_pb2.Claim(namespace=namespace, name=f"c-{i}", uid=uid) for i, uid in enumerate(uids)]

    def prepare(ref: Any) -> None:
        answer = service.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref]), context)
        if answer.claims[ref.uid].error:
            raise RuntimeError(answer.claims[ref.uid].error)

    def unprepare(ref: Any) -> None:
        service.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]), context)

    profiles = _Profiles(profile_dir)
    warm, measured = refs[:WARM], refs[WARM:]
    for ref in warm:
        prepare(ref)
    time.sleep(LATER)
    started = time.process_time()
    for ref in measured:
        profiles.run(prepare, ref)
    prepared = time.process_time()
    profiles.dump("prepare")
    time.sleep(LATER)
    later = time.process_time()
    for ref in measured:
        profiles.run(unprepare, ref)
    unprepared = time.process_time()
    profiles.dump("unprepare")
    time.sleep(LATER)
    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(lambda _: None, range(CALLERS)))  # the threads started before the clock
        switches, cpu, wall = _switches(), time.process_time(), time.perf_counter()
        list(pool.map(functools.partial(profiles.run, prepare), measured[:BURST]))
        wall, cpu, switches = time.perf_counter() - wall, time.process_time() - cpu, _switches() - switches
    profiles.dump("burst")
    count = len(measured)
    return {
        "prepare": (prepared - started) * 1000 / count,
        "later": (later - started) * 1000 / count,
        "unprepare": (unprepared - later) * 1000 / count,
        "burst_wall": wall * 1000,
        "burst_cpu": cpu * 1000,
        "burst_switches": switches / BURST,
    }


def _round(
    kube: Kube, kubeconfig: str, node: str, tree: Path, claims: int, profile: Path | None = None
) -> dict[str, float]:
    """Fresh claims in a namespace of their own, and one checkout's process over them (profiled into
    the directory `profile` when given)."""
    from tests.bench.bench_driver import _claims

    namespace = f"claimpath-{uuid.uuid4().hex[:6]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    devices = [f"gpu-{i}" for i in range(DEVICES)]
    made = _claims(kube, namespace, node, devices, WARM + claims, DRIVER, "c")
    uids = [str(claim["metadata"]["uid"]) for claim in made]  # type: ignore[index]
    # The file run as a script: its directory, not this checkout, is first on the child's path.
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kubeconfig, namespace, node]
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        command.append(str(profile.resolve()))
    done = subprocess.run(command, input=json.dumps(uids), capture_output=True, text=True, cwd=tree)
    if done.returncode:
        raise RuntimeError(f"{tree}: {done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    kube.delete("v1", "Namespace", namespace)
    return figures


def main() -> None:
    """Both checkouts' rounds, then the medians side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of dra-gpu with dra/pb (required)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds, each checkout once per round")
    parser.add_argument("--claims", type=int, default=100, help="claims prepared one by one per round")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write each round's cProfile (per-thread CPU clock) of the prepares, unprepares and burst "
        "under DIR/<checkout>-<round>/; the figures of profiled rounds carry the profiler's cost",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kubeconfig, namespace, node, *profile_dir = args.child
        uids = json.loads(sys.stdin.read())
        print(json.dumps(child(kubeconfig, namespace, node, uids, *profile_dir)))
        return
    # Here, not at the top: a child imports the dra of its checkout, and nothing that imports this one's.
    from localcluster.cluster import running_cluster
    from localcluster.kube import Kube

    from tests.bench.bench_compare import baseline_tree

    if args.baseline is None:
        parser.error("--baseline is required")
    if not BURST <= args.claims <= DEVICES - WARM:
        parser.error(f"--claims must be {BURST} to {DEVICES - WARM}")
    try:
        described = baseline_tree(args.baseline.resolve())
    except ValueError as err:
        parser.error(f"--baseline: {err}")
    trees = {"this tree": REPO, "baseline": args.baseline.resolve()}
    results: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with running_cluster() as cluster:
        kube = Kube(cluster.kubeconfig)
        for turn in range(args.rounds):
            order = list(trees) if turn % 2 == 0 else list(trees)[::-1]
            for label in order:
                where = None
                if args.profile is not None:
                    where = args.profile / f"{label.replace(' ', '-')}-{turn + 1}"
                results[label].append(
                    _round(kube, cluster.kubeconfig, cluster.node_name, trees[label], args.claims, where)
                )
            print(f"round {turn + 1}/{args.rounds}", flush=True)
        kube.close()
    print(f"this tree beside the baseline ({described}), {args.rounds} alternated rounds, median (range)")
    for key, title in FIGURES.items():
        ours, theirs = ([run[key] for run in results[label]] for label in trees)
        mine, base = statistics.median(ours), statistics.median(theirs)
        print(
            f"{title}: this tree {mine:.3g} ({min(ours):.3g}-{max(ours):.3g}), "
            f"baseline {base:.3g} ({min(theirs):.3g}-{max(theirs):.3g}), ratio {mine / base:.2f}x"
        )


if __name__ == "__main__":
    main()
