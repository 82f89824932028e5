"""RE2 patterns (what cel-go's ``matches`` takes) rewritten for Python's ``re``.

Where the two part, a pattern is rewritten so that it means what it means to the scheduler
(checked on a 1.34 API server and scheduler): what RE2 refuses is an error here too, what only
RE2 accepts is translated, and what neither rewrite covers stays an error or differs. The list:
docs/architecture.md ("CEL: why our own evaluator").
"""

from __future__ import annotations

import re

_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_FLAGS = re.compile(r"\(\?([imsU]*(?:-[imsU]*)?)(\)|:)")
_NAMED = re.compile(r"\(\?<([A-Za-z_][A-Za-z0-9_]*)>")
_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_UNSUPPORTED_GROUPS = ("(?=", "(?!", "(?<=", "(?<!", "(?>", "(?(", "(?#", "(?P=", "(?P>")
_SPACE = "\\t\\n\\f\\r "
_HEX = re.compile(r"\{([0-9A-Fa-f]{1,6})\}")
_OCTAL = re.compile(r"[1-7][0-7]{1,2}")


def translate(pattern: str) -> str:
    """The ``re`` pattern (for ``re.ASCII``) that matches what RE2 matches; raises re.error."""
    return _Translator(pattern).run()


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0
        self.out: list[str] = []
        # Per open group: how many scoped-flag groups opened inside it still need closing.
        self.scopes = [0]
        self.multiline = False

    def error(self, message: str, pos: int | None = None) -> re.error:
        return re.error(message, self.pattern, self.pos if pos is None else pos)

    def run(self) -> str:
        while self.pos < len(self.pattern):
            char = self.pattern[self.pos]
            if char == "\\":
                self.out.append(self.escape(in_class=False))
            elif char == "[":
                self.char_class()
            elif char == "(":
                self.group()
            elif char == ")":
                if len(self.scopes) == 1:
                    raise self.error("unexpected )")
                self.out.append(")" * (self.scopes.pop() + 1))
                self.pos += 1
            elif char == "$":
                self.out.append("$" if self.multiline else "\\Z")
                self.pos += 1
            elif char == "{":
                self.brace()
            elif char in "*+?":
                self.out.append(char)
                self.pos += 1
                self.after_repeat()
            else:
                self.out.append(char)
                self.pos += 1
        if len(self.scopes) > 1:
            raise self.error("missing )")
        return "".join(self.out) + ")" * self.scopes[0]

    def after_repeat(self) -> None:
        if self.pattern.startswith("?", self.pos):
            self.out.append("?")
            self.pos += 1
        if self.pattern.startswith("+", self.pos):
            raise self.error("invalid nested repetition operator")

    def brace(self) -> None:
        repeat = _REPEAT.match(self.pattern, self.pos)
        if repeat is None:
            self.out.append("\\{")
            self.pos += 1
            return
        if any(int(n) > 1000 for n in repeat.groups() if n):
            raise self.error("invalid repeat count")
        self.out.append(repeat.group())
        self.pos = repeat.end()
        self.after_repeat()

    def group(self) -> None:
        rest = self.pattern[self.pos :]
        if rest.startswith(_UNSUPPORTED_GROUPS):
            raise self.error("invalid or unsupported Perl syntax")
        flags = _FLAGS.match(self.pattern, self.pos)
        named = _NAMED.match(self.pattern, self.pos)
        if flags is not None and flags.group(1):
            if "U" in flags.group(1):
                raise self.error("the U flag (ungreedy) is not supported by this evaluator")
            if "m" in flags.group(1).partition("-")[0]:
                self.multiline = True
            self.out.append(f"(?{flags.group(1)}:")
            self.pos = flags.end()
            if flags.group(2) == ")":
                # Python only takes flags at the very start; RE2's last to the group's end.
                self.scopes[-1] += 1
                return
        elif named is not None:
            self.out.append(f"(?P<{named.group(1)}>")
            self.pos = named.end()
        else:
            self.out.append("(")
            self.pos += 1
        self.scopes.append(0)

    def char_class(self) -> None:
        start = self.pos
        self.out.append("[")
        self.pos += 1
        if self.pattern.startswith("^", self.pos):
            self.out.append("^")
            self.pos += 1
        first = True
        while self.pos < len(self.pattern):
            char = self.pattern[self.pos]
            if char == "]" and not first:
                self.out.append("]")
                self.pos += 1
                return
            first = False
            if char == "\\":
                self.out.append(self.escape(in_class=True))
            elif char == "[" and self.pattern.startswith("[:", self.pos):
                self.posix_class()
            elif char in "[&~|":
                # Literal in RE2; Python reserves doubled ones for set operations.
                self.out.append("\\" + char)
                self.pos += 1
            else:
                self.out.append(char)
                self.pos += 1
        raise self.error("missing closing ]", start)

    def posix_class(self) -> None:
        end = self.pattern.find(":]", self.pos + 2)
        name = self.pattern[self.pos + 2 : end] if end >= 0 else ""
        if name not in _POSIX:
            raise self.error(f"invalid character class range: [:{name}:]")
        self.out.append(_POSIX[name])
        self.pos = end + 2

    def escape(self, *, in_class: bool) -> str:
        start = self.pos
        if start + 1 >= len(self.pattern):
            raise self.error("trailing backslash at end of expression")
        char = self.pattern[start + 1]
        self.pos = start + 2
        if char == "Q" and not in_class:
            end = self.pattern.find("\\E", self.pos)
            literal = self.pattern[self.pos :] if end < 0 else self.pattern[self.pos : end]
            self.pos = len(self.pattern) if end < 0 else end + 2
            return re.escape(literal)
        if char == "x" and self.pattern.startswith("{", self.pos):
            code = _HEX.match(self.pattern, self.pos)
            if code is None or int(code.group(1), 16) > 0x10FFFF:
                raise self.error("invalid escape sequence: \\x{", start)
            self.pos = code.end()
            return re.escape(chr(int(code.group(1), 16)))
        octal = _OCTAL.match(self.pattern, start + 1)
        if octal is not None:
            # As in Go: a second octal digit makes \1 a character code, not a backreference.
            self.pos = octal.end()
            return re.escape(chr(int(octal.group(), 8)))
        if char in "123456789":
            raise self.error(f"invalid escape sequence: \\{char}")
        if char in "zZ" and not in_class:
            if char == "Z":
                raise self.error("invalid escape sequence: \\Z")
            return "\\Z"
        if char == "s":
            return _SPACE if in_class else f"[{_SPACE}]"
        if char == "S" and not in_class:
            return f"[^{_SPACE}]"
        return self.pattern[start : self.pos]
