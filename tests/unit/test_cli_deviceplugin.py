"""The command line of the device plugin and of the GPU split (dra.cli), up to start-up refusals."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from dra.adapters.assignmentrecord import AssignmentRecord
from dra.adapters.checkpoint import CheckpointStore
from dra.cli import main
from dra.cli.parser import parse_args
from dra.core.assignment import GpuPath, restrict
from dra.daemon import bootstrap
from dra.daemon.bootstrap import GpuInitError, warn_about_stranded_claims
from dra.deviceplugin.allocate import Strategy
from dra.deviceplugin.daemon import DevicePluginSettings, run_device_plugin
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.gpu.library import GpuLibraryError
from dra.model.prepared import PreparedClaim, PreparedDevice


def test_device_plugin_defaults() -> None:
    args = parse_args(["device-plugin", "--node-name=n"])
    assert args.kubelet_root == Path("/var/lib/kubelet")
    assert args.device_plugin_dir is None
    assert args.cdi_root == Path("/var/run/cdi")
    assert args.resource_name == "nvidia.com/gpu"
    # Unset, so that a config file can choose; without one the plugin uses cdi-cri and mixed.
    assert args.device_list_strategy is None
    assert args.mig_strategy is None
    assert args.config_file is None
    assert args.http_address == ":8081"
    assert args.dra_gpus is None
    assert args.device_plugin_gpus is None


def test_flags_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_DEVICE_PLUGIN_GPUS", "2,3")
    monkeypatch.setenv("DRA_GPU_DEVICE_LIST_STRATEGY", "cdi-annotations,envvar")
    for command in ("device-plugin", "kubelet-plugin"):
        args = parse_args([command, "--node-name=n"])
        assert args.device_plugin_gpus.indexes == {2, 3}
    args = parse_args(["device-plugin", "--node-name=n"])
    assert args.device_list_strategy == {Strategy.CDI_ANNOTATIONS, Strategy.ENVVAR}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dra-gpus=gpu-1"], "'gpu-1' in 'gpu-1' is not a GPU index"),
        (["--device-list-strategy=volume-mounts"], "expected cdi-cri, cdi-annotations or envvar"),
    ],
)
def test_bad_values_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["device-plugin", "--node-name=n", *argv])
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_env_value_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRA_GPU_DRA_GPUS", "0,all")
    assert main(["device-plugin", "--node-name=n"]) == 2
    assert "environment variable DRA_GPU_DRA_GPUS='0,all'" in capsys.readouterr().err


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", ["device-plugin", "kubelet-plugin"])
def test_overlapping_selectors_stop_either_command_naming_the_gpu(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = discover(FakeGpuLibrary(load_profile("mixed"), "n")).gpus[3]
    line = _refusal(
        [
            command,
            "--node-name=n",
            "--fake-gpus=mixed",
            f"--state-dir={tmp_path}",
            f"--kubelet-root={tmp_path}",
            "--dra-gpus=model=Tesla T4",
            "--device-plugin-gpus=3",
            "--log-level=error",
        ],
        capsys,
    )
    assert line == (
        f"dra-gpu: error: GPU 3 ({gpu.uuid}, Tesla T4) is selected by both --dra-gpus=model=Tesla T4 and "
        "--device-plugin-gpus=3: a GPU can be advertised by one path only"
    )


def test_device_plugin_refuses_a_gpu_the_running_dra_path_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = discover(FakeGpuLibrary(load_profile("mixed"), "n")).gpus
    dra = AssignmentRecord(tmp_path).lease(GpuPath.DRA, list(gpus), "n")
    try:
        line = _refusal(
            [
                "device-plugin",
                "--node-name=n",
                "--fake-gpus=mixed",
                f"--state-dir={tmp_path}",
                "--log-level=error",
            ],
            capsys,
        )
    finally:
        dra.release()
    assert line.startswith(
        f"dra-gpu: error: GPU 0 ({gpus[0].uuid}, NVIDIA L40S) is already advertised by "
        "the DRA kubelet-plugin on this node (3 more GPU(s) overlap)"
    )


def _device_plugin(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "device-plugin",
        "--node-name=n",
        "--fake-gpus=mixed",
        f"--state-dir={tmp_path / 'state'}",
        f"--kubelet-root={tmp_path}",
        f"--cdi-root={tmp_path / 'cdi'}",
        "--http-address=",
        "--log-level=error",
        *extra,
    ]


def test_device_plugin_refuses_a_gpu_a_prepared_dra_claim_still_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = discover(FakeGpuLibrary(load_profile("mixed"), "n")).gpus
    checkpoint = tmp_path / "state" / "checkpoint.json"
    # Prepared while GPU 3 was DRA's; now the selectors give 2 and 3 to the device plugin.
    CheckpointStore(checkpoint).save(
        {
            "uid-1": PreparedClaim(
                uid="uid-1",
                namespace="team-a",
                name="trainer-gpu",
                devices=(
                    PreparedDevice(
                        ("gpu",), "n", "gpu-3", ("k8s.gpu.nvidia.com/claim=uid-1-gpu-3",), uuid=gpus[3].uuid
                    ),
                ),
            )
        }
    )
    line = _refusal(_device_plugin(tmp_path, "--device-plugin-gpus=2,3"), capsys)
    assert line == (
        f"dra-gpu: error: GPU 3 ({gpus[3].uuid}, Tesla T4) is still used by ResourceClaim team-a/trainer-gpu "
        f"(UID uid-1), prepared for DRA on this node (checkpoint {checkpoint}): wait until the pods using it "
        "end, or drain the node; the device plugin starts once the kubelet has unprepared the claim"
    )
    # It refused before serving anything, and left the GPU assignment record as it found it.
    assert not (tmp_path / "device-plugins").exists()
    assert not (tmp_path / "cdi").exists()
    assert AssignmentRecord(tmp_path / "state").read() == {}


def test_device_plugin_refuses_a_corrupt_checkpoint_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "state" / "checkpoint.json"
    checkpoint.parent.mkdir()
    checkpoint.write_text('{"kind": "DraGpuCheckpoint", "version": 1, "claims": {}, "checksum": "x"}')
    line = _refusal(_device_plugin(tmp_path), capsys)
    assert line.startswith(f"dra-gpu: error: checkpoint {checkpoint} fails its checksum")


def test_the_kubelet_plugin_warns_about_claims_left_on_gpus_it_no_longer_has(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    everything = discover(FakeGpuLibrary(load_profile("mixed"), "n"))
    gpus = everything.gpus
    checkpoint = tmp_path / "checkpoint.json"
    CheckpointStore(checkpoint).save(
        {
            uid: PreparedClaim(
                uid, "team-a", name, (PreparedDevice(("gpu",), "n", gpu.name, ("x",), uuid=gpu.uuid),)
            )
            for uid, name, gpu in [("uid-1", "stays", gpus[0]), ("uid-2", "moved", gpus[3])]
        }
    )
    with caplog.at_level(logging.WARNING, logger="dra.daemon.bootstrap"):
        warn_about_stranded_claims(
            everything, restrict(everything, gpus[:2]), CheckpointStore(checkpoint).load().values()
        )
    assert [r.getMessage() for r in caplog.records] == [
        f"prepared ResourceClaim team-a/moved (UID uid-2) uses gpu-3 on GPU 3 ({gpus[3].uuid}, Tesla T4), "
        "no longer assigned to DRA: the claim stays prepared until its pods end, and the device plugin "
        "refuses to start with the GPU until then"
    ]


def test_check_config_prints_the_effective_settings_and_resources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nflags:\n  migStrategy: none\n  nvidiaDriverRoot: /run/nvidia/driver\n"
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    argv = ["device-plugin", f"--config-file={config}", "--check-config", "--device-list-strategy=envvar"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        "resource: nvidia.com/gpu",
        "MIG strategy: none",
        "fail on init error: true",
        "device list strategy: envvar",
        "time-slicing: nvidia.com/gpu x4 advertised as nvidia.com/gpu",
        "ignored: flags.nvidiaDriverRoot (driver libraries come from the container runtime; "
        "device nodes from --host-root)",
    ]
    assert main([*argv, "--fake-gpus=h100x8-mig"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "offers nvidia.com/gpu: 16"


def test_check_config_refuses_bad_input_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}"
    )
    line = _refusal(["device-plugin", f"--config-file={config}", "--check-config"], capsys)
    assert line == (
        f"dra-gpu: error: {config}: sharing.timeSlicing.resources[0].replicas: "
        "must be a whole number of at least 1, got 0"
    )
    line = _refusal(["device-plugin", f"--config-file={tmp_path / 'absent'}", "--check-config"], capsys)
    assert line.startswith(f"dra-gpu: error: --config-file: cannot read {tmp_path / 'absent'}: ")
    # The single strategy on a node with several MIG profiles, the strategy set by the environment.
    monkeypatch.setenv("DRA_GPU_MIG_STRATEGY", "single")
    line = _refusal(["device-plugin", "--check-config", "--fake-gpus=a100x4-mig"], capsys)
    assert line.startswith("dra-gpu: error: MIG strategy single needs one MIG profile on the node, found 5")


def test_the_device_plugin_needs_a_node_name_unless_it_only_checks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse_args(["device-plugin"])
    assert raised.value.code == 2
    assert "the following arguments are required: --node-name" in capsys.readouterr().err
    assert parse_args(["device-plugin", "--check-config"]).node_name is None


class _NoDriver(FakeGpuLibrary):
    def init(self) -> None:
        raise GpuLibraryError(9, "Driver Not Loaded")


@pytest.mark.anyio
async def test_fail_on_init_error_false_waits_instead_of_exiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(bootstrap, "gpu_library", lambda *_: _NoDriver(load_profile("mixed"), "n"))
    settings = DevicePluginSettings(
        driver_name="gpu.nvidia.com",
        node_name="n",
        kubelet_root=tmp_path,
        cdi_root=tmp_path,
        state_dir=tmp_path,
    )
    with pytest.raises(GpuInitError, match="cannot read GPUs through NVML"):
        await run_device_plugin(settings)
    with caplog.at_level(logging.ERROR, logger="dra.deviceplugin.daemon"), anyio.move_on_after(0.3) as waited:
        await run_device_plugin(replace(settings, fail_on_init_error=False))
    assert waited.cancelled_caught, "it serves nothing until SIGTERM"
    [record] = caplog.records
    assert record.getMessage().endswith(
        "failOnInitError is false, so this plugin serves nothing until it is stopped"
    )


def test_check_config_with_a_config_dir_validates_every_named_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "four").write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}"
    )
    (tmp_path / "plain").write_text("version: v1\n")
    (tmp_path / "..data").mkdir()
    argv = ["device-plugin", f"--config-dir={tmp_path}", "--check-config"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "config four:"
    assert "  time-slicing: nvidia.com/gpu x4 advertised as nvidia.com/gpu" in out
    assert "config plain:" in out

    (tmp_path / "zero").write_text(
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}"
    )
    line = _refusal(argv, capsys)
    assert line.startswith(f"dra-gpu: error: config zero ({tmp_path / 'zero'}): sharing.timeSlicing")


def test_config_dir_excludes_config_file_and_config_default_needs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["device-plugin", f"--config-dir={tmp_path}", f"--config-file={tmp_path / 'x'}", "--check-config"]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert line == "dra-gpu: error: --config-file and --config-dir exclude each other: give one"
    assert main(["device-plugin", "--config-default=four", "--check-config"]) == 2
    line = capsys.readouterr().err.strip()
    assert (
        line
        == "dra-gpu: error: --config-default needs --config-dir: it names one of that directory's configs"
    )
