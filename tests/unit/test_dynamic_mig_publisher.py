"""The kubelet plugin publishes dynamic-MIG GPUs and passthrough twins as the server's counters allow."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra.core.assignment import parse_selector
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.publisher import SlicePublisher
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE
from tests.unit.test_publisher import FakeKube

pytestmark = pytest.mark.anyio


async def test_without_counters_dynamic_gpus_are_published_whole_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes("dynamic"))
    kube = FakeKube()
    publisher = SlicePublisher(kube, DRIVER, NODE, inventory, ApiFeatures(minor=34))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        await publisher.reconcile()
        await publisher.reconcile()
    assert sum("published whole" in r.message for r in caplog.records) == 1
    assert len([d for s in kube.server.list() for d in s["spec"]["devices"]]) == 8

    # The next instance, on a server that keeps them, publishes the partitions.
    publisher = SlicePublisher(
        kube,  # type: ignore[arg-type]
        DRIVER,
        NODE,
        inventory,
        ApiFeatures(minor=37, partitionable_devices=True),
    )
    await publisher.reconcile()
    published = kube.server.list()
    assert sum(len(s["spec"].get("sharedCounters", [])) for s in published) == 8
    assert sum(len(s["spec"].get("devices", [])) for s in published) == 8 * 26


async def _shared_offers(minor: int, caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The devices published for shareable dynamic-MIG GPUs on a server of this release."""
    inventory = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes("dynamic"))
    kube = FakeKube()
    on = ApiFeatures(minor=minor, partitionable_devices=True, consumable_capacity=True)
    with caplog.at_level(logging.WARNING):
        publisher = SlicePublisher(
            kube,  # type: ignore[arg-type]
            DRIVER,
            NODE,
            inventory,
            on,
            shareable=parse_selector("all"),
        )
    await publisher.reconcile()
    return [d for s in kube.server.list() for d in s["spec"].get("devices", [])]


async def test_before_1_37_a_shareable_dynamic_mig_gpu_offers_exclusive_partitions_and_it_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    devices = await _shared_offers(34, caplog)
    assert any(
        "dynamic MIG mode" in r.message and "exclusive" in r.message and "1.37" in r.message
        for r in caplog.records
    )
    assert devices
    assert not [d for d in devices if d.get("allowMultipleAllocations")]


async def test_from_1_37_a_shareable_dynamic_mig_gpu_offers_shared_partitions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    devices = await _shared_offers(37, caplog)
    assert not any("dynamic MIG mode" in r.message for r in caplog.records)
    shared = [d for d in devices if d.get("allowMultipleAllocations")]
    offers = [d for d in devices if "placementStart" in d["attributes"]]
    assert shared == offers
    offer = offers[0]
    # The counters are consumed as before: once, however many claims hold the offer (1.37's allocator).
    assert offer["consumesCounters"]
    assert offer["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Mi"
    assert offer["capacity"]["multiprocessors"]["requestPolicy"] == {"default": "0", "validValues": ["0"]}


@pytest.mark.parametrize(
    ("features", "twins"),
    [(ApiFeatures(minor=34), 0), (ApiFeatures(minor=34, partitionable_devices=True), 8)],
)
async def test_vfio_publishes_the_twins_only_with_counters_and_says_so_without(
    caplog: pytest.LogCaptureFixture, features: ApiFeatures, twins: int
) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8"), NODE), parse_mig_modes("static"))
    kube = FakeKube()
    with caplog.at_level(logging.WARNING):
        publisher = SlicePublisher(kube, DRIVER, NODE, inventory, features, vfio=True)  # type: ignore[arg-type]
        await publisher.reconcile()
    devices = [d["name"] for s in kube.server.list() for d in s["spec"].get("devices", [])]
    assert len([n for n in devices if n.startswith("gpu-vfio-")]) == twins
    told = [r.message for r in caplog.records if "passthrough twin" in r.message]
    assert len(told) == (0 if twins else 1), told
