"""The prepare's blocking claim GET against a scripted HTTP server: the same answers as the event loop's GET.

KubeClient.read_resource_claim runs on a worker thread (as the prepare does) over
dra.adapters.kubeget; what the server answers becomes the object or the KubeError that
get_resource_claim gives for it. (tests/integration/test_kube.py has it against the real API
server, over TLS.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import pytest
import yaml

from dra.adapters import kubeget
from dra.adapters.kube import KubeClient, KubeError, NotFoundError, UnreachableError
from tests.unit.test_kube import Server, _chunked, _client, _response

pytestmark = pytest.mark.anyio

CLAIM = b'{"metadata": {"name": "c", "namespace": "ns", "uid": "u"}}'
PATH = b"GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c HTTP/1.1\r\n"


async def _read(client: KubeClient, name: str = "c") -> object:
    return await anyio.to_thread.run_sync(client.read_resource_claim, "ns", name)


def _kubeconfig(tmp_path: Path, cluster: dict[str, str]) -> str:
    """A kubeconfig with a token for a cluster with these fields (server, proxy-url)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


@asynccontextmanager
async def _serving(
    tmp_path: Path, handle: Callable[[anyio.abc.SocketStream], Awaitable[None]], **cluster: str
) -> AsyncIterator[KubeClient]:
    """A client of a cluster whose fields are `cluster` ({port}: the listener's), `handle` serving it."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = KubeClient(_kubeconfig(tmp_path, {k: v.format(port=port) for k, v in cluster.items()}))
    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        try:
            yield client
        finally:
            await client.aclose()
            group.cancel_scope.cancel()


async def test_a_claim_is_read_with_the_token_on_a_kept_connection(tmp_path: Path) -> None:
    # The scripted server answers one request per connection, then closes it: the second GET finds
    # its pooled connection closed and is sent again on a new one.
    server = Server([_response(200, CLAIM)], [_response(200, CLAIM)])
    async with _client(tmp_path, server) as client:
        assert await _read(client) == json.loads(CLAIM)
        await anyio.sleep(0.05)
        assert await _read(client) == json.loads(CLAIM)
    assert len(server.requests) == 2
    assert server.requests[0].startswith(PATH)
    assert b"\r\nAuthorization: Bearer t\r\n" in server.requests[0]
    assert b"\r\nAccept: application/json\r\n" in server.requests[0]


async def test_one_connection_carries_every_get_while_the_server_keeps_it(tmp_path: Path) -> None:
    connections: list[int] = []

    async def keep(stream: anyio.abc.SocketStream) -> None:
        connections.append(1)
        async with stream:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    pending += await stream.receive()
                _, _, pending = pending.partition(b"\r\n\r\n")
                await stream.send(_response(200, CLAIM))

    async with _serving(tmp_path, keep, server="http://127.0.0.1:{port}") as client:
        for _ in range(5):
            assert await _read(client) == json.loads(CLAIM)
    assert len(connections) == 1


async def test_a_server_url_with_a_path_keeps_it_in_front_of_every_request(tmp_path: Path) -> None:
    server = Server([_response(200, CLAIM)])
    async with _serving(
        tmp_path, server.handle, server="http://127.0.0.1:{port}/k8s/clusters/c-1/"
    ) as client:
        assert await _read(client) == json.loads(CLAIM)
    assert server.requests[0].startswith(b"GET /k8s/clusters/c-1/apis/resource.k8s.io/v1/namespaces/ns/")


async def test_a_chunked_answer_is_joined(tmp_path: Path) -> None:
    async with _client(tmp_path, Server(_chunked(CLAIM[:10], CLAIM[10:]))) as client:
        assert await _read(client) == json.loads(CLAIM)


async def test_a_missing_claim_is_not_found_with_the_servers_message(tmp_path: Path) -> None:
    body = json.dumps({"kind": "Status", "message": 'resourceclaims "c" not found', "code": 404}).encode()
    async with _client(tmp_path, Server([_response(404, body)])) as client:
        with pytest.raises(NotFoundError, match=r"/resourceclaims/c: 404 resourceclaims \"c\" not found$"):
            await _read(client)


async def test_an_odd_name_stays_one_quoted_path_segment(tmp_path: Path) -> None:
    server = Server([_response(404, b"{}")])
    async with _client(tmp_path, server) as client:
        with pytest.raises(NotFoundError):
            await _read(client, "../../x?watch=1")
    assert server.requests[0].startswith(
        b"GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/..%2F..%2Fx%3Fwatch%3D1 HTTP/1.1\r\n"
    )


async def test_a_connection_lost_mid_body_is_unreachable(tmp_path: Path) -> None:
    async with _client(tmp_path, Server([_response(200, CLAIM[:12], length=100)])) as client:
        with pytest.raises(UnreachableError, match="closed the connection in the middle of its answer"):
            await _read(client)


async def test_a_server_that_does_not_answer_is_unreachable_after_the_timeout(tmp_path: Path) -> None:
    async with _client(tmp_path, Server(None), call_timeout=0.3) as client:
        with pytest.raises(UnreachableError, match=r"no answer within 0.3 s"):
            await _read(client)


async def test_no_server_is_unreachable(tmp_path: Path) -> None:
    client = KubeClient(_kubeconfig(tmp_path, {"server": "http://127.0.0.1:1"}))
    with pytest.raises(UnreachableError, match=r"http://127.0.0.1:1 unreachable .*cannot connect"):
        await _read(client)
    await client.aclose()


async def test_an_answer_too_large_or_not_http_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeget, "MAX_BODY", 16)
    async with _client(tmp_path, Server([_response(200, CLAIM)], [b"SSH-2.0-OpenSSH\r\n\r\n"])) as client:
        with pytest.raises(UnreachableError, match="the answer exceeds 16 bytes"):
            await _read(client)
        with pytest.raises(UnreachableError, match=r"not HTTP/1\.1"):
            await _read(client)


async def test_a_body_that_is_not_json_is_a_kube_error(tmp_path: Path) -> None:
    async with _client(tmp_path, Server([_response(200, b"<html>proxy error</html>")])) as client:
        with pytest.raises(KubeError, match="the API server's answer is not JSON"):
            await _read(client)


async def test_behind_a_proxy_the_get_goes_through_the_event_loops_client(tmp_path: Path) -> None:
    # The scripted server plays the proxy: an http target is asked for in absolute form.
    server = Server([_response(200, CLAIM)])
    proxy = {"server": "http://api.invalid:6443", "proxy-url": "http://127.0.0.1:{port}"}
    async with _serving(tmp_path, server.handle, **proxy) as client:
        assert await _read(client) == json.loads(CLAIM)
    assert server.requests[0].startswith(
        b"GET http://api.invalid:6443/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c HTTP/1.1\r\n"
    )
