"""Fuzz target: the CEL parser and evaluator on every kind of device the driver publishes.

The input is an expression (UTF-8, invalid bytes replaced). It must compile or raise
CelSyntaxError; a compiled selector must give a bool or a CEL error on each device, never
raise, and its explanation (exhaustive ``&&``/``||``, every node traced) must render and
agree with the plain run, unless only the exhaustive run reached the cost limit.
"""

from __future__ import annotations

from dra.cel import CelEvaluationError, CelSyntaxError, compile_expression, explain_program, render_text
from dra.cel.evaluator import COST_LIMIT_MESSAGE
from dra.cel.values import ErrorValue
from tests.celgen import devices

DRIVER = "gpu.nvidia.com"
# A full GPU, a MIG device and a device of another product: three attribute sets.
DEVICES = devices(DRIVER)[::7][:3]


def TestOneInput(data: bytes) -> None:  # noqa: N802  (the name atheris and libFuzzer expect)
    """Compile and run one expression; raise only on a bug."""
    expression = data.decode("utf-8", "replace")
    try:
        program = compile_expression(expression)
    except CelSyntaxError as err:
        if not err.message:
            raise AssertionError(f"{expression!r}: a syntax error without a message") from err
        return
    for device in DEVICES:
        result = program.run_selector(device, DRIVER)
        assert isinstance(result, bool | ErrorValue), f"{expression!r} gave {result!r}"
        try:
            assert program.matches(device, DRIVER) is result
        except CelEvaluationError:
            assert isinstance(result, ErrorValue)
        explanation = explain_program(program, device, DRIVER)
        render_text(explanation)
        error = result.message if isinstance(result, ErrorValue) else None
        if explanation.error != COST_LIMIT_MESSAGE and (explanation.matched, explanation.error) != (
            result is True,
            error,
        ):
            raise AssertionError(f"{expression!r}: explain says {explanation}, the run {result!r}")
