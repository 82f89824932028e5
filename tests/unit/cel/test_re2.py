"""``matches`` with RE2's meaning where Python's ``re`` would differ.

Every case was run on a 1.34 API server and scheduler (a constant selector on a
hand-made slice): it allocated (true), said "cannot allocate all claims" (false), or
rejected the claim at write time with "invalid matches argument".
"""

from __future__ import annotations

import pytest

from dra.cel import CelSyntaxError, compile_expression


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('"a".matches("[[:alpha:]]")', True),
        ('"1".matches("^[[:alpha:]]$")', False),
        ('"a\\n".matches("a$")', False),  # `$` is the end of the text ...
        ('"a\\nb".matches("a$")', False),
        ('"a\\nb".matches("(?m)a$")', True),  # ... unless multi-line
        ('"a".matches("\\\\z")', True),
        ('"é".matches("\\\\x{e9}")', True),
        ('"a.b".matches("\\\\Qa.b\\\\E")', True),
        ('"axb".matches("\\\\Qa.b\\\\E")', False),
        ('"a".matches("(?<n>a)")', True),
        ('"a".matches("(?P<n>a)")', True),
        ('"a".matches("a{,2}")', False),  # not a repetition: literal braces
        ('"a{,2}".matches("a{,2}")', True),
        ('"a\\nb".matches("a.b")', False),
        ('"a\\nb".matches("(?s)a.b")', True),
        ('"ab".matches("\\\\Ab")', False),
        ('"é".matches("^\\\\w$")', False),
        # RE2 semantics beyond the cases run on the cluster
        ('"aB".matches("a(?i)b")', True),  # flags mid-pattern last to the end of the group
        ('"aB-C".matches("(a(?i)b)-c")', False),
        ('"\\v".matches("\\\\s")', False),  # RE2's \s has no \v
        ('"\\n".matches("\\\\012")', True),  # octal, not a backreference
    ],
)
def test_matches_means_what_re2_means(expression: str, expected: bool) -> None:
    assert compile_expression(expression).evaluate() is expected


@pytest.mark.parametrize(
    "pattern",
    ["a(?=b)", "(?<=a)b", "(ab)\\\\1", "a++", "(?>a)", "\\\\C", "a\\\\Z", "(?U)a*"],
)
def test_patterns_re2_refuses_do_not_compile(pattern: str) -> None:
    with pytest.raises(CelSyntaxError) as raised:
        compile_expression(f'"ab".matches("{pattern}")')
    assert raised.value.message.startswith("invalid matches argument: ")
    assert raised.value.column == 14  # the pattern, where cel-go points too
