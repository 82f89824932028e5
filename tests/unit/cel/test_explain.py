"""Explanations of why a selector does or does not match a device."""

from __future__ import annotations

from typing import Any

import pytest

from dra.cel import CelSyntaxError, compile_expression
from dra.cel.trace import SCHEDULER_ON_ERROR, Explanation, Reason, explain, explain_program

DRIVER = "gpu.nvidia.com"
H100: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "index": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "migCapable": {"bool": False},
        "mpsCapable": {"bool": True},
    },
    "capacity": {"memory": {"value": "81559Mi"}},
}
GPU = 'device.attributes["gpu.nvidia.com"]'
MEMORY = 'device.capacity["gpu.nvidia.com"].memory'


def reasons(expression: str) -> list[str]:
    return [str(reason) for reason in explain(expression, H100, DRIVER).reasons]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (
            f'{GPU}.productName == "NVIDIA A100-SXM4-40GB"',
            [
                f'`{GPU}.productName == "NVIDIA A100-SXM4-40GB"` is false: '
                'productName is "NVIDIA H100 80GB HBM3"'
            ],
        ),
        (
            f'{MEMORY}.compareTo(quantity("100Gi")) >= 0',
            [
                f'`{MEMORY}.compareTo(quantity("100Gi")) >= 0` is false: '
                "memory is 81559Mi; compareTo() returned -1"
            ],
        ),
        (
            f'{MEMORY}.isGreaterThan(quantity("80Gi"))',
            [f'`{MEMORY}.isGreaterThan(quantity("80Gi"))` is false: memory is 81559Mi'],
        ),
        (
            f'{GPU}.driverVersion.isGreaterThan(semver("560.0.0"))',
            [f'`{GPU}.driverVersion.isGreaterThan(semver("560.0.0"))` is false: driverVersion is 550.54.15'],
        ),
        (
            'device.driver == "example.com"',
            ['`device.driver == "example.com"` is false: driver is "gpu.nvidia.com"'],
        ),
        (
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:16"',
            [
                '`device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:16"` is false: '
                'resource.kubernetes.io/pcieRoot is "pci0000:15"'
            ],
        ),
        # a && b: only the false operands
        (
            f'{GPU}.type == "gpu" && {GPU}.index == 1 && {MEMORY}.isGreaterThan(quantity("100Gi"))',
            [
                f"`{GPU}.index == 1` is false: index is 0",
                f'`{MEMORY}.isGreaterThan(quantity("100Gi"))` is false: memory is 81559Mi',
            ],
        ),
        # a || b: all of them
        (
            f'{GPU}.productName.matches("A100") || {GPU}.index > 3',
            [
                f'`{GPU}.productName.matches("A100")` is false: productName is "NVIDIA H100 80GB HBM3"',
                f"`{GPU}.index > 3` is false: index is 0",
            ],
        ),
        # !x: x was true
        (f"!{GPU}.mpsCapable", [f"`!{GPU}.mpsCapable` is false: mpsCapable is true"]),
        (
            f'!{GPU}.type.startsWith("g")',
            [f'`!{GPU}.type.startsWith("g")` is false: `{GPU}.type.startsWith("g")` is true; type is "gpu"'],
        ),
        (
            f"!({GPU}.index == 0)",
            [f"`!({GPU}.index == 0)` is false: `({GPU}.index == 0)` is true; index is 0"],
        ),
        (
            f'!({GPU}.type == "gpu" || device.driver == "x")',
            [
                f'`!({GPU}.type == "gpu" || device.driver == "x")` is false because '
                f'`({GPU}.type == "gpu" || device.driver == "x")` is true',
                f'`{GPU}.type == "gpu"` is true: type is "gpu"',
            ],
        ),
        # c ? a : b: the condition and the branch taken
        (
            f'{GPU}.type == "mig" ? {GPU}.index == 0 : {GPU}.index == 1',
            [
                f'`{GPU}.type == "mig"` is false, so `{GPU}.index == 1` decides',
                f"`{GPU}.index == 1` is false: index is 0",
            ],
        ),
        # cel.bind: through its body, attributes still named as such
        (
            f'cel.bind(gpu, {GPU}, gpu.type == "gpu" && gpu.index == 1)',
            ["`gpu.index == 1` is false: index is 0"],
        ),
        # presence tests
        (f"has({GPU}.model)", [f'`has({GPU}.model)` is false: attribute "model" is not set on this device']),
        (
            'has(device.capacity["example.com"].cores)',
            [
                '`has(device.capacity["example.com"].cores)` is false: '
                'capacity "cores" in domain example.com is not set on this device'
            ],
        ),
        (
            f'"model" in {GPU}',
            [
                f'`"model" in {GPU}` is false: {GPU} has keys '
                '["type", "index", "productName", "driverVersion", "migCapable", "mpsCapable"]'
            ],
        ),
        (
            f"{GPU}.index in [1, 2]",
            [f"`{GPU}.index in [1, 2]` is false: index is 0"],
        ),
        # macros
        (
            f'["A100", "H200"].exists(m, {GPU}.productName.contains(m))',
            [
                f'`["A100", "H200"].exists(m, {GPU}.productName.contains(m))` is false: '
                '0 of 2 elements satisfy the condition; productName is "NVIDIA H100 80GB HBM3"'
            ],
        ),
        (
            'device.attributes.all(d, d.endsWith(".com"))',
            [
                '`device.attributes.all(d, d.endsWith(".com"))` is false: '
                'false for element "resource.kubernetes.io"; '
                'attributes has keys ["gpu.nvidia.com", "resource.kubernetes.io"]'
            ],
        ),
        (f"{GPU}.migCapable", [f"`{GPU}.migCapable` is false"]),
        ("false", ["`false` is false"]),
        # a false term next to an absorbed error: the false term decides
        (f'{GPU}.model == "x" && {GPU}.index == 1', [f"`{GPU}.index == 1` is false: index is 0"]),
    ],
)
def test_reasons_for_false(expression: str, expected: list[str]) -> None:
    explanation = explain(expression, H100, DRIVER)
    assert (explanation.matched, explanation.error) == (False, None)
    assert [str(reason) for reason in explanation.reasons] == expected


@pytest.mark.parametrize(
    ("expression", "error", "expected"),
    [
        (
            f"{GPU}.index == 0 && {GPU}.model == 'x'",
            "no such key: model",
            f'`{GPU}.model` — attribute "model" is missing on this device (no such key); '
            "guard it with has() or an `in` check",
        ),
        (
            "cel.bind(gpu, device.attributes['gpu.nvidia.com'], gpu.model == 'x')",
            "no such key: model",
            '`gpu.model` — attribute "model" is missing on this device (no such key); '
            "guard it with has() or an `in` check",
        ),
        (
            'device.attributes["other.io"].x == 1',
            "no such key: x",
            '`device.attributes["other.io"].x` — attribute "x" of domain other.io is missing on this device '
            "(no such key); guard it with has() or an `in` check",
        ),
        (
            f'{GPU}.driverVersion == "550.54.15"',
            "no such overload: _==_(kubernetes.Semver, string)",
            f'`{GPU}.driverVersion == "550.54.15"` — no such overload: _==_(kubernetes.Semver, string): '
            'driverVersion is kubernetes.Semver 550.54.15, `"550.54.15"` is string; '
            'compare with semver("550.54.15") instead',
        ),
        (
            f"{GPU}.index",
            "expression must return bool, not int",
            f"`{GPU}.index` — is 0, but a selector must return a bool",
        ),
        (f"{GPU}.index / 0 == 1", "division by zero", f"`{GPU}.index / 0` — division by zero"),
        (
            '{"a": 1}.b == 1',
            "no such key: b",
            '`{"a": 1}.b` — the key is not in {"a": 1} (no such key); guard it with has() or an `in` check',
        ),
    ],
)
def test_reasons_for_errors(expression: str, error: str, expected: str) -> None:
    explanation = explain(expression, H100, DRIVER)
    assert (explanation.matched, explanation.error) == (False, error)
    assert [str(reason) for reason in explanation.reasons] == [expected]


def test_match_has_no_reasons() -> None:
    explanation = explain(f'{GPU}.type == "gpu" && {MEMORY}.compareTo(quantity("80Gi")) < 0', H100, DRIVER)
    assert explanation == Explanation(explanation.expression, True, None, ())


def test_unconvertible_device_is_an_error() -> None:
    broken = {"attributes": {"driverVersion": {"version": "535.104.05"}}}
    explanation = explain("true", broken, DRIVER)
    assert explanation.error == (
        'attribute driverVersion: parse semantic version: Patch number must not contain leading zeroes "05"'
    )
    assert explanation.reasons == ()


def test_compiled_program_and_syntax_errors() -> None:
    program = compile_expression(f"{GPU}.index == 1")
    assert explain_program(program, H100, DRIVER).reasons == (
        Reason(f"{GPU}.index == 1", "is false: index is 0"),
    )
    with pytest.raises(CelSyntaxError):
        explain(f"{GPU}.index ==", H100, DRIVER)


def test_multiline_selectors_are_quoted_on_one_line() -> None:
    expression = f'{GPU}.type == "gpu" &&\n    {GPU}.index == 1'
    assert reasons(expression) == [f"`{GPU}.index == 1` is false: index is 0"]


def test_render_text() -> None:
    assert explain(f'{GPU}.index == 1 || device.driver == "x"', H100, DRIVER).render() == "\n".join(
        [
            f'selector: {GPU}.index == 1 || device.driver == "x"',
            "result: does not match",
            f"  - `{GPU}.index == 1` is false: index is 0",
            '  - `device.driver == "x"` is false: driver is "gpu.nvidia.com"',
        ]
    )
    assert explain(f"{GPU}.model == 'x'", H100, DRIVER).render() == "\n".join(
        [
            f"selector: {GPU}.model == 'x'",
            "result: error",
            "  error: no such key: model",
            f'  - `{GPU}.model` — attribute "model" is missing on this device (no such key); '
            "guard it with has() or an `in` check",
            f"  note: {SCHEDULER_ON_ERROR}",
        ]
    )
    assert explain("true", H100, DRIVER).render() == "selector: true\nresult: matches"
