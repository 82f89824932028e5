"""Compiling expressions for the DRA environment and running them.

Compilation parses, expands macros and resolves names: an unknown variable or function,
a call with an argument count no overload has, an unknown field of ``device``, an
invalid constant regular expression and a list or map literal mixing static types (see
``literals``) are compile errors, as with cel-go.  There is no other static type
checking; type mismatches surface at runtime as ``no such overload`` errors.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra.cel import ast, cost, k8slib, literals, regex, stdlib
from dra.cel.device import DEVICE_FIELDS, DEVICE_FIELDS_CONSUMABLE_CAPACITY, device_variable
from dra.cel.errors import CelEvaluationError, CelSyntaxError
from dra.cel.evaluator import CostLimitExceededError, Evaluator, Scope
from dra.cel.functions import Registry
from dra.cel.parser import parse
from dra.cel.values import ErrorValue, Result, Value, type_name

FUNCTIONS = Registry()
stdlib.register(FUNCTIONS)
k8slib.register(FUNCTIONS)

DEVICE_VARIABLE = "device"
_REGEX_FUNCTIONS = frozenset(("matches", "find", "findAll"))


@dataclass(frozen=True)
class Program:
    """A compiled expression; immutable and safe to share between threads."""

    expression: str
    tree: ast.Expr

    def run(self, variables: Mapping[str, Value], evaluator: Evaluator | None = None) -> Result:
        """Evaluate to a value or an ErrorValue (never raises for CEL runtime errors)."""
        evaluator = evaluator or Evaluator(FUNCTIONS)
        try:
            return evaluator.eval(self.tree, Scope(dict(variables)))
        except CostLimitExceededError as exc:
            return ErrorValue(str(exc), self.tree.id)
        except RecursionError:
            return ErrorValue("expression is nested too deeply to evaluate", self.tree.id)
        finally:
            evaluator.settle()

    def evaluate(self, variables: Mapping[str, Value] | None = None) -> Value:
        """Evaluate with the given variables; raises CelEvaluationError on a runtime error."""
        result = self.run(variables or {})
        if isinstance(result, ErrorValue):
            raise CelEvaluationError(result.message)
        return result

    def run_selector(
        self, device: Mapping[str, Any], driver: str, evaluator: Evaluator | None = None
    ) -> Result:
        """Evaluate as a device selector: a bool or an ErrorValue (also for a non-bool result)."""
        try:
            variable = device_variable(device, driver)
        except CelEvaluationError as exc:
            return ErrorValue(exc.message, None)
        result = self.run({DEVICE_VARIABLE: variable}, evaluator)
        if isinstance(result, ErrorValue | bool):
            return result
        return ErrorValue(f"expression must return bool, not {type_name(result)}", self.tree.id)

    def attribute_references(self) -> frozenset[tuple[str, str]]:
        """(domain, name) of every ``device.attributes["domain"].name`` the expression reads.

        Lookups with a constant key count, ``["name"]`` and ``has(...)`` included; an attribute
        reached through a ``cel.bind`` variable or a computed key does not.
        """
        found = set()
        for node in ast.walk(self.tree):
            match node:
                case ast.Select(operand=operand, field=name) | ast.Has(operand=operand, field=name):
                    pass
                case ast.Index(operand=operand, index=ast.Literal(value=str() as name)):
                    pass
                case _:
                    continue
            domain = _attribute_domain(operand)
            if domain is not None:
                found.add((domain, name))
        return frozenset(found)

    def matches(self, device: Mapping[str, Any], driver: str) -> bool:
        """Whether the selector accepts ``device`` (a ResourceSlice device) of ``driver``.

        Raises CelEvaluationError where the scheduler would get a runtime error, which
        fails the allocation instead of just skipping the device.
        """
        result = self.run_selector(device, driver)
        if isinstance(result, ErrorValue):
            raise CelEvaluationError(result.message)
        return bool(result)


def _attribute_domain(node: ast.Expr) -> str | None:
    """ "d" when ``node`` is ``device.attributes["d"]`` (or ``device.attributes.d``)."""
    match node:
        case ast.Index(operand=operand, index=ast.Literal(value=str() as domain)):
            pass
        case ast.Select(operand=operand, field=domain):
            pass
        case _:
            return None
    match operand:
        case ast.Select(operand=ast.Ident(name="device"), field="attributes"):
            return domain
    return None


def compile_expression(
    expression: str, *, consumable_capacity: bool = False, list_attributes: bool = False
) -> Program:
    """Compile a CEL expression for the DRA environment (the ``device`` variable).

    ``consumable_capacity`` mirrors the DRAConsumableCapacity feature gate, which adds
    ``device.allowMultipleAllocations``; ``list_attributes`` the DRAListTypeAttributes gate,
    which adds ``includes``.  Raises CelSyntaxError, also for an expression
    longer than the API server accepts (10 KiB), which is not parsed at all.
    """
    length = len(expression.encode("utf-8", "surrogatepass"))
    if length > cost.MAX_EXPRESSION_BYTES:
        raise CelSyntaxError(
            f"expression is {length} bytes long; "
            f"the API server accepts at most {cost.MAX_EXPRESSION_BYTES} bytes",
            "",
            0,
        )
    return _compile(expression, consumable_capacity, list_attributes)


def evaluate_selector(
    expression: str,
    device: Mapping[str, Any],
    driver: str,
    *,
    consumable_capacity: bool = False,
    list_attributes: bool = False,
) -> bool:
    """Compile (cached) and run a selector against one device; raises CelSyntaxError or CelEvaluationError."""
    program = compile_expression(
        expression, consumable_capacity=consumable_capacity, list_attributes=list_attributes
    )
    return program.matches(device, driver)


#: Functions a new selector may call only with DRAListTypeAttributes on. At 1.37 the scheduler and the
#: API server check new expressions against 1.36's environment, which has `includes` only through the
#: gate (k8s.io/dynamic-resource-allocation/cel compile.go, IncludesOption).
LIST_FUNCTIONS = frozenset({"includes"})


@functools.lru_cache(maxsize=512)
def _compile(expression: str, consumable_capacity: bool, list_attributes: bool) -> Program:
    # A selector is compiled once and evaluated for every device of every slice.
    tree = parse(expression, frozenset(name for name in FUNCTIONS.names() if "." in name))
    fields = DEVICE_FIELDS_CONSUMABLE_CAPACITY if consumable_capacity else DEVICE_FIELDS
    hidden = frozenset() if list_attributes else LIST_FUNCTIONS
    _Checker(expression, fields, hidden).visit(tree, frozenset())
    mixed = literals.mixed_literal(tree)
    if mixed is not None:
        message, offset = mixed
        raise CelSyntaxError(message, expression, offset)
    return Program(expression, tree)


@dataclass(frozen=True)
class _Checker:
    source: str
    device_fields: frozenset[str]
    #: Declared functions this environment leaves out.
    hidden: frozenset[str] = frozenset()

    def error(self, message: str, offset: int) -> CelSyntaxError:
        return CelSyntaxError(message, self.source, offset)

    def visit(self, node: ast.Expr, bound: frozenset[str]) -> None:
        match node:
            case ast.Ident():
                if node.name not in bound and node.name != DEVICE_VARIABLE:
                    raise self.error(f"undeclared reference to '{node.name}' (in container '')", node.start)
            case ast.Select(operand=ast.Ident(name="device")) if DEVICE_VARIABLE not in bound:
                if node.field not in self.device_fields:
                    raise self.error(f"undefined field '{node.field}'", node.end - len(node.field) - 1)
            case ast.Call():
                # Operands first, so `cel.bnd(x)` reports the unknown `cel`, as cel-go does.
                for child in ast.children(node):
                    self.visit(child, bound)
                self.check_call(node)
                return
            case ast.Comprehension():
                self.visit(node.iter_range, bound)
                for part in (node.predicate, node.transform):
                    if part is not None:
                        self.visit(part, bound | {node.variable})
                return
            case ast.Bind():
                self.visit(node.init, bound)
                self.visit(node.body, bound | {node.variable})
                return
        for child in ast.children(node):
            self.visit(child, bound)

    def check_call(self, node: ast.Call) -> None:
        name, member = node.function, node.target is not None
        if name not in FUNCTIONS or name in self.hidden:
            raise self.error(f"undeclared reference to '{name}' (in container '')", node.start)
        argc = len(node.args) + member
        if not FUNCTIONS.has_signature(name, member=member, argc=argc):
            style = "method" if member else "function"
            raise self.error(
                f"found no matching overload for '{name}' as a {style} with {len(node.args)} argument(s)",
                node.start,
            )
        if name in _REGEX_FUNCTIONS:
            pattern = node.args[0] if member else node.args[1]
            if isinstance(pattern, ast.Literal) and isinstance(pattern.value, str):
                try:
                    regex.compile_regex(pattern.value)
                except regex.RegexError as exc:
                    raise self.error(f"invalid {name} argument: {exc}", pattern.start) from exc
