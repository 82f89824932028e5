"""The burst's client (tests/bench/burstclient): every claim prepared once, timed, and refusals not timed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench import burstclient
from tests.bench.grpcfloor import SyncFloor


class _Counting(SyncFloor):
    """The Python floor, counting the claims it was asked to prepare and refusing the ones named `bad`."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        answer = super().NodePrepareResources(request, context)
        for ref in request.claims:
            self.asked.append(ref.uid)
            if ref.name == "bad":
                answer.claims[ref.uid].error = "refused"
        return answer


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[tuple[str, _Counting]]:
    servicer = _Counting()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(servicer, server)
    target = f"unix://{tmp_path / 'dra.sock'}"
    server.add_insecure_port(target)
    server.start()
    yield target, servicer
    server.stop(None)


def _claims(count: int, name: str = "ok") -> list[dra_pb2.Claim]:
    return [dra_pb2.Claim(namespace="ns", name=name, uid=str(uuid.uuid4())) for _ in range(count)]


def test_each_batch_is_prepared_once_per_claim_and_handed_on(floor: tuple[str, _Counting]) -> None:
    target, servicer = floor
    batches = [_claims(5), _claims(7)]
    handed: list[Sequence[dra_pb2.Claim]] = []
    timed = burstclient.bursts(target, batches, 3, handed.append)
    assert handed == batches
    # The empty call that connects the channel carries no claim.
    assert sorted(servicer.asked) == sorted(ref.uid for batch in batches for ref in batch)
    assert [len(burst.each) for burst in timed] == [5, 7]
    for burst in timed:
        assert all(0 < ms <= burst.wall for ms in burst.each)


def test_a_refused_claim_ends_the_benchmark_with_its_error(floor: tuple[str, _Counting]) -> None:
    target, _ = floor
    with pytest.raises(RuntimeError, match="the burst's claims were refused: refused"):
        burstclient.bursts(target, [[*_claims(3), *_claims(1, "bad")]], 2)
