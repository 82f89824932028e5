"""The DRA service's server models side by side, and the floor under them (issue 29).

    python -m tests.bench.bench_grpcserver [--runs 3] [--claims 200] [--devices 128] [--modes plugin,sync,...]

The driver's per-call cost without the API server: each server runs in a process of its own
on a unix socket, with the real DeviceState (checkpoint with its fsync in a temporary directory,
CDI specs on tmpfs as on a node) and the claim GET answered from memory, so what differs is only
how a call reaches the state and comes back. `plugin` is the plugin as it serves (DraService and
PluginServer: grpcio's synchronous server, each call on a thread of its pool, with metrics and
events); `sync` is the bare handler on the same kind of server (the state called directly, no
metrics), what the plugin's serving costs on top of it. The grpc.aio models measured before the
switch (issue 44) are in docs/testing.md.

The floors do no work at all, so they are what no driver on their runtime goes under:
`floor-aio` and `floor-sync` (tests/bench/grpcfloor.py: grpc.aio on uvloop, grpcio's synchronous
server) and `floor-go` (deploy/local/floorbin/grpcfloor, built into the cache on first use, on
the grpc-go and protobuf versions of Kubernetes' DRA test driver). `make bench` measures the
same two floors beside the drivers (bench_compare).

The client plays the kubelet from this process: empty calls, a prepare then an unprepare per
fresh claim, and 32 fresh claims with 8 in flight; then the server's RSS. The servers run in
turns, alternated, `--runs` of each.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import anyio
import grpc

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core.plan import read_allocation
from dra.daemon.health import HealthTracker
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.server import PluginServer
from dra.kubeletplugin.service import DraService, HealthService, _response
from dra.kubeletplugin.state import DeviceState
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench import burstclient

DRIVER = "bench.dra-gpu.test"
NODE = "bench-node"
NAMESPACE = "bench"
FAKE_MODEL = "h100-sxm5-80gb"
CALLERS, BURST, BURSTS = 8, 32, 5
MODES = ("plugin", "sync")
#: Each figure's unit; the others are in milliseconds (CPU: per prepare and unprepare pair).
UNITS = {"RSS": "MiB"}
#: Servers that do no work: the per-call floor of gRPC on each runtime.
FLOORS = ("floor-aio", "floor-sync", "floor-go")


def _claim(name: str) -> dict[str, Any]:
    """The allocated claim the API server would return: `name` is `<device>.<uid>`."""
    device, uid = name.split(".", 1)
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": NAMESPACE, "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": {}}},
    }


class _MemoryClaims:
    """The claim GET from memory (ClaimSource), so that neither server waits on an API server."""

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return _claim(name)

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        return None


def _state(root: Path, cdi: Path, devices: int) -> DeviceState:
    profile = parse_profile({"gpus": [{"model": FAKE_MODEL, "count": devices}]}, "bench")
    inventory = discover(FakeGpuLibrary(profile, NODE))
    return DeviceState(
        DRIVER, NODE, inventory, CdiStore(cdi, DRIVER), CheckpointStore(root / "checkpoint.json")
    )


class _SyncDra(dra_pb2_grpc.DRAPluginServicer):
    """The bare handler: each call handled on one of the pool's threads, the state called directly."""

    def __init__(self, state: DeviceState) -> None:
        self._state = state

    def NodePrepareResources(  # noqa: N802
        self, request: dra_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_pb2.NodePrepareResourcesResponse:
        answers = {}
        for ref in request.claims:
            allocation = read_allocation(_claim(ref.name), ref.uid, DRIVER)
            answers[ref.uid] = _response(self._state.prepare(allocation))
        return dra_pb2.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(  # noqa: N802
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        for ref in request.claims:
            self._state.unprepare(ref.uid)
        return dra_pb2.NodeUnprepareResourcesResponse(
            claims={ref.uid: dra_pb2.NodeUnprepareResourceResponse() for ref in request.claims}
        )


def _serve_sync(root: Path, cdi: Path, devices: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=CALLERS))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(_SyncDra(_state(root, cdi, devices)), server)
    server.add_insecure_port(f"unix://{root / 'dra.sock'}")
    server.start()
    print("ready", flush=True)
    sys.stdin.read()
    server.stop(None)


def _serve_plugin(root: Path, cdi: Path, devices: int) -> None:
    state = _state(root, cdi, devices)
    dra = DraService(DRIVER, NODE, state, _MemoryClaims())
    server = PluginServer(root / "kubelet", DRIVER, dra, HealthService(NODE, HealthTracker(state.inventory)))
    server.start()
    link = root / "dra.sock"
    link.symlink_to(server.dra_socket)
    print("ready", flush=True)
    sys.stdin.read()
    anyio.run(functools.partial(server.stop, drain=1, grace=0))


def _timed(call: Callable[..., object], *args: object) -> float:
    started = time.perf_counter()
    call(*args)
    return (time.perf_counter() - started) * 1000


def _measure(mode: str, claims: int, devices: int) -> dict[str, float]:
    """Start one server, make the calls, the figures (ms; CPU ms per prepare and unprepare pair)."""
    # Here, not at the top: bench_driver needs the local-cluster tooling, which the served process lacks.
    from tests.bench.bench_compare import cdi_dirs
    from tests.bench.bench_driver import _rss_kib, cpu_seconds

    with (
        tempfile.TemporaryDirectory(prefix="bench-grpcserver-", dir="/tmp") as tmp,
        cdi_dirs("cdi") as (cdi,),
    ):
        root = Path(tmp)
        socket = str(root / "dra.sock")
        if mode == "floor-go":
            from localcluster.binaries import ensure_grpc_floor

            command = [str(ensure_grpc_floor()), socket]
        elif mode in FLOORS:
            command = [sys.executable, "-m", "tests.bench.grpcfloor", mode.removeprefix("floor-"), socket]
        else:
            serve = ["--serve", mode, "--root", tmp, "--cdi", str(cdi), "--devices", str(devices)]
            command = [sys.executable, "-m", "tests.bench.bench_grpcserver", *serve]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stdin is not None
        assert process.stdout.readline().strip() == "ready"
        try:
            with grpc.insecure_channel(f"unix://{root / 'dra.sock'}") as channel:
                stub = dra_pb2_grpc.DRAPluginStub(channel)
                empty_request = dra_pb2.NodePrepareResourcesRequest()
                empty = [_timed(stub.NodePrepareResources, empty_request) for _ in range(claims)]
                prepare, unprepare = [], []
                cpu = cpu_seconds(process.pid)
                for ref in _refs(claims, devices):
                    prepare.append(_timed(_prepare, stub, ref))
                    undo = dra_pb2.NodeUnprepareResourcesRequest(claims=[ref])
                    unprepare.append(_timed(stub.NodeUnprepareResources, undo))
                cpu_pair = (cpu_seconds(process.pid) - cpu) * 1000 / claims

                def unprepare_all(batch: Sequence[dra_pb2.Claim]) -> None:
                    stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=batch))

                # The two clients in turns, BURSTS each, on the same server (the figures their medians).
                futures_walls, aio_walls = [], []
                for _ in range(BURSTS):
                    batch = _refs(BURST, devices)
                    futures_walls.append(_futures_burst(stub, batch))
                    unprepare_all(batch)
                    target = f"unix://{root / 'dra.sock'}"
                    aio = burstclient.bursts(target, [_refs(BURST, devices)], CALLERS, unprepare_all)
                    aio_walls.append(aio[0].wall)
                rss = _rss_kib(process.pid)[0] / 1024
        finally:
            process.stdin.close()
            process.wait(10)
    return {
        "empty p50": statistics.median(empty),
        "prepare p50": statistics.median(prepare),
        "prepare p99": statistics.quantiles(prepare, n=100)[98],
        "unprepare p50": statistics.median(unprepare),
        "CPU per prepare+unprepare": cpu_pair,
        "burst wall": statistics.median(aio_walls),
        "burst wall, grpcio futures client": statistics.median(futures_walls),
        "RSS": rss,
    }


def _futures_burst(stub: dra_pb2_grpc.DRAPluginStub, refs: list[dra_pb2.Claim]) -> float:
    """The burst's wall ms from grpcio's synchronous channel, a window of CALLERS futures (the client
    `make bench` had until issue 57), beside tests/bench/burstclient's: what a client adds."""
    started = time.perf_counter()
    pending: list[tuple[dra_pb2.Claim, Any]] = []
    for ref in refs:
        if len(pending) == CALLERS:
            _check(pending[0][1].result(), pending[0][0])
            pending.pop(0)
        call = stub.NodePrepareResources.future(dra_pb2.NodePrepareResourcesRequest(claims=[ref]))
        pending.append((ref, call))
    for ref, call in pending:
        _check(call.result(), ref)
    return (time.perf_counter() - started) * 1000


def _refs(count: int, devices: int) -> list[dra_pb2.Claim]:
    """Fresh claims, one device each, round robin."""
    uids = [str(uuid.uuid4()) for _ in range(count)]
    return [
        dra_pb2.Claim(namespace=NAMESPACE, name=f"gpu-{i % devices}.{uid}", uid=uid)
        for i, uid in enumerate(uids)
    ]


def _prepare(stub: dra_pb2_grpc.DRAPluginStub, ref: dra_pb2.Claim) -> None:
    _check(stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ref])), ref)


def _check(answer: dra_pb2.NodePrepareResourcesResponse, ref: dra_pb2.Claim) -> None:
    error = answer.claims[ref.uid].error
    if error:
        raise AssertionError(f"{ref.name}: {error}")


def alternated(
    modes: tuple[str, ...], runs: int, claims: int, devices: int
) -> dict[str, list[dict[str, float]]]:
    """Each server `runs` times in turns (the order reversed every other run): each run's figures."""
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for run in range(runs):
        for mode in modes if run % 2 == 0 else tuple(reversed(modes)):
            load = os.getloadavg()[0]
            results[mode].append(_measure(mode, claims, devices))
            print(
                f"run {run + 1} {mode} (load {load:.1f}): "
                + ", ".join(f"{k} {v:.2f}" for k, v in results[mode][-1].items()),
                flush=True,
            )
    return results


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(text.split(","))
    unknown = [mode for mode in modes if mode not in MODES + FLOORS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; known: {', '.join(MODES + FLOORS)}")
    return modes


def main() -> None:
    """Run the servers in turns and print median (range) of each figure."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--devices", type=int, default=128)
    parser.add_argument(
        "--modes", type=_modes, default=MODES, help="servers, comma-separated (default: both)"
    )
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--cdi", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve = _serve_sync if args.serve == "sync" else _serve_plugin
        serve(Path(args.root), Path(args.cdi), args.devices)
        return
    results = alternated(args.modes, args.runs, args.claims, args.devices)
    for figure in results[args.modes[0]][0]:
        line = []
        for mode in args.modes:
            values = [r[figure] for r in results[mode]]
            line.append(f"{mode} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"{figure} {UNITS.get(figure, 'ms')}: " + ", ".join(line))


if __name__ == "__main__":
    main()
