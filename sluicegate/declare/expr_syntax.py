"""The grammar of key, priority, `if` and `match` expressions: a tokenizer and a Pratt parser.

    expr     := or ('?' expr ':' expr)?
    or       := and ('||' and)*          and := equality ('&&' equality)*
    equality := compare (('=='|'!=') compare)?
    compare  := sum (('<'|'<='|'>'|'>=') sum)?
    sum      := unary (('+'|'-') unary)*
    unary    := ('!'|'-') unary | primary
    primary  := number | string | true | false | null | path | '(' expr ')'
    path     := name ('.' name | '[' integer ']' | '[' string ']')*

Nothing else is accepted: no calls, no attribute access on values, no assignment. The parser
builds a small tree; `expressions.py` resolves its paths against the schema and compiles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_SOURCE = 2_000
# Deep trees would make compilation and evaluation recurse past Python's limit; no real key
# needs more than a handful of levels.
MAX_DEPTH = 48

_TWO_CHAR = {"==", "!=", "<=", ">=", "&&", "||"}
_ONE_CHAR = set("<>!+-?:()[].")
_HINTS = {
    "=": "'=' is not an operator here; use '==' to compare",
    "&": "use '&&' for 'and'",
    "|": "use '||' for 'or'",
    ",": "function calls and lists are not part of the expression language",
    "`": "template strings are not supported; join text with '+'",
}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "/": "/",
            "b": "\b", "f": "\f"}
_COMPARE = {"<", "<=", ">", ">="}
_EQUALITY = {"==", "!="}
_BINDING = {"||": 2, "&&": 3, "==": 4, "!=": 4, "<": 5, "<=": 5, ">": 5, ">=": 5, "+": 6, "-": 6}
_KEYWORDS = {"true": True, "false": False, "null": None}


class ExpressionError(ValueError):
    """An expression that does not parse, names a field the schema lacks, or cannot be
    evaluated on a payload. `position` is the 0-based offset in `source`, when known."""

    def __init__(self, message: str, source: str = "", position: int | None = None) -> None:
        self.message = message
        self.source = source
        self.position = position
        where = f" at column {position + 1}" if position is not None else ""
        shown = source if len(source) <= 80 else source[:77] + "..."
        super().__init__(f"{message}{where} in {shown!r}" if source else message)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "num", "str", "name", "op", "end"
    value: Any
    pos: int


# --- the tree -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any
    pos: int
    depth: int = 1


@dataclass(frozen=True, slots=True)
class PathRef:
    """A field path as written: segments are names (str) or indexes (int)."""

    segments: tuple[str | int, ...]
    # Whether each segment was written as `[...]`; `a["b"]` and `a.b` mean the same field.
    bracketed: tuple[bool, ...]
    pos: int
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    operand: Node
    pos: int
    depth: int


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: Node
    right: Node
    pos: int
    depth: int


@dataclass(frozen=True, slots=True)
class Conditional:
    test: Node
    then: Node
    otherwise: Node
    pos: int
    depth: int


Node = Literal | PathRef | Unary | Binary | Conditional


# --- tokenizer ------------------------------------------------------------------------------


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch in " \t\r\n":
            i += 1
        elif ch in "'\"":
            start = i
            value, i = _read_string(source, i)
            tokens.append(Token("str", value, start))
        elif "0" <= ch <= "9":
            start = i
            number, i = _read_number(source, i)
            tokens.append(Token("num", number, start))
        elif ch == "_" or ch.isalpha():
            start = i
            i += 1
            while i < n and (source[i] == "_" or source[i].isalnum()):
                i += 1
            tokens.append(Token("name", source[start:i], start))
        elif source[i : i + 3] in ("===", "!=="):
            raise ExpressionError(
                f"{source[i:i + 3]!r} is not an operator; use {source[i:i + 2]!r}", source, i
            )
        elif source[i : i + 2] in _TWO_CHAR:
            tokens.append(Token("op", source[i : i + 2], i))
            i += 2
        elif ch in _ONE_CHAR:
            tokens.append(Token("op", ch, i))
            i += 1
        else:
            hint = _HINTS.get(ch, "it is not part of the expression language")
            raise ExpressionError(f"unexpected character {ch!r} ({hint})", source, i)
    tokens.append(Token("end", None, n))
    return tokens


def _read_string(source: str, start: int) -> tuple[str, int]:
    quote = source[start]
    out: list[str] = []
    i = start + 1
    while i < len(source):
        ch = source[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\":
            if i + 1 >= len(source):
                break
            esc = source[i + 1]
            if esc == "u":
                digits = source[i + 2 : i + 6]
                if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                    raise ExpressionError("'\\u' must be followed by 4 hex digits", source, i)
                out.append(chr(int(digits, 16)))
                i += 6
                continue
            if esc not in _ESCAPES:
                raise ExpressionError(f"unknown escape '\\{esc}' in a string", source, i)
            out.append(_ESCAPES[esc])
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ExpressionError(f"unterminated string (no closing {quote})", source, start)


def _read_number(source: str, start: int) -> tuple[int | float, int]:
    i, n = start, len(source)
    while i < n and "0" <= source[i] <= "9":
        i += 1
    is_float = False
    if i + 1 < n and source[i] == "." and "0" <= source[i + 1] <= "9":
        is_float = True
        i += 1
        while i < n and "0" <= source[i] <= "9":
            i += 1
    if i < n and source[i] in "eE":
        j = i + 1
        if j < n and source[j] in "+-":
            j += 1
        if j < n and "0" <= source[j] <= "9":
            is_float = True
            i = j
            while i < n and "0" <= source[i] <= "9":
                i += 1
    if i < n and (source[i] == "_" or source[i].isalpha()):
        raise ExpressionError("a number runs into a name; add an operator", source, i)
    text = source[start:i]
    return (float(text) if is_float else int(text)), i


# --- parser ---------------------------------------------------------------------------------


def parse(source: str) -> Node:
    """The tree of `source`; raises ExpressionError naming what is wrong and where."""
    if not isinstance(source, str):
        raise ExpressionError(f"an expression must be text, not {type(source).__name__}")
    if not source.strip():
        raise ExpressionError("the expression is empty", source, 0)
    if len(source) > MAX_SOURCE:
        raise ExpressionError(f"the expression is longer than {MAX_SOURCE} characters")
    return _Parser(source).parse_all()


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.index = 0
        self.nesting = 0

    def parse_all(self) -> Node:
        node = self.expression(0)
        token = self.peek()
        if token.kind != "end":
            self.fail(f"{self.unexpected(token)}; expected an operator or the end", token)
        return node

    # -- helpers

    def peek(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, op: str, what: str) -> Token:
        token = self.take()
        if token.kind != "op" or token.value != op:
            self.fail(f"expected {op!r} {what}, found {self.describe(token)}", token)
        return token

    def fail(self, message: str, token: Token) -> None:
        raise ExpressionError(message, self.source, token.pos)

    @classmethod
    def unexpected(cls, token: Token) -> str:
        """`unexpected 'x'`, or `unexpected end of the expression` (no article after
        "unexpected")."""
        if token.kind == "end":
            return "unexpected end of the expression"
        return f"unexpected {cls.describe(token)}"

    @staticmethod
    def describe(token: Token) -> str:
        if token.kind == "end":
            return "the end of the expression"
        if token.kind == "str":
            return "a string"
        return repr(str(token.value))

    def deeper(self, depth: int, token: Token) -> int:
        if depth > MAX_DEPTH:
            self.fail(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)", token)
        return depth

    # -- grammar

    def expression(self, right_binding: int) -> Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            self.fail("the expression is nested too deeply", self.peek())
        left = self.prefix()
        built_by: str | None = None  # the operator that built `left` here (not in parentheses)
        while True:
            token = self.peek()
            if token.kind != "op":
                break
            if token.value == "?":
                if right_binding >= 1:
                    break
                self.take()
                then = self.expression(0)
                self.expect(":", "between the two branches of '?'")
                otherwise = self.expression(0)
                depth = 1 + max(left.depth, then.depth, otherwise.depth)
                left = Conditional(left, then, otherwise, token.pos, self.deeper(depth, token))
                built_by = "?"
                continue
            binding = _BINDING.get(token.value)
            if binding is None or binding <= right_binding:
                break
            self.take()
            right = self.expression(binding)
            for group, word in ((_COMPARE, "comparisons"), (_EQUALITY, "equality tests")):
                if token.value in group and built_by in group:
                    self.fail(f"chained {word} are ambiguous; join them with '&&'", token)
            depth = 1 + max(left.depth, right.depth)
            left = Binary(token.value, left, right, token.pos, self.deeper(depth, token))
            built_by = token.value
        self.nesting -= 1
        return left

    def prefix(self) -> Node:
        token = self.take()
        node: Node
        grouped = False
        if token.kind == "op" and token.value in ("!", "-"):
            operand = self.expression(7)
            if token.value == "-" and isinstance(operand, Literal) and _is_number(operand.value):
                return Literal(-operand.value, token.pos)
            return Unary(token.value, operand, token.pos, self.deeper(operand.depth + 1, token))
        if token.kind == "op" and token.value == "(":
            node = self.expression(0)
            self.expect(")", "to close '('")
            grouped = True
        elif token.kind in ("num", "str"):
            node = Literal(token.value, token.pos)
        elif token.kind == "name" and token.value in _KEYWORDS:
            node = Literal(_KEYWORDS[token.value], token.pos)
        elif token.kind == "name":
            node = self.path(token)
        else:
            self.fail(f"{self.unexpected(token)}; expected a value or a field", token)
            raise AssertionError("unreachable")
        follow = self.peek()
        if follow.kind == "op" and follow.value == "(":
            self.fail("function calls are not part of the expression language", follow)
        not_a_path = grouped or not isinstance(node, PathRef)
        if follow.kind == "op" and follow.value in (".", "[") and not_a_path:
            self.fail(f"only a field path can be followed by {follow.value!r}", follow)
        return node

    def path(self, first: Token) -> PathRef:
        segments: list[str | int] = [first.value]
        bracketed = [False]
        while True:
            token = self.peek()
            if token.kind != "op" or token.value not in (".", "["):
                break
            self.take()
            if token.value == ".":
                name = self.take()
                if name.kind != "name":
                    hint = " (write [0] to index a list)" if name.kind == "num" else ""
                    self.fail(f"expected a field name after '.'{hint}", name)
                segments.append(name.value)
                bracketed.append(False)
            else:
                index = self.take()
                is_index = index.kind == "num" and isinstance(index.value, int)
                if is_index or index.kind == "str":
                    segments.append(index.value)
                else:
                    self.fail("an index must be a whole number or a quoted field name", index)
                bracketed.append(True)
                self.expect("]", "to close '['")
        return PathRef(tuple(segments), tuple(bracketed), first.pos)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
