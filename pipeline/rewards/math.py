"""Math answer grading with math-verify.

`extract_answer` picks what to grade from a response: the content of the last `\\boxed{...}`
(or `\\fbox{...}`), else the last number in the text (thousands separators dropped). With
`boxed_only` (the `boxed_` rm types) a response without a box scores 0. An answer that equals the
label as text (spaces and surrounding `$` aside) scores 1 at any length; other answers longer than
`MAX_ANSWER_CHARS` are not parsed and score 0. The label may be a string
(`"12"`, `"\\frac{1}{2}"`, `"$x^2$"`) or a number (`0` included). `grade` is synchronous and
thread-safe: math-verify's own signal-based timeouts are off (they only work in the main
thread); callers bound the time by running it in a thread pool (see `dispatch.py`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["last_boxed", "last_number", "extract_answer", "grade", "MAX_ANSWER_CHARS"]

logger = logging.getLogger(__name__)

# extracted answers longer than this are not parsed (sympy on huge strings can take forever);
# one equal to the label as text still scores 1 (slime's string match has no limit)
MAX_ANSWER_CHARS = 300

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")
# `\boxed{` / `\fbox{` (spaces before the brace allowed) at the start of the text
_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")
# the brace-less `\boxed 5`: its first token
_BARE_BOX = re.compile(r"\\boxed\s+([^\s$]+)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (nested braces allowed), or of a
    trailing `\\boxed 5` form; None when there is none (or its braces do not close)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    opening = _BOX_OPENING.match(rest)
    if opening is None:  # `\boxed 5`, or no box after all: `\boxedx`, `\fbox 5`, a cut-off `\boxed`
        bare = _BARE_BOX.match(rest)
        return bare.group(1) if bare else None
    body = rest[opening.end():]
    depth = 1
    for i, char in enumerate(body):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return body[:i]
    return None  # unbalanced


def last_number(text: str) -> str | None:
    """The last number in `text` (`-3`, `2.5`, `3/4`, `1,234` -> `1234`), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    return found[-1].replace(",", "")


def extract_answer(text: str, boxed_only: bool = False) -> str | None:
    """What to grade in a response (see module docstring)."""
    boxed = last_boxed(text)
    if boxed is not None or boxed_only:
        return boxed
    return last_number(text)


def _as_latex(value: str) -> str:
    """`value` as math-verify's input: in `$...$` unless it already starts with a `$`.

    Without delimiters math-verify finds no LaTeX in `x^2` or `\\fbox{4}`; a value that starts
    with `$` keeps its own (`$12$ cm$^2$` is 12 with a unit, wrapped again it would not be). A label
    holding a `\\boxed{}` is wrapped too: math-verify finds the box inside `$...$` all the same.
    """
    value = value.strip()
    if value.startswith("$"):
        return value
    return f"${value}$"


def _label_text(label: Any) -> str:
    if isinstance(label, bool) or label is None:
        raise ValueError(f"math reward: label must be a string or a number, got {label!r}")
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    return str(label)


def _same_text(answer: str, label: str) -> bool:
    """True when `answer` and `label` are the same text once spaces and surrounding `$` are dropped."""
    def bare(text: str) -> str:
        return "".join(text.strip().strip("$").split())
    return bare(answer) == bare(label)


def _quiet_timeout_warnings() -> None:
    """math-verify warns that its timeouts are off; ours are enforced by the caller."""
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


def grade(response: str, label: Any, boxed_only: bool = False) -> float:
    """1.0 when the answer extracted from `response` equals `label` under math-verify, else 0.0."""
    from math_verify import parse, verify

    _quiet_timeout_warnings()
    if not response:  # "" or None: nothing to grade
        return 0.0
    answer = extract_answer(response, boxed_only=boxed_only)
    if answer is None or not answer.strip():
        return 0.0
    label_text = _label_text(label)
    if len(answer) > MAX_ANSWER_CHARS:
        return 1.0 if _same_text(answer, label_text) else 0.0
    gold = parse(_as_latex(label_text), parsing_timeout=None)
    if not gold:
        raise ValueError(f"math reward: cannot parse the label {label!r}")
    pred = parse(_as_latex(answer), parsing_timeout=None)
    if not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0
