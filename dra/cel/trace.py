"""Why a selector does or does not match a device: the facility behind ``dra-gpu explain``.

The selector is evaluated once with every sub-expression's value recorded (``&&`` and
``||`` evaluated exhaustively, which changes no result).  A false result is then walked
structurally: for ``a && b`` the false operands are explained, for ``a || b`` all of
them, ``!x`` is explained through ``x`` being true, ``c ? a : b`` through the branch
taken, ``cel.bind`` through its body.  What remains are leaves (comparisons, calls,
``has()``, macros); each is reported with its source text and the values involved, e.g.
``productName is "NVIDIA H100 80GB HBM3"``.  A runtime error is traced to the
sub-expression where it arose.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dra.cel import ast
from dra.cel.evaluator import Budget, Evaluator
from dra.cel.program import FUNCTIONS, Program, compile_expression
from dra.cel.semver import Semver
from dra.cel.values import CelMap, ErrorValue, Result, display, type_name
from dra.model.quantity import Quantity

# What the allocator in k8s.io/dynamic-resource-allocation does with a runtime error.
SCHEDULER_ON_ERROR = (
    "the scheduler treats a runtime error as a failed allocation attempt (CEL runtime error), "
    "not as a device that does not match, so the claim stays unallocated until the selector is fixed"
)
_VALUE_LIMIT = 120
_DOMAIN_MAPS = {"attributes": "attribute", "capacity": "capacity"}


@dataclass(frozen=True)
class Reason:
    """One sub-expression that decided the result, and why."""

    expression: str
    message: str

    def __str__(self) -> str:
        return f"`{self.expression}` {self.message}"


@dataclass(frozen=True)
class Explanation:
    """The verdict for one selector and one device."""

    expression: str
    matched: bool
    error: str | None
    reasons: tuple[Reason, ...]

    def render(self) -> str:
        """Plain text for a terminal; see render_text()."""
        return render_text(self)


def render_text(explanation: Explanation) -> str:
    """Render an explanation as indented plain text, one reason per line."""
    verdict = "error" if explanation.error else ("matches" if explanation.matched else "does not match")
    lines = [f"selector: {_one_line(explanation.expression)}", f"result: {verdict}"]
    if explanation.error:
        lines.append(f"  error: {explanation.error}")
    lines.extend(f"  - {reason}" for reason in explanation.reasons)
    if explanation.error:
        lines.append(f"  note: {SCHEDULER_ON_ERROR}")
    return "\n".join(lines)


def explain(
    expression: str, device: Mapping[str, Any], driver: str, *, consumable_capacity: bool = False
) -> Explanation:
    """Compile ``expression`` (raises CelSyntaxError) and explain its result for ``device``."""
    return explain_program(
        compile_expression(expression, consumable_capacity=consumable_capacity), device, driver
    )


def explain_program(
    program: Program, device: Mapping[str, Any], driver: str, budget: Budget | None = None
) -> Explanation:
    """Explain a compiled selector's result for one ResourceSlice device of ``driver``.

    With a ``budget`` the run also spends from it, and raises BudgetSpentError where it runs out.
    """
    evaluator = Evaluator(FUNCTIONS, trace={}, exhaustive=True, budget=budget)
    result = program.run_selector(device, driver, evaluator)
    context = _Context(program, evaluator, driver)
    if isinstance(result, ErrorValue):
        reasons = context.explain_error(result)
        return Explanation(program.expression, False, result.message, _unique(reasons))
    if result is True:
        return Explanation(program.expression, True, None, ())
    return Explanation(program.expression, False, None, _unique(context.why(program.tree, False)))


def _unique(reasons: list[Reason]) -> tuple[Reason, ...]:
    return tuple(dict.fromkeys(reasons))


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text.strip())


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _is_constant(node: ast.Expr) -> bool:
    """Literals and calls on literals only, like ``quantity("40Gi")``: nothing to report."""
    if isinstance(node, ast.Literal):
        return True
    if isinstance(node, ast.Call | ast.ListExpr | ast.MapExpr | ast.Unary):
        return all(_is_constant(child) for child in ast.children(node))
    return False


def _is_path(node: ast.Expr) -> bool:
    """A variable with field selections and constant indexes: ``device.attributes["d"].x``."""
    if isinstance(node, ast.Ident):
        return True
    if isinstance(node, ast.Select):
        return _is_path(node.operand)
    return isinstance(node, ast.Index) and _is_path(node.operand) and isinstance(node.index, ast.Literal)


def _is_structural(node: ast.Expr) -> bool:
    return isinstance(node, ast.Logical | ast.Conditional | ast.Bind) or (
        isinstance(node, ast.Unary) and node.op == "!"
    )


class _Context:
    def __init__(self, program: Program, evaluator: Evaluator, driver: str) -> None:
        self.source = program.expression
        self.trace = evaluator.trace or {}
        self.iterations = evaluator.iterations
        self.driver = driver
        self.root = program.tree
        self.nodes = {node.id: node for node in ast.walk(program.tree)}
        # Bind variables resolve to their initializers, so `gpu.model` can be recognised
        # as an attribute when `gpu` is `device.attributes["gpu.nvidia.com"]`.
        self.bindings = {n.variable: n.init for n in self.nodes.values() if isinstance(n, ast.Bind)}

    def text(self, node: ast.Expr) -> str:
        return _one_line(self.source[node.start : node.end])

    def value(self, node: ast.Expr) -> Result | None:
        return self.trace.get(node.id)

    # -- false (or, under negation, true) results ----------------------------------------

    def why(self, node: ast.Expr, value: bool) -> list[Reason]:
        """Reasons why ``node`` evaluated to ``value``."""
        match node:
            case ast.Logical():
                deciding = node.op == "||"
                if value is deciding:
                    # `a && b` is false because of its false terms (`||`: its true terms).
                    terms = [t for t in node.terms if self.value(t) is value]
                else:
                    terms = list(node.terms)  # every term had to be true (`||`: false)
                return [reason for term in terms for reason in self.why(term, value)]
            case ast.Unary(op="!") if _is_structural(node.operand):
                operand = node.operand
                head = Reason(
                    self.text(node), f"is {_bool(value)} because `{self.text(operand)}` is {_bool(not value)}"
                )
                return [head, *self.why(operand, not value)]
            case ast.Conditional():
                condition = self.value(node.condition)
                branch = node.then if condition is True else node.otherwise
                head = Reason(
                    self.text(node.condition),
                    f"is {_bool(condition is True)}, so `{self.text(branch)}` decides",
                )
                return [head, *self.why(branch, value)]
            case ast.Bind():
                return self.why(node.body, value)
        return [self.leaf(node, value)]

    def leaf(self, node: ast.Expr, value: bool) -> Reason:
        details = list(dict.fromkeys(self.details(node)))
        message = f"is {_bool(value)}" + (": " + "; ".join(details) if details else "")
        return Reason(self.text(node), message)

    def details(self, node: ast.Expr) -> Iterator[str]:
        match node:
            case ast.Unary(op="!") if _is_path(node.operand):
                yield self.describe_path(node.operand)
            case ast.Unary(op="!"):
                yield f"`{self.text(node.operand)}` is {display(self.value(node.operand), _VALUE_LIMIT)}"
                yield from (self.describe_path(path) for path in self.paths(node.operand))
            case ast.Has():
                yield self.describe_has(node)
            case ast.Binary(op="in"):
                yield from self.describe_operand(node.left)
                yield from self.describe_container(node.right)
            case ast.Binary():
                for side in (node.left, node.right):
                    yield from self.describe_operand(side)
            case ast.Comprehension():
                yield from self.describe_comprehension(node)
            case _ if not _is_path(node):
                for path in self.paths(node):
                    yield self.describe_path(path)

    def describe_operand(self, node: ast.Expr) -> Iterator[str]:
        """Values of a comparison side: its attribute lookups, then the side's own value."""
        if _is_constant(node):
            return
        if _is_path(node):
            yield self.describe_path(node)
            return
        for path in self.paths(node):
            yield self.describe_path(path)
        if node.id in self.trace:
            value = display(self.value(node), _VALUE_LIMIT)
            if isinstance(node, ast.Call):
                yield f"{node.function}() returned {value}"
            else:
                yield f"`{self.text(node)}` is {value}"

    def describe_path(self, node: ast.Expr) -> str:
        value = self.value(node)
        if isinstance(value, CelMap):
            keys = ", ".join(display(key) for key in value)
            return (
                f"{self.short_name(node)} has keys [{keys}]" if keys else f"{self.short_name(node)} is empty"
            )
        return f"{self.short_name(node)} is {display(value, _VALUE_LIMIT)}"

    def describe_container(self, node: ast.Expr) -> Iterator[str]:
        if _is_constant(node):
            return
        if isinstance(self.value(node), CelMap) or _is_path(node):
            yield self.describe_path(node)
        else:
            yield from self.describe_operand(node)

    def describe_has(self, node: ast.Has) -> str:
        present = self.value(node) is True
        reference = self.domain_of(node.operand)
        if reference is not None:
            kind, domain = reference
            where = "" if domain == self.driver else f" in domain {domain}"
            state = "is set" if present else "is not set"
            return f'{_DOMAIN_MAPS[kind]} "{node.field}"{where} {state} on this device'
        return (
            f'"{node.field}" is {"present" if present else "not present"} in {self.short_name(node.operand)}'
        )

    def describe_comprehension(self, node: ast.Comprehension) -> Iterator[str]:
        runs = self.iterations.get(node.id, [])
        outcome = self.value(node)
        if node.macro == "all" and outcome is False:
            failing = next((item for item, result in runs if result is False), None)
            yield f"false for element {display(failing, _VALUE_LIMIT)}"
        elif node.macro == "exists" and outcome is True:
            passing = next((item for item, result in runs if result is True), None)
            yield f"true for element {display(passing, _VALUE_LIMIT)}"
        elif node.macro in ("exists", "exists_one", "all"):
            matching = [item for item, result in runs if result is True]
            yield f"{len(matching)} of {len(runs)} elements satisfy the condition"
        if _is_path(node.iter_range):
            yield self.describe_path(node.iter_range)
        # Lookups in the predicate that do not depend on the loop have one value for all
        # elements (the trace holds the last iteration's values).
        for part in (node.predicate, node.transform):
            for path in self.paths(part) if part is not None else ():
                if self.loop_invariant(path, node):
                    yield self.describe_path(path)

    def loop_invariant(self, path: ast.Expr, loop: ast.Comprehension) -> bool:
        root = path
        while isinstance(root, ast.Select | ast.Index):
            root = root.operand
        if not isinstance(root, ast.Ident):
            return False
        if root.name == "device":
            return loop.variable != "device"
        bind = next(
            (n for n in self.nodes.values() if isinstance(n, ast.Bind) and n.variable == root.name), None
        )
        return bind is not None and not loop.start <= bind.start < loop.end

    def paths(self, node: ast.Expr) -> Iterator[ast.Expr]:
        """Maximal attribute-like lookups inside ``node`` that have a recorded value."""
        for child in ast.children(node):
            if _is_constant(child):
                continue
            if _is_path(child) and not isinstance(child, ast.Ident):
                if child.id in self.trace:
                    yield child
            else:
                yield from self.paths(child)

    # -- names for attribute lookups -----------------------------------------------------

    def domain_of(self, node: ast.Expr) -> tuple[str, str] | None:
        """("attributes" or "capacity", domain) when ``node`` is e.g. ``device.attributes["d"]``."""
        if isinstance(node, ast.Ident) and node.name in self.bindings:
            return self.domain_of(self.bindings[node.name])
        key = self.key_of(node)
        if key is None or not isinstance(node, ast.Select | ast.Index):
            return None
        match node.operand:
            case ast.Select(operand=ast.Ident(name="device"), field=field) if field in _DOMAIN_MAPS:
                return field, key
        return None

    def key_of(self, node: ast.Expr) -> str | None:
        if isinstance(node, ast.Select):
            return node.field
        if (
            isinstance(node, ast.Index)
            and isinstance(node.index, ast.Literal)
            and isinstance(node.index.value, str)
        ):
            return node.index.value
        return None

    def short_name(self, node: ast.Expr) -> str:
        """``productName`` for ``device.attributes["gpu.nvidia.com"].productName``."""
        key = self.key_of(node)
        if key is not None and isinstance(node, ast.Select | ast.Index):
            reference = self.domain_of(node.operand)
            if reference is not None:
                domain = reference[1]
                return key if domain == self.driver else f"{domain}/{key}"
            if self.domain_of(node) is None:
                return key
        return self.text(node)

    # -- errors --------------------------------------------------------------------------

    def explain_error(self, error: ErrorValue) -> list[Reason]:
        origin = self.nodes.get(error.node_id) if error.node_id is not None else None
        if origin is None:
            return []
        if error.message.startswith("expression must return bool"):
            value = display(self.value(self.root), _VALUE_LIMIT)
            return [Reason(self.text(self.root), f"— is {value}, but a selector must return a bool")]
        if error.message.startswith("no such key") and isinstance(origin, ast.Select | ast.Index):
            return [Reason(self.text(origin), self.missing_key(origin))]
        if isinstance(origin, ast.Binary) and error.message.startswith("no such overload"):
            return [Reason(self.text(origin), self.mismatch(origin, error.message))]
        return [Reason(self.text(origin), f"— {error.message}")]

    def missing_key(self, node: ast.Select | ast.Index) -> str:
        key = self.key_of(node)
        reference = self.domain_of(node.operand)
        guard = "guard it with has() or an `in` check"
        if reference is not None and key is not None:
            kind, domain = reference
            where = "" if domain == self.driver else f" of domain {domain}"
            return f'— {_DOMAIN_MAPS[kind]} "{key}"{where} is missing on this device (no such key); {guard}'
        container = self.value(node.operand)
        if isinstance(container, CelMap):
            return f"— the key is not in {self.short_name(node.operand)} (no such key); {guard}"
        return f"— {type_name(container) if container is not None else 'the value'} has no such key"

    def mismatch(self, node: ast.Binary, message: str) -> str:
        left, right = self.value(node.left), self.value(node.right)
        parts = []
        for side, value in ((node.left, left), (node.right, right)):
            shown = "" if _is_constant(side) else f" {display(value, _VALUE_LIMIT)}"
            parts.append(f"{self.operand_label(side)} is {type_name(value)}{shown}")
        hint = ""
        for typed, other in ((left, right), (right, left)):
            if isinstance(typed, Semver | Quantity) and isinstance(other, str | int):
                function = "semver" if isinstance(typed, Semver) else "quantity"
                hint = f"; compare with {function}({display(str(other))}) instead"
        return f"— {message}: " + ", ".join(parts) + hint

    def operand_label(self, node: ast.Expr) -> str:
        return self.short_name(node) if _is_path(node) else f"`{self.text(node)}`"
