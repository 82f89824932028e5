"""What every program of steps is made of: a step, a question, asking one, a step's failure, a log line.

A program is a generator: it yields one step at a time and is resumed with the step's result,
the way a sans-I/O protocol asks for more input. It decides everything; an executor only runs
each step and sends back what it returned, or throws `StepError` into the program when the step
failed. A step's `run` calls the one method of its runner that runs its kind: the runner's type
is the step's type parameter, the protocol of the vocabulary it belongs to. dra.core.gpusteps
has the GPU's steps (GpuRunner), which static MIG layouts are made of alone; dra.core.steps the
rest of what prepare, unprepare and the start-up repair yield (Runner, which extends GpuRunner):
a step that needs less of its runner is a step of every vocabulary that has it.
"""

from __future__ import annotations

import abc
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

#: The runner a step needs: a step for a smaller runner is a step for every larger one.
R = TypeVar("R", contravariant=True)
T = TypeVar("T")


@dataclass(frozen=True)
class Step(abc.ABC, Generic[R]):
    """One effect or question; `point` names the crash point the executor passes right after it."""

    #: Whether the executor runs it holding the state's lock (threads and other instances).
    locked: ClassVar[bool] = True
    point: str = field(default="", kw_only=True)

    @abc.abstractmethod
    def run(self, runner: R) -> object:
        """Have the runner's method for this kind of step run it; its result."""


@dataclass(frozen=True)
class Query(Step[R], Generic[R, T]):
    """A step whose result the program needs: `yield from ask(step)` returns it (its `run` returns a T)."""


def ask(step: Query[R, T]) -> Generator[Step[R], Any, T]:
    """Yield a query and return its result: what `step.run` returned, of the query's type."""
    result: T = yield step
    return result


class StepError(Exception):
    """A step failed (a file, NVML, nvidia-smi, an MPS daemon); thrown into the program at its yield.

    `code`: NVML's return code (nvml.h's nvmlReturn_t) where the step was an NVML call, else 0.
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class Logger(Protocol):
    """What runs Log steps; every runner does."""

    def log(self, step: Log) -> None: ...


@dataclass(frozen=True)
class Log(Step[Logger]):
    """Tell the admin, in the plugin's log."""

    level: Literal["debug", "info", "warning", "error"]
    message: str

    def run(self, runner: Logger) -> None:
        return runner.log(self)
