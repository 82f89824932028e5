"""Integer text to int without converting text too long to be a CEL int or uint.

CEL's integers are 64 bits, so text with more significant digits than a uint64 can hold is out of
range whatever it says; converting it anyway costs quadratic time in Python and is refused past
4,300 digits. The lexer, the semver parser and `int()`/`uint()` share this one guard.
"""

from __future__ import annotations

#: The most significant digits a uint64 has in each base CEL writes integers in.
_MAX_DIGITS = {10: 20, 16: 16}
#: Stands for any value beyond a uint64: every range check the callers make refuses it.
OUT_OF_RANGE = 2**64


def bounded_int(digits: str, base: int = 10) -> int:
    """`digits` (no sign) as an int, or `OUT_OF_RANGE` for text too long for any 64-bit integer."""
    if len(digits.lstrip("0")) > _MAX_DIGITS[base]:
        return OUT_OF_RANGE
    return int(digits, base)
