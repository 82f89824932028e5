"""The dra-gpu command line: flags from environment variables, `discover` output, exit codes and messages."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra import cli
from dra.cli.parser import parse_args
from dra.core.deviceentries import SliceError
from dra.daemon import bootstrap
from dra.daemon import flags as envflags
from dra.gpu.library import GpuLibraryError
from dra.kubeletplugin import command as kubeletplugin_command
from tests.unit.helpers import write_kubeconfig


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No DRA_GPU_* variable of the caller's environment leaks in; logging is restored after main()."""
    for name in list(os.environ):
        if name.startswith("DRA_GPU_"):
            monkeypatch.delenv(name)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    urllib3_level = logging.getLogger("urllib3").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("urllib3").setLevel(urllib3_level)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dra-gpu: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "env"),
    [
        ("--node-name", "DRA_GPU_NODE_NAME"),
        ("--fake-gpus", "DRA_GPU_FAKE_GPUS"),
        ("--fake-gpu-events", "DRA_GPU_FAKE_GPU_EVENTS"),
        ("--log-level", "DRA_GPU_LOG_LEVEL"),
        ("--cdi-root", "DRA_GPU_CDI_ROOT"),
        ("output", "DRA_GPU_OUTPUT"),
    ],
)
def test_env_name(flag: str, env: str) -> None:
    assert envflags.env_name(flag) == env


def test_discover_defaults() -> None:
    args = parse_args(["discover"])
    assert args.fake_gpus is None
    assert args.driver_name == "gpu.nvidia.com"
    assert args.node_name == socket.gethostname()
    assert (args.output, args.log_level, args.log_format) == ("yaml", "info", "text")


def test_environment_variables_set_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_FAKE_GPUS", "mixed")
    monkeypatch.setenv("DRA_GPU_NODE_NAME", "node-7")
    monkeypatch.setenv("DRA_GPU_OUTPUT", "json")
    monkeypatch.setenv("DRA_GPU_DRIVER_NAME", "gpu.example.com")
    monkeypatch.setenv("DRA_GPU_LOG_LEVEL", "debug")
    args = parse_args(["discover"])
    assert (args.fake_gpus, args.node_name, args.output, args.driver_name, args.log_level) == (
        "mixed",
        "node-7",
        "json",
        "gpu.example.com",
        "debug",
    )


def test_a_flag_wins_over_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_OUTPUT", "json")
    monkeypatch.setenv("DRA_GPU_FAKE_GPUS", "mixed")
    args = parse_args(["discover", "--output", "yaml", "--fake-gpus", "h100x8"])
    assert (args.output, args.fake_gpus) == ("yaml", "h100x8")


def test_kubelet_plugin_defaults_and_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args(["kubelet-plugin", "--node-name", "node-a"])
    assert args.kubelet_root == Path("/var/lib/kubelet")
    assert args.cdi_root == Path("/var/run/cdi")
    assert (args.state_dir, args.kubeconfig, args.fake_gpus, args.fake_gpu_events) == (None, None, None, None)
    assert args.http_address == ":8080"
    monkeypatch.setenv("DRA_GPU_CDI_ROOT", "/etc/cdi")
    monkeypatch.setenv("DRA_GPU_STATE_DIR", "/var/lib/dra-gpu")
    monkeypatch.setenv("DRA_GPU_HTTP_ADDRESS", "")
    args = parse_args(["kubelet-plugin", "--node-name", "node-a"])
    assert (args.cdi_root, args.state_dir, args.http_address) == (
        Path("/etc/cdi"),
        Path("/var/lib/dra-gpu"),
        "",
    )


@pytest.mark.parametrize(
    ("given", "vfio"),
    [
        ((), False),
        (("--vfio",), True),
        (("--vfio=true",), True),
        (("--vfio=false",), False),
        (("--vfio", "false"), False),
        (("--vfio=off",), False),
    ],
)
def test_a_boolean_flag_alone_means_true_as_go_flags_do(given: tuple[str, ...], vfio: bool) -> None:
    args = parse_args(["kubelet-plugin", "--node-name", "node-a", *given, "--device-metadata"])
    assert (args.vfio, args.device_metadata) == (vfio, True)


def test_every_boolean_flag_takes_the_bare_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_ROLLING_UPDATE", "false")
    args = parse_args(["kubelet-plugin", "--node-name", "node-a", "--usage-processes", "--cdi-driver-files"])
    assert (args.usage_processes, args.cdi_driver_files, args.rolling_update) == (True, True, False)
    assert parse_args(["top", "--once"]).once is True
    assert parse_args(["discover", "--vfio"]).vfio is True


def test_a_boolean_flag_refuses_what_is_not_true_or_false(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["kubelet-plugin", "--node-name", "node-a", "--vfio=maybe"])
    assert exit_info.value.code == 2
    assert "argument --vfio: invalid boolean value: 'maybe'" in capsys.readouterr().err


def test_the_node_name_is_required_unless_the_environment_gives_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["kubelet-plugin"])
    assert exit_info.value.code == 2
    assert "--node-name" in capsys.readouterr().err
    monkeypatch.setenv("DRA_GPU_NODE_NAME", "node-from-env")
    assert parse_args(["kubelet-plugin"]).node_name == "node-from-env"


def test_help_names_the_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["kubelet-plugin", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for env in ("DRA_GPU_NODE_NAME", "DRA_GPU_FAKE_GPUS", "DRA_GPU_CDI_ROOT", "DRA_GPU_KUBELET_ROOT"):
        assert f"env {env}" in text
    assert "default /var/run/cdi" in text


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DRA_GPU_OUTPUT", "xml", "environment variable DRA_GPU_OUTPUT='xml': expected one of yaml, json"),
        (
            "DRA_GPU_LOG_LEVEL",
            "loud",
            "DRA_GPU_LOG_LEVEL='loud': expected one of debug, info, warning, error",
        ),
        ("DRA_GPU_LOG_FORMAT", "JSON", "DRA_GPU_LOG_FORMAT='JSON': expected one of text, json"),
    ],
)
def test_an_invalid_environment_value_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    message: str,
) -> None:
    monkeypatch.setenv(variable, value)
    code, out, err = _run(capsys, "discover", "--fake-gpus", "h100x8")
    assert code == 2
    assert out == ""
    assert message in _one_error_line(err)


def _slices(document: dict[str, Any]) -> list[dict[str, Any]]:
    assert document["apiVersion"] == "v1"
    assert document["kind"] == "List"
    items: list[dict[str, Any]] = document["items"]
    assert all(item["kind"] == "ResourceSlice" for item in items)
    return items


def test_discover_prints_the_resource_slices_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "discover", "--fake-gpus", "h100x8", "--node-name", "node-a", "--output", "json"
    )
    assert code == 0
    (only,) = _slices(json.loads(out))
    assert only["apiVersion"] == "resource.k8s.io/v1"
    assert only["metadata"] == {"name": "node-a-gpu.nvidia.com-0"}
    assert only["spec"]["nodeName"] == "node-a"
    assert only["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    devices = only["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert devices[0]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert devices[0]["capacity"]["memory"] == {"value": "81559Mi"}


def test_discover_with_vfio_prints_each_gpus_passthrough_twin(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("discover", "--fake-gpus", "h100x8", "--node-name", "node-a", "--output", "json", "--vfio=true")
    code, out, _ = _run(capsys, *args)
    assert code == 0
    devices = [d for s in _slices(json.loads(out)) for d in s["spec"].get("devices", [])]
    twins = [d["name"] for d in devices if d["attributes"]["type"] == {"string": "vfio"}]
    assert twins == [f"gpu-vfio-{i}" for i in range(8)]


def test_discover_prints_yaml_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    _, as_yaml, _ = _run(capsys, "discover", "--fake-gpus", "a100x4-mig", "--node-name", "node-a")
    _, as_json, _ = _run(
        capsys, "discover", "--fake-gpus", "a100x4-mig", "--node-name", "node-a", "--output", "json"
    )
    assert yaml.safe_load(as_yaml) == json.loads(as_json)
    assert len(_slices(json.loads(as_json))[0]["spec"]["devices"]) == 14


def test_discover_takes_its_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRA_GPU_FAKE_GPUS", "mixed")
    monkeypatch.setenv("DRA_GPU_NODE_NAME", "node-9")
    monkeypatch.setenv("DRA_GPU_DRIVER_NAME", "gpu.example.com")
    monkeypatch.setenv("DRA_GPU_OUTPUT", "json")
    code, out, _ = _run(capsys, "discover")
    assert code == 0
    (only,) = _slices(json.loads(out))
    assert only["metadata"]["name"] == "node-9-gpu.example.com-0"
    assert only["spec"]["driver"] == "gpu.example.com"
    # The mixed profile's GPUs, least memory first (dra.core.slices.DeviceOrder).
    assert [d["attributes"]["productName"]["string"] for d in only["spec"]["devices"]] == [
        "Tesla T4",
        "Tesla T4",
        "NVIDIA L40S",
        "NVIDIA L40S",
    ]


def test_fake_uuids_follow_the_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    def uuids(node: str) -> list[str]:
        _, out, _ = _run(capsys, "discover", "--fake-gpus", "h100x8", "--node-name", node, "--output", "json")
        return [d["attributes"]["uuid"]["string"] for d in _slices(json.loads(out))[0]["spec"]["devices"]]

    assert uuids("node-a") == uuids("node-a")
    assert not set(uuids("node-a")) & set(uuids("node-b"))


def test_an_unknown_profile_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "discover", "--fake-gpus", "h100x16")
    assert code == 1
    assert out == ""
    line = _one_error_line(err)
    assert line.startswith("dra-gpu: error: --fake-gpus: fake GPU profile 'h100x16' is neither a built-in")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("gpus: [model: t4\n", "not valid YAML or JSON: line 2, column 1"),
        ("gpus: [{model: v100}]\n", "gpus[0].model: unknown model 'v100'"),
        ("gpus: [{model: l40s, mig: [1g.5gb]}]\n", "gpus[0].mig: NVIDIA L40S does not support MIG"),
    ],
)
def test_a_bad_profile_file_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    code, out, err = _run(capsys, "discover", "--fake-gpus", str(path))
    assert code == 1
    assert out == ""
    assert problem in _one_error_line(err)


class NoDriver:
    """NVML on a machine without the NVIDIA driver."""

    def __init__(self, dev: Path, library: Path | None = None) -> None:
        self.dev = dev

    def init(self) -> None:
        raise GpuLibraryError(9, "nvmlInit: Driver Not Loaded")


def test_without_nvml_discover_exits_1_suggesting_fake_gpus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bootstrap, "NvmlLibrary", NoDriver)
    code, out, err = _run(capsys, "discover")
    assert code == 1
    assert out == ""
    line = _one_error_line(err)
    assert "cannot read GPUs through NVML (nvmlInit: Driver Not Loaded)" in line
    assert "--fake-gpus" in line


def test_an_inventory_the_api_would_reject_exits_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def reject(*args: object, **kwargs: object) -> list[dict[str, Any]]:
        raise SliceError("device names are not unique: ['gpu-0']")

    monkeypatch.setattr(kubeletplugin_command, "build_slices", reject)
    code, out, err = _run(capsys, "discover", "--fake-gpus", "mixed")
    assert code == 1
    assert out == ""
    assert _one_error_line(err) == "dra-gpu: error: device names are not unique: ['gpu-0']"


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        ("DRA_GPU_CDI_ROOT", "environment variable DRA_GPU_CDI_ROOT='': must not be empty"),
        ("DRA_GPU_NODE_NAME", "environment variable DRA_GPU_NODE_NAME='': must not be empty"),
    ],
)
def test_an_empty_variable_is_an_error_not_a_silent_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, message: str
) -> None:
    monkeypatch.setenv("DRA_GPU_NODE_NAME", "node-a")
    monkeypatch.setenv(variable, "")
    code, _, err = _run(capsys, "kubelet-plugin")
    assert code == 2
    assert err.strip() == f"dra-gpu: error: {message}"


def test_a_variable_of_another_subcommand_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_OUTPUT", "xml")
    args = parse_args(["kubelet-plugin", "--node-name", "node-a"])
    assert args.node_name == "node-a"
    with pytest.raises(envflags.UsageError, match="DRA_GPU_OUTPUT='xml': expected one of yaml, json"):
        parse_args(["discover"])


def test_the_command_line_wins_over_an_invalid_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_GPU_OUTPUT", "xml")
    assert parse_args(["discover", "--output", "json"]).output == "json"


def test_a_corrupt_checkpoint_stops_the_daemon_with_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig")
    state = tmp_path / "state"
    state.mkdir()
    (state / "checkpoint.json").write_text(
        '{"kind": "DraGpuCheckpoint", "version": 1, "claims": {}, "checksum": "x"}'
    )
    code, out, err = _run(
        capsys,
        "kubelet-plugin",
        "--node-name=node-a",
        "--fake-gpus=mixed",
        f"--kubeconfig={kubeconfig}",
        f"--kubelet-root={tmp_path / 'kubelet'}",
        f"--cdi-root={tmp_path / 'cdi'}",
        f"--state-dir={state}",
        "--http-address=",
        "--log-level=error",
    )
    assert (code, out) == (1, "")
    line = _one_error_line(err)
    assert f"checkpoint {state / 'checkpoint.json'} fails its checksum" in line


def test_a_startup_error_inside_a_task_group_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(args: Any) -> int:
        raise ExceptionGroup(
            "task group", [bootstrap.StartupError("cannot serve the plugin's sockets (x): busy")]
        )

    monkeypatch.setitem(cli.COMMANDS, "discover", fails)
    code, _, err = _run(capsys, "discover")
    assert code == 1
    assert _one_error_line(err) == "dra-gpu: error: cannot serve the plugin's sockets (x): busy"


def test_discover_prints_dynamic_mig_counter_sets_and_every_placement(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "discover",
        "--fake-gpus",
        "h100x8-dynamic-mig",
        "--mig-mode",
        "dynamic",
        "--mig-profiles",
        "all",
        "--node-name",
        "node-a",
    ]
    for minor, layout in ((34, [(2, 52)] * 4), (37, [(8, 0), *[(0, 52)] * 4])):
        code, out, _ = _run(capsys, *argv, "--output", "json", "--kubernetes-minor", str(minor))
        assert code == 0
        items = _slices(json.loads(out))
        assert [
            (len(i["spec"].get("sharedCounters", [])), len(i["spec"].get("devices", []))) for i in items
        ] == layout
        names = {d["name"] for i in items for d in i["spec"].get("devices", [])}
        assert {f"gpu-7-mig-1g10gb-at{s}" for s in range(7)} <= names


def test_a_profile_made_for_dynamic_mig_selects_it_and_static_mig_says_why_nothing_is_published(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_args(["discover", "--fake-gpus", "a100x4-dynamic-mig"]).mig_mode.default == "dynamic"
    assert parse_args(["discover", "--fake-gpus", "h100x8-mig"]).mig_mode.default == "static"
    base = ["discover", "--fake-gpus", "h100x8-dynamic-mig", "--node-name", "node-a", "--output", "json"]
    code, out, err = _run(capsys, *base)
    assert code == 0
    assert any(i["spec"].get("devices") for i in _slices(json.loads(out)))
    assert err == ""
    code, out, err = _run(capsys, *base, "--mig-mode", "static")
    assert code == 0
    assert not any(i["spec"].get("devices") for i in _slices(json.loads(out)))
    lines = err.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("no device published: GPU 0 (GPU-")
    assert lines[0].endswith(
        "MIG mode is on and it has no MIG device; static MIG publishes only the MIG devices made "
        "beforehand: make some (--mig-config), or offer them per claim with --mig-mode dynamic"
    )


def test_a_bad_mig_mode_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["discover", "--mig-mode", "dynamic,0=sliced"])
    err = capsys.readouterr().err
    assert "argument --mig-mode: '0=sliced': the mode must be one of static, dynamic, whole" in err
