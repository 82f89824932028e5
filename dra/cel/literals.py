"""Homogeneous aggregate literals: the one static type rule Kubernetes enforces on selectors.

The API server compiles selectors with cel-go's HomogeneousAggregateLiterals: the elements of a
list literal, and the keys and values of a map literal, must have one static type, else the
object is rejected at write time. Attribute values are statically ``any`` and ``dyn`` is a type
of its own, so ``[0, device.attributes["d"].index]`` and ``[1, dyn(2)]`` are rejected. With no
type checker here, a type is inferred only where it is certain: the check may miss a rejection,
never invent one.
"""

from __future__ import annotations

from dra.cel import ast
from dra.cel.values import type_name

_BOOL_FUNCTIONS = frozenset(
    (
        "matches",
        "startsWith",
        "endsWith",
        "contains",
        "isGreaterThan",
        "isLessThan",
        "isQuantity",
        "isSemver",
        "isInteger",
        "isSorted",
        "includes",
        "sets.contains",
        "sets.equivalent",
        "sets.intersects",
        "bool",
    )
)
_RESULT_TYPES = {
    **dict.fromkeys(_BOOL_FUNCTIONS, "bool"),
    **dict.fromkeys(("size", "int", "indexOf", "lastIndexOf", "compareTo", "asInteger", "sign"), "int"),
    **dict.fromkeys(("major", "minor", "patch"), "int"),
    **dict.fromkeys(
        ("string", "lowerAscii", "upperAscii", "trim", "replace", "substring", "charAt"), "string"
    ),
    "join": "string",
    "split": "list(string)",
    "uint": "uint",
    "double": "double",
    "bytes": "bytes",
    "dyn": "dyn",
    "quantity": "kubernetes.Quantity",
    "semver": "kubernetes.Semver",
}
_NUMBERS_AND_STRINGS = frozenset(("int", "uint", "double", "string"))


def _literal_type(node: ast.Literal) -> str:
    # The checker's messages call the null literal's type "null", where values say "null_type".
    return "null" if node.value is None else type_name(node.value)


def _is_device_map(node: ast.Expr, field: str) -> bool:
    """``device.attributes`` (or ``device.capacity``), with ``device`` the selector's variable."""
    return (
        isinstance(node, ast.Select)
        and node.field == field
        and isinstance(node.operand, ast.Ident)
        and node.operand.name == "device"
    )


def _leaf_type(node: ast.Select | ast.Index, bound: frozenset[str]) -> str | None:
    """``device.attributes[domain].name`` is ``any``; a capacity is a quantity."""
    if "device" in bound:
        return None
    domain = node.operand
    if not isinstance(domain, ast.Index):
        return None
    if _is_device_map(domain.operand, "attributes"):
        return "any"
    if _is_device_map(domain.operand, "capacity"):
        return "kubernetes.Quantity"
    return None


def static_type(node: ast.Expr, bound: frozenset[str] = frozenset()) -> str | None:
    """The cel-go static type name of ``node`` where it is certain, else None.

    ``bound`` names the macro and bind variables in scope (their types are not tracked).
    """
    match node:
        case ast.Literal():
            return _literal_type(node)
        case ast.Select(operand=ast.Ident(name="device")) if "device" not in bound:
            return {"driver": "string", "allowMultipleAllocations": "bool"}.get(node.field)
        case ast.Select() | ast.Index():
            return _leaf_type(node, bound)
        case ast.Has() | ast.Logical():
            return "bool"
        case ast.Unary():
            return "bool" if node.op == "!" else _numeric(static_type(node.operand, bound))
        case ast.Binary():
            if node.op in ("==", "!=", "<", "<=", ">", ">=", "in"):
                return "bool"
            return _arithmetic(node.op, static_type(node.left, bound), static_type(node.right, bound))
        case ast.Conditional():
            then, otherwise = static_type(node.then, bound), static_type(node.otherwise, bound)
            return then if then == otherwise else None
        case ast.Call():
            return _RESULT_TYPES.get(node.function)
        case ast.ListExpr():
            element = _common_type(node.elements, bound)
            return None if element is None else f"list({element})"
        case ast.MapExpr():
            key = _common_type(tuple(k for k, _ in node.entries), bound)
            value = _common_type(tuple(v for _, v in node.entries), bound)
            return None if key is None or value is None else f"map({key}, {value})"
        case ast.Comprehension():
            if node.macro in ("all", "exists", "exists_one"):
                return "bool"
            return static_type(node.iter_range, bound) if node.macro == "filter" else None
    return None


def _numeric(operand: str | None) -> str | None:
    return operand if operand in ("int", "double") else None


def _arithmetic(op: str, left: str | None, right: str | None) -> str | None:
    # With one side `any`, the other side's type picks the only overload that can apply.
    known = {left, right} - {"any"}
    if len(known) != 1:
        return None
    [operand] = known
    if operand not in _NUMBERS_AND_STRINGS or (operand == "string" and op != "+"):
        return None
    return operand


def _common_type(nodes: tuple[ast.Expr, ...], bound: frozenset[str]) -> str | None:
    types = {static_type(node, bound) for node in nodes}
    return types.pop() if len(types) == 1 else None


def _offset(node: ast.Expr) -> int:
    # cel-go places a field selection at its dot.
    return node.end - len(node.field) - 1 if isinstance(node, ast.Select) else node.start


def mixed_literal(tree: ast.Expr) -> tuple[str, int] | None:
    """The first element of a list or map literal whose static type differs from the first's.

    Returns (message, offset) in cel-go's words, or None where every literal is homogeneous
    as far as types are known.
    """
    stack: list[tuple[ast.Expr, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        node, bound = stack.pop()
        groups: tuple[tuple[ast.Expr, ...], ...] = ()
        if isinstance(node, ast.ListExpr):
            groups = (node.elements,)
        elif isinstance(node, ast.MapExpr):
            groups = (tuple(k for k, _ in node.entries), tuple(v for _, v in node.entries))
        for group in groups:
            problem = _first_mismatch(group, bound)
            if problem is not None:
                return problem
        inner = bound | {node.variable} if isinstance(node, ast.Comprehension | ast.Bind) else bound
        for child in ast.children(node):
            # A bind initializer and a comprehension range see only the outer variables.
            outer = isinstance(node, ast.Comprehension) and child is node.iter_range
            outer = outer or (isinstance(node, ast.Bind) and child is node.init)
            stack.append((child, bound if outer else inner))
    return None


def _first_mismatch(group: tuple[ast.Expr, ...], bound: frozenset[str]) -> tuple[str, int] | None:
    if not group:
        return None
    expected = static_type(group[0], bound)
    if expected is None:
        return None
    for node in group[1:]:
        found = static_type(node, bound)
        if found is not None and found != expected:
            return f"expected type '{expected}' but found '{found}'", _offset(node)
    return None
