"""The burst's client: 8 NodePrepareResources in flight from one asyncio loop over one grpc.aio channel.

Issue 57: an independent harness (an asyncio client, 8 workers) timed Kubernetes' Go test driver's
32-claim burst at 26 ms where `make bench`'s client, grpcio's synchronous channel with a future
and a Python callback per call, timed 39 to 47 ms on the same machine and day. What a client
spends on its own calls it spends on the driver's machine too (two cores here), and it adds the
same milliseconds to both drivers' bursts: the ratio printed came out flatter than the drivers'.
This client does as little as a Python one can: every request message built before the clock
starts, one channel connected before it, 8 worker coroutines on one loop each awaiting its next
call (grpcio's C core completes them; no thread, no callback, no lock of ours), each call's end
time taken where its answer arrives.

bench_compare, bench_driver and bench_grpcserver time their bursts with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import cast

import grpc
import uvloop

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc


@dataclass(frozen=True)
class Burst:
    """One burst: its wall milliseconds (first call sent to last answered) and each call's."""

    wall: float
    each: list[float]


async def _one_burst(
    stub: dra_pb2_grpc.DRAPluginStub, batch: Sequence[dra_pb2.Claim], callers: int
) -> tuple[Burst, list[dra_pb2.NodePrepareResourcesResponse]]:
    requests = [dra_pb2.NodePrepareResourcesRequest(claims=[ref]) for ref in batch]
    answers: list[dra_pb2.NodePrepareResourcesResponse | None] = [None] * len(batch)
    each = [0.0] * len(batch)
    following = iter(range(len(batch)))
    # The generated stub is typed for the synchronous channel; on a grpc.aio one its calls are awaited.
    call = cast(
        Callable[[dra_pb2.NodePrepareResourcesRequest], Awaitable[dra_pb2.NodePrepareResourcesResponse]],
        stub.NodePrepareResources,
    )

    async def caller() -> None:
        # Each takes the next claim as soon as its call is answered, as a kubelet goroutine would.
        for index in following:
            sent = time.perf_counter()
            answers[index] = await call(requests[index])
            each[index] = (time.perf_counter() - sent) * 1000

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    wall = (time.perf_counter() - started) * 1000
    return Burst(wall, each), [answer for answer in answers if answer is not None]


async def _bursts(
    target: str,
    batches: Sequence[Sequence[dra_pb2.Claim]],
    callers: int,
    after: Callable[[Sequence[dra_pb2.Claim]], object],
) -> list[Burst]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = dra_pb2_grpc.DRAPluginStub(channel)
        # Connected before the first clock: an empty call answers at once from any DRA server.
        await cast(Awaitable[object], stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest()))
        timed = []
        for batch in batches:
            burst, answers = await _one_burst(stub, batch, callers)
            refused = [a.claims[r.uid].error for a, r in zip(answers, batch, strict=True)]
            if any(refused):
                # A refused claim answers at once: its time would be no prepare's.
                raise RuntimeError(f"the burst's claims were refused: {next(e for e in refused if e)}")
            timed.append(burst)
            # Blocking the loop is fine here: nothing of the client is in flight between bursts.
            after(batch)
    return timed


def bursts(
    target: str,
    batches: Sequence[Sequence[dra_pb2.Claim]],
    callers: int,
    after: Callable[[Sequence[dra_pb2.Claim]], object] = lambda batch: None,
) -> list[Burst]:
    """Each batch prepared with `callers` calls in flight, one claim per call, `after(batch)` between.

    `target` is the driver's gRPC address (``unix:///path/dra.sock``). A claim the driver refuses
    ends the benchmark with its error.
    """
    return uvloop.run(_bursts(target, batches, callers, after))
