"""ResourceSlice publishing against the real API server: accepted, converged, fewest writes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, Obj

from dra.adapters.kube import KubeClient
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.publisher import SlicePublisher
from dra.model.devices import Inventory

DRIVER = "publisher-test.dra-gpu.test"

pytestmark = pytest.mark.anyio


def _inventory(cluster: ClusterInfo, profile: str | int) -> Inventory:
    fake = (
        parse_profile({"gpus": [{"model": "t4", "count": profile}]}, "many")
        if isinstance(profile, int)
        else load_profile(profile)
    )
    return discover(FakeGpuLibrary(fake, cluster.node_name))


def _slices(kube: Kube, cluster: ClusterInfo) -> list[Obj]:
    found = kube.list_objects(
        "resource.k8s.io/v1",
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )
    return sorted(found, key=lambda s: s["metadata"]["name"])


@pytest.fixture
async def client(cluster: ClusterInfo, kube: Kube) -> AsyncIterator[KubeClient]:
    """The driver's adapter; this driver's slices are removed afterwards."""
    adapter = KubeClient(cluster.kubeconfig)
    yield adapter
    for obj in _slices(kube, cluster):
        kube.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])
    await adapter.aclose()


async def test_publish_then_reconcile_again_writes_nothing(
    cluster: ClusterInfo, kube: Kube, client: KubeClient
) -> None:
    publisher = SlicePublisher(
        client, DRIVER, cluster.node_name, _inventory(cluster, "h100x8-mig"), ApiFeatures()
    )
    first = await publisher.reconcile()
    assert (len(first.create), first.generation) == (1, 1)
    [published] = _slices(kube, cluster)
    node = kube.get("v1", "Node", cluster.node_name)
    assert published["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert len(published["spec"]["devices"]) == 4 + 4 * 4

    assert (await publisher.reconcile()).writes == 0
    # A restarted driver adopts what it finds instead of rewriting it.
    restarted = SlicePublisher(
        client, DRIVER, cluster.node_name, _inventory(cluster, "h100x8-mig"), ApiFeatures()
    )
    plan = await restarted.reconcile()
    assert (plan.writes, plan.generation) == (0, 1)
    assert (
        _slices(kube, cluster)[0]["metadata"]["resourceVersion"] == published["metadata"]["resourceVersion"]
    )


async def test_pool_is_split_and_regrouped_under_new_generations(
    cluster: ClusterInfo, kube: Kube, client: KubeClient
) -> None:
    publisher = SlicePublisher(client, DRIVER, cluster.node_name, _inventory(cluster, 300), ApiFeatures())
    await publisher.reconcile()
    slices = _slices(kube, cluster)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (1, 3)
    }

    publisher.set_inventory(_inventory(cluster, 4))
    plan = await publisher.reconcile()
    assert (len(plan.update), len(plan.delete), plan.generation) == (1, 2, 2)
    [remaining] = _slices(kube, cluster)
    assert remaining["spec"]["pool"] == {"name": cluster.node_name, "generation": 2, "resourceSliceCount": 1}


async def _wait_until(what: str, check: Callable[[], bool]) -> None:
    with anyio.move_on_after(20):
        while not check():  # noqa: ASYNC110 (polls the API server; nothing to wait on)
            await anyio.sleep(0.1)
        return
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
async def running(cluster: ClusterInfo, client: KubeClient) -> AsyncIterator[SlicePublisher]:
    """A publisher running its watch and reconcile loop."""
    publisher = SlicePublisher(client, DRIVER, cluster.node_name, _inventory(cluster, "mixed"), ApiFeatures())
    async with anyio.create_task_group() as group:
        group.start_soon(publisher.run)
        await publisher.published.wait()
        yield publisher
        group.cancel_scope.cancel()


async def test_deleted_or_edited_slice_is_restored(
    running: SlicePublisher, cluster: ClusterInfo, kube: Kube
) -> None:
    [original] = _slices(kube, cluster)
    name = original["metadata"]["name"]

    kube.delete("resource.k8s.io/v1", "ResourceSlice", name)
    await _wait_until(
        "the slice to be re-created",
        lambda: (
            [s["metadata"]["uid"] for s in _slices(kube, cluster)] not in ([], [original["metadata"]["uid"]])
        ),
    )
    [recreated] = _slices(kube, cluster)
    assert recreated["spec"] == original["spec"]

    edited = dict(recreated)
    edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "tampered"}
    kube.replace(edited)
    await _wait_until(
        "the edit to be reverted",
        lambda: (
            _slices(kube, cluster)[0]["spec"]["devices"][0]["attributes"]["productName"]["string"]
            != "tampered"
        ),
    )
    assert _slices(kube, cluster)[0]["spec"] == original["spec"]
