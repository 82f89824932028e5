"""Every YAML example in docs/sharing.md holds.

Configs decode, claims and classes pass the webhook, and the ResourceSlice is what the driver
publishes for a shareable GPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra.api import opaque
from dra.api.v1beta1 import MigDeviceConfig, validate
from dra.core.config import ConfigError, checked, decode
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.webhook.admission import CONFIG_PATHS, problems
from tests.unit.helpers import inventory

DOC = Path(__file__).resolve().parents[2] / "docs" / "sharing.md"
BLOCKS = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("text", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_every_example_is_accepted(text: str) -> None:
    document: dict[str, Any] = yaml.safe_load(text)
    if document["apiVersion"].startswith("resource.nvidia.com/"):
        config = opaque.decode(document)
        devices = inventory("h100x8-mig")
        names = ["gpu-4-mig-1g10gb-3-0"] if isinstance(config, MigDeviceConfig) else ["gpu-0", "gpu-1"]
        validate(config, [d for d in devices if d.name in names])
        return
    if document["kind"] == "ResourceSlice":
        _assert_published(document)
        return
    assert document["kind"] in CONFIG_PATHS
    assert problems(document, document["kind"], "gpu.nvidia.com") == []


def _assert_published(document: dict[str, Any]) -> None:
    # The page's GPU: a shareable fake H100, on a server that keeps consumable capacity.
    shareable = {d["name"] for d in document["spec"]["devices"]}
    published = build_slices(
        inventory("h100x8"),
        document["spec"]["driver"],
        "node-a",
        None,
        1,
        features=ApiFeatures(consumable_capacity=True),
        shareable=shareable,
    )
    devices = {d["name"]: d for s in published for d in s["spec"]["devices"]}
    for device in document["spec"]["devices"]:
        shown = {key: value for key, value in devices[device["name"]].items() if key in device}
        assert shown == device


def test_the_documented_memory_is_the_fake_h100s() -> None:
    gpu = inventory("h100x8").get("gpu-0")
    assert gpu is not None
    assert f"more than the {gpu.memory_bytes // 2**20} MiB of memory of gpu-0" in DOC.read_text()
    limit = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Gi"}}
    config = decode({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": limit})
    with pytest.raises(ConfigError, match=f"{gpu.memory_bytes // 2**20} MiB"):
        checked(config, [gpu])
