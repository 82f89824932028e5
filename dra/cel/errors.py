"""Exceptions raised by the CEL package.

Inside the evaluator errors are values (see ``values.ErrorValue``) so that ``&&``/``||``
can absorb them; these exceptions are what callers see at the API boundary.
"""

from __future__ import annotations


class CelError(Exception):
    """Base class of every error the CEL package raises."""


class CelSyntaxError(CelError):
    """An expression that does not compile: bad syntax, an unknown name or function.

    ``line`` and ``column`` are 1-based and count characters (code points), like
    cel-go's ``<input>:line:column`` prefix; ``str()`` adds a caret snippet.
    """

    def __init__(self, message: str, expression: str, offset: int) -> None:
        self.message = message
        self.expression = expression
        self.offset = max(0, min(offset, len(expression)))
        before = expression[: self.offset]
        self.line = before.count("\n") + 1
        line_start = before.rfind("\n") + 1
        self.column = self.offset - line_start + 1
        line_end = expression.find("\n", self.offset)
        self.source_line = expression[line_start : len(expression) if line_end < 0 else line_end]
        super().__init__(self.render())

    def render(self) -> str:
        """The message in cel-go's layout: position, message, source line and caret."""
        caret = "." * (self.column - 1) + "^"
        return f"ERROR: <input>:{self.line}:{self.column}: {self.message}\n | {self.source_line}\n | {caret}"


class CelEvaluationError(CelError):
    """A runtime error, e.g. ``no such key: model``; the scheduler fails the allocation on it."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)
