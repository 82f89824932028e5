"""How a message quotes what a user wrote: recognisably, and never a whole hostile input."""

from __future__ import annotations

#: How much of a value a message quotes: enough to recognise it, never a whole hostile input.
QUOTE_CHARS = 60


def cut(text: str) -> str:
    """`text`, cut to QUOTE_CHARS characters (the cut marked with "...")."""
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 3] + "..."


def quote(value: object) -> str:
    """repr(value), cut to QUOTE_CHARS characters: for messages that quote what the user wrote."""
    return cut(repr(value))
