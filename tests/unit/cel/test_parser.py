"""Lexer and parser: literals, precedence, macros, spans and syntax errors."""

from __future__ import annotations

import pytest

from dra.cel import ast
from dra.cel.errors import CelSyntaxError
from dra.cel.lexer import Kind, tokenize
from dra.cel.parser import MAX_NESTING, parse
from dra.cel.values import Uint, Value


def sexpr(node: ast.Expr) -> str:
    """A compact rendering of the tree that makes precedence visible."""
    match node:
        case ast.Literal():
            return repr(node.value)
        case ast.Ident():
            return node.name
        case ast.Select():
            return f"{sexpr(node.operand)}.{node.field}"
        case ast.Index():
            return f"{sexpr(node.operand)}[{sexpr(node.index)}]"
        case ast.Call():
            args = " ".join(sexpr(a) for a in node.args)
            target = f"{sexpr(node.target)}." if node.target is not None else ""
            return f"({target}{node.function} {args})".replace(" )", ")")
        case ast.Unary():
            return f"({node.op} {sexpr(node.operand)})"
        case ast.Binary():
            return f"({node.op} {sexpr(node.left)} {sexpr(node.right)})"
        case ast.Logical():
            return f"({node.op} {' '.join(sexpr(t) for t in node.terms)})"
        case ast.Conditional():
            return f"(? {sexpr(node.condition)} {sexpr(node.then)} {sexpr(node.otherwise)})"
        case ast.ListExpr():
            return f"[{' '.join(sexpr(e) for e in node.elements)}]"
        case ast.MapExpr():
            return "{" + " ".join(f"{sexpr(k)}:{sexpr(v)}" for k, v in node.entries) + "}"
        case ast.Has():
            return f"(has {sexpr(node.operand)}.{node.field})"
        case ast.Comprehension():
            parts = [p for p in (node.predicate, node.transform) if p is not None]
            rest = " ".join(sexpr(p) for p in parts)
            return f"({node.macro} {sexpr(node.iter_range)} {node.variable} {rest})"
        case ast.Bind():
            return f"(bind {node.variable} {sexpr(node.init)} {sexpr(node.body)})"
    raise AssertionError(node)


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("0", 0),
        ("042", 42),
        ("0x1F", 31),
        ("0X1f", 31),
        ("1u", Uint(1)),
        ("0x1Fu", Uint(31)),
        ("18446744073709551615u", Uint(2**64 - 1)),
        ("-9223372036854775808", -(2**63)),
        ("1.5", 1.5),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("1.5E-3", 0.0015),
        ("-2.5", -2.5),
        ('"double"', "double"),
        ("'single'", "single"),
        ('"""tri"ple"""', 'tri"ple'),
        ("'''a\nb'''", "a\nb"),
        (r'"\a\b\f\n\r\t\v\\\?\"\'\`"', "\a\b\f\n\r\t\v\\?\"'`"),
        (r'"\x41\101\u00e9\U0001F600"', "AAé😀"),
        (r'"\xff"', "\xff"),  # a code point in strings ...
        (r'b"\xff\377"', b"\xff\xff"),  # ... but a byte in bytes
        ('b"é"', "é".encode()),
        (r'r"\n"', "\\n"),
        (r'R"\d+"', "\\d+"),
        (r'br"\n"', b"\\n"),
        ("true", True),
        ("false", False),
        ("null", None),
    ],
)
def test_literals(source: str, value: Value) -> None:
    node = parse(source)
    assert isinstance(node, ast.Literal)
    assert node.value == value
    assert type(node.value) is type(value)


@pytest.mark.parametrize(
    ("source", "tree"),
    [
        ("a || b && c", "(|| a (&& b c))"),
        ("a && b || c && d", "(|| (&& a b) (&& c d))"),
        ("a && b && c", "(&& a b c)"),
        ("a ? b : c ? d : e", "(? a b (? c d e))"),
        ("a || b ? c : d", "(? (|| a b) c d)"),
        ("1 + 2 * 3 == 7", "(== (+ 1 (* 2 3)) 7)"),
        ("1 - 2 - 3", "(- (- 1 2) 3)"),
        ("a < b == c", "(== (< a b) c)"),
        ("x in [1, 2] && y", "(&& (in x [1 2]) y)"),
        ("!a && b", "(&& (! a) b)"),
        ("!!a", "a"),
        ("!!!a", "(! a)"),
        ("-x", "(- x)"),
        ("--x", "x"),
        ("-1", "-1"),
        ("--1", "1"),
        ("-(1)", "(- 1)"),
        ("-1.5", "-1.5"),
        ("a.b.c[0]", "a.b.c[0]"),
        ("a.f(1).g()", "((a.f 1).g)"),
        ("f(1, 2)", "(f 1 2)"),
        (".a.b", "a.b"),
        ("[1, 2,]", "[1 2]"),
        ('{"a": 1, "b": 2,}', "{'a':1 'b':2}"),
        ("(a)", "a"),
        ("has(a.b.c)", "(has a.b.c)"),
        ("l.all(x, x > 0)", "(all l x (> x 0))"),
        ("l.exists_one(x, x)", "(exists_one l x x)"),
        ("l.map(x, x * 2)", "(map l x (* x 2))"),
        ("l.map(x, x > 1, x * 2)", "(map l x (> x 1) (* x 2))"),
        ("l.filter(x, x)", "(filter l x x)"),
        ("cel.bind(v, 1, v + 1)", "(bind v 1 (+ v 1))"),
        ("sets.contains(a, b)", "(sets.contains a b)"),
        ("a // comment\n && b", "(&& a b)"),
    ],
)
def test_precedence_and_macros(source: str, tree: str) -> None:
    assert sexpr(parse(source, {"sets.contains"})) == tree


def test_spans_quote_the_source() -> None:
    source = 'device.attributes["gpu.nvidia.com"].index == 0 && x.size() > 1'
    node = parse(source)
    assert isinstance(node, ast.Logical)
    assert [source[t.start : t.end] for t in node.terms] == [
        'device.attributes["gpu.nvidia.com"].index == 0',
        "x.size() > 1",
    ]
    texts = {source[n.start : n.end] for n in ast.walk(node)}
    assert 'device.attributes["gpu.nvidia.com"]' in texts
    assert '"gpu.nvidia.com"' in texts
    assert "x.size()" in texts


def test_node_ids_are_unique() -> None:
    nodes = ast.walk(parse("[1, 2].all(x, x > 0) && {'a': [3]}.a[0] == 3"))
    assert len({n.id for n in nodes}) == len(nodes)


def test_tokens() -> None:
    kinds = [(t.kind, t.text) for t in tokenize("a<=b in [1u]")]
    assert kinds == [
        (Kind.IDENT, "a"),
        (Kind.OP, "<="),
        (Kind.IDENT, "b"),
        (Kind.OP, "in"),
        (Kind.OP, "["),
        (Kind.UINT, "1u"),
        (Kind.OP, "]"),
        (Kind.EOF, ""),
    ]


@pytest.mark.parametrize(
    ("source", "message", "line", "column"),
    [
        ("1 +", "Syntax error: mismatched input '<EOF>' expecting an expression", 1, 4),
        ("(1 == 1", "Syntax error: missing ')' at '<EOF>'", 1, 8),
        ("1 = 1", "Syntax error: token recognition error at: '='", 1, 3),
        ("1 & 1", "Syntax error: token recognition error at: '&'", 1, 3),
        ("1. == 1.0", "Syntax error: mismatched input '==' expecting IDENTIFIER", 1, 4),
        ("in == 1", "Syntax error: mismatched input 'in' expecting an expression", 1, 1),
        ('"abc', "Syntax error: token recognition error at: '\"abc'", 1, 1),
        ("'a\nb'", "Syntax error: token recognition error at: ''a'", 1, 1),
        ("a b", "Syntax error: extraneous input 'b' expecting <EOF>", 1, 3),
        ("if", "reserved identifier: if", 1, 1),
        ("9223372036854775808", "invalid int literal", 1, 1),
        ("18446744073709551616u", "invalid uint literal", 1, 1),
        (r'"\8"', "Syntax error: invalid escape sequence", 1, 1),
        (r'"\400"', "Syntax error: invalid escape sequence", 1, 1),
        (r'"\uD800"', "invalid unicode code point", 1, 1),
        (r'b"\u00ff"', "unable to unescape string", 1, 1),
        ("has(a)", "invalid argument to has() macro", 1, 5),
        ('has(a["b"])', "invalid argument to has() macro", 1, 5),
        ("l.all(x.y, true)", "argument must be a simple name", 1, 7),
        ("l.exists(__result__, true)", "iteration variable overwrites accumulator variable", 1, 10),
        ("l.all(k, v, k == v)", "two-variable all() is not supported", 1, 1),
        ("cel.bind(a.b, 1, 2)", "cel.bind() variable names must be simple identifiers", 1, 10),
        ("Msg{a: 1}", "unsupported syntax: message construction", 1, 4),
        ("true &&\n  false ||\n  )", "Syntax error: mismatched input ')' expecting an expression", 3, 3),
    ],
)
def test_syntax_errors(source: str, message: str, line: int, column: int) -> None:
    with pytest.raises(CelSyntaxError) as raised:
        parse(source)
    error = raised.value
    assert (error.message, error.line, error.column) == (message, line, column)


def test_syntax_error_snippet() -> None:
    with pytest.raises(CelSyntaxError) as raised:
        parse('device.driver == "a" &&')
    assert str(raised.value) == (
        "ERROR: <input>:1:24: Syntax error: mismatched input '<EOF>' expecting an expression\n"
        ' | device.driver == "a" &&\n'
        " | .......................^"
    )


def test_nesting_limit() -> None:
    # The whole expression is the first level.
    depth = MAX_NESTING - 1
    parse("(" * depth + "1" + ")" * depth)
    with pytest.raises(CelSyntaxError, match="nested more than"):
        parse("(" * (depth + 1) + "1" + ")" * (depth + 1))
    with pytest.raises(CelSyntaxError, match="nested more than"):
        parse(" + ".join(["1"] * 500))
