"""The minimal harness of issue 47: its client's rows under make bench's names, its place in make bench."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import pytest

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench import bench_compare
from tests.bench.bench_reference import minimal_calls


def _fresh(count: int) -> list[dra_pb2.Claim]:
    return [dra_pb2.Claim(namespace="ns", name=f"c-{i}", uid=str(uuid.uuid4())) for i in range(count)]


def test_the_minimal_client_times_make_bench_s_rows_against_a_server(tmp_path: Path) -> None:
    # The Python floor answers every claim at once: the client's own calls are all that is timed.
    socket = tmp_path / "floor.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.grpcfloor", "sync", str(socket)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert server.stdin is not None
    assert server.stdout is not None
    try:
        assert server.stdout.readline().strip() == b"ready"
        target = f"unix://{socket}"
        with grpc.insecure_channel(target) as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            burst = _fresh(bench_compare.BURST * bench_compare.BURSTS)
            figures = minimal_calls(target, stub, _fresh(3), burst)
    finally:
        server.stdin.close()
        server.wait(10)
    assert list(figures) == [
        "empty NodePrepareResources p50",
        "first prepare p50",
        "repeat prepare p50",
        "unprepare p50",
        "32 fresh claims from 8 callers, wall",
    ]
    assert all(value > 0 for value in figures.values())


def test_reference_alone_needs_the_go_reference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_compare", "--reference-alone", "--no-go"])
    with pytest.raises(SystemExit):
        bench_compare.main()
    assert "--reference-alone times the Go reference: it cannot go with --no-go" in capsys.readouterr().err
