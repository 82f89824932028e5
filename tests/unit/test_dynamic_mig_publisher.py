"""The kubelet plugin finds out whether the server keeps shared counters, and publishes accordingly."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra.adapters.kube import KubeError
from dra.core.versions import ApiFeatures
from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.profiles import load_profile
from dra.kubeletplugin import features
from dra.kubeletplugin.publisher import SlicePublisher
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE
from tests.unit.test_publisher import FakeKube

pytestmark = pytest.mark.anyio


class ProbedKube:
    """A server answering the dry-run create: keeping sharedCounters (gate on), dropping them, or failing."""

    def __init__(self, keeps: bool | None) -> None:
        self.keeps = keeps
        self.dry_runs: list[dict[str, Any]] = []

    async def create_resource_slice(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        assert dry_run, "the probe must never create a slice"
        self.dry_runs.append(obj)
        if self.keeps is None:
            raise KubeError("POST resourceslices: 403 forbidden")
        spec = dict(obj["spec"])
        if not self.keeps:
            spec.pop("sharedCounters")
        return {**obj, "spec": spec}


@pytest.mark.parametrize(("keeps", "expected"), [(True, True), (False, False), (None, False)])
async def test_before_1_36_a_dry_run_says_whether_counters_survive(
    keeps: bool | None, expected: bool
) -> None:
    kube = ProbedKube(keeps)
    assert await features.partitionable_devices(kube, DRIVER, NODE, 34) is expected  # type: ignore[arg-type]
    assert len(kube.dry_runs) == 1
    assert kube.dry_runs[0]["spec"]["nodeName"] == NODE


async def test_from_1_36_no_probe_is_needed() -> None:
    kube = ProbedKube(False)
    assert await features.partitionable_devices(kube, DRIVER, NODE, 37) is True  # type: ignore[arg-type]
    assert kube.dry_runs == []


async def test_without_counters_dynamic_gpus_are_published_whole_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes("dynamic"))
    kube = FakeKube()
    publisher = SlicePublisher(kube, DRIVER, NODE, inventory)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        await publisher.reconcile()
        await publisher.reconcile()
    assert sum("published whole" in r.message for r in caplog.records) == 1
    assert len([d for s in kube.server.list() for d in s["spec"]["devices"]]) == 8

    publisher.set_features(ApiFeatures(minor=37, partitionable_devices=True))
    await publisher.reconcile()
    published = kube.server.list()
    assert sum(len(s["spec"].get("sharedCounters", [])) for s in published) == 8
    assert sum(len(s["spec"].get("devices", [])) for s in published) == 8 * 26
