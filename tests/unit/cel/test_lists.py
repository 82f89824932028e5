"""List-valued attributes and `includes` (KEP-5491), case by case as Kubernetes 1.37 decides them.

The cases are those of k8s.io/dynamic-resource-allocation/cel compile_test.go at v0.37.2
(list-type and includes cases), with the verdict the Go tests expect.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra.cel import CelEvaluationError, CelSyntaxError, compile_expression

DRIVER = "dra.example.com"
A = 'device.attributes["dra.example.com"]'


def _device(**attributes: dict[str, Any]) -> dict[str, Any]:
    return {"name": "d", "attributes": attributes}


def _matches(expression: str, device: dict[str, Any]) -> bool:
    return compile_expression(expression, list_attributes=True).matches(device, DRIVER)


@pytest.mark.parametrize(
    ("expression", "attributes", "expected"),
    [
        (f"{A}.names.size() == 2", {"names": {"ints": [1, 2]}}, True),
        (f"{A}.names.size() == 2", {"names": {"bools": [True, False]}}, True),
        (f"{A}.names.size() == 2", {"names": {"strings": ["a", "b"]}}, True),
        (
            f"{A}.names.size() == 2",
            {"names": {"versions": ["1.0.0", "2.0.0"]}},
            True,
        ),
        (f"{A}.names.exists(x, x > 0)", {"names": {"ints": [1, 2]}}, True),
        (
            f'{A}.names.all(x, x != "")',
            {"names": {"strings": ["a", "b"]}},
            True,
        ),
        (
            f'{A}.names.all(x, x.isGreaterThan(semver("0.0.1")))',
            {"names": {"versions": ["1.0.0", "2.0.0"]}},
            True,
        ),
        (f'{A}.attr.includes("fish")', {"attr": {"string": "fish"}}, True),
        (f"{A}.name.includes(true)", {"name": {"bool": True}}, True),
        (f"{A}.name.includes(true)", {"name": {"bool": False}}, False),
        (
            f"{A}.name.includes(true)",
            {"name": {"bools": [True, False]}},
            True,
        ),
        (f"{A}.name.includes(2)", {"name": {"ints": [1, 3]}}, False),
        # Another type is simply not included, as the list library's Equal says.
        (f'{A}.name.includes("1")', {"name": {"ints": [1]}}, False),
    ],
)
def test_list_attributes_as_the_1_37_scheduler_evaluates_them(
    expression: str, attributes: dict[str, Any], expected: bool
) -> None:
    assert _matches(expression, _device(**attributes)) is expected


@pytest.mark.parametrize(
    ("expression", "attributes"),
    [
        # A macro over a scalar: "got 'types.Int', expected iterable type" at runtime.
        (f"{A}.name.exists(x, x > 0)", {"name": {"int": 1}}),
        (f'{A}.name.exists(x, x == "fish")', {"name": {"string": "fish"}}),
    ],
)
def test_a_macro_over_a_scalar_attribute_is_an_error(expression: str, attributes: dict[str, Any]) -> None:
    with pytest.raises(CelEvaluationError):
        _matches(expression, _device(**attributes))


def test_a_list_is_not_a_selectors_bool() -> None:
    # "CEL result of type list could not be converted to bool"
    with pytest.raises(CelEvaluationError):
        _matches(f"{A}.names", _device(names={"ints": [1, 2]}))


def test_includes_is_undeclared_without_the_gate() -> None:
    with pytest.raises(CelSyntaxError, match="undeclared reference to 'includes'"):
        compile_expression(f'{A}.attr.includes("fish")')


def test_a_list_is_taken_before_a_scalar_and_elements_must_have_their_type() -> None:
    assert _matches(f"{A}.n == [1]", _device(n={"int": 2, "ints": [1]}))
    with pytest.raises(CelEvaluationError, match="ints value"):
        _matches(f"{A}.n == [1]", _device(n={"ints": [True]}))
    with pytest.raises(CelEvaluationError, match="parse semantic version"):
        _matches(f"{A}.n.size() == 1", _device(n={"versions": ["x"]}))
