"""RewardDispatcher: resolution order, group mode, errors, non-blocking grading, remote."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.rewards import dispatch as dispatch_mod
from pipeline.rewards.dispatch import RewardDispatcher
from pipeline.samples.sample import Sample
from tests.engines.fake_server import FakeServer, serve
from tests.rewards import plugins

pytestmark = pytest.mark.timeout(60)

P = "tests.rewards.plugins."


def s(i: int, response: str, label: Any = "12", **kw: Any) -> Sample:
    return Sample(index=i, prompt="q", response=response, label=label, **kw)


def args(**kw: Any) -> SimpleNamespace:
    base = dict(rm_type=None, custom_rm_path=None, allowed_targets=["pipeline.", "tests."],
                allowed_targets_extra=[])
    base.update(kw)
    return SimpleNamespace(**base)


def score(d: RewardDispatcher, a: Any, samples: list[Sample]) -> list[Any]:
    return asyncio.run(d.score(a, samples))


def test_math_default_with_numeric_and_zero_labels() -> None:
    out = score(RewardDispatcher(), args(), [s(0, "= 12"), s(1, "= 11"), s(2, "0", label=0),
                                             s(3, r"\boxed{5}", label=5)])
    assert out == [1.0, 0.0, 1.0, 1.0]


def test_resolution_order() -> None:
    d = RewardDispatcher(rm_type="math")
    samples = [
        s(0, "abc", custom_rm_path=P + "sync_constant", metadata={"rm_type": "boxed_math"}),
        s(1, "abcd", metadata={"rm_type": "boxed_math"}),   # args.custom_rm_path applies
    ]
    assert score(d, args(custom_rm_path=P + "length_reward"), samples) == [7.0, 4.0]
    # without any custom path: metadata rm_type beats args.rm_type
    samples = [s(0, "12", metadata={"rm_type": "boxed_math"}), s(1, "12")]
    assert score(d, args(rm_type="math"), samples) == [0.0, 1.0]
    # the dispatcher's own config is the last fallback
    assert score(RewardDispatcher(rm_type="boxed_math"), SimpleNamespace(), [s(0, "12")]) == [0.0]


def test_group_mode_gets_the_whole_list() -> None:
    plugins.CALLS.clear()
    d = RewardDispatcher(custom_rm_path=P + "group_rank", group_rm=True)
    out = score(d, args(), [s(0, "aaa"), s(1, "a"), s(2, "aa")])
    assert out == [1.0, 0.0, 0.5]
    assert plugins.CALLS == [("group", [0, 1, 2])]
    with pytest.raises(ValueError, match="expected a list of 3 rewards"):
        score(RewardDispatcher(custom_rm_path=P + "bad_group", group_rm=True), args(),
              [s(0, "a"), s(1, "b"), s(2, "c")])


def test_unknown_rm_type_names_its_source() -> None:
    with pytest.raises(ValueError, match=r"unknown rm_type 'gsm8k' \(from sample.metadata"):
        score(RewardDispatcher(), args(), [s(3, "1", metadata={"rm_type": "gsm8k"})])
    with pytest.raises(ValueError, match="needs a label"):
        score(RewardDispatcher(), args(), [s(3, "1", label=None)])


def test_disallowed_or_missing_function_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="not allowed"):
        score(RewardDispatcher(custom_rm_path="os.getcwd"), args(), [s(0, "1")])
    with pytest.raises(Exception, match="tests.rewards.plugins.nope"):
        score(RewardDispatcher(custom_rm_path=P + "nope"), args(), [s(0, "1")])


def test_grading_does_not_block_the_loop_and_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow_grade(response: str, label: Any, boxed_only: bool = False) -> float:
        time.sleep(0.6 if response == "slow" else 0.05)
        return 1.0

    monkeypatch.setattr(dispatch_mod, "grade", slow_grade)
    d = RewardDispatcher(grade_timeout_s=0.3, grade_workers=2)

    async def go() -> tuple[list[Any], int]:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        hb = asyncio.create_task(heartbeat())
        out = await d.score(args(), [s(0, "slow"), s(1, "fast"), s(2, "fast")])
        hb.cancel()
        return out, ticks

    out, ticks = asyncio.run(go())
    assert out == [0.0, 1.0, 1.0] and d.timeouts == 1
    assert ticks >= 8  # the loop kept running while grading
    d.close()


def test_remote_reward_with_retries_and_boxed_variant() -> None:
    calls = {"n": 0}

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            return 503, {}
        return 200, {"score": len(body["response"]), "label": body["label"]}

    with serve(FakeServer(handler)) as fake:
        d = RewardDispatcher(rm_type="remote", remote_url=fake.url + "/reward", remote_backoff_s=0.01)
        out = score(d, args(), [s(0, "abc", metadata={"k": 1})])
        assert out == [{"score": 3, "label": "12"}]
        path, body = fake.requests[-1]
        assert path == "/reward" and body == {"prompt": "q", "response": "abc", "label": "12",
                                              "metadata": {"k": 1}}
        sample = s(1, r"so \boxed{42} done")
        d2 = RewardDispatcher(rm_type="boxed_remote", remote_url=fake.url + "/reward")
        assert score(d2, args(), [sample]) == [{"score": 2, "label": "12"}]
        assert sample.response == r"so \boxed{42} done"  # the sample itself is untouched


def test_remote_concurrency_limit_and_rm_url_fallback() -> None:
    with serve(FakeServer(lambda p, b: (200, 1.0), delay_s=0.1)) as fake:
        d = RewardDispatcher(rm_type="remote_rm", remote_max_concurrency=2)
        out = score(d, args(rm_url=fake.url), [s(i, "x") for i in range(6)])
    assert out == [1.0] * 6 and fake.max_active == 2


def test_remote_bad_answer_and_missing_url() -> None:
    with serve(FakeServer(lambda p, b: (200, "yes"))) as fake:
        with pytest.raises(ValueError, match="expected a number or a JSON object"):
            score(RewardDispatcher(rm_type="remote", remote_url=fake.url), args(), [s(0, "x")])
    with pytest.raises(ValueError, match="remote_url"):
        score(RewardDispatcher(rm_type="remote"), args(), [s(0, "x")])
