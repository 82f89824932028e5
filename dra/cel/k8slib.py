"""Kubernetes CEL libraries: quantity, semver, lists and cel-go's sets extension.

Names, call styles and error texts follow k8s.io/apiserver/pkg/cel/library (v0.34), e.g.
``sign`` is a global function (``sign(q)``) while ``compareTo`` is a method.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from dra.cel import cost
from dra.cel.functions import Registry, error
from dra.cel.semver import Semver, SemverError
from dra.cel.values import Result, Uint, Value, compare, equals, list_contains, no_such_overload
from dra.model.quantity import Quantity, QuantityError

_COMPARABLE = (bool, int, Uint, float, str, bytes)


def _wrap_int64(value: int) -> int:
    # blang/semver numbers are uint64; Kubernetes returns them as types.Int(int64(...)).
    return (value + 2**63) % 2**64 - 2**63


def _quantity(text: str) -> Result:
    try:
        return Quantity.parse(text)
    except QuantityError as exc:
        return error(str(exc))


def _is_quantity(text: str) -> Result:
    return isinstance(_quantity(text), Quantity)


def _quantity_arithmetic(operation: Callable[[Quantity, Quantity], Quantity]) -> Callable[..., Result]:
    def apply(left: Quantity, right: Quantity | int) -> Result:
        other = Quantity.from_int(right) if isinstance(right, int) else right
        try:
            return operation(left, other)
        except QuantityError as exc:
            return error(str(exc))

    return apply


def _as_integer(quantity: Quantity) -> Result:
    value = quantity.as_int64()
    return error("cannot convert value to integer") if value is None else value


def _semver(text: str, normalize: bool = False) -> Result:
    try:
        return Semver.parse_normalized(text) if normalize else Semver.parse(text)
    except SemverError as exc:
        return error(str(exc))


def _is_semver(text: str, normalize: bool = False) -> Result:
    return isinstance(_semver(text, normalize), Semver)


# -- lists ---------------------------------------------------------------------------------


def _is_sorted(items: tuple[Value, ...]) -> Result:
    for item in items:
        if not isinstance(item, _COMPARABLE):
            return no_such_overload("isSorted", items)
    # An element pair that cannot be ordered does not count as unsorted (as in Kubernetes).
    return all(compare("isSorted", a, b) != 1 for a, b in itertools.pairwise(items))


def _extreme(name: str, replace_when: int) -> Callable[[tuple[Value, ...]], Result]:
    def pick(items: tuple[Value, ...]) -> Result:
        if not items:
            return error(f"{name} called on empty list")
        best = items[0]
        for item in items:
            if not isinstance(item, _COMPARABLE):
                return no_such_overload(name, items)
            if compare(name, best, item) == replace_when:
                best = item
        return best

    return pick


def _sum(items: tuple[Value, ...]) -> Result:
    if not items:
        return 0  # the element type is unknown without type checking; int is the common case
    kind = type(items[0])
    if kind not in (int, Uint, float) or any(type(item) is not kind for item in items):
        return no_such_overload("sum", items)
    if kind is Uint:
        total = sum(item.value for item in items if isinstance(item, Uint))
        return Uint(total) if total < 2**64 else error("unsigned integer overflow")
    if kind is float:
        return float(sum(item for item in items if isinstance(item, float)))
    total = sum(item for item in items if isinstance(item, int))
    return total if -(2**63) <= total < 2**63 else error("integer overflow")


def _index_of(items: tuple[Value, ...], needle: Value) -> Result:
    return next((i for i, item in enumerate(items) if equals(item, needle) is True), -1)


def _last_index_of(items: tuple[Value, ...], needle: Value) -> Result:
    return next((i for i in range(len(items) - 1, -1, -1) if equals(items[i], needle) is True), -1)


def _includes(target: Value, needle: Value) -> Result:
    # The list library's includes (v1, Kubernetes 1.37): a list holding it, or a value equal to it.
    if isinstance(target, tuple):
        return list_contains(target, needle)
    return equals(target, needle) is True


def _includes_cost(target: Value, _needle: Value) -> int:
    return len(target) if isinstance(target, tuple) else 1


def _sets_contains(items: tuple[Value, ...], subset: tuple[Value, ...]) -> Result:
    return all(list_contains(items, item) for item in subset)


def _list_cost(items: tuple[Value, ...], *_needle: Value) -> int:
    return len(items)


def _pairs_cost(a: tuple[Value, ...], b: tuple[Value, ...]) -> int:
    # cel-go's sets extension compares every element of one list with every one of the other.
    return len(a) * len(b)


def register(registry: Registry) -> None:
    """Add the Kubernetes library functions to ``registry``, with their costs (library/cost.go)."""
    registry.add("quantity", (str,), _quantity, member=False, cost=cost.first_traversal)
    registry.add("isQuantity", (str,), _is_quantity, member=False, cost=cost.first_traversal)
    registry.add("sign", (Quantity,), lambda q: q.sign(), member=False)
    registry.add("asApproximateFloat", (Quantity,), lambda q: q.as_approximate_float(), member=True)
    registry.add("asInteger", (Quantity,), _as_integer, member=True)
    registry.add("isInteger", (Quantity,), lambda q: q.as_int64() is not None, member=True)
    for name, operation in (("add", Quantity.add), ("sub", Quantity.sub)):
        for operand in (Quantity, int):
            registry.add(name, (Quantity, operand), _quantity_arithmetic(operation), member=True)

    registry.add("semver", (str,), _semver, member=False, cost=cost.first_traversal)
    registry.add("semver", (str, bool), _semver, member=False, cost=cost.first_traversal)
    registry.add("isSemver", (str,), _is_semver, member=False, cost=cost.first_traversal)
    registry.add("isSemver", (str, bool), _is_semver, member=False, cost=cost.first_traversal)
    registry.add("major", (Semver,), lambda v: _wrap_int64(v.major), member=True)
    registry.add("minor", (Semver,), lambda v: _wrap_int64(v.minor), member=True)
    registry.add("patch", (Semver,), lambda v: _wrap_int64(v.patch), member=True)

    for kind in (Quantity, Semver):
        registry.add("compareTo", (kind, kind), lambda a, b: a.compare(b), member=True)
        registry.add("isGreaterThan", (kind, kind), lambda a, b: a.compare(b) == 1, member=True)
        registry.add("isLessThan", (kind, kind), lambda a, b: a.compare(b) == -1, member=True)

    registry.add("isSorted", (tuple,), _is_sorted, member=True, cost=_list_cost)
    registry.add("sum", (tuple,), _sum, member=True, cost=_list_cost)
    registry.add("min", (tuple,), _extreme("min", 1), member=True, cost=_list_cost)
    registry.add("max", (tuple,), _extreme("max", -1), member=True, cost=_list_cost)
    registry.add("indexOf", (tuple, None), _index_of, member=True, cost=_list_cost)
    registry.add("lastIndexOf", (tuple, None), _last_index_of, member=True, cost=_list_cost)
    # Declared for a selector only with DRAListTypeAttributes on (dra.cel.program.LIST_FUNCTIONS).
    registry.add("includes", (None, None), _includes, member=True, cost=_includes_cost)

    registry.add("sets.contains", (tuple, tuple), _sets_contains, member=False, cost=_pairs_cost)
    registry.add(
        "sets.intersects",
        (tuple, tuple),
        lambda a, b: any(list_contains(b, x) for x in a),
        member=False,
        cost=_pairs_cost,
    )
    registry.add(
        "sets.equivalent",
        (tuple, tuple),
        lambda a, b: _sets_contains(a, b) and _sets_contains(b, a),
        member=False,
        cost=_pairs_cost,
    )
