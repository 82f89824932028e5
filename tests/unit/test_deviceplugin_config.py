"""NVIDIA's device-plugin config file, read as it is (dra.deviceplugin.config)."""

from __future__ import annotations

import json

import pytest

from dra.deviceplugin.allocate import Strategy
from dra.deviceplugin.config import (
    ConfigError,
    ConfigFile,
    MigStrategy,
    Overrides,
    Settings,
    SharedResource,
    TimeSlicing,
    describe,
    effective,
    parse_config,
)

GPU = "nvidia.com/gpu"

#: The time-slicing ConfigMap of NVIDIA's documentation, verbatim.
TIME_SLICING = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def settings(
    text: str, mig_strategy: MigStrategy | None = None, strategies: frozenset[Strategy] | None = None
) -> Settings:
    return effective(parse_config(text, "cfg.yaml"), Overrides(GPU, mig_strategy, strategies))


def error(text: str) -> str:
    with pytest.raises(ConfigError) as raised:
        effective(parse_config(text, "cfg.yaml"), Overrides(GPU))
    return str(raised.value)


def test_time_slicing_configmap_as_nvidia_documents_it() -> None:
    config = parse_config(TIME_SLICING, "cfg.yaml")
    assert config == ConfigFile(
        mig_strategy=MigStrategy.NONE,
        time_slicing=TimeSlicing(resources=(SharedResource(GPU, 4),)),
        source="cfg.yaml",
    )
    result = effective(config, Overrides(GPU))
    assert result.mig_strategy is MigStrategy.NONE
    assert result.strategies == {Strategy.CDI_CRI}
    assert result.fail_on_init_error is True
    assert describe(result) == [
        "resource: nvidia.com/gpu",
        "MIG strategy: none",
        "fail on init error: true",
        "device list strategy: cdi-cri",
        "time-slicing: nvidia.com/gpu x4 advertised as nvidia.com/gpu",
    ]


def test_json_is_read_too() -> None:
    document = {"version": "v1", "flags": {"migStrategy": "single", "failOnInitError": False}}
    config = parse_config(json.dumps(document), "cfg.json")
    assert config.mig_strategy is MigStrategy.SINGLE
    assert config.fail_on_init_error is False


def test_renames_and_one_per_container() -> None:
    config = parse_config(
        """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: gpu
      replicas: 2
    - name: nvidia.com/mig-1g.10gb
      replicas: 3
      rename: mig-small
      devices: all
""",
        "cfg.yaml",
    )
    shared = config.time_slicing
    gpu, mig = shared.resources
    assert shared.advertised_name(gpu) == "nvidia.com/gpu.shared"
    assert shared.advertised_name(mig) == "nvidia.com/mig-small"
    assert shared.fail_requests_greater_than_one


def test_flags_that_are_set_win_over_the_file() -> None:
    text = """
version: v1
flags:
  migStrategy: single
  plugin:
    deviceListStrategy: [envvar, cdi-annotations]
"""
    from_file = settings(text)
    assert from_file.mig_strategy is MigStrategy.SINGLE
    assert from_file.strategies == {Strategy.ENVVAR, Strategy.CDI_ANNOTATIONS}
    flagged = settings(text, mig_strategy=MigStrategy.MIXED, strategies=frozenset({Strategy.CDI_CRI}))
    assert flagged.mig_strategy is MigStrategy.MIXED
    assert flagged.strategies == {Strategy.CDI_CRI}


def test_fields_for_other_programs_are_ignored_and_listed() -> None:
    config = parse_config(
        """
version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  gdsEnabled: false
  mofedEnabled: null
  plugin:
    passDeviceSpecs: true
    deviceIDStrategy: uuid
    deviceListStrategy: envvar
  gfd:
    oneshot: false
    sleepInterval: 60s
""",
        "cfg.yaml",
    )
    assert config.strategies == frozenset({Strategy.ENVVAR})
    assert [item.split(" ")[0] for item in config.ignored] == [
        "flags.nvidiaDriverRoot",
        "flags.gfd",
        "flags.plugin.passDeviceSpecs",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\nflags: {migStrategy: none\n", "cfg.yaml: not valid YAML or JSON: line 3, column 1"),
        ("- a list", "cfg.yaml: the file: expected a mapping, got a list"),
        ("version: v2", "cfg.yaml: version: unsupported version 'v2'; dra-gpu reads version v1"),
        (
            "version: v1\nflag: {}",
            "cfg.yaml: unknown field flag; allowed in the top level: flags, resources, sharing, version",
        ),
        ("flags: {plugin: {deviceListStratgy: envvar}}", "unknown field flags.plugin.deviceListStratgy"),
        ("flags: {migStrategy: hybrid}", "flags.migStrategy: MIG strategy 'hybrid': expected none, single"),
        ("flags: {failOnInitError: 'no'}", "flags.failOnInitError: expected true or false, got 'no'"),
        ("flags: {gdsEnabled: true}", "flags.gdsEnabled: not supported"),
        (
            "flags: {plugin: {deviceIDStrategy: index}}",
            "flags.plugin.deviceIDStrategy: 'index' is not supported",
        ),
        (
            "flags: {plugin: {deviceListStrategy: volume-mounts}}",
            "flags.plugin.deviceListStrategy: 'volume-mounts' not supported",
        ),
        (
            "flags: {plugin: {deviceListStrategy: [cdi-cri, cdi-annotations]}}",
            "flags.plugin.deviceListStrategy: choose one of cdi-cri and cdi-annotations",
        ),
        ("resources: {gpus: [{pattern: '*', name: gpu}]}", "resources: renaming resources by GPU model"),
        ("sharing: {mps: {resources: []}}", "sharing.mps: MPS sharing is not supported"),
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}",
            "sharing.timeSlicing.resources[0].replicas: must be a whole number of at least 1, got 0",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}",
            "sharing.timeSlicing.resources[0].replicas: must be a whole number of at least 1, got None",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, 1]}]}}",
            "sharing.timeSlicing.resources[0].devices: [0, 1] is not supported",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}, "
            "{name: nvidia.com/gpu, replicas: 3}]}}",
            "sharing.timeSlicing.resources[1].name: nvidia.com/gpu is shared twice",
        ),
        (
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpus, replicas: 2}]}}",
            "cfg.yaml: sharing.timeSlicing.resources[0].name: unknown resource 'nvidia.com/gpus'; "
            "this plugin serves nvidia.com/gpu and nvidia.com/mig-<profile>",
        ),
    ],
)
def test_bad_input_is_one_clear_error(text: str, message: str) -> None:
    assert message in error(text)


def test_resource_names_follow_the_gpu_resource_domain() -> None:
    text = "sharing: {timeSlicing: {resources: [{name: example.com/mig-1g.10gb, replicas: 2}]}}"
    result = effective(parse_config(text, "cfg.yaml"), Overrides("example.com/gpu"))
    assert [r.name for r in result.time_slicing.resources] == ["example.com/mig-1g.10gb"]


def test_no_file_means_the_defaults() -> None:
    result = effective(None, Overrides(GPU))
    assert result.mig_strategy is MigStrategy.MIXED
    assert result.time_slicing == TimeSlicing()
