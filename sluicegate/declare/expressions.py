"""Key, priority, `if` and `match` expressions: compiled once at load, evaluated per start.

`compile_expression("'tour:' + rowId", Tour)` parses the text (`expr_syntax`), resolves every
field path against the pydantic model (`expr_schema`), and turns the tree into nested
closures, so evaluating a start does no parsing and no schema lookups. Evaluation reads the
decoded JSON payload (a dict) and never calls getattr, eval or anything of the payload's: the
only operations are dict lookups, list indexes and the operators of the grammar.

Semantics are JavaScript's where the seeds' users expect them and stricter where JavaScript
would silently produce garbage:
- `+` joins text when either side is text (`'n:' + 5` is `'n:5'`), adds numbers otherwise;
  anything else (`null + 1`) is an evaluation error.
- `==` / `!=` never coerce (`1 == '1'` is false); `<`, `<=`, `>`, `>=` compare two numbers or
  two texts, and anything else is an evaluation error.
- `&&`, `||` short-circuit and return an operand (`region || 'none'`); `!` and `? :` use
  JavaScript truthiness (null, false, 0, NaN and '' are false).
- A field that is absent at run time, an index past the end, or a step through null is null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from sluicegate.declare import expr_schema
from sluicegate.declare.expr_syntax import (
    Binary,
    Conditional,
    ExpressionError,
    Literal,
    Node,
    PathRef,
    Unary,
    parse,
)

Evaluator = Callable[[Any], Any]

__all__ = ["Expression", "ExpressionError", "compile_expression", "constant_expression",
           "render_text", "truthy"]


class Expression:
    """A compiled expression. `evaluate(data)` gives its value on a decoded payload;
    `text` the key text; `number` a priority; `matches` a condition."""

    __slots__ = ("_fn", "canonical", "constant_results", "fields", "source")

    def __init__(
        self, source: str, fn: Evaluator, fields: tuple[str, ...], canonical: str,
        constant_results: tuple[Any, ...],
    ) -> None:
        self.source = source
        self.fields = fields  # the field paths it reads, in order of first use
        # A normal form: equal for `event.data.x` and `x`, blind to spacing and quote style.
        self.canonical = canonical
        # The literal values it can yield from its result positions (the branches of `? :`),
        # for load-time range checks such as priority's -600..600.
        self.constant_results = constant_results
        self._fn = fn

    @property
    def is_constant(self) -> bool:
        return not self.fields

    def evaluate(self, data: Any) -> Any:
        """The value on `data` (the decoded JSON payload; for expressions compiled with
        `roots`, a dict of root name to decoded object). Raises ExpressionError only."""
        try:
            return self._fn(data)
        except ExpressionError:
            raise
        except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
            raise ExpressionError(f"cannot evaluate on this payload: {exc}", self.source) from exc

    def text(self, data: Any) -> str:
        """The key text: text as is, whole numbers without `.0`, `true`/`false`, `null`.
        An evaluation error is raised (as ExpressionError), not turned into a key."""
        return render_text(self.evaluate(data))

    def number(self, data: Any) -> float:
        """A number for priority: anything that fails or is not a finite number gives 0."""
        try:
            value = self._fn(data)
        except Exception:  # seed 003: "if the expression fails, the priority is 0"
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0.0
        try:
            result = float(value)
        except OverflowError:
            return 0.0
        return result if math.isfinite(result) else 0.0

    def matches(self, data: Any) -> bool:
        """Truthiness of the value, for `if` and `match`; a failing expression is no match."""
        try:
            return truthy(self._fn(data))
        except Exception:  # a condition that cannot be judged does not hold
            return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expression) and other.canonical == self.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"


def compile_expression(
    source: str,
    model: type[BaseModel] | None = None,
    *,
    roots: Mapping[str, type[BaseModel]] | None = None,
) -> Expression:
    """Compile `source` against `model` (bare paths name its fields; `event.data.<path>` is
    accepted as the same thing) or, with `roots`, against several named models (every path
    starts with a root name, as `event.issueKey == payload.issueKey`). Raises ExpressionError
    naming what is wrong and where."""
    tree = parse(source)
    compiler = _Compiler(source, model, roots)
    fn, canonical = compiler.compile(tree)
    fields = tuple(dict.fromkeys(compiler.fields))
    return Expression(source, fn, fields, canonical, tuple(_results(tree)))


def constant_expression(value: str = "") -> Expression:
    """The expression of an omitted key: the same text for every start of the workflow."""
    return compile_expression(json.dumps(value))


# --- runtime semantics ----------------------------------------------------------------------


def render_text(value: Any) -> str:
    """A value as key text, the way JavaScript's String() shows the usual values."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(value)
    # Objects and lists: compact JSON with sorted keys, so equal values give equal keys.
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                      default=str)


def truthy(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0 and not (isinstance(value, float) and math.isnan(value))
    if isinstance(value, str):
        return value != ""
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if _is_number(value):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"


def _equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return bool(a == b)


def _getter(steps: tuple[expr_schema.Step, ...]) -> Evaluator:
    if len(steps) == 1 and isinstance(steps[0], str):
        key = steps[0]

        def get_one(data: Any) -> Any:
            return data.get(key) if isinstance(data, dict) else None

        return get_one

    length = expr_schema.LENGTH

    def get(data: Any) -> Any:
        current = data
        for step in steps:
            if current is None:
                return None
            if isinstance(step, str):
                current = current.get(step) if isinstance(current, dict) else None
            elif step is length:
                current = len(current) if isinstance(current, list | str) else None
            elif isinstance(current, list) and isinstance(step, int) and step < len(current):
                current = current[step]
            else:
                current = None
        return current

    return get


class _Compiler:
    def __init__(
        self, source: str, model: type[BaseModel] | None,
        roots: Mapping[str, type[BaseModel]] | None,
    ) -> None:
        self.source = source
        self.model = model
        self.roots = roots
        self.fields: list[str] = []

    def error(self, message: str, pos: int) -> ExpressionError:
        return ExpressionError(message, self.source, pos)

    def compile(self, node: Node) -> tuple[Evaluator, str]:
        if isinstance(node, Literal):
            value = node.value

            def constant(_data: Any) -> Any:
                return value

            return constant, json.dumps(value)
        if isinstance(node, PathRef):
            resolved = expr_schema.resolve(node, self.source, self.model, self.roots)
            self.fields.append(resolved.display)
            return _getter(resolved.steps), resolved.display
        if isinstance(node, Unary):
            return self.unary(node)
        if isinstance(node, Binary):
            return self.binary(node)
        return self.conditional(node)

    def unary(self, node: Unary) -> tuple[Evaluator, str]:
        inner, text = self.compile(node.operand)
        if node.op == "!":
            return (lambda data: not truthy(inner(data))), f"!{text}"
        error = self.error

        def negate(data: Any) -> Any:
            value = inner(data)
            if not _is_number(value):
                raise error(f"'-' needs a number, got {_kind(value)}", node.pos)
            return -value

        return negate, f"-{text}"

    def conditional(self, node: Conditional) -> tuple[Evaluator, str]:
        test, t_text = self.compile(node.test)
        then, then_text = self.compile(node.then)
        otherwise, o_text = self.compile(node.otherwise)

        def choose(data: Any) -> Any:
            return then(data) if truthy(test(data)) else otherwise(data)

        return choose, f"({t_text} ? {then_text} : {o_text})"

    def binary(self, node: Binary) -> tuple[Evaluator, str]:
        left, l_text = self.compile(node.left)
        right, r_text = self.compile(node.right)
        op, pos, error = node.op, node.pos, self.error
        fn: Evaluator
        if op == "&&":
            def fn(data: Any) -> Any:
                value = left(data)
                return right(data) if truthy(value) else value
        elif op == "||":
            def fn(data: Any) -> Any:
                value = left(data)
                return value if truthy(value) else right(data)
        elif op == "==":
            def fn(data: Any) -> Any:
                return _equal(left(data), right(data))
        elif op == "!=":
            def fn(data: Any) -> Any:
                return not _equal(left(data), right(data))
        elif op == "+":
            def fn(data: Any) -> Any:
                a, b = left(data), right(data)
                if isinstance(a, str) or isinstance(b, str):
                    return render_text(a) + render_text(b)
                if _is_number(a) and _is_number(b):
                    return a + b
                raise error(f"'+' needs numbers or text, got {_kind(a)} and {_kind(b)}", pos)
        elif op == "-":
            def fn(data: Any) -> Any:
                a, b = left(data), right(data)
                if _is_number(a) and _is_number(b):
                    return a - b
                raise error(f"'-' needs numbers, got {_kind(a)} and {_kind(b)}", pos)
        else:
            fn = _comparison(op, left, right, lambda m: error(m, pos))
        return fn, f"({l_text} {op} {r_text})"


def _comparison(
    op: str, left: Evaluator, right: Evaluator, error: Callable[[str], ExpressionError]
) -> Evaluator:
    def compare(data: Any) -> Any:
        a, b = left(data), right(data)
        if not ((_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))):
            raise error(f"{op!r} compares two numbers or two texts, got {_kind(a)} and {_kind(b)}")
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b

    return compare


def _results(node: Node) -> list[Any]:
    """Literal values in result position: the expression itself, or the branches of `? :`."""
    if isinstance(node, Literal):
        return [node.value]
    if isinstance(node, Conditional):
        return _results(node.then) + _results(node.otherwise)
    return []
