"""A pure-Python CEL evaluator with Kubernetes DRA semantics.

Compile a DeviceClass or ResourceClaim selector once, then evaluate it for each device
of a ResourceSlice, or explain why a device does not match::

    program = compile_expression('device.attributes["gpu.nvidia.com"].type == "gpu"')
    program.matches(device, "gpu.nvidia.com")
    print(explain_program(program, device, "gpu.nvidia.com").render())

Rule: pure (no I/O); imports only ``dra.model``; inside (a layer contract), ``trace`` over
``program`` over the language core (``evaluator``, ``parser``) beside the libraries (``stdlib``,
``k8slib``), which are independent, so the core never needs Kubernetes' library; below them the
syntax tree, lexer and operators, then the values.
"""

from dra.cel.device import device_variable
from dra.cel.errors import CelError, CelEvaluationError, CelSyntaxError
from dra.cel.evaluator import Budget, BudgetSpentError
from dra.cel.program import Program, compile_expression, evaluate_selector
from dra.cel.semver import Semver, SemverError
from dra.cel.trace import Explanation, Reason, explain, explain_program, render_text
from dra.model.quantity import Quantity, QuantityError

__all__ = [
    "Budget",
    "BudgetSpentError",
    "CelError",
    "CelEvaluationError",
    "CelSyntaxError",
    "Explanation",
    "Program",
    "Quantity",
    "QuantityError",
    "Reason",
    "Semver",
    "SemverError",
    "compile_expression",
    "device_variable",
    "evaluate_selector",
    "explain",
    "explain_program",
    "render_text",
]
