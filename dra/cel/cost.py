"""What an evaluation costs, charged the way Kubernetes' CEL charges it, and the API server's limits.

cel-go's runtime cost (``interpreter/runtimecost.go``) charges 1 per variable, field and
index lookup and per function call, and by size where work grows with it: string
traversals at 0.1 per character, ``matches`` at (0.1 per text character) x (0.25 per
pattern character), ``contains`` at the product of both traversals, ``in`` on a list at
1 per element, list and map literals 10 and 30. Kubernetes' library
(``k8s.io/apiserver/pkg/cel/library/cost.go``) adds the string extensions (``replace``
and ``split`` at 0.2 per input character, ``join`` at 0.2 per result character, ...) and
the quantity and semver parsers. A DRA selector may cost 1,000,000
(``CELSelectorExpressionMaxCost``) per evaluation; more cancels it.

Where Python would allocate what cel-go does not, this evaluator charges more, before the
allocation: concatenating lists (cel-go: 1, a lazy view; here a copy) is charged like
strings, and ``replace``/``split`` also by the size of their result, so that no
expression within the limit builds more than a few megabytes.
"""

from __future__ import annotations

import math

from dra.cel.values import CelMap, Value

#: ``CELSelectorExpressionMaxCost`` (k8s.io/api resource/v1 types.go): per evaluation.
COST_LIMIT = 1_000_000
#: ``CELSelectorExpressionMaxLength`` (same file): bytes, as Go's len() counts them.
MAX_EXPRESSION_BYTES = 10 * 1024

STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25
LIST_CREATE = 10
MAP_CREATE = 30
_SCALARS = frozenset((bool, int, float))


def size(value: Value) -> int:
    """cel-go's actualSize: the length of a string, bytes, list or map; 1 for anything else."""
    if isinstance(value, str | bytes | tuple | CelMap):
        return len(value)
    return 1


def traversal(length: int, factor: float = STRING_TRAVERSAL) -> int:
    """ceil(length * factor), the cost of walking ``length`` characters once."""
    return math.ceil(length * factor)


def first_traversal(value: Value, *_rest: Value) -> int:
    """The traversal of the first argument (receiver or parsed text), whatever the others are."""
    return traversal(size(value))


def regex(text: str, pattern: str) -> int:
    """``matches``, ``find``, ``findAll``: the text's traversal times the pattern's length."""
    return traversal(1 + len(text)) * traversal(len(pattern), REGEX_LENGTH)


def binary(op: str, left: Value, right: Value) -> int:
    """The cost of ``left op right`` (both already evaluated), charged before it runs."""
    if type(left) in _SCALARS and type(right) in _SCALARS:
        return 1
    if op in ("==", "!=", "<", "<=", ">", ">="):
        if isinstance(left, str | bytes) or op in ("==", "!="):
            return traversal(min(size(left), size(right)))
        return 1
    if op == "in":
        return len(right) if isinstance(right, tuple) else 1
    if op == "+" and isinstance(left, str | bytes | tuple) and isinstance(right, str | bytes | tuple):
        return traversal(len(left) + len(right))
    return 1
