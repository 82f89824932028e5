"""The Kubernetes adapter against a scripted HTTP server: what the API server answers, callers see.

Every transport failure becomes an UnreachableError, every error status the
KubeError subclass callers handle, and a watch yields events however the
stream is cut into chunks. (tests/integration/test_kube.py has the same
against the real API server.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from dra.adapters.kube import ConflictError, KubeClient, KubeError, NotFoundError, UnreachableError
from tests.unit.helpers import write_kubeconfig

pytestmark = pytest.mark.anyio


def _response(status: int, body: bytes, length: int | None = None) -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {length or len(body)}\r\n"
    )
    return head.encode() + b"\r\n" + body


def _chunked(*chunks: bytes) -> list[bytes]:
    """A streamed 200 answer, one write per chunk, as a watch arrives."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [head, *(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks), b"0\r\n\r\n"]


class Server:
    """Answers each connection with the next scripted list of writes (None: never answer)."""

    def __init__(self, *answers: list[bytes] | None) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            self.requests.append(head)
            answer = self.answers.pop(0)
            if answer is None:
                await anyio.sleep_forever()
                return
            for write in answer:
                await stream.send(write)
                await anyio.sleep(0.01)


@asynccontextmanager
async def _client(tmp_path: Path, server: Server, call_timeout: float = 10.0) -> AsyncIterator[KubeClient]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=f"http://127.0.0.1:{port}")
    client = KubeClient(str(kubeconfig), timeout=call_timeout)
    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, server.handle)
        try:
            yield client
        finally:
            await client.aclose()
            group.cancel_scope.cancel()


async def test_a_get_returns_the_object_and_sends_the_token(tmp_path: Path) -> None:
    server = Server([_response(200, b'{"metadata": {"name": "n", "uid": "u"}}')])
    async with _client(tmp_path, server) as client:
        assert await client.get_node("n") == {"metadata": {"name": "n", "uid": "u"}}
    assert server.requests[0].startswith(b"GET /api/v1/nodes/n HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in server.requests[0]


async def test_node_labels_are_changed_by_a_merge_patch(tmp_path: Path) -> None:
    server = Server([_response(200, b'{"metadata": {"name": "n", "labels": {"a": "1"}}}')])
    async with _client(tmp_path, server) as client:
        node = await client.patch_node_labels("n", {"a": "1"}, remove=["b"])
    assert node["metadata"]["labels"] == {"a": "1"}
    assert server.requests[0].startswith(b"PATCH /api/v1/nodes/n HTTP/1.1\r\n")
    assert b"\r\nContent-Type: application/merge-patch+json\r\n" in server.requests[0]


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (404, NotFoundError, r"GET /api/v1/nodes/n: 404 nodes \"n\" not found$"),
        (409, ConflictError, r"GET /api/v1/nodes/n: 409 nodes \"n\" not found$"),
        (403, KubeError, r"GET /api/v1/nodes/n: 403 nodes \"n\" not found$"),
    ],
)
async def test_an_error_status_is_its_kube_error_with_the_servers_message(
    tmp_path: Path, status: int, error: type[KubeError], message: str
) -> None:
    body = json.dumps({"kind": "Status", "message": 'nodes "n" not found', "code": status}).encode()
    async with _client(tmp_path, Server([_response(status, body)])) as client:
        with pytest.raises(error, match=message) as raised:
            await client.get_node("n")
    assert raised.value.status == status


async def test_a_connection_lost_mid_body_is_unreachable(tmp_path: Path) -> None:
    async with _client(tmp_path, Server([_response(200, b'{"metadata":', length=100)])) as client:
        with pytest.raises(UnreachableError, match=r"unreachable \(GET /api/v1/nodes/n\): ") as raised:
            await client.get_node("n")
    assert raised.value.status == 0


async def test_a_body_that_is_not_json_is_a_kube_error(tmp_path: Path) -> None:
    async with _client(tmp_path, Server([_response(200, b"<html>proxy error</html>")])) as client:
        with pytest.raises(KubeError, match="the API server's answer is not JSON"):
            await client.get_node("n")


async def test_a_server_that_does_not_answer_in_time_is_unreachable(tmp_path: Path) -> None:
    async with _client(tmp_path, Server(None), call_timeout=0.3) as client:
        expected = r"unreachable \(GET /api/v1/nodes/n\): no answer within 0.3 s"
        with pytest.raises(UnreachableError, match=expected):
            await client.get_node("n")


async def test_a_refused_connection_is_unreachable(tmp_path: Path) -> None:
    client = KubeClient(str(write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(UnreachableError, match=r"API server https://127.0.0.1:1 unreachable"):
            await client.get_node("n")
    finally:
        await client.aclose()


def _event(kind: str, name: str, size: int = 0) -> bytes:
    obj = {"metadata": {"name": name}, "spec": {"padding": "x" * size}}
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def test_a_watch_yields_events_however_the_stream_is_cut(tmp_path: Path) -> None:
    # One event longer than a stream reader's usual line limit, one split across writes.
    big, split = _event("MODIFIED", "big", size=300_000), _event("ADDED", "split")
    stream = _chunked(big + split[:10], split[10:], b"\n", _event("BOOKMARK", ""))
    async with _client(tmp_path, Server(stream)) as client:
        events = [
            (kind, obj["metadata"]["name"])
            async for kind, obj in client.watch_resource_slices("d", "node", "42", 5)
        ]
    assert events == [("MODIFIED", "big"), ("ADDED", "split"), ("BOOKMARK", "")]


async def test_a_watch_asks_for_bookmarks_from_the_resource_version(tmp_path: Path) -> None:
    server = Server(_chunked())
    async with _client(tmp_path, server) as client:
        assert [e async for e in client.watch_resource_slices("d", "node", "42", 5)] == []
    line = server.requests[0].split(b"\r\n")[0].decode()
    assert line.startswith("GET /apis/resource.k8s.io/v1/resourceslices?watch=1&allowWatchBookmarks=true&")
    assert "resourceVersion=42" in line
    assert "timeoutSeconds=5" in line


async def test_an_expired_resource_version_ends_the_watch_with_410(tmp_path: Path) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    stream = _chunked(json.dumps(gone).encode() + b"\n")
    async with _client(tmp_path, Server(stream)) as client:
        with pytest.raises(KubeError, match="too old resource version") as raised:
            async for _ in client.watch_resource_slices("d", "node", "1", 5):
                pass
    assert raised.value.status == 410
