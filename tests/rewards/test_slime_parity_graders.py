"""Graders on the (response, label) pairs of issue 31 (items 7-10), against slime @624b824's rm_hub.

The `SLIME` values were produced by slime's own graders (`slime/rollout/rm_hub/`, commit 624b824,
run outside the repo with pylatexenc installed); where ours differs on purpose docs/slime.md's
"Where the graders depart from slime" table says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config.args import ConfigError, validate
from pipeline.rewards import dispatch
from pipeline.rewards.dispatch import RewardDispatcher, grading_label
from pipeline.rewards.math import MAX_ANSWER_CHARS, grade
from pipeline.rewards.text_rules import grade_gpqa
from pipeline.samples.sample import Sample
from tests.engines.fake_server import FakeServer, serve
from tests.rewards.test_reward_preflight import _cfg

pytestmark = pytest.mark.timeout(60)



# ------------------------------------------------------------------ item 7: empty labels
def _data(path: Path, rows: list[tuple[Any, str | None]]) -> Path:
    """One row per (label, rm_type); a label of `...` leaves the key out."""
    lines = []
    for i, (label, rm_type) in enumerate(rows):
        row: dict[str, Any] = {"input": f"What is {i} + 1?", "metadata": {"rm_type": rm_type} if rm_type else {}}
        if label is not ...:
            row["label"] = label
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path




@pytest.mark.parametrize("empty", ["", " ", "\\boxed{}", "\\boxed{ }", "\\fbox{}"])
@pytest.mark.parametrize("rm_type", ["math", "boxed_math", "deepscaler", "dapo", "f1"])
def test_an_empty_label_is_refused_at_preflight_naming_the_line(tmp_path: Path, empty: str, rm_type: str) -> None:
    data = _data(tmp_path / "d.jsonl", [("2", None), ("3", None), (empty, None), (empty, None)])
    extra = ["reward_key=score"] if rm_type == "dapo" else []
    with pytest.raises(ConfigError, match=rf"data_source.prompt_data: {data} line 3: the label is empty "
                                          rf"\({re.escape(repr(empty))}\).*rm_type {rm_type} .*2 rows") as err:
        validate(_cfg(tmp_path, data, f"reward.rm_type={rm_type}", *extra))
    assert "fix or remove the row" in str(err.value)


def test_empty_labels_of_graders_that_need_none_pass(tmp_path: Path) -> None:
    data = _data(tmp_path / "d.jsonl", [("2", "math"), ("", "random"), (" ", "gpqa"), ("", "remote")])
    validate(_cfg(tmp_path, data, "reward.remote_url=http://127.0.0.1:9/r"))   # per-row types: only math needs one
    bad = _data(tmp_path / "bad.jsonl", [("", "random"), ("\\boxed{}", "f1"), ("", None)])
    with pytest.raises(ConfigError, match=rf"{bad} line 2: the label is empty .*rm_type f1 .*2 rows"):
        validate(_cfg(tmp_path, bad))   # row 3 has no rm_type: reward.rm_type=math grades it
    validate(_cfg(tmp_path, bad, "reward=custom", "reward.custom_rm_path=examples.reward.brevity_math",
                  "allowed_targets_extra=[examples.]"))


def test_eval_files_and_missing_label_keys_are_checked(tmp_path: Path) -> None:
    good = _data(tmp_path / "good.jsonl", [("2", None)])
    evals = _data(tmp_path / "eval.jsonl", [("1", None), (" ", None)])
    with pytest.raises(ConfigError, match=rf"eval.datasets\[0\].prompt_data: {evals} line 2: the label is empty"):
        validate(_cfg(tmp_path, good, "eval=engine", "eval_interval=1", f"eval.datasets.0.prompt_data={evals}"))
    with pytest.raises(ConfigError, match=r"data_source.label_key is null.*rm_type math compares"):
        validate(_cfg(tmp_path, good, "data_source.label_key=null"))


def test_an_empty_label_that_reaches_a_grader_names_the_sample() -> None:
    for label in ("", " ", "\\boxed{}", None):
        sample = Sample(index=7, group_index=3, prompt="q", response="\\boxed{4}", label=label)
        with pytest.raises(ValueError, match=r"sample 7 \(group 3\): .*math reward needs a label.*empty"):
            grading_label(sample, None, "math")
    assert grading_label(Sample(index=0, label=0), None, "math") == 0   # 0 is a label (slime: missing)


# ------------------------------------------------------------------ item 8: gpqa lower-case boxed letter
# (response, label, metadata) -> slime's reward
GPQA_CASES = [
    ("\\boxed{b}", "B", None, 1.0),
    ("so the pick is \\boxed{\\text{b}}", "B", None, 1.0),
    ("\\boxed{B}", "B", None, 1.0),
    ("\\boxed{b} It is clear", "B", None, 1.0),
]


@pytest.mark.parametrize("response,label,metadata,slime", GPQA_CASES)
def test_gpqa_reads_a_lower_case_boxed_letter(response: str, label: Any, metadata: Any, slime: float) -> None:
    assert grade_gpqa(response, label, metadata) == slime


def test_gpqa_departures_from_slime() -> None:
    # slime: 1.0 for both (its substring fallback finds "b" in "boxed c"); a wrong pick is wrong
    assert grade_gpqa("\\boxed{c}", "B") == 0.0 and grade_gpqa("\\boxed{a}", "B") == 0.0
    # slime: 0.0 (a boxed lower-case letter counts only by that substring accident); ours reads the box
    assert grade_gpqa("\\boxed{d}", 3, {"choices": ["w", "x", "y", "z"]}) == 1.0
    # slime: 0.0 (it reads "I" out of "It"); ours reads C
    assert grade_gpqa("The answer: It is C", "C") == 1.0
    # slime: 1.0 ("d" is a substring of "don t"); ours needs the right choice's text as whole words
    assert grade_gpqa("I don't know", "D", {"choices": ["w", "x", "y", "z"]}) == 0.0


# ------------------------------------------------------------------ item 9: long exact answers
LONG_TUPLE = "(" + ", ".join(str(i) for i in range(1, 120)) + ")"           # 487 characters
LONG_TEXT = "\\text{" + "the quick brown fox jumps over the lazy dog " * 8 + "}"  # 359 characters


@pytest.mark.parametrize("answer,wrong", [(LONG_TUPLE, LONG_TUPLE.replace("(1,", "(7,")),
                                          (LONG_TEXT, LONG_TEXT.replace("quick", "slow"))])
def test_a_long_answer_equal_to_the_label_scores_1(answer: str, wrong: str) -> None:
    assert len(answer) > MAX_ANSWER_CHARS
    assert grade(f"so \\boxed{{{answer}}}", answer) == 1.0               # slime: 1
    assert grade(f"so \\boxed{{ {answer} }}", f"${answer}$") == 1.0      # spaces and $ around do not matter
    assert grade(f"so \\boxed{{{wrong}}}", answer) == 0.0                # slime: 0; not parsed past the limit


# ------------------------------------------------------------------ item 10: remote non-numbers
def _remote(answer: Any, n: int = 1) -> tuple[list[Any], RewardDispatcher, str]:
    body = json.dumps(answer).encode()   # bytes: sent as they are (a list would be an SSE stream)
    with serve(FakeServer(lambda p, b: (200, body))) as fake:
        d = RewardDispatcher(rm_type="remote", remote_url=fake.url + "/rm", remote_backoff_s=0.01)
        try:
            args = SimpleNamespace(rm_type=None, custom_rm_path=None)
            out = asyncio.run(d.score(args, [Sample(index=i, prompt="q", response="r", label="1") for i in range(n)]))
        finally:
            d.close()
        return out, d, fake.url + "/rm"


def test_remote_true_false_are_1_and_0() -> None:
    assert _remote(True)[0] == [1.0] and _remote(False)[0] == [0.0]
    assert _remote(0.25)[0] == [0.25] and _remote({"score": 2})[0] == [{"score": 2}]


def test_remote_null_is_a_counted_failure_scored_0(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline.rewards.remote"):
        out, d, url = _remote(None, n=4)
    assert out == [0.0] * 4
    assert dispatch.reward_counts(d) == {"reward/remote_null_answers": 4, "reward/grade_timeouts": 0}
    logged = [r.getMessage() for r in caplog.records if r.name == "pipeline.rewards.remote"]
    line = (rf"remote reward at {re.escape(url)} answered null for sample [0-3]; scored 0\.0 \((\d) null answers "
            r"so far, metric reward/remote_null_answers\)")
    assert [re.fullmatch(line, m).group(1) for m in logged] == ["1", "2", "4"]   # the 1st, 2nd, 4th, ...


@pytest.mark.parametrize("answer", ["0.5", [1.0], "yes"])
def test_remote_strings_and_lists_are_a_clear_error(answer: Any) -> None:
    with pytest.raises(ValueError, match=r"remote reward at http://127\.0\.0\.1:\d+/rm answered .*expected a "
                                         r"number") as err:
        _remote(answer)
    assert repr(answer) in str(err.value)


def test_remote_client_timeout_retry_log_and_payload(caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.rewards.remote import RemoteReward

    with pytest.raises(ValueError, match=r"^remote reward: reward.remote_url \(or args.rm_url\) is not set$"):
        RemoteReward("")
    bare = SimpleNamespace(prompt="p", response="r", label=1)   # a duck-typed sample without metadata
    assert RemoteReward.payload(bare) == {"prompt": "p", "response": "r", "label": 1, "metadata": {}}
    with serve(FakeServer(lambda p, b: (200, 1.0), delay_s=0.5)) as fake:
        client = RemoteReward(fake.url, timeout_s=0.1, max_retries=0)
        try:
            with pytest.raises(Exception, match="(?i)timed? ?out|ReadTimeout"):
                asyncio.run(client(Sample(index=0, prompt="q", response="r", label="1")))
        finally:
            client.close()
    calls = iter([(503, {}), (200, 1.0)])
    with serve(FakeServer(lambda p, b: next(calls))) as fake, caplog.at_level(logging.WARNING):
        client = RemoteReward(fake.url, backoff_s=0.01)
        try:
            assert asyncio.run(client(Sample(index=5, prompt="q", response="r", label="1"))) == 1.0
        finally:
            client.close()
    assert any(f"remote reward for sample 5 at {fake.url}" in r.getMessage() for r in caplog.records)
