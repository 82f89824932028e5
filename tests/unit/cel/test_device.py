"""The DRA ``device`` variable, following k8s.io/dynamic-resource-allocation/cel (1.34)."""

from __future__ import annotations

from typing import Any

import pytest

from dra.cel import (
    CelEvaluationError,
    Quantity,
    Semver,
    compile_expression,
    device_variable,
    evaluate_selector,
)
from dra.cel.values import CelMap

DRIVER = "gpu.nvidia.com"
H100: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "index": {"int": 0},
        "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "migCapable": {"bool": False},
        "gpu.nvidia.com/productName": {"string": "NVIDIA H100 80GB HBM3"},
    },
    "capacity": {"memory": {"value": "81559Mi"}},
}


def test_variable_layout() -> None:
    device = device_variable(H100, DRIVER)
    assert device.get("driver") == (True, DRIVER)
    assert device.get("allowMultipleAllocations") == (True, False)
    _, attributes = device.get("attributes")
    assert isinstance(attributes, CelMap)
    assert list(attributes) == [DRIVER, "resource.kubernetes.io"]
    _, gpu = attributes.get(DRIVER)
    assert isinstance(gpu, CelMap)
    assert gpu.get("driverVersion") == (True, Semver.parse("550.54.15"))
    assert gpu.get("productName") == (True, "NVIDIA H100 80GB HBM3")
    _, capacity = device.get("capacity")
    assert isinstance(capacity, CelMap)
    _, gpu_capacity = capacity.get(DRIVER)
    assert isinstance(gpu_capacity, CelMap)
    assert gpu_capacity.get("memory") == (True, Quantity.parse("81559Mi"))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.nvidia.com"', True),
        ('device.attributes["gpu.nvidia.com"].type == "gpu"', True),
        ('device.attributes["gpu.nvidia.com"]["type"] == "gpu"', True),
        # a qualified name of the driver's own domain is the same attribute as the bare one
        ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")', True),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"', True),
        ('"resource.kubernetes.io/pcieRoot" in device.attributes["gpu.nvidia.com"]', False),
        ('device.attributes["gpu.nvidia.com"].index == 0', True),
        ('device.attributes["gpu.nvidia.com"].index < 1.5', True),
        ('!device.attributes["gpu.nvidia.com"].migCapable', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("535.0.0"))', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.major() >= 550', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion == semver("550.54.15")', True),
        ('"550.54.15" == device.attributes["gpu.nvidia.com"].driverVersion', False),
        ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) < 0', True),
        ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))', True),
        ('device.capacity["gpu.nvidia.com"].memory == quantity("81559Mi")', True),
        ('device.capacity["gpu.nvidia.com"].memory.asInteger() == 85520809984', True),
        # an unpublished domain is an empty map for lookups ...
        ('device.attributes["other.io"].size() == 0', True),
        ('has(device.attributes["other.io"].x)', False),
        ('"x" in device.attributes["other.io"]', False),
        ("has(device.attributes.other)", True),  # the lookup always succeeds, as in Kubernetes
        # ... but not for `in` or iteration
        ('"other.io" in device.attributes', False),
        ('"resource.kubernetes.io" in device.attributes', True),
        ("device.attributes.size() == 2", True),
        ('device.attributes.exists_one(d, d == "gpu.nvidia.com")', True),
        ('device.capacity.all(d, d == "gpu.nvidia.com")', True),
        ('device.attributes["gpu.nvidia.com"].exists(a, a == "migCapable")', True),
        # guards against missing attributes
        (
            'has(device.attributes["gpu.nvidia.com"].model) && device.attributes["gpu.nvidia.com"].model',
            False,
        ),
        (
            '!("model" in device.attributes["gpu.nvidia.com"]) || device.attributes["gpu.nvidia.com"].model',
            True,
        ),
        ('device.attributes["gpu.nvidia.com"].model == "x" || true', True),
        ('cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.type == "gpu" && gpu.index == 0)', True),
    ],
)
def test_selectors(expression: str, expected: bool) -> None:
    assert evaluate_selector(expression, H100, DRIVER) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('device.attributes["gpu.nvidia.com"].model == "x"', "no such key: model"),
        ('device.attributes["other.io"].x', "no such key: x"),
        (
            'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
            "no such key: noSuchAttr",
        ),
        (
            'device.attributes["gpu.nvidia.com"]["resource.kubernetes.io/pcieRoot"] == ""',
            "no such key: resource.kubernetes.io/pcieRoot",
        ),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion == "550.54.15"',
            "no such overload: _==_(kubernetes.Semver, string)",
        ),
        ('device.attributes["gpu.nvidia.com"].index', "expression must return bool, not int"),
        ('device.attributes["gpu.nvidia.com"].productName > 1', "no such overload: _>_(string, int)"),
    ],
)
def test_selector_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvaluationError) as raised:
        evaluate_selector(expression, H100, DRIVER)
    assert raised.value.message == message


def test_allow_multiple_allocations_behind_feature_gate() -> None:
    shared = {**H100, "allowMultipleAllocations": True}
    program = compile_expression("device.allowMultipleAllocations", consumable_capacity=True)
    assert program.matches(shared, DRIVER) is True
    assert program.matches(H100, DRIVER) is False


def test_device_without_attributes() -> None:
    bare = {"name": "gpu-1"}
    assert evaluate_selector(
        'device.driver == "gpu.nvidia.com" && device.attributes.size() == 0', bare, DRIVER
    )
    assert evaluate_selector('!has(device.capacity["gpu.nvidia.com"].memory)', bare, DRIVER)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (
            {"attributes": {"driverVersion": {"version": "535.104.05"}}},
            "attribute driverVersion: parse semantic version: "
            'Patch number must not contain leading zeroes "05"',
        ),
        ({"attributes": {"x": {}}}, "attribute x: unsupported attribute value"),
        ({"attributes": {"x": {"int": "1"}}}, "attribute x: int value '1' has the wrong type"),
        ({"attributes": {"x": {"bool": 1}}}, "attribute x: bool value 1 has the wrong type"),
        ({"capacity": {"memory": {"value": "80mi"}}}, "capacity memory: unable to parse quantity's suffix"),
    ],
)
def test_unconvertible_devices(device: dict[str, Any], message: str) -> None:
    with pytest.raises(CelEvaluationError) as raised:
        device_variable(device, DRIVER)
    assert raised.value.message == message
    with pytest.raises(CelEvaluationError):
        evaluate_selector("true", device, DRIVER)


def test_capacity_from_yaml_number() -> None:
    assert evaluate_selector(
        'device.capacity["gpu.nvidia.com"].cores == quantity("8")',
        {"capacity": {"cores": {"value": 8}}},
        DRIVER,
    )
