"""Answer extraction and math-verify grading."""

from __future__ import annotations

import pytest

from pipeline.rewards.math import extract_answer, grade, last_boxed, last_number


@pytest.mark.parametrize("text,expected", [
    (r"so \boxed{12}.", "12"),
    (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{a_{1}+{b}}", "a_{1}+{b}"),
    (r"\fbox{7}", "7"),
    (r"\boxed 5", "5"),
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
