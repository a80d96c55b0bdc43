"""Answer extraction and math-verify grading."""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.rewards.math import MAX_ANSWER_CHARS, extract_answer, grade, last_boxed, last_number


@pytest.mark.parametrize("text,expected", [
    (r"so \boxed{12}.", "12"),
    (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{a_{1}+{b}}", "a_{1}+{b}"),
    (r"\fbox{7}", "7"),
    (r"\boxed 5", "5"),
    (r"\boxed {4}", "4"),
    (r"first \fbox{3}; rechecking, the final answer is \fbox{4}", "4"),   # the last \fbox, as for \boxed
    (r"The sum is 12, so the answer is \boxed", None),                  # cut off at the token limit
    (r"\boxed{12", None),
    ("no box", None),
])
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("3 apples and 4 pears", "4"), ("total: 1,234.", "1234"), ("x = -3", "-3"),
    ("about 2.5 km", "2.5"), ("3/4 of it", "3/4"), ("none", None),
])
def test_last_number(text: str, expected: str | None) -> None:
    assert last_number(text) == expected


@pytest.mark.parametrize("response,label,reward", [
    ("7 + 5 = 12", "12", 1.0),
    ("7 + 5 = 13", "12", 0.0),
    (r"The answer is \boxed{12}. Check: 13", 12, 1.0),     # the box wins over the last number
    ("It is 0", 0, 1.0),                                     # a zero label is a real label
    ("It is 0", "0", 1.0),
    ("It is 1", 0, 0.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    ("0.75", "3/4", 1.0),
    ("12.0", 12, 1.0),
    ("12.0", 12.0, 1.0),
    ("I have 1,234 apples", 1234, 1.0),
    ("x = -3", "-3", 1.0),
    ("no idea", "3", 0.0),
    ("", "3", 0.0),
    (r"so \boxed{x^2+1}", "x^2+1", 1.0),                     # LaTeX without `$` in answer and label
    (r"so \boxed{x^2+1}", "$x^2+1$", 1.0),
    (r"The area is \boxed{$12$ cm$^2$}.", 12, 1.0),          # inline math with a unit inside the box
    (r"so \boxed{0.5}", r"\boxed{\frac{1}{2}}", 1.0),        # a MATH-style boxed label
    (r"I could not finish: \boxed{\ldots}", "12", 0.0),     # a box with no math in it
])
def test_grade(response: str, label: object, reward: float) -> None:
    assert grade(response, label) == reward


def test_boxed_only() -> None:
    assert grade("7 + 5 = 12", "12", boxed_only=True) == 0.0
    assert grade(r"so \boxed{12}", "12", boxed_only=True) == 1.0
    assert extract_answer("12", boxed_only=True) is None


@pytest.mark.parametrize("label", [None, True])
def test_bad_label_is_a_clear_error(label: object) -> None:
    with pytest.raises(ValueError, match="label"):
        grade("12", label)


def test_huge_answer_is_not_parsed() -> None:
    assert grade(r"\boxed{" + "1+" * 500 + "1}", "501") == 0.0


def test_extract_answer_falls_back_to_the_last_number_by_default() -> None:
    assert extract_answer("7 + 5 = 12") == "12"
    assert extract_answer(r"\boxed{12}, check: 13") == "12"


def test_a_cut_off_box_scores_0_when_only_boxes_count() -> None:
    assert grade(r"The sum is 12, so the answer is \boxed", "12", boxed_only=True) == 0.0


def test_an_unparsable_label_is_an_error_naming_it() -> None:
    for label in ("", r"\text{}"):
        with pytest.raises(ValueError, match=f"cannot parse the label {re.escape(repr(label))}"):
            grade(r"\boxed{3}", label)


def test_grade_works_in_worker_threads() -> None:
    """The dispatcher grades in a thread pool, where math-verify's signal timeouts cannot run."""
    cases = [(r"\boxed{\frac{1}{2}}", "0.5", 1.0), ("7 + 5 = 13", "12", 0.0), ("0.75", "3/4", 1.0)]
    with ThreadPoolExecutor(2) as pool:
        rewards = list(pool.map(lambda case: grade(case[0], case[1]), cases))
    assert rewards == [reward for _, _, reward in cases]


def test_grade_logs_no_timeout_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Timeouts are the caller's; math-verify's warning that its own are off would flood the log."""
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert grade(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert [r.getMessage() for r in caplog.records if "imeout" in r.getMessage()] == []


def test_an_answer_of_max_answer_chars_is_parsed_one_longer_is_not() -> None:
    third = "0." + "3" * (MAX_ANSWER_CHARS - 2)
    assert len(third) == MAX_ANSWER_CHARS
    assert grade(rf"\boxed{{{third}}}", r"\frac{1}{3}") == 1.0
    assert grade(rf"\boxed{{{third}3}}", r"\frac{1}{3}") == 0.0    # compared as text only


_POLY = "+".join(f"{k}X^{{{k}}}" for k in range(60, 1, -1))   # a long answer (over MAX_ANSWER_CHARS)


def test_a_long_answer_equal_to_the_label_but_for_spaces_and_dollars_scores_1() -> None:
    assert len(_POLY) > MAX_ANSWER_CHARS
    assert grade(rf"\boxed{{{_POLY.replace('+', ' + ')}+2X}}", f"${_POLY}+2X$") == 1.0


def test_a_long_answer_with_a_different_last_term_scores_0() -> None:
    assert grade(rf"\boxed{{{_POLY}+2X}}", f"{_POLY}+2") == 0.0
