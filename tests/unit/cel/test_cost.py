"""The cost model: charged by size like Kubernetes' CEL, before the work, within the API server's limits."""

from __future__ import annotations

import pytest

from dra.cel import CelEvaluationError, CelSyntaxError, compile_expression
from dra.cel.evaluator import Budget, BudgetSpentError, Evaluator
from dra.cel.program import FUNCTIONS

LIMIT = r"^operation cancelled: actual cost limit exceeded$"


def _cost(expression: str) -> int:
    evaluator = Evaluator(FUNCTIONS)
    compile_expression(expression).run({}, evaluator)
    return evaluator.cost


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # cel-go: constants are free, `==` on scalars costs ceil(1 * 0.1) = 1
        ("1 == 1", 1),
        # matches: ceil((1 + 3) * 0.1) * ceil(1 * 0.25)
        ('"abc".matches("b")', 1),
        # ceil((1 + 1000) * 0.1) * ceil(8 * 0.25) = 101 * 2
        (f'"{"x" * 1000}".matches("^x+y$|z")', 202),
        # `+` on strings: ceil((1000 + 1000) * 0.1); then size(): 1
        (f'size("{"x" * 1000}" + "{"y" * 1000}") > 0', 200 + 1 + 1),
        # a list literal costs 10, `in` on it 1 per element
        ("3 in [1, 2, 3]", 10 + 3),
    ],
)
def test_costs_follow_cel_go(expression: str, expected: int) -> None:
    assert _cost(expression) == expected


def test_a_string_doubled_in_binds_stops_before_it_is_built() -> None:
    # Each level is charged for the string it is about to build, so the run stops at a
    # few megabytes rather than the gigabyte that 9 levels of 10x would make (issue 26).
    body = "size(s9) > 0"
    for level in range(9, 0, -1):
        body = f'cel.bind(s{level}, [{", ".join([f"s{level - 1}"] * 10)}].join(""), {body})'
    with pytest.raises(CelEvaluationError, match=LIMIT):
        compile_expression(f'cel.bind(s0, "x", {body})').evaluate()


@pytest.mark.parametrize(
    "expression",
    [
        # replace is charged for the string it makes, not only the one it reads
        'cel.bind(s, "' + "x" * 4000 + '", s.replace("", s).size() > 0)',
        # list concatenation copies here, so it is charged by size (cel-go: 1)
        "cel.bind(a, [" + ", ".join(["1"] * 1000) + "], cel.bind(b, a + a + a + a + a + a + a + a, "
        "cel.bind(c, b + b + b + b + b + b + b + b, cel.bind(d, c + c + c + c + c + c + c + c, "
        "cel.bind(e, d + d + d + d + d + d + d + d, size(e) > 0)))))",
    ],
)
def test_size_is_charged_before_allocation(expression: str) -> None:
    with pytest.raises(CelEvaluationError, match=LIMIT):
        compile_expression(expression).evaluate()


def test_an_expression_over_10_kib_is_refused_unparsed() -> None:
    with pytest.raises(CelSyntaxError, match="at most 10240 bytes"):
        compile_expression("1 == 1 && " * 1100 + "true")
    # bytes, as Go's len() counts them: 5,121 two-byte characters are too many
    with pytest.raises(CelSyntaxError, match="is 10250 bytes long"):
        compile_expression(f'"{"é" * 5121}" != ""')
    compile_expression(f'"{"x" * 10200}" != ""')


def test_a_shared_budget_stops_the_run_that_spends_it() -> None:
    program = compile_expression("[1, 2, 3].all(x, x > 0)")
    one_run = _cost(program.expression)
    budget = Budget(limit=2 * one_run + one_run // 2)
    first = Evaluator(FUNCTIONS, budget=budget)
    assert program.run({}, first) is True
    assert budget.spent == first.cost > 0
    assert program.run({}, Evaluator(FUNCTIONS, budget=budget)) is True
    with pytest.raises(BudgetSpentError):
        program.run({}, Evaluator(FUNCTIONS, budget=budget))


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9" * 4301 + " > 0", "invalid int literal"),
        ("0x" + "f" * 4301 + " > 0", "invalid int literal"),
        ("9" * 4301 + "u > 0u", "invalid uint literal"),
    ],
)
def test_a_literal_of_thousands_of_digits_is_out_of_range(expression: str, message: str) -> None:
    with pytest.raises(CelSyntaxError) as raised:
        compile_expression(expression)
    assert raised.value.message == message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f'int("{"9" * 4301}") > 0', "type conversion error from 'string' to 'int'"),
        (f'uint("{"9" * 4301}") > 0u', "type conversion error from 'string' to 'uint'"),
        (f'semver("1.2.{"9" * 4301}").major() > 0', "strconv.ParseUint: parsing"),
        (f'sign(quantity("{"9" * 4301}")) > 0', "quantity is 4301 characters long, more than 1000"),
    ],
)
def test_thousands_of_digits_at_runtime_are_a_cel_error(expression: str, message: str) -> None:
    with pytest.raises(CelEvaluationError, match=message):
        compile_expression(expression).evaluate()
    # Leading zeros do not count: Go parses them.
    assert compile_expression(f"{'0' * 100}1 == 1").evaluate() is True
