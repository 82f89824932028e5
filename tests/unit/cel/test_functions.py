"""Standard functions, string extensions and the Kubernetes libraries, called from CEL."""

from __future__ import annotations

import math

import pytest

from dra.cel import CelEvaluationError, Quantity, Semver, compile_expression
from dra.cel.values import Uint, Value


def evaluate(expression: str) -> Value:
    return compile_expression(expression).evaluate()


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # size, contains, prefixes, regular expressions (unanchored, like RE2's)
        ('size("é") == 1 && "é".size() == 1 && b"é".size() == 2', True),
        ("[1, 2].size() + {'a': 1}.size()", 3),
        ('"abc".contains("b") && "abc".startsWith("ab") && "abc".endsWith("bc")', True),
        ('"NVIDIA H100 80GB HBM3".matches("H100|A100")', True),
        ('matches("abc", "^b")', False),
        ('"abc".matches("(?i)ABC")', True),
        ('"abc".matches("\\\\Aabc\\\\z")', True),
        ('"١٢".matches("\\\\d")', False),  # \d is ASCII-only, as in RE2
        # conversions
        ('int("-12") + int("+3")', -9),
        ("int(1.9) + int(-1.9)", 0),
        ("int(3u)", 3),
        ('uint("7")', Uint(7)),
        ("uint(1.5)", Uint(1)),
        ('double("1e3")', 1000.0),
        ('double("0x1p3")', 8.0),
        ('double("-Infinity")', -math.inf),
        ("double(2u)", 2.0),
        ("string(1000000.0)", "1e+06"),
        ("string(123456.0)", "123456"),
        ("string(0.0001)", "0.0001"),
        ("string(0.00001)", "1e-05"),
        ("string(1.5e-7)", "1.5e-07"),
        ("string(-0.0)", "-0"),
        ("string(1e100)", "1e+100"),
        ('string(double("inf"))', "+Inf"),
        ("string(18446744073709551615u)", "18446744073709551615"),
        ("string(true)", "true"),
        ('string(b"abc")', "abc"),
        ('bytes("é")', "é".encode()),
        ('bool("t") && bool("True") && !bool("FALSE")', True),
        ("dyn(1)", 1),
        # string extensions (cel-go ext.Strings v2)
        ('"aé".charAt(1)', "é"),
        ('"abc".charAt(3)', ""),
        ('"hello mellow".indexOf("ello")', 1),
        ('"hello mellow".indexOf("ello", 2)', 7),
        ('"hello mellow".indexOf("ello", 20)', -1),
        ('"hello".indexOf("", 10)', 10),
        ('"hello mellow".lastIndexOf("ello")', 7),
        ('"hello mellow".lastIndexOf("ello", 6)', 1),
        ('"hello".lastIndexOf("")', 5),
        ('"".lastIndexOf("a")', -1),
        ('"ÀB".lowerAscii()', "Àb"),
        ('"àb".upperAscii()', "àB"),
        ('"hello hello".replace("he", "we")', "wello wello"),
        ('"hello hello".replace("he", "we", 1)', "wello hello"),
        ('"hello hello".replace("he", "we", 0)', "hello hello"),
        ('"aaa".replace("", "_")', "_a_a_a_"),
        ('"a,b,c".split(",")', ("a", "b", "c")),
        ('"a,b,c".split(",", 2)', ("a", "b,c")),
        ('"a,b,c".split(",", 0)', ()),
        ('"a,b,c".split(",", -1)', ("a", "b", "c")),
        ('"abc".split("")', ("a", "b", "c")),
        ('"abc".split("", 2)', ("a", "bc")),
        ('"tacocat".substring(4)', "cat"),
        ('"tacocat".substring(0, 4)', "taco"),
        ('" \\t\\u00a0x\\u0085\\n".trim()', "x"),
        ('"\\u001cx".trim()', "\x1cx"),  # not whitespace for Go, unlike Python's str.strip()
        ('["a", "b"].join()', "ab"),
        ('["a", "b"].join("-")', "a-b"),
        ("[].join('/')", ""),
        # Kubernetes regex library
        ('"abc".find("b.")', "bc"),
        ('"abc".find("x")', ""),
        ('"abcabc".findAll("b")', ("b", "b")),
        ('"abcabc".findAll("b", 1)', ("b",)),
        ('"baaac".findAll("a*")', ("", "aaa", "")),  # Go skips an empty match right after a match
        # Kubernetes lists library
        ("[1, 2, 2].isSorted() && ![3, 1].isSorted() && [].isSorted()", True),
        ("[1, 2].sum()", 3),
        ("[1.5, 2.5].sum()", 4.0),
        ("[1u, 2u].sum()", Uint(3)),
        ("[].sum()", 0),
        ("[3, 1, 2].min()", 1),
        ('["b", "c", "a"].max()', "c"),
        ("[1, 2, 2].indexOf(2)", 1),
        ("[1, 2, 2].lastIndexOf(2)", 2),
        ("[1, 2].indexOf(3)", -1),
        # sets extension
        ("sets.contains([1, 2], [1])", True),
        ("sets.contains([1, 2], [1.0])", True),
        ("sets.equivalent([1, 2], [2, 1, 1])", True),
        ("sets.intersects([1], [2])", False),
        # quantity library
        ('quantity("81559Mi").compareTo(quantity("80Gi"))', -1),
        ('quantity("81559Mi").compareTo(quantity("80Gi")) < 0', True),
        ('quantity("1.5Gi").compareTo(quantity("1536Mi"))', 0),
        ('quantity("100m").isLessThan(quantity("1"))', True),
        ('quantity("2").isGreaterThan(quantity("1999m"))', True),
        ('isQuantity("1.5Gi") && !isQuantity("1x")', True),
        ('sign(quantity("-1"))', -1),
        ('quantity("1k").asInteger()', 1000),
        ('quantity("1").isInteger()', True),
        ('quantity("1000m").isInteger()', False),
        ('quantity("1.5Ki").isInteger()', False),
        ('quantity("1m").asApproximateFloat()', 0.001),
        ('quantity("1").add(1).asInteger()', 2),
        ('quantity("1").sub(5).asInteger()', -4),
        ('quantity("1Gi").add(quantity("512Mi"))', Quantity.parse("1536Mi")),
        ('quantity("1Mi").sub(quantity("1Ki")).asInteger()', 1047552),
        # semver library
        ('semver("550.54.15").isGreaterThan(semver("535.0.0"))', True),
        ('semver("1.2.3-alpha").isLessThan(semver("1.2.3"))', True),
        ('semver("1.0.0-beta.2").compareTo(semver("1.0.0-beta.11"))', -1),
        (
            'cel.bind(v, semver("550.54.15"), v.major() * 10000 + v.minor() * 100 + v.patch())',
            5505415,
        ),
        ('semver("v1.2", true)', Semver.parse("1.2.0")),
        ('isSemver("535.104.05") || isSemver("v1.0.0")', False),
        ('isSemver("535.104.05", true) && isSemver("v1.0.0", true)', True),
        ('semver("18446744073709551615.0.0").major()', -1),  # uint64 read as int64, as in Kubernetes
    ],
)
def test_functions(expression: str, expected: Value) -> None:
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('"abc".charAt(4)', "index out of range: 4"),
        ('"hello".indexOf("l", -1)', "index out of range: -1"),
        ('"hello".substring(2, 1)', "invalid substring range. start: 2, end: 1"),
        ('"hello".substring(6)', "index out of range: 6"),
        ('int(" 12")', "type conversion error from 'string' to 'int'"),
        ('int("9223372036854775808")', "type conversion error from 'string' to 'int'"),
        ("int(9223372036854775807.0)", "integer overflow"),
        ("uint(-1)", "unsigned integer overflow"),
        ('uint("+1")', "type conversion error from 'string' to 'uint'"),
        ('double(" 1")', "type conversion error from 'string' to 'double'"),
        ('double("1e400")', "type conversion error from 'string' to 'double'"),
        ('bool("tRue")', "type conversion error from 'string' to 'bool'"),
        ('string(b"\\xff")', "invalid UTF-8 in bytes, cannot convert to string"),
        ('string(quantity("1"))', "no such overload: string(kubernetes.Quantity)"),
        ("size(dyn(1))", "no such overload: size(int)"),
        ('"abc".contains(dyn(1))', "no such overload: contains(string, int)"),
        ("dyn([1, 2]).join()", "no such overload: join(list)"),
        ("[].max()", "max called on empty list"),
        ("[[1]].min()", "no such overload: min(list)"),
        ("[9223372036854775807, 1].sum()", "integer overflow"),
        ('quantity("1ki")', "unable to parse quantity's suffix"),
        ('quantity("1.5Ki").asInteger()', "cannot convert value to integer"),
        ('semver("535.104.05")', 'Patch number must not contain leading zeroes "05"'),
        ('semver("v1.0.0")', 'Invalid character(s) found in major number "v1"'),
        ('semver("1.2-rc", true)', "short version cannot contain PreRelease/Build meta data"),
        (
            'quantity("1").isGreaterThan(semver("1.0.0"))',
            "no such overload: isGreaterThan(kubernetes.Quantity, kubernetes.Semver)",
        ),
        (
            '"abc".matches(dyn("["))',
            "invalid regular expression '[': error parsing regexp: missing closing ]: `[`",
        ),
    ],
)
def test_function_errors(expression: str, message: str) -> None:
    with pytest.raises(CelEvaluationError) as raised:
        evaluate(expression)
    assert raised.value.message == message
