"""`dra-gpu node-labeller`: its flags, the device plugin's settings as labels, and no GPU lease."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from dra.cli import main
from dra.cli.parser import parse_args
from dra.daemon.bootstrap import open_node
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.setup import label_sharing
from dra.labeller.daemon import LabellerSettings


def test_a_bad_label_template_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["node-labeller", "--node-name=n", "--label-template=gpu-type={modle}"])
    assert raised.value.code == 2
    assert "unknown placeholder {modle}" in capsys.readouterr().err


def test_the_template_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_LABEL_TEMPLATE", "gpu-type={model}")
    args = parse_args(["node-labeller", "--node-name=n"])
    assert dict(args.label_template.labels) == {"gpu-type": "{model}"}
    assert args.interval == 60.0


def test_time_slicing_of_the_device_plugin_becomes_sharing_labels() -> None:
    config = dpconfig.parse_config(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
        "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n      rename: nvidia.com/small\n",
        "config.yaml",
    )
    plugin = dpconfig.effective(config, dpconfig.Overrides("nvidia.com/gpu"))
    sharing = label_sharing(plugin, dpconfig.MigStrategy.MIXED)
    assert sharing.mig_strategy == "mixed"
    assert sharing.strategy == "time-slicing"
    assert dict(sharing.replicas) == {"gpu": 4, "mig-1g.10gb": 2}
    assert sharing.renamed == {"mig-1g.10gb"}


def test_the_labeller_sees_every_gpu_and_takes_no_lease(tmp_path: Path) -> None:
    settings = LabellerSettings(
        driver_name="gpu.nvidia.com",
        node_name="n",
        kubelet_root=tmp_path,
        cdi_root=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        fake_gpus="mixed",
    )

    async def check() -> None:
        async with open_node(settings, None) as node:
            assert node.inventory == node.everything
            assert len(node.everything.gpus) == 4
            assert not (tmp_path / "state").exists()

    anyio.run(check)
