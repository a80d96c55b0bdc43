"""The math rewards and non-string labels (issue 10, item 5): numbers are graded, a dict or list
label is a clear error naming the sample (never its text graded), `reward.label_field` picks the
entry of a dict label to grade."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.rewards.dispatch import RewardDispatcher
from pipeline.samples.sample import Sample

pytestmark = pytest.mark.timeout(60)

ARGS = SimpleNamespace(rm_type=None, custom_rm_path=None)


def score(d: RewardDispatcher, *samples: Sample) -> list[Any]:
    return asyncio.run(d.score(ARGS, list(samples)))


def sample(response: str, label: Any, index: int = 3) -> Sample:
    return Sample(index=index, group_index=1, prompt="q", response=response, label=label)


def test_number_labels_are_graded_as_numbers():
    assert score(RewardDispatcher(), sample(r"\boxed{10}", 10), sample("= 2.5", 2.5), sample("= 3", 10)) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("label,hint", [
    ({"answer": 10, "points": 3}, "set reward.label_field=<key> to grade one entry (keys: ['answer', 'points'])"),
    ([10], "grade it with a reward function of your own (reward=custom)"),
])
def test_a_dict_or_list_label_is_an_error_naming_the_sample(label, hint):
    with pytest.raises(ValueError) as err:
        score(RewardDispatcher(), sample(r"\boxed{10}", label))
    msg = str(err.value)
    assert msg.startswith("sample 3 (group 1): the math reward compares the answer with a string or number label")
    assert f"but the label is a {type(label).__name__}: {label!r}" in msg and hint in msg


def test_label_field_grades_one_entry_of_a_dict_label():
    d = RewardDispatcher(rm_type="boxed_math", label_field="answer")
    label = {"answer": 10, "points": 3}
    assert score(d, sample(r"so \boxed{10}", label), sample(r"\boxed{3}", label)) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"sample 3 \(group 1\): reward.label_field='answer' picks an entry of a "
                                         r"dict label, but the label is \{'points': 3\} \(its keys are \['points'\]\)"):
        score(d, sample(r"\boxed{10}", {"points": 3}))
    with pytest.raises(ValueError, match="but the label is '10' \\(it is a str\\)"):
        score(d, sample(r"\boxed{10}", "10"))
