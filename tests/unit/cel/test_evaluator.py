"""Core CEL semantics: operators, errors as values, macros, bind and compile-time checks.

The expected results were cross-checked against cel-go v0.26 with the Kubernetes 1.34
DRA environment; ``dyn()`` hides types from cel-go's checker where it would reject an
expression at compile time that this evaluator (which has no type checker) runs.
"""

from __future__ import annotations

import math

import pytest

from dra.cel import CelEvaluationError, CelSyntaxError, compile_expression, cost
from dra.cel.values import CelMap, Uint, Value


def evaluate(expression: str) -> Value:
    return compile_expression(expression).evaluate()


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # arithmetic, 64-bit with Go's truncating division
        ("1 + 2 * 3", 7),
        ("-5 / 2", -2),
        ("-5 % 3", -2),
        ("5 % -3", 2),
        ("7u / 2u", Uint(3)),
        ("1.0 / 0.0", math.inf),
        ("-(9223372036854775807) - 1", -(2**63)),
        ('"a" + "b"', "ab"),
        ('b"a" + b"b"', b"ab"),
        ("[1] + [2]", (1, 2)),
        # heterogeneous equality: numbers compare by value, other types are just unequal
        ("dyn(1) == 1u", True),
        ("dyn(1) == 1.0", True),
        ("dyn(1u) == 1.0", True),
        ("dyn([1]) == [1.0]", True),
        ('dyn(1) == "1"', False),
        ("dyn(1) == true", False),
        ("null == null", True),
        ("dyn(null) == 0", False),
        ("dyn({1: 2}) == dyn({1u: 2})", True),
        ("dyn({1: 2}) == dyn({1.0: 2})", False),  # double keys never match int lookups
        ('quantity("1Gi") == quantity("1024Mi")', True),
        ('quantity("1") != 1', True),  # unlike `==`, which fails, see test_errors
        ('semver("1.2.3+build") == semver("1.2.3")', True),
        ('"1.2.3" == semver("1.2.3")', False),  # a string is simply unequal to a semver ...
        ("dyn([quantity('1')]) == dyn([1])", True),  # ... and element errors do not make lists unequal
        ('double("nan") == double("nan")', False),
        # ordering across numeric types
        ("1 < 1.5", True),
        ("1u < 2.5", True),
        ("dyn(1) < 1u", False),
        ('"a" < "b"', True),
        ('b"abc" < b"abd"', True),
        ("false < true", True),
        # logical operators absorb errors and are commutative
        ("false && 1 / 0 == 1", False),
        ("1 / 0 == 1 && false", False),
        ("true || 1 / 0 == 1", True),
        ("1 / 0 == 1 || true", True),
        ("false && dyn(1)", False),
        ("dyn(1) || true", True),
        ("true ? 1 : 1 / 0", 1),
        ("false ? 1 / 0 : 2", 2),
        # in
        ("2 in [1, 2, 3]", True),
        ("[1] in [[1]]", True),
        ('"a" in {"a": 1}', True),
        ('"b" in {"a": 1}', False),
        ("dyn(1.5) in {1: 2}", False),
        ("dyn([1]) in {'a': 1}", False),
        ("dyn(quantity('1')) in [1]", False),
        # indexing
        ("[1, 2][1]", 2),
        ("dyn([1, 2])[dyn(1.0)]", 2),
        ("dyn([1, 2])[dyn(1u)]", 2),
        ('{"a": {"b": 1}}.a.b', 1),
        ('{"a": 1}["a"]', 1),
        ('dyn({1: "a"})[dyn(1u)]', "a"),
        ('dyn({1: "a"})[dyn(1.0)]', "a"),
        ('{"a": 1, "a": 2}["a"]', 2),
        ("{dyn(true): 1, dyn(1): 2}[true]", 1),  # bool and int keys stay apart
        # has() tests presence without an error
        ('has({"a": 1}.a)', True),
        ('has({"a": 1}.b)', False),
        ('has({"a": {"b": 1}}.a.b)', True),
        ('has(dyn("abc").foo)', False),
        # macros
        ("[1, 2, 3].all(x, x > 0)", True),
        ("[1, 2, 3].exists(x, x == 2)", True),
        ("[1, 2, 3].exists_one(x, x > 2)", True),
        ("[1, 2, 3].exists_one(x, x > 1)", False),
        ("[1, 2, 3].map(x, x * 2)", (2, 4, 6)),
        ("[1, 2, 3].map(x, x > 1, x * 2)", (4, 6)),
        ("[1, 2, 3].filter(x, x > 1)", (2, 3)),
        ('{"a": 1, "b": 2}.map(k, k)', ("a", "b")),
        ('{"a": 1}.all(k, k == "a")', True),
        ("[].all(x, false)", True),
        ("[].exists(x, true)", False),
        ("[1].all(x, [2].all(x, x == 2))", True),  # the inner variable shadows the outer one
        # all/exists absorb errors like && and ||
        ("[0, 1].exists(x, 1 / x > 0)", True),
        ("[1, 0].all(x, 1 / x < 0)", False),
        ("[0, 1].all(x, 1 / x < 0)", False),
        # cel.bind is lazy: an unused failing initializer is no error
        ("cel.bind(x, 1, x + 1)", 2),
        ("cel.bind(x, 1 / 0, true)", True),
        ("cel.bind(x, 1 / 0, false && x == 1)", False),
        ("cel.bind(x, [1, 2], cel.bind(y, x.size(), y == 2))", True),
        ("cel.bind(x, 1, cel.bind(x, 2, x))", 2),
        # literals
        (
            '{"a": [dyn(1), dyn(2u), dyn(3.5), dyn("s"), dyn(b"b"), dyn(null), dyn(true)]}',
            CelMap([("a", (1, Uint(2), 3.5, "s", b"b", None, True))]),
        ),
    ],
)
def test_results(expression: str, expected: Value) -> None:
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9223372036854775807 + 1", "integer overflow"),
        ("-9223372036854775807 - 2", "integer overflow"),
        ("-(-9223372036854775807 - 1)", "integer overflow"),
        ("(-9223372036854775807 - 1) / -1", "integer overflow"),
        ("3037000500 * 3037000500", "integer overflow"),
        ("18446744073709551615u + 1u", "unsigned integer overflow"),
        ("0u - 1u", "unsigned integer overflow"),
        ("1 / 0", "division by zero"),
        ("1 % 0", "modulus by zero"),
        ("1u / 0u", "division by zero"),
        ("dyn(1) + dyn(1u)", "no such overload: _+_(int, uint)"),
        ("dyn(1.0) % dyn(2.0)", "no such overload: _%_(double, double)"),
        ("-dyn(1u)", "no such overload: -_(uint)"),
        ("!dyn(1)", "no such overload: !_(int)"),
        ('dyn(1) < dyn("a")', "no such overload: _<_(int, string)"),
        ('semver("1.0.0") < semver("2.0.0")', "no such overload: _<_(kubernetes.Semver, kubernetes.Semver)"),
        ('quantity("1") == 1', "no such overload: _==_(kubernetes.Quantity, int)"),
        ("1 < double('nan')", "NaN values cannot be ordered"),
        ("dyn(1) && true", "no such overload: _&&_(int)"),
        ("true && dyn(1)", "no such overload: _&&_(int)"),
        ("1 / 0 == 1 && 2 / 0 == 1", "division by zero"),
        ("dyn(1) ? true : false", "no such overload: _?_:_(int)"),
        ("[1, 2][5]", "index out of bounds: 5"),
        ("[1, 2][-1]", "index out of bounds: -1"),
        ("dyn([1, 2])[dyn(1.5)]", "unsupported index value 1.5 in list"),
        ('dyn([1, 2])["a"]', "unsupported index type 'string' in list"),
        ('{"a": 1}["b"]', "no such key: b"),
        ('{"a": 1}.b', "no such key: b"),
        ('dyn({1: "a"})[dyn(1.5)]', "no such key: 1.5"),
        ('dyn("abc")[0]', "no such key: 0"),
        ('dyn("abc").foo', "no such key: foo"),
        ("has(dyn([1]).foo)", "unsupported index type 'string' in list"),
        ("[0, 1].all(x, 1 / x > 0)", "division by zero"),
        ("[0, 1].exists_one(x, 1 / x > 0)", "division by zero"),
        ("[1, 2].map(x, x / 0)", "division by zero"),
        ("[1, 2].filter(x, x / 0 > 1)", "division by zero"),
        ("dyn(1).all(x, true)", "expression of type 'int' cannot be the range of a comprehension"),
        ("{[1]: 2}", "unsupported map key type: list"),
    ],
)
def test_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvaluationError) as raised:
        evaluate(expression)
    assert raised.value.message == message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("foo", "undeclared reference to 'foo' (in container '')"),
        ("a.b", "undeclared reference to 'a' (in container '')"),
        ("[1].all(x, x == 1) && x == 1", "undeclared reference to 'x' (in container '')"),
        ("cel.bind(x, 1)", "undeclared reference to 'cel' (in container '')"),
        ("foo(1)", "undeclared reference to 'foo' (in container '')"),
        ("device.driver.bar()", "undeclared reference to 'bar' (in container '')"),
        ("sets.foo([1])", "undeclared reference to 'sets' (in container '')"),
        ("device.foo", "undefined field 'foo'"),
        ("device.allowMultipleAllocations", "undefined field 'allowMultipleAllocations'"),
        ('quantity("1").sign()', "found no matching overload for 'sign' as a method with 0 argument(s)"),
        (
            "device.driver.startsWith()",
            "found no matching overload for 'startsWith' as a method with 0 argument(s)",
        ),
        ('"x".matches("[")', "invalid matches argument: error parsing regexp: missing closing ]: `[`"),
        # Kubernetes compiles with homogeneous aggregate literals; attribute values are `any`
        # (messages as a 1.34 API server gave them)
        ("[1, 2.0].size() == 2", "expected type 'int' but found 'double'"),
        ("[1, 1u].size() == 2", "expected type 'int' but found 'uint'"),
        ('[1, dyn("a")].size() == 2', "expected type 'int' but found 'dyn'"),
        ("[null, 1].size() == 2", "expected type 'null' but found 'int'"),
        ('[[1], ["a"]].size() == 2', "expected type 'list(int)' but found 'list(string)'"),
        ('{"a": 1, "b": "x"}.size() == 2', "expected type 'int' but found 'string'"),
        ('{"a": 1, 2: 1}.size() == 2', "expected type 'string' but found 'int'"),
        ('[0, device.attributes["d"].index].exists(x, x == 1)', "expected type 'int' but found 'any'"),
        ('[device.attributes["d"].index, 0].exists(x, x == 1)', "expected type 'any' but found 'int'"),
        ('[device.attributes["d"].type, "a"].exists(x, x == "a")', "expected type 'any' but found 'string'"),
        ('[device.attributes["d"].index, null].size() == 2', "expected type 'any' but found 'null'"),
        (
            '[1].exists(x, [x, "a"].size() == 2) || ["a", 1].size() == 2',
            "expected type 'string' but found 'int'",
        ),
    ],
)
def test_compile_errors(expression: str, message: str) -> None:
    with pytest.raises(CelSyntaxError) as raised:
        compile_expression(expression)
    assert raised.value.message == message


#: A device of driver "d" for the literals below: index 1, minor 7, type "gpu", 1Gi of memory.
LITERALS_DEVICE = {
    "name": "gpu-1",
    "attributes": {"index": {"int": 1}, "minor": {"int": 7}, "type": {"string": "gpu"}},
    "capacity": {"memory": {"value": "1Gi"}},
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # literals whose elements have one static type (accepted by a 1.34 API server), and what
        # each selects on the device above: a literal that compiled to the wrong value would show
        ('[device.attributes["d"].index, device.attributes["d"].minor].exists(x, x == 1)', True),
        ('[device.attributes["d"].index, device.attributes["d"].minor].exists(x, x == 2)', False),
        ('[device.attributes["d"].index + 1, 0].exists(x, x == 1)', False),
        ('[device.attributes["d"].index + 1, 0].exists(x, x == 2)', True),
        ('[int(device.attributes["d"].index), 0].exists(x, x == 1)', True),
        ('[device.attributes["d"].index == 1, true].all(x, x)', True),
        ('[device.attributes["d"].index == 2, true].all(x, x)', False),
        ('[size(device.attributes["d"].type), 0].exists(x, x == 3)', True),
        ('[device.driver, "a"].exists(x, x == "d")', True),
        ('[device.driver, "a"].exists(x, x == "b")', False),
        ('[device.capacity["d"].memory, quantity("1")].size() == 2', True),
        ('[device.capacity["d"].memory, quantity("1")][0] == quantity("1024Mi")', True),
        ('device.attributes["d"].index in [1, 2]', True),
        ('device.attributes["d"].index in [2, 3]', False),
        ('1 in [device.attributes["d"].index]', True),
        ('7 in [device.attributes["d"].index]', False),
    ],
)
def test_homogeneous_literals_compile_and_select(expression: str, expected: bool) -> None:
    assert compile_expression(expression).matches(LITERALS_DEVICE, "d") is expected


def test_cost_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runaway nested comprehensions stop like at cel-go's cost limit, and `||` cannot absorb that.
    monkeypatch.setattr(cost, "COST_LIMIT", 1000)
    ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
    nested = f"{ten}.all(a, {ten}.all(b, {ten}.all(c, c > 0)))"
    with pytest.raises(CelEvaluationError, match=r"^operation cancelled: actual cost limit exceeded$"):
        evaluate(f"{nested} || true")


def test_bound_names_shadow_device() -> None:
    # Once `device` is a macro variable, its fields are no longer checked.
    assert evaluate('[{"foo": 1}].all(device, device.foo == 1)') is True


def test_compile_is_cached_and_programs_are_reusable() -> None:
    program = compile_expression("1 + 1 == 2")
    assert compile_expression("1 + 1 == 2") is program
    assert program.evaluate() is True
    assert program.evaluate() is True


@pytest.mark.parametrize(
    ("expression", "references"),
    [
        ('device.attributes["d.io"].a == 1', {("d.io", "a")}),
        (
            'device.attributes["d.io"]["a"] == 1 && has(device.attributes["k.io"].b)',
            {("d.io", "a"), ("k.io", "b")},
        ),
        ("device.attributes.d.a == 1", {("d", "a")}),
        # Capacities, computed keys and bound variables are not attribute lookups it can name.
        ('device.capacity["d.io"].memory.isGreaterThan(quantity("1"))', set()),
        ('device.attributes["d.io"]["a" + "b"] == 1', set()),
        ('cel.bind(x, device.attributes["d.io"], x.a == 1)', set()),
    ],
)
def test_attribute_references_name_each_constant_lookup(
    expression: str, references: set[tuple[str, str]]
) -> None:
    assert compile_expression(expression).attribute_references() == references
