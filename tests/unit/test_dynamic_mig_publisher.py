"""The kubelet plugin publishes dynamic-MIG GPUs as the server's shared-counter support allows."""

from __future__ import annotations

import logging

import pytest

from dra.core.assignment import parse_selector
from dra.core.versions import ApiFeatures
from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.profiles import load_profile
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


async def test_a_shareable_dynamic_mig_gpu_is_published_exclusive_and_it_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes("dynamic"))
    kube = FakeKube()
    on = ApiFeatures(minor=37, partitionable_devices=True, consumable_capacity=True)
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
    assert any("dynamic MIG mode" in r.message and "exclusive" in r.message for r in caplog.records)
    devices = [d for s in kube.server.list() for d in s["spec"].get("devices", [])]
    assert devices
    assert not [d for d in devices if d.get("allowMultipleAllocations")]
