"""The scripted engine and its byte codec: determinism, length / stop / abort, continuation."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine

pytestmark = pytest.mark.timeout(30)
TOK = ByteTokenizer()
PROMPT = TOK.encode("What is 12 + 30?")


def gen(engine: ScriptedEngine, rid: str = "a", ids=PROMPT, **sp) -> object:
    req = GenerationRequest(request_id=rid, input_ids=list(ids), sampling=SamplingParams(**sp))
    return asyncio.run(engine.generate(req))


def test_codec_roundtrip_and_chat_template():
    text = "héllo 1 + 2 ✓"
    assert TOK.decode(TOK.encode(text)) == text
    assert TOK(text)["input_ids"] == TOK.encode(text)
    rendered = TOK.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "user: hi\nassistant: "
    assert TOK.decode(TOK.encode("x") + [TOK.eos_token_id]) == "x"


def test_deterministic_and_answers_vary():
    e = ScriptedEngine(max_filler=3)
    r1, r2 = gen(e, "a", max_new_tokens=500), gen(e, "a", max_new_tokens=500)
    assert r1.output_ids == r2.output_ids and r1.log_probs == r2.log_probs
    assert r1.finish_reason == "stop" and r1.output_ids[-1] == TOK.eos_token_id
    answers = {gen(e, str(i), max_new_tokens=500).text.rsplit("{", 1)[1] for i in range(40)}
    assert "42}." in answers and len(answers) > 1
    always = ScriptedEngine(correct_rate=1.0)
    assert all(gen(always, str(i), max_new_tokens=500).text.endswith("\\boxed{42}.") for i in range(10))


def test_length_and_stop():
    e = ScriptedEngine(max_filler=8)
    r = gen(e, max_new_tokens=5, seed=3)
    assert r.finish_reason == "length" and len(r.output_ids) == 5 and len(r.log_probs) == 5
    r = gen(e, max_new_tokens=500, seed=3, stop=("answer",))
    assert r.finish_reason == "stop" and r.text.endswith("answer")
    r = gen(e, max_new_tokens=500, seed=3, stop_token_ids=(ord("{"),))
    assert r.finish_reason == "stop" and r.text.endswith("{")
    assert gen(e, max_new_tokens=0).output_ids == []


def test_abort_returns_partial_output():
    e = ScriptedEngine(token_delay=0.005, max_filler=8)

    async def main():
        task = asyncio.create_task(e.generate(GenerationRequest(
            "x", input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=500, seed=1))))
        await asyncio.sleep(0.05)
        await e.abort_all()
        return await task

    r = asyncio.run(main())
    assert r.finish_reason == "abort"
    full = gen(ScriptedEngine(max_filler=8), max_new_tokens=500, seed=1)
    assert 0 < len(r.output_ids) < len(full.output_ids)
    assert full.output_ids[: len(r.output_ids)] == r.output_ids
    assert e.stats.aborted == 1 and e.stats.in_flight == 0


def test_seeded_continuation_is_coherent():
    e = ScriptedEngine(max_filler=8)
    full = gen(e, max_new_tokens=500, seed=9)
    head = gen(e, max_new_tokens=10, seed=9)
    tail = gen(e, ids=PROMPT + head.output_ids, max_new_tokens=500, seed=9)
    assert head.output_ids + tail.output_ids == full.output_ids


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="correct_rate"):
        ScriptedEngine(correct_rate=2)
    e = ScriptedEngine()
    e.close()
    assert asyncio.run(e.health()) is False


def test_solver_understands_symbols_words_and_the_bundled_data():
    import json
    from pathlib import Path

    from pipeline.engines.scripted import solve

    assert solve("What is 3 + 4?") == 7 and solve("What is 9 - 12?") == -3
    assert solve("What is 8 times 8?") == 64 and solve("12 divided by 4") == 3
    assert solve("Ann has 3 pens and gets 2 more. How many?") == 5
    assert solve("Bo had 9 cards and gave 4 away. How many are left?") == 5
    assert solve("There are 5 bags with 6 shells in each bag.") == 30
    assert solve("Name a colour.") is None
    root = Path(__file__).resolve().parents[2] / "data"
    rows = [json.loads(line) for f in sorted(root.glob("math_*.jsonl")) for line in open(f)]
    assert rows, "bundled data missing"
    assert all(solve(r["input"]) == int(r["label"]) for r in rows)
