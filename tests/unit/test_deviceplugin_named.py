"""Named configs: which config a node's labels choose, and how a running plugin follows them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest

from dra.adapters.kube import KubeClient
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.configwatch import REFUSED, ConfigFollower, NamedConfigs
from dra.deviceplugin.named import LABEL, choose, config_names

NAMES = ["default", "four"]


def test_the_label_chooses_then_the_default_then_the_only_config() -> None:
    assert choose({LABEL: "four"}, NAMES, "default") == "four"
    assert choose({"other": "x"}, NAMES, "default") == "default"
    assert choose({}, ["only"], None) == "only"


@pytest.mark.parametrize(
    ("labels", "default", "message"),
    [
        ({LABEL: "eight"}, "default", f"node label {LABEL}=eight names no config (have default, four)"),
        ({}, "missing", "--config-default missing names no config (have default, four)"),
        ({}, None, f"the node has no {LABEL} label and there is no --config-default"),
    ],
)
def test_a_choice_that_names_nothing_says_what_is_missing(
    labels: dict[str, str], default: str | None, message: str
) -> None:
    with pytest.raises(dpconfig.ConfigError, match="^" + re.escape(message)):
        choose(labels, NAMES, default)


def test_a_mounted_configmap_s_own_entries_are_not_configs() -> None:
    assert config_names(["four", "..data", "..2026_11_23_12_00_00.1", "default"]) == NAMES


class FakeKube:
    """Records the Events the follower would create."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def create_event(
        self, involved: dict[str, Any], reason: str, message: str, *, host: str = ""
    ) -> None:
        self.events.append((involved["metadata"]["name"], reason, message))


def _node(label: str | None) -> dict[str, Any]:
    labels = {LABEL: label} if label else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": labels}}


def _replicas(n: int) -> str:
    entry = f"    - name: nvidia.com/gpu\n      replicas: {n}\n"
    return "version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + entry


@pytest.mark.anyio
async def test_a_new_label_applies_its_config_and_a_bad_one_is_refused_once(tmp_path: Path) -> None:
    (tmp_path / "default").write_text(_replicas(1))
    (tmp_path / "four").write_text(_replicas(4))
    (tmp_path / "bad").write_text("version: v2\n")
    configs = NamedConfigs(tmp_path, "default", dpconfig.Overrides("nvidia.com/gpu"))
    applied: list[int] = []

    async def apply(settings: dpconfig.Settings) -> str | None:
        replicas = settings.time_slicing.resources[0].replicas
        applied.append(replicas)
        return "the node cannot offer 3" if replicas == 3 else None

    kube = FakeKube()
    name, text, _ = configs.load({})
    follower = ConfigFollower(configs, cast(KubeClient, kube), "node-a", apply, (name, text))

    await follower.consider(_node(None))
    assert applied == [], "the config in force is not applied again"
    await follower.consider(_node("four"))
    assert applied == [4]
    assert follower.in_force[0] == "four"

    await follower.consider(_node("bad"))
    await follower.consider(_node("bad"))
    [(node, reason, message)] = kube.events
    assert (node, reason) == ("node-a", REFUSED)
    assert message.startswith(f"config bad ({tmp_path / 'bad'}): ")
    assert message.endswith("; keeping config four")
    assert applied == [4]

    # A config that parses but the node cannot offer is refused too, and so is a missing name.
    (tmp_path / "three").write_text(_replicas(3))
    await follower.consider(_node("three"))
    assert kube.events[-1][2] == "config three: the node cannot offer 3; keeping config four"
    await follower.consider(_node("gone"))
    assert "names no config" in kube.events[-1][2]
    assert follower.in_force[0] == "four"

    # The file in force changes: polled, applied.
    (tmp_path / "four").write_text(_replicas(5))
    await follower.consider(_node("four"))
    assert applied[-1] == 5
