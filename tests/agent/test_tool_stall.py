"""Tools never stall the batch (bench/agent_tool_stall.py, small): with a tool that sleeps, every sample
waits for its own calls only; 16 samples x 2 calls of 0.3 s cost about 0.6 s more, not the 9.6 s of
calls run one at a time."""

from bench import agent_tool_stall as bench
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine


def test_sleeping_tools_overlap_with_everything_else(tmp_path):
    bench.SLEEP_S["value"] = 0.3
    data = bench._questions(tmp_path / "q.jsonl", 16, two_shot=False)
    engine, tok = ScriptedEngine(tool_calls=2, max_filler=0), ByteTokenizer()
    instant, m0 = bench.measure(engine, tok, "pipeline.agent.calculator.calculator", 16, data)
    sleeps, m1 = bench.measure(engine, tok, "bench.agent_tool_stall.calculator", 16, data)
    assert m0["agent/tool_calls"] == m1["agent/tool_calls"] == 32 and m1["agent/turns_mean"] == 3.0
    assert m1["agent/tool_latency_mean_s"] >= 0.3
    assert 0.55 < sleeps - instant < 1.6, (instant, sleeps)
