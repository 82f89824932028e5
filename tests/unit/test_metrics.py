"""The probes endpoint: never blocked by an idle client, failing liveness when the loop stalls."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from localcluster.driverprocess import free_port

from dra.daemon import metrics


@pytest.fixture
def endpoint() -> Iterator[tuple[str, dict[str, bool]]]:
    flags = {"ready": False, "alive": True}
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}", lambda: flags["ready"], lambda: flags["alive"])
    yield f"http://127.0.0.1:{port}", flags
    server.shutdown()
    server.server_close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_probes_follow_readiness_and_liveness(endpoint: tuple[str, dict[str, bool]]) -> None:
    base, flags = endpoint
    assert (_status(f"{base}/healthz"), _status(f"{base}/readyz")) == (200, 503)
    flags["ready"] = True
    assert _status(f"{base}/readyz") == 200
    flags["alive"] = False
    assert _status(f"{base}/healthz") == 503
    assert "dra_gpu_prepared_claims" in urllib.request.urlopen(f"{base}/metrics", timeout=3).read().decode()


def test_an_idle_client_does_not_block_the_probes(endpoint: tuple[str, dict[str, bool]]) -> None:
    base, _ = endpoint
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))):
        # Connected, sending nothing: a single-threaded server would now wait on this socket.
        assert _status(f"{base}/healthz") == 200


def test_an_address_in_use_is_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=r"[Aa]ddress already in use"):
            metrics.serve(f"127.0.0.1:{port}", lambda: True)
