"""Rule-based math rewards with slime's rm_type names `deepscaler` and `dapo`.

`deepscaler` (DeepScaleR's rule): only the text after the last `</think>` (or after the first
`###Response`) counts; without either marker the reward is 0. The answer is the content of the
last `\\boxed{...}` there (no box: 0); a label that itself holds a box is unboxed first, an empty
label scores 0. Equivalence is decided by math-verify (as for rm_type `math`), so `\\dfrac12`,
`0.5`, `\\text{(B)}`, `1,000` and `90^\\circ` match what they mean. Reward 1.0 or 0.0.

`dapo` (DAPO / Minerva rule): the answer is the last `Answer: ...` line in the last 300 characters
of the response (case-insensitive; none: `[INVALID]`). Both sides are normalised as text: the
part after the last `=`, units and filler words, `$`, `\\text{}`/`\\textbf{}`/`\\overline{}`/
`\\boxed{}` wrappers and spaces removed, shorthand `\\frac12` / `\\sqrt2` expanded, thousands
commas dropped. A numeric label is compared as an integer (DAPO's answers are integers). The
reward is slime's dict `{"score": 1.0 | -1.0, "acc": bool, "pred": str}`: set `reward_key=score`.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.rewards.math import grade, last_boxed

__all__ = ["dapo_normalize", "grade_dapo", "grade_deepscaler"]

# response characters the dapo rule looks at (the longest MATH-500 answer has 159 characters)
DAPO_TAIL_CHARS = 300

_ANSWER_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)

# textual replacements first, then words and markup removed outright (DAPO's normalisation)
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
            ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_UNITS = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "sue",
          "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
          "meals", "edges", "students", "childrentickets", "multiples")
_MARKUP = ("\\ldots", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
           "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
           "<|im_end|>", "<|endoftext|>")
_WRAPPERS = (re.compile(r"\\text\{(.*?)\}"), re.compile(r"\\textbf\{(.*?)\}"),
             re.compile(r"\\overline\{(.*?)\}"), re.compile(r"\\boxed\{(.*)\}"))


def grade_deepscaler(response: str, label: Any) -> float:
    """DeepScaleR's reward (see module docstring)."""
    response = response or ""
    if "</think>" in response:
        solution = response.rsplit("</think>", 1)[1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0.0
    truth = "" if label is None else str(label)
    if "\\boxed" in truth or "\\fbox" in truth:
        truth = last_boxed(truth) or ""
    if not truth.strip():
        return 0.0
    answer = last_boxed(solution)
    if answer is None:
        return 0.0
    return grade(f"\\boxed{{{answer}}}", truth, boxed_only=True)


def dapo_normalize(text: str) -> str:
    """DAPO's textual normal form of a final answer."""
    text = str(text).split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _UNITS + _MARKUP:
        text = text.replace(word, "")
    inline = re.search(r"\$(.*?)\$", text)
    if inline is not None:
        text = f"${inline.group(1)}$"
    for wrapper in _WRAPPERS:
        text = wrapper.sub(r"\1", text)
    text = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", text)
    text = re.sub(r"sqrt([^{])", r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def _dapo_label(label: Any) -> str:
    truth = dapo_normalize(label)
    try:
        return str(int(float(truth)))
    except ValueError:
        return truth  # slime raises here; a text label is compared as normalised text


def grade_dapo(response: str, label: Any) -> dict[str, Any]:
    """DAPO's reward dict (see module docstring)."""
    if label is None:
        raise ValueError("rm_type dapo needs a label (set data_source.label_key)")
    tail = (response or "")[-DAPO_TAIL_CHARS:]
    found = _ANSWER_LINE.findall(tail)
    pred = dapo_normalize(found[-1] if found else "[INVALID]")
    correct = pred == _dapo_label(label)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
