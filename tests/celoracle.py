"""Two CEL evaluators behind one verdict: dra.cel and cel-expr-python (Google's C++ runtime).

A verdict is ``"true"``, ``"false"`` or ``"error"`` (compile or runtime), what decides
whether the scheduler picks a device, skips it or aborts the allocation.

cel-expr-python knows nothing of Kubernetes, so it gets ``device`` as plain data:
attributes and capacities by domain, versions and quantities as their strings, and the
domains a selector may name but a device does not publish as empty maps (the default
Kubernetes gives every unknown domain).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

from dra.cel import CelSyntaxError, compile_expression
from dra.cel.device import split_qualified_name
from dra.cel.values import ErrorValue

Obj = dict[str, Any]


def compiles(expression: str) -> bool:
    """Whether dra.cel compiles a selector, which is whether the API server must accept it."""
    try:
        compile_expression(expression)
    except CelSyntaxError:
        return False
    return True


def dra_verdict(expression: str, device: Obj, driver: str) -> str:
    """What dra.cel makes of a selector on one device."""
    try:
        program = compile_expression(expression)
    except CelSyntaxError:
        return "error"
    result = program.run_selector(device, driver)
    return "error" if isinstance(result, ErrorValue) else str(result).lower()


def oracle_device(device: Obj, driver: str, domains: Iterable[str] = ()) -> Obj:
    """``device`` as cel-expr-python gets it; ``domains`` are added as empty maps where unpublished."""
    attributes: dict[str, Obj] = {domain: {} for domain in domains}
    for qualified, attribute in (device.get("attributes") or {}).items():
        domain, name = split_qualified_name(qualified, driver)
        attributes.setdefault(domain, {})[name] = next(iter(attribute.values()))
    capacity: dict[str, Obj] = {domain: {} for domain in domains}
    for qualified, entry in (device.get("capacity") or {}).items():
        domain, name = split_qualified_name(qualified, driver)
        capacity.setdefault(domain, {})[name] = str(entry["value"])
    return {"driver": driver, "attributes": attributes, "capacity": capacity}


class Oracle:
    """cel-expr-python with the strings extension, as the Kubernetes environment has it.

    Expressions compile unchecked: cel-cpp's checker rejects a ``dyn`` comprehension range
    ("cannot be the range of a comprehension (must be list, map, or dynamic)"), which
    cel-go and the Kubernetes environment accept; at runtime the map iterates fine.
    """

    def __init__(self) -> None:
        self.env = cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])
        self._compiled: dict[str, Any] = {}

    def compile(self, expression: str) -> Any:
        """The compiled expression, or None where it does not compile (cached either way)."""
        if expression not in self._compiled:
            try:
                self._compiled[expression] = self.env.compile(expression, disable_check=True)
            except Exception:  # the binding raises plain exceptions for compile errors
                self._compiled[expression] = None
        return self._compiled[expression]

    def verdict(self, expression: str, data: Obj) -> str:
        """What cel-expr-python makes of a selector on one device given as ``oracle_device`` data."""
        compiled = self.compile(expression)
        if compiled is None:
            return "error"
        result = compiled.eval(data={"device": data})
        if result.type() != cel.Type.BOOL:
            return "error"
        return "true" if result.value() else "false"
