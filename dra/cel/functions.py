"""The function registry: overloads by name, call style and argument types.

Arity and call style (``f(x)`` versus ``x.f()``) are checked when an expression compiles;
argument types are only known at runtime, where a call that matches no overload yields a
``no such overload`` error value, as in cel-go with dynamically typed values. Each overload
says what a call costs (``cost``); the default is cel-go's 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra.cel.values import ErrorValue, Result, Value

# A parameter's CEL type as the Python class of its values (int, str, tuple, CelMap, ...),
# or None for any value.
ParamType = type | None
# What a call costs given its arguments (receiver first), known before it runs.
CostFunction = Callable[..., int]


def _unit(*_args: Value) -> int:
    return 1


@dataclass(frozen=True)
class Overload:
    """One signature; for member overloads ``params[0]`` is the receiver."""

    member: bool
    params: tuple[ParamType, ...]
    impl: Callable[..., Result]
    cost: CostFunction = _unit

    def accepts(self, args: Sequence[Value]) -> bool:
        """Whether the runtime argument types fit (bool is not an int here)."""
        return len(args) == len(self.params) and all(
            param is None or type(arg) is param for param, arg in zip(self.params, args, strict=True)
        )


class Registry:
    """Functions by name; several libraries may add overloads to the same name."""

    def __init__(self) -> None:
        self._overloads: dict[str, list[Overload]] = {}

    def add(
        self,
        name: str,
        params: tuple[ParamType, ...],
        impl: Callable[..., Result],
        *,
        member: bool,
        cost: CostFunction = _unit,
    ) -> None:
        """Declare ``name(params)``, costing ``cost(*args)``; ``member``: ``params[0].name(rest)``."""
        self._overloads.setdefault(name, []).append(Overload(member, params, impl, cost))

    def __contains__(self, name: str) -> bool:
        return name in self._overloads

    def names(self) -> frozenset[str]:
        """Every declared function name."""
        return frozenset(self._overloads)

    def has_signature(self, name: str, *, member: bool, argc: int) -> bool:
        """Whether some overload has this call style and argument count (receiver included)."""
        return any(o.member == member and len(o.params) == argc for o in self._overloads.get(name, ()))

    def resolve(self, name: str, args: Sequence[Value], *, member: bool) -> Overload | None:
        """The first overload whose types fit the (error-free) arguments."""
        for overload in self._overloads.get(name, ()):
            if overload.member == member and overload.accepts(args):
                return overload
        return None


def error(message: str) -> ErrorValue:
    """Shorthand for function implementations."""
    return ErrorValue(message)
