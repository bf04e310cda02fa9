"""Declarations as data: workflows, their flow-control options, a safe expression language,
and the load-time validation that reports every problem together (SPEC.md section 1)."""

from sluicegate.declare.app import App, load_app
from sluicegate.declare.controls import Control
from sluicegate.declare.durations import format_duration, parse_duration
from sluicegate.declare.errors import DeclarationError
from sluicegate.declare.expressions import (
    Expression,
    ExpressionError,
    compile_expression,
    constant_expression,
    render_text,
)
from sluicegate.declare.failure import FailureReport
from sluicegate.declare.options import (
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Idempotency,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
)
from sluicegate.declare.origins import Origin, applies
from sluicegate.declare.workflow import CONTROL_ORDER, Workflow

__all__ = [
    "CONTROL_ORDER",
    "App",
    "Batch",
    "CancelOn",
    "Concurrency",
    "Control",
    "Debounce",
    "DeclarationError",
    "Expression",
    "ExpressionError",
    "FailureReport",
    "Idempotency",
    "Origin",
    "Priority",
    "RateLimit",
    "Singleton",
    "Throttle",
    "Timeouts",
    "Workflow",
    "applies",
    "compile_expression",
    "constant_expression",
    "format_duration",
    "load_app",
    "parse_duration",
    "render_text",
]
