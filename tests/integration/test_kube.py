"""The Kubernetes adapter against the real API server: its answers become the errors callers handle."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import anyio
import anyio.abc
import anyio.to_thread
import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import free_port
from localcluster.kube import Kube, Obj

from dra.adapters.kube import ConflictError, KubeClient, KubeError, NotFoundError, UnreachableError
from dra.core import versions
from dra.kubeletplugin.daemon import check_server

DRIVER = "kube-test.dra-gpu.test"

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(cluster: ClusterInfo, kube: Kube) -> AsyncIterator[KubeClient]:
    """The driver's adapter; this driver's slices are removed afterwards."""
    adapter = KubeClient(cluster.kubeconfig)
    yield adapter
    await adapter.aclose()
    for obj in kube.list_objects(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={DRIVER}"
    ):
        kube.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])


def _slice(cluster: ClusterInfo) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"kube-test-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": cluster.node_name,
            "pool": {"name": cluster.node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


async def test_a_missing_claim_is_not_found(client: KubeClient, namespace: str) -> None:
    with pytest.raises(NotFoundError, match=rf"/namespaces/{namespace}/resourceclaims/nope: 404 .*not found"):
        await client.get_resource_claim(namespace, "nope")


@pytest.mark.parametrize("name", ["?watch=true", "../../../../../../api/v1/namespaces/default", "a/b", "%2F"])
async def test_an_odd_claim_name_is_one_missing_name_not_another_request(
    client: KubeClient, namespace: str, name: str
) -> None:
    # Unquoted, the first is a watch of every claim (cut by the timeout), the second a GET of a Namespace.
    with pytest.raises(KubeError) as raised:
        await client.get_resource_claim(namespace, name)
    assert raised.value.status in (400, 404), raised.value


async def test_a_claim_read_from_the_prepares_thread_is_the_one_a_coroutine_reads(
    client: KubeClient, kube: Kube, namespace: str
) -> None:
    # Over TLS with the cluster's credentials, as the kubelet plugin's prepare makes it on its thread.
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "claim", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        }
    )
    for _ in range(3):
        read = await anyio.to_thread.run_sync(client.read_resource_claim, namespace, "claim")
        assert read == await client.get_resource_claim(namespace, "claim")
    with pytest.raises(NotFoundError, match=r"/resourceclaims/nope: 404 .*not found"):
        await anyio.to_thread.run_sync(client.read_resource_claim, namespace, "nope")
    for name in ["?watch=true", "../../../../../../api/v1/namespaces/default", "a/b"]:
        with pytest.raises(KubeError) as raised:
            await anyio.to_thread.run_sync(client.read_resource_claim, namespace, name)
        assert raised.value.status in (400, 404), raised.value


async def test_a_create_of_an_existing_slice_and_a_stale_replace_conflict(
    client: KubeClient, cluster: ClusterInfo
) -> None:
    created = await client.create_resource_slice(_slice(cluster))
    with pytest.raises(ConflictError, match="already exists") as raised:
        await client.create_resource_slice({**created, "metadata": {"name": created["metadata"]["name"]}})
    assert raised.value.status == 409

    changed = {**created, "spec": {**created["spec"], "devices": [{"name": "gpu-1"}]}}
    await client.replace_resource_slice(changed)
    with pytest.raises(ConflictError, match="the object has been modified"):
        await client.replace_resource_slice(created)

    await client.delete_resource_slice(created["metadata"]["name"], created["metadata"]["uid"])
    # Deleting what is gone is fine.
    await client.delete_resource_slice(created["metadata"]["name"])


async def test_a_watch_sees_a_create_after_the_listed_version_and_ends_on_time(
    client: KubeClient, cluster: ClusterInfo
) -> None:
    _, version = await client.list_resource_slices(DRIVER, cluster.node_name)
    obj = _slice(cluster)
    seen: list[tuple[str, str]] = []

    async def create() -> None:
        await anyio.sleep(0.5)
        await client.create_resource_slice(obj)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(create)
            async for kind, event in client.watch_resource_slices(DRIVER, cluster.node_name, version, 3):
                seen.append((kind, event["metadata"].get("name", "")))
    assert ("ADDED", obj["metadata"]["name"]) in seen


async def test_an_api_server_that_is_not_there_is_unreachable(cluster: ClusterInfo, tmp_path: Path) -> None:
    config = yaml.safe_load(await anyio.Path(cluster.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    kubeconfig = tmp_path / "dead.kubeconfig"
    await anyio.Path(kubeconfig).write_text(yaml.safe_dump(config))
    client = KubeClient(str(kubeconfig))
    try:
        with pytest.raises(UnreachableError, match=r"unreachable \(GET /api/v1/nodes/n\)") as raised:
            await client.get_node("n")
        assert raised.value.status == 0
    finally:
        await client.aclose()


async def test_the_local_api_server_is_a_supported_one(
    client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    info = versions.server_info(await client.server_version(), await client.resource_api_group())
    assert versions.OLDEST_MINOR <= info.minor <= versions.NEWEST_MINOR
    assert "v1" in info.resource_versions
    assert info.git_version.startswith(f"v1.{info.minor}.")
    with caplog.at_level(logging.INFO, logger="dra.kubeletplugin.daemon"):
        await check_server(client)
    assert f"API server {info.git_version} serves resource.k8s.io v1" in caplog.text


async def _tunnel(client_stream: anyio.abc.SocketStream, seen: list[bytes]) -> None:
    """An HTTP proxy's CONNECT: a tunnel to the address asked for, copying both ways until one side ends."""
    async with client_stream:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await client_stream.receive()
        seen.append(head)
        host, _, port = head.split(b" ")[1].decode().rpartition(":")
        async with await anyio.connect_tcp(host, int(port)) as upstream:
            await client_stream.send(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def copy(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
                with contextlib.suppress(
                    anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    async for data in source:
                        await sink.send(data)
                group.cancel_scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(copy, client_stream, upstream)
                group.start_soon(copy, upstream, client_stream)


async def test_through_an_http_proxy_the_calls_and_a_watch_reach_the_api_server_over_tls(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    # A kubeconfig's proxy-url: HTTPS goes through a CONNECT tunnel, TLS end to end with the API server.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    config = yaml.safe_load(await anyio.Path(cluster.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["proxy-url"] = f"http://127.0.0.1:{port}"
    kubeconfig = tmp_path / "proxied.kubeconfig"
    await anyio.Path(kubeconfig).write_text(yaml.safe_dump(config))
    seen: list[bytes] = []
    client = KubeClient(str(kubeconfig))
    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, lambda stream: _tunnel(stream, seen))
        try:
            with anyio.fail_after(30):
                assert (await client.server_version())["gitVersion"].startswith("v1.")
                _, version = await client.list_resource_slices(DRIVER, cluster.node_name)
                assert [
                    e async for e in client.watch_resource_slices(DRIVER, cluster.node_name, version, 1)
                ] in (
                    [],
                    [("BOOKMARK", mock.ANY)],
                )
        finally:
            await client.aclose()
            group.cancel_scope.cancel()
    server = _authority(cluster)
    assert seen
    assert all(head.startswith(f"CONNECT {server} HTTP/1.1\r\n".encode()) for head in seen)


def _authority(cluster: ClusterInfo) -> str:
    """host:port of the cluster's API server, as its kubeconfig names it."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    return str(config["clusters"][0]["cluster"]["server"]).partition("://")[2].rstrip("/")
