"""The calculator tool: exact arithmetic on the syntax tree, limits, and messages that say what to fix."""

import pytest

from pipeline.agent.calculator import MAX_BITS, calculator, evaluate
from pipeline.agent.tools import ToolError


@pytest.mark.parametrize("expression, value", [
    ("17 + 25", "42"), ("(17 + 25) * 3", "126"), ("2 ** 100", str(2 ** 100)), ("7 / 2", "3.5"),
    ("84 / 2", "42.0"), ("7 // 2", "3"), ("-7 % 3", "2"), ("-(3 - 5)", "2"), ("sqrt(16)", "4.0"),
    ("max(3, 9, 4) - min(2, 1)", "8"), ("round(2.567, 2)", "2.57"), ("12 × 3 ÷ 4", "9.0"), ("2 ** -1", "0.5"),
    ("10 − 4", "6"), ("abs(-3) + floor(2.7) + ceil(2.1)", "8"),
])
def test_it_computes_exactly(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("0 ** -1", "division by zero"),
    ("2 ^ 3", r"\^ is not a power here; write \*\*"),
    ("__import__('os').system('id')", "unsupported syntax"), ("open('/etc/passwd')", "unsupported syntax"),
    ("(1).__class__", "unsupported syntax"), ("x + 1", "unsupported syntax Name"), ("'a' * 3", "unsupported syntax"),
    ("9 ** 9 ** 9", f"more than {MAX_BITS} bits"), ("2 ** 5000", f"more than {MAX_BITS} bits"),
    ("(2 ** 4000) * (2 ** 4000)", f"more than {MAX_BITS} bits"), ("10.0 ** 400", "too large"),
    ("(-8) ** 0.5", "no real value"), ("1 +", "cannot parse"), ("", "empty"), ("1" * 1001, "longer than 1000"),
    ("+".join(["1"] * 150), "more than 200 parts"), ("sqrt(-1)", "sqrt: math domain error"),
    ("lambda: 1", "unsupported syntax Lambda"), ("[1, 2]", "unsupported syntax List"),
])
def test_refusals_are_tool_errors_that_say_why(expression, message):
    with pytest.raises(ToolError, match=message):
        evaluate(expression)


def test_big_integers_up_to_the_limit_are_exact():
    assert evaluate("2 ** 4000 + 1") == 2 ** 4000 + 1
    assert evaluate("3 ** 2000 - 3 ** 2000") == 0
