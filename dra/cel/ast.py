"""The typed CEL syntax tree.

Every node carries a unique ``id`` (the evaluator records values by it) and the
``start``/``end`` character offsets of its source text, so explanations can quote the
exact sub-expression.  Macros (``has``, ``all``, ``cel.bind``, ...) are expanded by the
parser into dedicated nodes instead of cel-go's generic comprehension form.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra.cel.values import Value


@dataclass(frozen=True, slots=True, eq=False)
class Expr:
    """Base class: node id and source span (``source[start:end]``)."""

    id: int
    start: int
    end: int


@dataclass(frozen=True, slots=True, eq=False)
class Literal(Expr):
    """A constant: ``1``, ``2u``, ``1.5``, ``"s"``, ``b"b"``, ``true``, ``null``."""

    value: Value


@dataclass(frozen=True, slots=True, eq=False)
class Ident(Expr):
    """A variable reference: ``device`` or a macro/bind variable."""

    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Select(Expr):
    """Field selection ``operand.field`` (a map lookup with a string key)."""

    operand: Expr
    field: str


@dataclass(frozen=True, slots=True, eq=False)
class Index(Expr):
    """Indexing ``operand[index]`` of a list or map."""

    operand: Expr
    index: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Call(Expr):
    """A function call ``function(args)`` or, with a target, ``target.function(args)``."""

    function: str
    target: Expr | None
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Unary(Expr):
    """``!operand`` or ``-operand``."""

    op: str
    operand: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Binary(Expr):
    """Arithmetic (``+ - * / %``), comparisons and ``in``."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Logical(Expr):
    """A chain of ``&&`` or ``||`` terms, flattened (CEL treats both as commutative)."""

    op: str
    terms: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Conditional(Expr):
    """``condition ? then : otherwise``."""

    condition: Expr
    then: Expr
    otherwise: Expr


@dataclass(frozen=True, slots=True, eq=False)
class ListExpr(Expr):
    """A list literal ``[a, b]``."""

    elements: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class MapExpr(Expr):
    """A map literal ``{k: v}``."""

    entries: tuple[tuple[Expr, Expr], ...]


@dataclass(frozen=True, slots=True, eq=False)
class Has(Expr):
    """The ``has(operand.field)`` macro: presence test without an error."""

    operand: Expr
    field: str


@dataclass(frozen=True, slots=True, eq=False)
class Comprehension(Expr):
    """``iter_range.all/exists/exists_one/filter(variable, predicate)`` and ``map``.

    ``map`` has a ``transform`` and, in its three-argument form, a ``predicate`` filter.
    """

    macro: str
    iter_range: Expr
    variable: str
    predicate: Expr | None
    transform: Expr | None


@dataclass(frozen=True, slots=True, eq=False)
class Bind(Expr):
    """``cel.bind(variable, init, body)``; ``init`` is evaluated lazily, at most once."""

    variable: str
    init: Expr
    body: Expr


def children(node: Expr) -> tuple[Expr, ...]:
    """Direct sub-expressions in evaluation order."""
    match node:
        case Select() | Has():
            return (node.operand,)
        case Index():
            return (node.operand, node.index)
        case Call():
            return (node.target, *node.args) if node.target is not None else node.args
        case Unary():
            return (node.operand,)
        case Binary():
            return (node.left, node.right)
        case Logical():
            return node.terms
        case Conditional():
            return (node.condition, node.then, node.otherwise)
        case ListExpr():
            return node.elements
        case MapExpr():
            return tuple(part for entry in node.entries for part in entry)
        case Comprehension():
            return tuple(
                part for part in (node.iter_range, node.predicate, node.transform) if part is not None
            )
        case Bind():
            return (node.init, node.body)
    return ()


def walk(node: Expr) -> list[Expr]:
    """All nodes of the tree in pre-order (iteratively, so deep trees are fine)."""
    out: list[Expr] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(children(current)))
    return out
