"""The DRA service in Python doing no work: the floor of a Python driver's call (issue 29).

    python -m tests.bench.grpcfloor {aio|sync} SOCKET

Serves NodePrepareResources and NodeUnprepareResources on a unix socket and answers each at
once, as deploy/local/floorbin/grpcfloor does in Go: one made-up device per claim, success per
unprepared claim. `aio` is grpc.aio on uvloop, the server the kubelet plugin runs; `sync` is
grpcio's synchronous server with a thread pool. It imports nothing of dra but the generated
messages, so its memory is the runtime's (interpreter, asyncio, grpcio, uvloop, protobuf) and
nothing of the driver. Prints "ready" once serving; stops when its standard input closes.
tests/bench/bench_grpcserver.py measures it beside the Go floor and the driver's own servers.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent import futures
from typing import Any

import grpc
import uvloop

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc

#: Threads of the synchronous server: the benchmarks' concurrent callers.
WORKERS = 8


def prepared(request: dra_pb2.NodePrepareResourcesRequest) -> dra_pb2.NodePrepareResourcesResponse:
    """One made-up device per claim, nothing done."""
    answers = {}
    for ref in request.claims:
        cdi = [f"floor.example.com/gpu={ref.uid}"]
        device = dra_pb2.Device(pool_name="floor", device_name="gpu-0", cdi_device_ids=cdi)
        answers[ref.uid] = dra_pb2.NodePrepareResourceResponse(devices=[device])
    return dra_pb2.NodePrepareResourcesResponse(claims=answers)


def unprepared(request: dra_pb2.NodeUnprepareResourcesRequest) -> dra_pb2.NodeUnprepareResourcesResponse:
    """Success for every claim."""
    return dra_pb2.NodeUnprepareResourcesResponse(
        claims={ref.uid: dra_pb2.NodeUnprepareResourceResponse() for ref in request.claims}
    )


class SyncFloor(dra_pb2_grpc.DRAPluginServicer):
    """The floor on a pool thread of grpcio's synchronous server."""

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        return prepared(request)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return unprepared(request)


class AioFloor(dra_pb2_grpc.DRAPluginServicer):
    """The floor on grpc.aio's event loop."""

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return prepared(request)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return unprepared(request)


def serve_sync(socket: str) -> None:
    """Serve on grpcio's synchronous server until standard input closes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(SyncFloor(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    print("ready", flush=True)
    sys.stdin.read()
    server.stop(None)


async def serve_aio(socket: str) -> None:
    """Serve on grpc.aio until standard input closes."""
    server = grpc.aio.server()
    dra_pb2_grpc.add_DRAPluginServicer_to_server(AioFloor(), server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def main(argv: list[str]) -> int:
    """Serve the floor named by argv[0] on the socket argv[1]."""
    if len(argv) != 2 or argv[0] not in ("aio", "sync"):
        print("usage: python -m tests.bench.grpcfloor {aio|sync} SOCKET", file=sys.stderr)
        return 2
    if argv[0] == "sync":
        serve_sync(argv[1])
    else:
        uvloop.run(serve_aio(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
