"""Recursive-descent CEL parser producing ``dra.cel.ast`` nodes.

Grammar (cel-spec langdef.md), lowest precedence first::

    Expr     = Or ["?" Or ":" Expr]
    Or       = And {"||" And}
    And      = Rel {"&&" Rel}
    Rel      = Add {("<" | "<=" | ">=" | ">" | "==" | "!=" | "in") Add}
    Add      = Mul {("+" | "-") Mul}
    Mul      = Unary {("*" | "/" | "%") Unary}
    Unary    = Member | "!" {"!"} Member | "-" {"-"} Member
    Member   = Primary {"." IDENT ["(" [Args] ")"] | "[" Expr "]"}
    Primary  = ["."] IDENT ["(" [Args] ")"] | "(" Expr ")" | "[" [Args] [","] "]"
             | "{" [MapInits] [","] "}" | LITERAL

Message construction (``Type{field: v}``) and optional syntax (``a.?b``) are not supported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from dra.cel import ast
from dra.cel.errors import CelSyntaxError
from dra.cel.lexer import RESERVED, Kind, Token, tokenize
from dra.cel.values import INT64_MAX, UINT64_MAX, Uint, Value

# Nesting of parentheses, calls, lists, ... the parser follows; deeper input is rejected
# before Python's own recursion limit is anywhere near.
MAX_NESTING = 60
# Depth of the finished tree, which bounds the evaluator's recursion.
MAX_TREE_DEPTH = 200

_RELATIONS = frozenset(("<", "<=", ">", ">=", "==", "!=", "in"))
_PREDICATE_MACROS = frozenset(("all", "exists", "exists_one", "filter"))
# cel-go's two-variable forms (``m.all(k, v, p)``, ``transformMap``, ...), which we do not expand.
_TWO_VARIABLE_MACROS = frozenset(
    ("all", "exists", "existsOne", "exists_one", "transformList", "transformMap")
)
_Rule = Callable[[], ast.Expr]
# The variable cel-go's comprehensions accumulate into; it cannot be an iteration variable.
_ACCUMULATOR = "__result__"


def parse(source: str, namespaced_functions: Collection[str] = ()) -> ast.Expr:
    """Parse ``source``; ``namespaced_functions`` (e.g. ``sets.contains``) become global calls."""
    parser = _Parser(source, namespaced_functions)
    tree = parser.expression()
    parser.expect_end()
    _check_depth(tree, source)
    return tree


def _check_depth(tree: ast.Expr, source: str) -> None:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise CelSyntaxError(
                f"expression is nested more than {MAX_TREE_DEPTH} levels deep", source, node.start
            )
        stack.extend((child, depth + 1) for child in ast.children(node))


class _Parser:
    def __init__(self, source: str, namespaced_functions: Collection[str]) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.index = 0
        self.namespaced = namespaced_functions
        self.last_id = 0
        self.nesting = 0

    # -- token helpers -------------------------------------------------------------------

    def new_id(self) -> int:
        self.last_id += 1
        return self.last_id

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def at(self, text: str) -> bool:
        return self.token.kind is Kind.OP and self.token.text == text

    def accept(self, text: str) -> Token | None:
        if self.at(text):
            token = self.token
            self.index += 1
            return token
        return None

    def error(self, message: str, token: Token | None = None) -> CelSyntaxError:
        return CelSyntaxError(message, self.source, (token or self.token).start)

    def describe(self, token: Token) -> str:
        return "'<EOF>'" if token.kind is Kind.EOF else f"'{token.text}'"

    def expect(self, text: str) -> Token:
        token = self.accept(text)
        if token is None:
            raise self.error(f"Syntax error: missing '{text}' at {self.describe(self.token)}")
        return token

    def expect_end(self) -> None:
        if self.token.kind is not Kind.EOF:
            raise self.error(f"Syntax error: extraneous input {self.describe(self.token)} expecting <EOF>")

    # -- grammar -------------------------------------------------------------------------

    def expression(self) -> ast.Expr:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression is nested more than {MAX_NESTING} levels deep")
        condition = self.logical("||", self.conjunction)
        if self.accept("?"):
            then = self.logical("||", self.conjunction)
            self.expect(":")
            otherwise = self.expression()
            condition = ast.Conditional(
                self.new_id(), condition.start, otherwise.end, condition, then, otherwise
            )
        self.nesting -= 1
        return condition

    def conjunction(self) -> ast.Expr:
        return self.logical("&&", self.relation)

    def logical(self, op: str, operand: _Rule) -> ast.Expr:
        terms = [operand()]
        while self.accept(op):
            terms.append(operand())
        if len(terms) == 1:
            return terms[0]
        return ast.Logical(self.new_id(), terms[0].start, terms[-1].end, op, tuple(terms))

    def binary_chain(self, ops: Collection[str], operand: _Rule) -> ast.Expr:
        left = operand()
        while self.token.kind is Kind.OP and self.token.text in ops:
            op = self.token.text
            self.index += 1
            right = operand()
            left = ast.Binary(self.new_id(), left.start, right.end, op, left, right)
        return left

    def relation(self) -> ast.Expr:
        return self.binary_chain(_RELATIONS, self.addition)

    def addition(self) -> ast.Expr:
        return self.binary_chain(("+", "-"), self.multiplication)

    def multiplication(self) -> ast.Expr:
        return self.binary_chain(("*", "/", "%"), self.unary)

    def unary(self) -> ast.Expr:
        for op in ("!", "-"):
            if not self.at(op):
                continue
            start, count = self.token.start, 0
            while self.accept(op):
                count += 1
            if op == "-" and count == 1 and self.token.kind in (Kind.INT, Kind.DOUBLE):
                # `-1` is a literal (so -9223372036854775808 is representable), not a negation.
                return self.member_suffix(self.number_literal(self.token, start, negative=True))
            operand = self.member()
            # Pairs cancel out: `!!x` is just `x`, as in cel-go.
            return ast.Unary(self.new_id(), start, operand.end, op, operand) if count % 2 else operand
        return self.member()

    def member(self) -> ast.Expr:
        return self.member_suffix(self.primary())

    def member_suffix(self, node: ast.Expr) -> ast.Expr:
        while True:
            if self.accept("."):
                name = self.identifier()
                if self.accept("("):
                    args, end = self.arguments(")")
                    node = self.call(name.text, node, args, node.start, end)
                else:
                    node = ast.Select(self.new_id(), node.start, name.end, node, name.text)
            elif self.accept("["):
                index = self.expression()
                end = self.expect("]").end
                node = ast.Index(self.new_id(), node.start, end, node, index)
            else:
                return node

    def identifier(self) -> Token:
        token = self.token
        if token.kind is not Kind.IDENT:
            raise self.error(f"Syntax error: mismatched input {self.describe(token)} expecting IDENTIFIER")
        self.index += 1
        return token

    def arguments(self, closing: str) -> tuple[list[ast.Expr], int]:
        args: list[ast.Expr] = []
        while not self.at(closing):
            args.append(self.expression())
            if not self.accept(","):
                break
        return args, self.expect(closing).end

    def primary(self) -> ast.Expr:
        token = self.token
        if self.accept("."):
            return self.identifier_or_call(self.identifier(), token.start)
        if token.kind is Kind.IDENT:
            self.index += 1
            return self.identifier_or_call(token, token.start)
        if self.accept("("):
            inner = self.expression()
            end = self.expect(")").end
            # The span includes the parentheses, so quoting `!(a || b)` keeps them balanced.
            return dataclasses.replace(inner, start=token.start, end=end)
        if self.accept("["):
            elements, end = self.arguments("]")
            return ast.ListExpr(self.new_id(), token.start, end, tuple(elements))
        if self.accept("{"):
            return self.map_literal(token.start)
        if token.kind in (Kind.INT, Kind.DOUBLE):
            return self.number_literal(token, token.start, negative=False)
        if token.kind is Kind.UINT:
            assert isinstance(token.value, int)
            if token.value > UINT64_MAX:
                raise self.error("invalid uint literal")
            return self.literal(token, token.start, Uint(token.value))
        if token.kind in (Kind.STRING, Kind.BYTES, Kind.BOOL, Kind.NULL):
            return self.literal(token, token.start, token.value)
        raise self.error(f"Syntax error: mismatched input {self.describe(token)} expecting an expression")

    def literal(self, token: Token, start: int, value: Value) -> ast.Expr:
        self.index += 1
        return ast.Literal(self.new_id(), start, token.end, value)

    def number_literal(self, token: Token, start: int, negative: bool) -> ast.Expr:
        value = token.value
        assert isinstance(value, int | float)
        if negative:
            value = -value
        if token.kind is Kind.INT and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise self.error("invalid int literal", token)
        return self.literal(token, start, value)

    def map_literal(self, start: int) -> ast.Expr:
        entries: list[tuple[ast.Expr, ast.Expr]] = []
        while not self.at("}"):
            key = self.expression()
            self.expect(":")
            entries.append((key, self.expression()))
            if not self.accept(","):
                break
        end = self.expect("}").end
        return ast.MapExpr(self.new_id(), start, end, tuple(entries))

    def identifier_or_call(self, name: Token, start: int) -> ast.Expr:
        if name.text in RESERVED:
            raise self.error(f"reserved identifier: {name.text}", name)
        if self.accept("("):
            args, end = self.arguments(")")
            return self.call(name.text, None, args, start, end)
        if self.at("{"):
            raise self.error("unsupported syntax: message construction")
        return ast.Ident(self.new_id(), start, name.end, name.text)

    # -- calls and macros ----------------------------------------------------------------

    def call(
        self, name: str, target: ast.Expr | None, args: list[ast.Expr], start: int, end: int
    ) -> ast.Expr:
        if target is None and name == "has" and len(args) == 1:
            return self.has_macro(args[0], start, end)
        if isinstance(target, ast.Ident):
            qualified = f"{target.name}.{name}"
            if qualified == "cel.bind" and len(args) == 3:
                variable = self.macro_variable(
                    args[0], "cel.bind() variable names must be simple identifiers"
                )
                return ast.Bind(self.new_id(), start, end, variable, args[1], args[2])
            if qualified in self.namespaced:
                return ast.Call(self.new_id(), start, end, qualified, None, tuple(args))
        if target is not None and ((name in _PREDICATE_MACROS and len(args) == 2) or name == "map"):
            return self.comprehension(name, target, args, start, end)
        if target is not None and name in _TWO_VARIABLE_MACROS and len(args) == 3:
            raise CelSyntaxError(f"two-variable {name}() is not supported", self.source, start)
        return ast.Call(self.new_id(), start, end, name, target, tuple(args))

    def has_macro(self, arg: ast.Expr, start: int, end: int) -> ast.Expr:
        if not isinstance(arg, ast.Select):
            raise CelSyntaxError("invalid argument to has() macro", self.source, arg.start)
        return ast.Has(self.new_id(), start, end, arg.operand, arg.field)

    def macro_variable(self, arg: ast.Expr, message: str) -> str:
        if not isinstance(arg, ast.Ident):
            raise CelSyntaxError(message, self.source, arg.start)
        return arg.name

    def comprehension(
        self, name: str, target: ast.Expr, args: list[ast.Expr], start: int, end: int
    ) -> ast.Expr:
        if len(args) not in (2, 3):
            raise CelSyntaxError(f"{name}() takes 2 or 3 arguments", self.source, start)
        variable = self.macro_variable(args[0], "argument must be a simple name")
        if variable == _ACCUMULATOR:
            raise CelSyntaxError(
                "iteration variable overwrites accumulator variable", self.source, args[0].start
            )
        if name == "map":
            predicate = args[1] if len(args) == 3 else None
            return ast.Comprehension(self.new_id(), start, end, name, target, variable, predicate, args[-1])
        return ast.Comprehension(self.new_id(), start, end, name, target, variable, args[1], None)
