"""The CEL lexer: source text to tokens with character offsets.

Follows the lexical grammar of the CEL language definition (cel-spec doc/langdef.md):
decimal and hex integers, ``u`` suffixed unsigned integers, doubles, single/double/triple
quoted strings with escapes, raw (``r``) strings, bytes (``b``) literals and ``//``
comments.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from dra.cel.digits import bounded_int
from dra.cel.errors import CelSyntaxError


class Kind(enum.Enum):
    """Token kinds; keywords and operators are all OP, told apart by their text."""

    INT = "int literal"
    UINT = "uint literal"
    DOUBLE = "double literal"
    STRING = "string literal"
    BYTES = "bytes literal"
    BOOL = "bool literal"
    NULL = "null"
    IDENT = "identifier"
    OP = "operator"
    EOF = "end of input"


@dataclass(frozen=True, slots=True)
class Token:
    """One token; ``value`` holds the decoded literal (magnitude only for numbers)."""

    kind: Kind
    text: str
    start: int
    end: int
    value: int | float | str | bytes | bool | None = None


# Identifiers the language reserves; using one is a syntax error.
RESERVED = frozenset(
    (
        *("as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop"),
        *("package", "namespace", "return", "var", "void", "while"),
    )
)
# Two-character operators first, so that "<=" is not read as "<" "=".
_OPERATORS = (
    *("||", "&&", "==", "!=", "<=", ">=", "<", ">", "!", "?", ":", "+", "-", "*", "/", "%"),
    *(".", ",", "[", "]", "(", ")", "{", "}"),
)
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_IDENT_START = frozenset("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_IDENT_CHARS = _IDENT_START | _DIGITS
_OCTAL = frozenset("01234567")
_OCTAL_FIRST = frozenset("0123")
# Builds a CelSyntaxError positioned at the literal being decoded.
_ErrorFactory = Callable[[str], CelSyntaxError]
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "?": "?",
    '"': '"',
    "'": "'",
    "`": "`",
}


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens ending with an EOF token; raises CelSyntaxError."""
    return _Lexer(source).run()


class _Lexer:
    def __init__(self, source: str) -> None:
        self.src = source
        self.pos = 0
        self.tokens: list[Token] = []

    def error(self, message: str, offset: int) -> CelSyntaxError:
        return CelSyntaxError(message, self.src, offset)

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.src[index] if index < len(self.src) else ""

    def run(self) -> list[Token]:
        src = self.src
        while True:
            self.skip_space_and_comments()
            if self.pos >= len(src):
                self.tokens.append(Token(Kind.EOF, "", self.pos, self.pos))
                return self.tokens
            char = src[self.pos]
            if char in _DIGITS or (char == "." and self.peek(1) in _DIGITS):
                self.number()
            elif self.string_prefix_length() >= 0:
                self.string()
            elif char in _IDENT_START:
                self.identifier()
            else:
                self.operator()

    def skip_space_and_comments(self) -> None:
        src = self.src
        while self.pos < len(src):
            if src[self.pos] in " \t\n\r\f":
                self.pos += 1
            elif src.startswith("//", self.pos):
                end = src.find("\n", self.pos)
                self.pos = len(src) if end < 0 else end
            else:
                return

    def add(self, kind: Kind, start: int, value: int | float | str | bytes | bool | None = None) -> None:
        self.tokens.append(Token(kind, self.src[start : self.pos], start, self.pos, value))

    def take_while(self, allowed: frozenset[str]) -> None:
        while self.peek() in allowed:
            self.pos += 1

    def number(self) -> None:
        start = self.pos
        if self.peek() == "0" and self.peek(1) in ("x", "X") and self.peek(2) in _HEX:
            self.pos += 2
            self.take_while(_HEX)
            value = bounded_int(self.src[start + 2 : self.pos], 16)
            if self.peek() in ("u", "U"):
                self.pos += 1
                self.add(Kind.UINT, start, value)
            else:
                self.add(Kind.INT, start, value)
            return
        self.take_while(_DIGITS)
        is_double = False
        if self.peek() == "." and self.peek(1) in _DIGITS:
            self.pos += 1
            self.take_while(_DIGITS)
            is_double = True
        if self.peek() in ("e", "E"):
            sign = 1 if self.peek(1) in ("+", "-") else 0
            if self.peek(1 + sign) in _DIGITS:
                self.pos += 1 + sign
                self.take_while(_DIGITS)
                is_double = True
        text = self.src[start : self.pos]
        if is_double:
            self.add(Kind.DOUBLE, start, float(text))
        elif self.peek() in ("u", "U"):
            self.pos += 1
            self.add(Kind.UINT, start, bounded_int(text, 10))
        else:
            self.add(Kind.INT, start, bounded_int(text, 10))

    def identifier(self) -> None:
        start = self.pos
        self.take_while(_IDENT_CHARS)
        text = self.src[start : self.pos]
        if text in ("true", "false"):
            self.add(Kind.BOOL, start, text == "true")
        elif text == "null":
            self.add(Kind.NULL, start)
        elif text == "in":
            self.add(Kind.OP, start)
        else:
            self.add(Kind.IDENT, start)

    def operator(self) -> None:
        for op in _OPERATORS:
            if self.src.startswith(op, self.pos):
                start = self.pos
                self.pos += len(op)
                self.add(Kind.OP, start)
                return
        raise self.error(f"Syntax error: token recognition error at: '{self.src[self.pos]}'", self.pos)

    def string_prefix_length(self) -> int:
        """Length of a b/r prefix before a quote here (0 for a bare quote), or -1."""
        length = 0
        if self.peek(length) in ("b", "B"):
            length += 1
        if self.peek(length) in ("r", "R"):
            length += 1
        return length if self.peek(length) in ("'", '"') else -1

    def string(self) -> None:
        start = self.pos
        prefix = self.src[start : start + self.string_prefix_length()].lower()
        is_bytes, is_raw = "b" in prefix, "r" in prefix
        self.pos += len(prefix)
        quote = (
            self.src[self.pos] * 3
            if self.src.startswith(self.src[self.pos] * 3, self.pos)
            else self.src[self.pos]
        )
        self.pos += len(quote)
        body_start = self.pos
        while True:
            if self.pos >= len(self.src) or (len(quote) == 1 and self.src[self.pos] in "\r\n"):
                raise self.error(
                    f"Syntax error: token recognition error at: '{self.src[start : self.pos]}'", start
                )
            if self.src.startswith(quote, self.pos):
                break
            # An escaped character never ends the literal (raw strings have no escapes).
            self.pos += 2 if self.src[self.pos] == "\\" and not is_raw else 1
        body = self.src[body_start : self.pos]
        self.pos += len(quote)
        text = body if is_raw else _unescape(body, is_bytes, lambda message: self.error(message, start))
        if is_bytes:
            # \x and octal escapes in bytes literals are raw bytes, everything else is UTF-8.
            self.add(Kind.BYTES, start, text.encode("utf-8", "surrogateescape"))
        else:
            self.add(Kind.STRING, start, text)


def _unescape(body: str, is_bytes: bool, error: _ErrorFactory) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        kind = body[i + 1] if i + 1 < len(body) else ""
        if kind in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[kind])
            i += 2
        elif kind in ("x", "X", "u", "U"):
            width = {"x": 2, "X": 2, "u": 4, "U": 8}[kind]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(d in _HEX for d in digits):
                raise error("Syntax error: invalid escape sequence")
            if is_bytes and kind in ("u", "U"):
                raise error("unable to unescape string")
            out.append(_code_point(int(digits, 16), is_bytes and width == 2, error))
            i += 2 + width
        elif kind in _OCTAL_FIRST and len(body) >= i + 4 and all(d in _OCTAL for d in body[i + 2 : i + 4]):
            out.append(_code_point(int(body[i + 1 : i + 4], 8), is_bytes, error))
            i += 4
        else:
            raise error("Syntax error: invalid escape sequence")
    return "".join(out)


def _code_point(value: int, raw_byte: bool, error: _ErrorFactory) -> str:
    if raw_byte and value >= 0x80:
        # Encoded back to the single byte by "surrogateescape" in _Lexer.string().
        return chr(0xDC00 + value)
    if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF:
        raise error("invalid unicode code point")
    return chr(value)
