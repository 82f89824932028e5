"""Regular expressions for ``matches``, ``find`` and ``findAll``: RE2, the engine family the scheduler uses.

cel-go runs Go's ``regexp``, RE2 syntax in linear time; ``google-re2`` binds the C++ RE2,
which parses the same syntax and has the same linear-time guarantee, so a pattern cannot
make a selector run for long however it nests (issue 26: ``^(a+)+$`` took Python's
backtracking ``re`` past 15 s on 33 characters). Both run on UTF-8 and default to
leftmost-first, unanchored matching with ``$`` at the end of the text.

Where C++ RE2 accepts what Go refuses, the pattern is refused here too: ``\\C`` (any byte).
"""

from __future__ import annotations

import functools
from typing import Any

import re2

# google-re2 ships no type information; a compiled pattern (re2._Regexp).
Pattern = Any


class RegexError(ValueError):
    """A pattern that Go's regexp refuses; the message is RE2's, in one line."""


_OPTIONS = re2.Options()
# RE2 otherwise logs every refused pattern on stderr; the refusal is returned as an error value.
_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Pattern:
    """Compile ``pattern`` with RE2's syntax and meaning; raises RegexError."""
    if _byte_class(pattern):
        raise RegexError("invalid escape sequence: \\C")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise RegexError(_message(exc)) from None
    except UnicodeEncodeError:
        raise RegexError("invalid UTF-8 in the pattern (a lone surrogate)") from None


# Attribute values repeat across a fleet (every H100 has the same productName); one call
# through google-re2's wrapper costs about 10 µs where the lookup costs well under 1.
_MEMO_TEXT_LIMIT = 256


def contains(regex: Pattern, text: str) -> bool:
    """Whether ``regex`` matches somewhere in ``text`` (CEL's ``matches``)."""
    if len(text) <= _MEMO_TEXT_LIMIT:
        return _contains_memo(regex, text)
    return search(regex, text) is not None


@functools.lru_cache(maxsize=4096)
def _contains_memo(regex: Pattern, text: str) -> bool:
    return search(regex, text) is not None


def search(regex: Pattern, text: str, pos: int = 0) -> tuple[int, int] | None:
    """The span of the leftmost match at or after ``pos`` (character offsets), or None."""
    try:
        found = regex.search(text, pos)
    except UnicodeEncodeError:
        # Go decodes a lone surrogate in JSON as U+FFFD, which RE2 then sees.
        found = regex.search("".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text), pos)
    return None if found is None else found.span()


def _byte_class(pattern: str) -> bool:
    escaped = False
    for char in pattern:
        if escaped and char == "C":
            return True
        escaped = not escaped and char == "\\"
    return False


# C++ RE2's error codes in the words of Go's regexp/syntax, which the scheduler reports.
_GO_WORDING = {
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid repetition size": "invalid repeat count",
    "trailing \\": "trailing backslash at end of expression",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
}


def _message(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    code, _, argument = " ".join(str(text).split()).partition(": ")
    code = _GO_WORDING.get(code, code)
    return f"error parsing regexp: {code}: `{argument}`" if argument else f"error parsing regexp: {code}"
