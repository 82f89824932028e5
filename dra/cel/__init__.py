"""A pure-Python CEL evaluator with Kubernetes DRA semantics.

Compile a DeviceClass or ResourceClaim selector once, then evaluate it for each device
of a ResourceSlice::

    program = compile_expression('device.attributes["gpu.nvidia.com"].type == "gpu"')
    program.matches(device, "gpu.nvidia.com")
"""

from dra.cel.device import device_variable
from dra.cel.errors import CelError, CelEvaluationError, CelSyntaxError
from dra.cel.program import Program, compile_expression, evaluate_selector
from dra.cel.quantity import Quantity, QuantityError
from dra.cel.semver import Semver, SemverError

__all__ = [
    "CelError",
    "CelEvaluationError",
    "CelSyntaxError",
    "Program",
    "Quantity",
    "QuantityError",
    "Semver",
    "SemverError",
    "compile_expression",
    "device_variable",
    "evaluate_selector",
]
