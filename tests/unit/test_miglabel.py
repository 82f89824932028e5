"""The Node's side of static MIG layouts: the label names the layout, the state label and Events
report it, and a new label value is applied while the plugin runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.kube import KubeError
from dra.core.migconfig import LAYOUT_LABEL, STATE_LABEL, MigConfigs
from dra.core.miglayout import Applied
from dra.daemon.bootstrap import DaemonSettings
from dra.kubeletplugin.miglabel import LayoutFollower, apply_at_start
from dra.kubeletplugin.miglayout import MigLayoutError, apply_with_own_library
from dra.model.migmode import MigModes
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import NODE
from tests.unit.test_miglayout import LAYOUTS, _apply, _layout, _lib, _migs


class FakeKube:
    """The Node (with its labels) and the Events recorded on it, as KubeClient answers them."""

    def __init__(
        self, labels: dict[str, str] | None, events_allowed: bool = True, patch_allowed: bool = True
    ) -> None:
        self.labels = labels
        self.events_allowed = events_allowed
        self.patch_allowed = patch_allowed
        self.events: list[tuple[str, str, str]] = []
        #: Every value the state label was given, in order.
        self.states: list[str] = []
        #: The layouts a follower applied, in order.
        self.relayouts: list[str] = []

    async def patch_node_labels(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        if not self.patch_allowed:
            raise KubeError("nodes is forbidden", 403)
        assert self.labels is not None
        assert name == NODE
        assert set(labels) == {STATE_LABEL}
        self.labels = {**self.labels, **labels}
        self.states.append(labels[STATE_LABEL])
        return {"metadata": {"name": name, "labels": self.labels}}

    async def get_node(self, name: str) -> dict[str, Any]:
        if self.labels is None:
            raise KubeError("connection refused")
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": self.labels}}

    async def create_event(
        self, involved: dict[str, Any], reason: str, message: str, *, host: str = ""
    ) -> None:
        if not self.events_allowed:
            raise KubeError("events is forbidden", 403)
        self.events.append((involved["metadata"]["name"], reason, message))


def _settings(root: Path) -> DaemonSettings:
    return DaemonSettings(
        driver_name="gpu.nvidia.com",
        node_name=NODE,
        kubelet_root=root / "kubelet",
        cdi_root=root / "cdi",
        state_dir=root,
        fake_gpus="h100x8",
    )


async def _start(root: Path, kube: FakeKube, fallback: str | None) -> MigModes:
    layouts = root / "layouts.yaml"
    layouts.write_text(yaml.safe_dump(LAYOUTS))
    modes, _ = await apply_at_start(_settings(root), kube, layouts, fallback)  # type: ignore[arg-type]
    return modes


@pytest.mark.anyio
async def test_the_node_label_names_the_layout_and_the_flag_serves_nodes_without_it(tmp_path: Path) -> None:
    modes = await _start(tmp_path, FakeKube({LAYOUT_LABEL: "sevens"}), "mixed")
    assert _layout(tmp_path) == {g: [("1g.10gb", s) for s in range(7)] for g in (0, 1)}
    lib = _lib(tmp_path)
    assert modes.of(0, lib.uuid(lib.device_by_index(0))) == "static"
    await _start(tmp_path, FakeKube({}), "off")
    assert _layout(tmp_path) == {}


@pytest.mark.anyio
async def test_without_a_label_or_a_flag_the_gpus_stay_as_they_are(tmp_path: Path) -> None:
    _apply(tmp_path, "sevens")
    assert await _start(tmp_path, FakeKube({}), None) == MigModes()
    assert _layout(tmp_path) == {g: [("1g.10gb", s) for s in range(7)] for g in (0, 1)}
    # An API server that does not answer: the flag's layout.
    await _start(tmp_path, FakeKube(None), "off")
    assert _layout(tmp_path) == {}


def _a_claim_holds_the_3g(root: Path) -> None:
    """Layout `mixed` on the GPUs, and a prepared claim (checkpoint) holding its 3g.40gb instance."""
    _apply(root, "mixed")
    three_g = next(m for m in _migs(_lib(root)) if m.profile == "3g.40gb")
    device = PreparedDevice(("r",), NODE, three_g.name, (), uuid=three_g.uuid)
    CheckpointStore(root / "checkpoint.json").save({"u": PreparedClaim("u", "a", "b", (device,))})


@pytest.mark.anyio
async def test_what_the_layout_cannot_do_yet_is_an_event_on_the_node(tmp_path: Path) -> None:
    _a_claim_holds_the_3g(tmp_path)
    kube = FakeKube({LAYOUT_LABEL: "off"})
    await _start(tmp_path, kube, None)
    [(node, reason, message)] = kube.events
    assert (node, reason) == (NODE, "MigLayoutIncomplete")
    assert message.startswith("GPU 0 (NVIDIA H100 80GB HBM3): 3g.40gb at 4")
    assert "MIG stays on" in message
    # Without RBAC for Events the warning is only logged.
    await _start(tmp_path, FakeKube({LAYOUT_LABEL: "off"}, events_allowed=False), None)


@pytest.mark.anyio
async def test_the_state_label_says_how_applying_went_as_the_mig_manager_sets_it(tmp_path: Path) -> None:
    kube = FakeKube({LAYOUT_LABEL: "sevens"})
    await _start(tmp_path, kube, None)
    assert kube.states == ["pending", "success"]
    assert kube.labels is not None
    assert kube.labels[STATE_LABEL] == "success"
    # Applied in part (a claim holds an instance the layout drops): pending, with the Event.
    _a_claim_holds_the_3g(tmp_path)
    kube = FakeKube({LAYOUT_LABEL: "sevens"})
    await _start(tmp_path, kube, None)
    assert kube.states == ["pending", "pending"]
    assert kube.events
    # A layout the file does not have: failed, then the exit.
    kube = FakeKube({LAYOUT_LABEL: "no-such-layout"})
    with pytest.raises(MigLayoutError):
        await _start(tmp_path, kube, None)
    assert kube.states == ["pending", "failed"]
    # No layout named: the label is left alone. RBAC without patch: the layout still applies.
    (tmp_path / "checkpoint.json").unlink()
    kube = FakeKube({})
    await _start(tmp_path, kube, None)
    assert kube.states == []
    kube = FakeKube({LAYOUT_LABEL: "off"}, patch_allowed=False)
    await _start(tmp_path, kube, None)
    assert kube.states == []
    assert _layout(tmp_path) == {}


def _follower(root: Path, kube: FakeKube, current: str | None, fallback: str | None = None) -> LayoutFollower:
    """A follower whose relayout applies the layout to the fake GPUs as the plugin does (no claims)."""
    layouts = root / "layouts.yaml"
    layouts.write_text(yaml.safe_dump(LAYOUTS))

    async def relayout(configs: MigConfigs, name: str) -> Applied:
        kube.relayouts.append(name)
        return apply_with_own_library(_settings(root), configs, name, MigModes(), [], [])

    return LayoutFollower(kube, NODE, layouts, fallback, current, relayout)  # type: ignore[arg-type]


def _node(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


@pytest.mark.anyio
async def test_a_new_label_value_is_applied_while_the_plugin_runs(tmp_path: Path) -> None:
    kube = FakeKube({LAYOUT_LABEL: "sevens"})
    await _start(tmp_path, kube, None)
    follower = _follower(tmp_path, kube, "sevens")
    # Other changes of the Node (its status, other labels) apply nothing.
    await follower.consider(_node({LAYOUT_LABEL: "sevens", "other": "x"}))
    assert kube.relayouts == []
    await follower.consider(_node({LAYOUT_LABEL: "mixed"}))
    assert kube.relayouts == ["mixed"]
    # Two of the seven 1g.10gb stay where they are; the rest make room.
    assert _layout(tmp_path)[0] == [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert kube.states == ["pending", "success", "pending", "success"]
    # The label removed and no --mig-config: the GPUs stay as they are, as at start.
    await follower.consider(_node({}))
    assert kube.relayouts == ["mixed"]
    assert follower.current == "mixed"


@pytest.mark.anyio
async def test_a_layout_that_fails_while_running_leaves_the_gpus_and_says_so(tmp_path: Path) -> None:
    kube = FakeKube({LAYOUT_LABEL: "sevens"})
    await _start(tmp_path, kube, None)
    before = _layout(tmp_path)
    follower = _follower(tmp_path, kube, "sevens")
    await follower.consider(_node({LAYOUT_LABEL: "no-such-layout"}))
    assert _layout(tmp_path) == before
    assert kube.states[-2:] == ["pending", "failed"]
    [(node, reason, message)] = kube.events
    assert (node, reason) == (NODE, "MigLayoutFailed")
    assert "no-such-layout" in message
    assert message.endswith("the GPUs stay as they were")
    # Not tried again on the next Node event; a fixed label is.
    await follower.consider(_node({LAYOUT_LABEL: "no-such-layout", "other": "x"}))
    assert kube.relayouts == ["no-such-layout"]
    await follower.consider(_node({LAYOUT_LABEL: "off"}))
    assert _layout(tmp_path) == {}
    assert kube.states[-1] == "success"
