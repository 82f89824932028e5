"""``matches`` with RE2's meaning (cases where Python's ``re`` would differ), in linear time.

The cases before "RE2 semantics beyond" were run on a 1.34 API server and scheduler (a constant selector on a
hand-made slice): it allocated (true), said "cannot allocate all claims" (false), or
rejected the claim at write time with "invalid matches argument".
"""

from __future__ import annotations

import time

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
    ["a(?=b)", "(?<=a)b", "(ab)\\\\1", "a++", "a**", "(?>a)", "\\\\C", "a\\\\Z", "a{1001}"],
)
def test_patterns_re2_refuses_do_not_compile(pattern: str) -> None:
    with pytest.raises(CelSyntaxError) as raised:
        compile_expression(f'"ab".matches("{pattern}")')
    assert raised.value.message.startswith("invalid matches argument: ")
    assert raised.value.column == 14  # the pattern, where cel-go points too


def test_ungreedy_flag_is_go_s() -> None:
    # Go's regexp has (?U); the re-based evaluator refused it.
    assert compile_expression('"aaa".find("(?U)a+")').evaluate() == "a"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("a" * 32 + "!", "^(a+)+$"),
        ("NVIDIA H100 80GB HBM3" * 20, "^(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*$x"),
        ("x" * 5000, "(x+x+)+y"),
    ],
)
def test_catastrophic_backtracking_patterns_match_in_linear_time(text: str, pattern: str) -> None:
    # Python's re took more than 15 s on the first; RE2 has no backtracking to blow up.
    program = compile_expression(f"{text!r}.matches({pattern!r})".replace("'", '"'))
    start = time.process_time()
    assert program.evaluate() is False
    assert time.process_time() - start < 0.5


def test_a_lone_surrogate_in_the_text_is_matched_as_go_decodes_it() -> None:
    program = compile_expression('device.attributes["d"].name.matches("^.a$")')
    device = {"name": "x", "attributes": {"name": {"string": "\ud800a"}}}
    assert program.matches(device, "d") is True
