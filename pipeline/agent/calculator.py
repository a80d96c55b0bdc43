"""The built-in calculator tool: safe arithmetic on Python's syntax tree, never `eval`.

Numbers (ints of any size, floats), + - * / // % **, unary + -, parentheses and the functions
abs, round, min, max, sqrt, floor, ceil. Limits keep one call cheap: at most `MAX_CHARS`
characters and `MAX_NODES` syntax nodes, integers of at most `MAX_BITS` bits (a power is refused
before it is computed when its result would be larger), exponents of floats at most
`MAX_FLOAT_EXPONENT`. `×`, `÷` and `−` are read as `*`, `/` and `-`; `^` is refused (it is XOR in
Python; write `**`). Every refusal is a `ToolError` whose message tells the model what to fix.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

from pipeline.agent.tools import ToolError

__all__ = ["calculator", "evaluate", "MAX_BITS", "MAX_CHARS", "MAX_NODES"]

MAX_CHARS = 1000
MAX_NODES = 200
MAX_BITS = 4096
MAX_FLOAT_EXPONENT = 1024

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "floor": math.floor, "ceil": math.ceil,
}


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise ToolError(f"the result has more than {MAX_BITS} bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    return value


def _power(base: Any, exp: Any) -> Any:
    if isinstance(base, int) and isinstance(exp, int):
        if exp < 0:
            return _check_size(float(base) ** exp) if base else _zero_division()
        if abs(base) > 1 and exp * max(1, abs(base).bit_length() - 1) > MAX_BITS:
            raise ToolError(f"{base} ** {exp} would have more than {MAX_BITS} bits")
        return base ** exp
    if abs(exp) > MAX_FLOAT_EXPONENT:
        raise ToolError(f"the exponent {exp} is larger than {MAX_FLOAT_EXPONENT}")
    try:
        value = float(base) ** float(exp)
    except OverflowError:
        raise ToolError("the result is too large") from None
    if isinstance(value, complex):
        raise ToolError("a negative number to a fractional power has no real value")
    return _check_size(value)


def _zero_division() -> Any:
    raise ToolError("division by zero")


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            return _zero_division()
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_BITS + 1:
            raise ToolError(f"the result has more than {MAX_BITS} bits")
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except OverflowError:
            raise ToolError("the result is too large") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise ToolError("^ is not a power here; write ** (2 ** 10)")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS \
            and not node.keywords:
        values = [_eval(a) for a in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*values))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    raise ToolError(f"unsupported syntax {type(node).__name__}: use numbers, + - * / // % **, parentheses and "
                    f"{', '.join(sorted(_FUNCTIONS))}")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression (module docstring); `ToolError` when it has none."""
    if not isinstance(expression, str):
        raise ToolError(f"the expression must be text, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_CHARS:
        raise ToolError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ToolError(f"cannot parse {text!r}: {getattr(exc, 'msg', None) or exc}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"the expression has more than {MAX_NODES} parts")
    return _eval(tree)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers of any size) and return its value.

    Args:
        expression: the expression, e.g. "(17 + 25) * 3" or "2 ** 100"; + - * / // % ** and
            abs, round, min, max, sqrt, floor, ceil.
    """
    value = evaluate(expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return repr(value)
    return str(value)
