"""The adapter's HTTP/1.1 transport (dra.adapters.kubeget) against scripted servers and proxies.

Kept connections, a claim read from the prepare's worker thread, proxies (absolute URLs, CONNECT
tunnels, their refusals), what is and is not sent twice, bounds, and cancellation: a cancelled
watch or call ends its connection instead of waiting out its deadline. (tests/integration/
test_kube.py has the same calls against the real API server, over TLS and through a proxy.)
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import anyio.to_thread
import pytest
import yaml

from dra.adapters import kube, kubeget
from dra.adapters.kube import KubeClient, KubeError, NotFoundError, UnreachableError
from dra.api.fields import DuplicatedKeys
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


async def test_opaque_parameters_keep_a_repeated_key_and_a_too_long_integer_for_their_decoder(
    tmp_path: Path,
) -> None:
    # dra.api.opaque refuses both with the field's path; outside parameters the C decoder alone reads
    # the answer, and an integer too long for it falls back to the same infinity.
    long = "9" * 5000
    parameters = b'{"config": [{"opaque": {"parameters": {"kind": "A", "kind": "B"}}}], "n": '
    config = parameters + long.encode() + b"}"
    plain = b'{"metadata": {"name": "c"}, "n": ' + long.encode() + b"}"
    server = Server([_response(200, config)], [_response(200, plain)])
    async with _client(tmp_path, server) as client:
        claim = await _read(client)
        assert isinstance(claim, dict)
        parameters = claim["config"][0]["opaque"]["parameters"]
        assert isinstance(parameters, DuplicatedKeys)
        assert (parameters, parameters.duplicates, claim["n"]) == ({"kind": "B"}, ("kind",), float("inf"))
        await anyio.sleep(0.05)
        assert await _read(client) == {"metadata": {"name": "c"}, "n": float("inf")}


async def test_behind_an_http_proxy_a_request_names_the_whole_url_and_the_proxys_user(
    tmp_path: Path,
) -> None:
    # The scripted server plays the proxy: an http target is asked for in absolute form.
    server = Server([_response(200, CLAIM)])
    proxy = {"server": "http://api.invalid:6443", "proxy-url": "http://me:p%40ss@127.0.0.1:{port}"}
    async with _serving(tmp_path, server.handle, **proxy) as client:
        assert await _read(client) == json.loads(CLAIM)
    assert server.requests[0].startswith(
        b"GET http://api.invalid:6443/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c HTTP/1.1\r\n"
    )
    assert b"\r\nProxy-Authorization: Basic bWU6cEBzcw==\r\n" in server.requests[0]  # me:p@ss


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
            "refused a tunnel to api.invalid:6443: HTTP/1.1 403",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x01", "the proxy sent data before the tunnel opened"),
        (b"", "the proxy closed the connection instead of opening a tunnel"),
    ],
)
async def test_a_proxy_that_opens_no_clean_tunnel_to_an_https_server_is_named(
    tmp_path: Path, answer: bytes, message: str
) -> None:
    server = Server([answer])
    proxy = {"server": "https://api.invalid:6443", "proxy-url": "http://127.0.0.1:{port}"}
    async with _serving(tmp_path, server.handle, **proxy) as client:
        with pytest.raises(UnreachableError, match=message):
            await client.get_node("n")
    assert server.requests[0].startswith(b"CONNECT api.invalid:6443 HTTP/1.1\r\nHost: api.invalid:6443\r\n")


def test_a_proxy_other_than_http_is_refused_when_the_client_is_made(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path, {"server": "https://api.invalid", "proxy-url": "socks5://127.0.0.1:1080"})
    with pytest.raises(KubeError, match=r"proxy-url 'socks5://127.0.0.1:1080': only http:// proxies"):
        KubeClient(config)


async def test_a_post_is_not_sent_twice_when_its_kept_connection_closes_unanswered(tmp_path: Path) -> None:
    # The server answers the first request, then reads the next on the same connection and closes it:
    # a GET is sent again on a new connection, a POST (which may have been carried out) is not.
    received: list[bytes] = []

    async def answer_once(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            pending = b""
            for answered in (True, False):
                while b"\r\n\r\n" not in pending:
                    pending += await stream.receive()
                head, _, pending = pending.partition(b"\r\n\r\n")
                received.append(head.split(b" ", 1)[0])
                if answered:
                    await stream.send(_response(200, b"{}"))

    async with _serving(tmp_path, answer_once, server="http://127.0.0.1:{port}") as client:
        await client.get_node("n")
        assert await client.get_node("n") == {}
        with pytest.raises(UnreachableError, match="closed the connection without answering"):
            await client.create_event({"metadata": {"name": "p", "namespace": "ns"}}, "Reason", "message")
    assert received == [b"GET", b"GET", b"GET", b"POST"]


async def test_a_cancelled_watch_returns_at_once_and_closes_its_connection(tmp_path: Path) -> None:
    closed = anyio.Event()

    async def stream_nothing(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            while b"\r\n\r\n" not in await stream.receive():
                pass
            await stream.send(_chunked()[0])
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await stream.receive()
            closed.set()

    async with _serving(tmp_path, stream_nothing, server="http://127.0.0.1:{port}") as client:
        started = time.monotonic()
        with anyio.move_on_after(0.3):
            async for _ in client.watch_resource_slices("d", "node", "1", 300):
                pass
        assert time.monotonic() - started < 2
        with anyio.fail_after(5):
            await closed.wait()


async def test_a_watch_event_longer_than_the_bound_ends_the_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube, "MAX_BODY", 1000)
    event = json.dumps({"type": "ADDED", "object": {"padding": "x" * 5000}}).encode() + b"\n"
    async with _client(
        tmp_path, Server(_chunked(*(event[i : i + 500] for i in range(0, len(event), 500))))
    ) as client:
        with pytest.raises(KubeError, match="an event exceeds 1000 bytes"):
            async for _ in client.watch_resource_slices("d", "node", "1", 5):
                pass


async def test_closing_the_client_cuts_a_cancelled_request_instead_of_waiting_out_its_deadline(
    tmp_path: Path,
) -> None:
    # At shutdown a cancelled call's request still runs on its thread; aclose() ends it there.
    cut = anyio.Event()
    connections = 0

    async def never_answer(stream: anyio.abc.SocketStream) -> None:
        # The client may cut the connection before the request's end has been read, under load.
        nonlocal connections
        connections += 1
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while b"\r\n\r\n" not in await stream.receive():
                    pass
                await stream.receive()
            cut.set()

    async with _serving(tmp_path, never_answer, server="http://127.0.0.1:{port}") as client:
        with anyio.move_on_after(0.2):
            await client.get_node("n")
        await client.aclose()
        with anyio.fail_after(2):  # the call's deadline is 10 s
            await cut.wait()
        with pytest.raises(UnreachableError, match="the client is closed"):
            await client.get_node("n")
        await anyio.sleep(0.05)
        assert connections == 1, "a closed client opened a connection"


async def test_the_idle_connections_are_opened_ahead_and_carry_concurrent_reads(tmp_path: Path) -> None:
    # What the plugin does once ready: a burst of claim GETs then finds a connection each, open.
    connections: list[anyio.abc.SocketStream] = []

    async def keep_alive(stream: anyio.abc.SocketStream) -> None:
        connections.append(stream)
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += await stream.receive()
                    await anyio.sleep(0.02)  # the reads overlap
                    await stream.send(_response(200, CLAIM))

    async with _serving(tmp_path, keep_alive, server="http://127.0.0.1:{port}") as client:
        assert await client.open_connections() == kubeget.MAX_IDLE
        await anyio.sleep(0.05)
        assert len(connections) == kubeget.MAX_IDLE
        assert await client.open_connections() == 0
        async with anyio.create_task_group() as group:
            for _ in range(kubeget.MAX_IDLE):
                group.start_soon(_read, client)
        assert len(connections) == kubeget.MAX_IDLE


async def test_connections_that_cannot_be_opened_ahead_are_an_unreachable_error(tmp_path: Path) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    client = KubeClient(_kubeconfig(tmp_path, {"server": f"http://127.0.0.1:{port}"}))
    with pytest.raises(UnreachableError, match="opening connections"):
        await client.open_connections()
    await client.aclose()
