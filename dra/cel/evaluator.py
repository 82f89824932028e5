"""Tree-walking CEL interpreter with errors as values.

``&&`` and ``||`` are commutative: ``false && <error>`` is false and ``true || <error>``
is true, whichever side the error is on; otherwise the first error wins.  ``cel.bind``
initializers run lazily, at most once, like cel-go's.

Every node is charged before it does its work (``cost``): a run that would pass
COST_LIMIT, or the ``Budget`` it shares with other runs, stops there, so a selector cannot
build a gigabyte string or run for minutes on its way to the limit.

For explanations the evaluator can record the value of every node (``trace``; inside
comprehension loops the last iteration's), what each top-level comprehension's predicate
gave per element, and evaluate ``&&``/``||`` exhaustively, which changes no result, only
how much gets recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dra.cel import ast, cost
from dra.cel.functions import Registry
from dra.cel.operators import arithmetic, has_field, index, logical_not, membership, negate, select
from dra.cel.values import (
    CelMap,
    ErrorValue,
    Result,
    Uint,
    Value,
    compare,
    equals,
    no_such_overload,
    type_name,
)

COST_LIMIT_MESSAGE = "operation cancelled: actual cost limit exceeded"

_COMPARISONS = {"<": (-1,), "<=": (-1, 0), ">": (1,), ">=": (1, 0)}
# cel-go charges nothing for constants and for the operators that only choose a branch;
# the work under them is charged where it happens. Other nodes cost 1 (see _eval).
_FREE = (ast.Literal, ast.Logical, ast.Conditional, ast.Bind, ast.Comprehension)


class CostLimitExceededError(Exception):
    """A run would cost more than COST_LIMIT; not absorbable by ``||``."""


class BudgetSpentError(Exception):
    """The Budget shared by several runs is spent; the run stops where it was."""


@dataclass
class Budget:
    """Cost units that several runs share (explain: one per run, across claims, selectors and devices)."""

    limit: int
    spent: int = 0

    @property
    def left(self) -> int:
        """Units still to spend."""
        return max(0, self.limit - self.spent)


@dataclass
class _Lazy:
    """A ``cel.bind`` variable: its initializer runs on first use."""

    init: ast.Expr
    scope: Scope
    value: Result = None
    done: bool = False


@dataclass
class Scope:
    """Variables by name, chained to the enclosing scope."""

    names: dict[str, Value | _Lazy]
    parent: Scope | None = None

    def lookup(self, name: str) -> Value | _Lazy | ErrorValue:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return ErrorValue(f"no such attribute(s): {name}")


@dataclass
class Evaluator:
    """Evaluates one expression tree; create a new one per evaluation."""

    registry: Registry
    trace: dict[int, Result] | None = None
    # For comprehensions outside loops: (element, predicate result) per iteration run.
    iterations: dict[int, list[tuple[Value, Result]]] = field(default_factory=dict)
    exhaustive: bool = False
    budget: Budget | None = None
    #: Cost charged so far by this evaluator.
    cost: int = field(default=0, init=False)
    _allowed: int = field(default=0, init=False)
    _loop_depth: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._allowed = cost.COST_LIMIT if self.budget is None else min(cost.COST_LIMIT, self.budget.left)

    def charge(self, units: int) -> None:
        """Add ``units`` before the work they pay for; raises when the limit or the budget is passed."""
        self.cost += units
        if self.cost > self._allowed:
            if self.cost > cost.COST_LIMIT:
                raise CostLimitExceededError(COST_LIMIT_MESSAGE)
            raise BudgetSpentError(f"the budget of {self.budget.limit if self.budget else 0} is spent")

    def settle(self) -> None:
        """Take what this evaluator spent from its budget (once, after the run)."""
        if self.budget is not None:
            self.budget.spent += self.cost

    def eval(self, node: ast.Expr, scope: Scope) -> Result:
        """Evaluate ``node``; errors come back as ErrorValue labelled with their origin node."""
        if not isinstance(node, _FREE):
            # charge(1), inlined: this runs for nearly every node.
            self.cost += 1
            if self.cost > self._allowed:
                self.charge(0)
        result = self._eval(node, scope)
        if isinstance(result, ErrorValue) and result.node_id is None:
            result = ErrorValue(result.message, node.id)
        if self.trace is not None:
            self.trace[node.id] = result
        return result

    def _eval_all(self, nodes: tuple[ast.Expr, ...], scope: Scope) -> list[Value] | ErrorValue:
        values: list[Value] = []
        for node in nodes:
            value = self.eval(node, scope)
            if isinstance(value, ErrorValue):
                return value
            values.append(value)
        return values

    def _eval(self, node: ast.Expr, scope: Scope) -> Result:
        match node:
            case ast.Literal():
                return node.value
            case ast.Ident():
                return self._resolve(node.name, scope)
            case ast.Select():
                operand = self.eval(node.operand, scope)
                return operand if isinstance(operand, ErrorValue) else select(operand, node.field)
            case ast.Has():
                operand = self.eval(node.operand, scope)
                return operand if isinstance(operand, ErrorValue) else has_field(operand, node.field)
            case ast.Index():
                values = self._eval_all((node.operand, node.index), scope)
                return values if isinstance(values, ErrorValue) else index(*values)
            case ast.Call():
                values = self._eval_all(ast.children(node), scope)
                if isinstance(values, ErrorValue):
                    return values
                overload = self.registry.resolve(node.function, values, member=node.target is not None)
                if overload is None:
                    return no_such_overload(node.function, *values)
                # The node's own 1 is charged already; the overload's cost replaces it.
                extra = overload.cost(*values) - 1
                if extra:
                    self.charge(extra)
                return overload.impl(*values)
            case ast.Unary():
                operand = self.eval(node.operand, scope)
                if isinstance(operand, ErrorValue):
                    return operand
                return logical_not(operand) if node.op == "!" else negate(operand)
            case ast.Binary():
                values = self._eval_all((node.left, node.right), scope)
                if isinstance(values, ErrorValue):
                    return values
                extra = cost.binary(node.op, *values) - 1
                if extra:
                    self.charge(extra)
                return _binary(node.op, *values)
            case ast.Logical():
                return self._logical(node, scope)
            case ast.Conditional():
                condition = self.eval(node.condition, scope)
                if isinstance(condition, ErrorValue):
                    return condition
                if not isinstance(condition, bool):
                    return no_such_overload("_?_:_", condition)
                return self.eval(node.then if condition else node.otherwise, scope)
            case ast.ListExpr():
                self.charge(cost.LIST_CREATE - 1)
                values = self._eval_all(node.elements, scope)
                return values if isinstance(values, ErrorValue) else tuple(values)
            case ast.MapExpr():
                return self._map_literal(node, scope)
            case ast.Comprehension():
                return self._comprehension(node, scope)
            case ast.Bind():
                return self.eval(node.body, Scope({node.variable: _Lazy(node.init, scope)}, scope))
        raise TypeError(f"unknown node {node!r}")

    def _resolve(self, name: str, scope: Scope) -> Result:
        value = scope.lookup(name)
        if isinstance(value, _Lazy):
            if not value.done:
                value.value, value.done = self.eval(value.init, value.scope), True
            return value.value
        return value

    def _logical(self, node: ast.Logical, scope: Scope) -> Result:
        # `&&` is decided by a false term, `||` by a true one; otherwise the first
        # error (or non-bool term) is the result.
        deciding = node.op == "||"
        decided = False
        error: ErrorValue | None = None
        for term in node.terms:
            value = self.eval(term, scope)
            if value is deciding:
                decided = True
                if not self.exhaustive:
                    break
            elif not isinstance(value, bool) and error is None:
                error = value if isinstance(value, ErrorValue) else no_such_overload(f"_{node.op}_", value)
        if decided:
            return deciding
        return error if error is not None else not deciding

    def _map_literal(self, node: ast.MapExpr, scope: Scope) -> Result:
        self.charge(cost.MAP_CREATE - 1)
        values = self._eval_all(ast.children(node), scope)
        if isinstance(values, ErrorValue):
            return values
        pairs = list(zip(values[::2], values[1::2], strict=True))
        for key, _ in pairs:
            if not isinstance(key, bool | int | Uint | str | float):
                return ErrorValue(f"unsupported map key type: {type_name(key)}")
        return CelMap(pairs)

    def _comprehension(self, node: ast.Comprehension, scope: Scope) -> Result:
        iter_range = self.eval(node.iter_range, scope)
        if isinstance(iter_range, ErrorValue):
            return iter_range
        if not isinstance(iter_range, tuple | CelMap):
            return ErrorValue(
                f"expression of type '{type_name(iter_range)}' cannot be the range of a comprehension"
            )
        record: list[tuple[Value, Result]] | None = None
        if self.trace is not None and self._loop_depth == 0:
            record = self.iterations.setdefault(node.id, [])
        self._loop_depth += 1
        try:
            return self._fold(node, tuple(iter_range), scope, record)
        finally:
            self._loop_depth -= 1

    def _fold(
        self,
        node: ast.Comprehension,
        items: tuple[Value, ...],
        scope: Scope,
        record: list[tuple[Value, Result]] | None,
    ) -> Result:
        macro = node.macro
        accumulator: Result = macro == "all"  # all: true until a false; exists: false until a true
        count = 0
        collected: list[Value] = []
        for item in items:
            # cel-go's loop condition and step: 1 per iteration, even for a constant predicate.
            self.cost += 1
            if self.cost > self._allowed:
                self.charge(0)
            inner = Scope({node.variable: item}, scope)
            predicate = self.eval(node.predicate, inner) if node.predicate is not None else True
            if record is not None:
                record.append((item, predicate))
            if macro in ("all", "exists"):
                accumulator = _fold_logical(macro == "exists", accumulator, predicate)
                if accumulator is (macro == "exists"):
                    break
                continue
            if isinstance(predicate, ErrorValue):
                return predicate
            if not isinstance(predicate, bool):
                return no_such_overload(f"{macro}()", predicate)
            if macro == "exists_one" and predicate:
                count += 1
            elif macro == "filter" and predicate:
                collected.append(item)
            elif macro == "map" and predicate and node.transform is not None:
                transformed = self.eval(node.transform, inner)
                if isinstance(transformed, ErrorValue):
                    return transformed
                collected.append(transformed)
        if macro in ("all", "exists"):
            return accumulator
        return count == 1 if macro == "exists_one" else tuple(collected)


def _fold_logical(deciding: bool, accumulator: Result, predicate: Result) -> Result:
    """One step of ``accu && pred`` (``all``) or ``accu || pred`` (``exists``)."""
    if accumulator is deciding or predicate is deciding:
        return deciding
    for value in (accumulator, predicate):
        if isinstance(value, ErrorValue):
            return value
        if not isinstance(value, bool):
            return no_such_overload("_||_" if deciding else "_&&_", value)
    return not deciding


def _binary(op: str, left: Value, right: Value) -> Result:
    if op == "==":
        return equals(left, right)
    if op == "!=":
        # cel-go negates "is equal": where `==` fails (a quantity against an int), `!=` is true.
        return equals(left, right) is not True
    if op in _COMPARISONS:
        order = compare(f"_{op}_", left, right)
        return order if isinstance(order, ErrorValue) else order in _COMPARISONS[op]
    if op == "in":
        return membership(left, right)
    return arithmetic(op, left, right)
