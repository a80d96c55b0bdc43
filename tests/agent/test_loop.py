"""The agent loop on the scripted engine: masks, log-probs, budgets, statuses, malformed calls, tool
errors, timeouts, the concurrency limit, abort and continuation, eval, deterministic dumps."""

import asyncio
import json

import pytest

from agent_helpers import BoxedReward, agent_settings, make_args, run_agent, samples_of, spans_ok, turns_engine
from pipeline.agent.loop import AgentLoop
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine
from pipeline.rollout.eval import EngineEval
from pipeline.rollout.sample_generate import GenContext, sampling_params_from_args
from pipeline.samples.sample import Sample
from pipeline.sinks.files import write_samples
from tests.agent import agent_tools

TOK = ByteTokenizer()
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


def test_two_calls_then_an_answer_masks_exactly_the_tool_tokens(tmp_path):
    out, _ = run_agent(tmp_path, ScriptedEngine(tool_calls=2), reward=BoxedReward(), args={"rollout_max_response_len": 512})
    for s in samples_of(out):
        state = s.metadata["agent"]
        assert state["turns"] == 3 and state["tool_calls"] == 2 and state["stop"] == "answer"
        assert [k for k, _ in state["spans"]] == ["model", "tool", "model", "tool", "model"]
        assert s.status == Sample.Status.COMPLETED and s.reward == 1.0
        spans_ok(s)
        prompt = s.tokens[: len(s.tokens) - s.response_length]
        text = TOK.decode(s.tokens, skip_special_tokens=False)
        question = TOK.decode(prompt).rsplit("user: ", 1)[1].split("\n")[0]
        a, _, b = question.removeprefix("What is ").removesuffix("?").partition(" + ")
        call, total = CALL % f"{a} + {b}", str(int(a) + int(b))
        # model turns as generated, tool turns as the (byte) template renders them
        body = text[len(TOK.decode(prompt)):]
        assert body.count(f"{call}\ntool: {total}\nassistant: ") == 2
        assert body.endswith(f"The answer is \\boxed{{{total}}}.<eos>")
        assert s.rollout_log_probs[0] <= 0 and len(s.weight_versions) >= 1
    m = out.metrics
    assert m["agent/samples"] == 4 and m["agent/turns_mean"] == 3.0 and m["agent/tool_calls"] == 8
    assert m["agent/malformed_calls"] == m["agent/tool_errors"] == 0 and 0 < m["agent/tool_token_share"] < 0.5
    assert m["agent/tool_latency_p95_s"] >= m["agent/tool_latency_mean_s"] > 0


def test_the_tool_list_reaches_the_prompt(tmp_path):
    out, _ = run_agent(tmp_path, ScriptedEngine(tool_calls=1), n_groups=1, n=1)
    s = samples_of(out)[0]
    prompt = TOK.decode(s.tokens[: len(s.tokens) - s.response_length])
    assert prompt.startswith("tools: [{'type': 'function', 'function': {'name': 'calculator'")


def test_malformed_calls_get_an_error_result_and_are_counted(tmp_path):
    bad = ['<tool_call>{"name": "calculator", "arguments": {"expression": "1+"</tool_call>',  # bad JSON
           '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',  # unknown tool
           '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>',  # wrong argument
           '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": 7}"}</tool_call>',  # wrong type
           "<tool_call>{\"name\": \"calculator\"",  # unterminated (the script ends: EOS)
           "Fine. The answer is \\boxed{1}."]
    out, _ = run_agent(tmp_path, turns_engine(bad), n_groups=1, n=1, max_turns=8, args={"rollout_max_response_len": 2048})
    s = samples_of(out)[0]
    text = TOK.decode(s.tokens)
    assert "tool: Error: the tool call is not valid JSON" in text
    assert "tool: Error: unknown tool 'search'; the tools are ['calculator']" in text
    assert "tool: Error: wrong arguments for calculator: missing 'expression'; unknown 'expr'" in text
    assert "tool: Error: wrong arguments for calculator: 'expression' must be string, got int" in text
    assert "tool: Error: the tool call has no closing </tool_call>" in text
    assert s.status == Sample.Status.COMPLETED and s.metadata["agent"]["malformed_calls"] == 5
    assert out.metrics["agent/malformed_calls"] == 5 and out.metrics["agent/tool_calls"] == 0
    spans_ok(s)


def _tool_error_run(tmp_path, on_tool_error, tool="tests.agent.agent_tools.broken", **kw):
    engine = turns_engine(['<tool_call>{"name": "%s", "arguments": {"expression": "1 + 1"}}</tool_call>'
                           % tool.rsplit(".", 1)[1], "Done."])
    out, _ = run_agent(tmp_path, engine, n_groups=1, n=1, tools=[tool], on_tool_error=on_tool_error,
                       args={"allowed_targets_extra": ["tests."]}, **kw)
    return samples_of(out)[0], out.metrics


def test_a_tool_error_goes_back_as_the_result_or_fails_the_sample(tmp_path):
    s, m = _tool_error_run(tmp_path, "message")
    assert "tool: Error: broken failed: the backend is down" in TOK.decode(s.tokens)
    assert s.status == Sample.Status.COMPLETED and m["agent/tool_errors"] == 1 and m["agent/failed"] == 0
    s, m = _tool_error_run(tmp_path, "fail")
    assert s.status == Sample.Status.FAILED and s.metadata["agent"]["stop"] == "tool_error"
    assert s.metadata["agent"]["error"] == "Error: broken failed: the backend is down"
    assert s.loss_mask == [1] * s.response_length and s.response.endswith("</tool_call>")  # output kept
    assert m["agent/failed"] == 1


def test_a_hanging_tool_times_out_and_the_sample_goes_on(tmp_path):
    s, m = _tool_error_run(tmp_path, "message", tool="tests.agent.agent_tools.hangs", tool_timeout_s=0.2)
    assert "tool: Error: hangs timed out after 0.2 s" in TOK.decode(s.tokens) and s.response.endswith("Done.")
    assert m["agent/tool_timeouts"] == 1 and m["agent/tool_errors"] == 1 and m["agent/tool_latency_mean_s"] >= 0.2


def test_budgets_end_samples_truncated(tmp_path):
    engine = ScriptedEngine(tool_calls=2, max_filler=0)
    # the first call takes 82 byte tokens; a tool turn would leave no room for a model token
    out, _ = run_agent(tmp_path, engine, n_groups=1, n=1, args={"rollout_max_response_len": 95})
    s = samples_of(out)[0]
    assert s.status == Sample.Status.TRUNCATED and s.metadata["agent"]["stop"] == "budget"
    assert s.response_length <= 95 and s.loss_mask == [1] * s.response_length  # the tool turn was not appended
    out, _ = run_agent(tmp_path, engine, n_groups=1, n=1, args={"rollout_max_response_len": 140})
    s = samples_of(out)[0]  # the second model turn is cut at the whole-response budget
    assert s.status == Sample.Status.TRUNCATED and s.response_length == 140 and s.metadata["agent"]["turns"] == 2
    spans_ok(s)
    out, _ = run_agent(tmp_path, engine, n_groups=1, n=1, max_tokens_per_turn=20)
    s = samples_of(out)[0]
    assert s.status == Sample.Status.TRUNCATED and s.metadata["agent"]["stop"] == "turn_cap" and s.response_length == 20
    assert out.metrics["agent/budget_truncated"] == 1


def test_max_turns_stops_before_running_the_last_call(tmp_path):
    out, _ = run_agent(tmp_path, ScriptedEngine(tool_calls=3), n_groups=1, n=1, max_turns=2)
    s = samples_of(out)[0]
    assert s.metadata["agent"]["stop"] == "max_turns" and s.metadata["agent"]["turns"] == 2
    assert s.metadata["agent"]["tool_calls"] == 1 and s.response.endswith("</tool_call>")
    assert s.status == Sample.Status.COMPLETED and out.metrics["agent/max_turns_reached"] == 1


def test_the_concurrency_limit_holds_across_the_rollout_and_tools_overlap(tmp_path):
    agent_tools.reset()
    engine = turns_engine(['<tool_call>{"name": "slow", "arguments": {"expression": "2 + 3"}}</tool_call>', "5."])
    out, _ = run_agent(tmp_path, engine, n_groups=4, n=2, tools=["tests.agent.agent_tools.slow"],
                       max_concurrent_tools=3)
    assert agent_tools.CALLS["slow"] == 8 and agent_tools.RUNNING["max"] == 3
    assert all("tool: 5\n" in TOK.decode(s.tokens) for s in samples_of(out))


def test_tags_format_search_r1_style(tmp_path):
    out, _ = run_agent(tmp_path, ScriptedEngine(tool_calls=1, tool_format="tags"), n_groups=1, n=1, format="tags")
    s = samples_of(out)[0]
    text = TOK.decode(s.tokens)
    assert "</calculator>\n\n<information>" in text and "</information>\n\nThe tool says" in text
    assert not text.startswith("tools:")  # the prompt is the data's own
    spans_ok(s)
    engine = turns_engine(["<search>2 + 3</search>", "It is <answer>5</answer>"])
    out, _ = run_agent(tmp_path, engine, n_groups=1, n=1, format="tags", call_tag="search")
    s = samples_of(out)[0]
    assert s.response == "<search>2 + 3</search>\n\n<information>5</information>\n\nIt is <answer>5</answer>"


def test_abort_mid_turn_then_the_loop_continues_the_sample():
    engine = ScriptedEngine(tool_calls=1, token_delay=0.002, max_filler=0)
    loop = AgentLoop(agent_settings())
    args = make_args()
    sample = Sample(index=0, group_index=0, prompt="What is 3 + 4?")

    async def go():
        ctx = GenContext(engine=engine, tokenizer=TOK, rollout_id=0, agent=loop.run_for(args))
        task = asyncio.create_task(ctx.agent.generate(ctx, args, sample, sampling_params_from_args(args)))
        await asyncio.sleep(0.05)
        ctx.aborted = True
        await engine.abort_all()
        await task
        first = (sample.status, sample.response_length, dict(sample.metadata["agent"]))
        ctx2 = GenContext(engine=engine, tokenizer=TOK, rollout_id=1, agent=loop.run_for(args))
        await ctx2.agent.generate(ctx2, args, sample, sampling_params_from_args(args))
        return first, ctx2

    (status, length, state), ctx2 = asyncio.run(go())
    assert status == Sample.Status.ABORTED and 0 < length and state["stop"] == "aborted" and state["turns"] == 1
    assert sample.status == Sample.Status.COMPLETED and sample.metadata["agent"]["turns"] == 2
    assert ctx2.continued_samples == 1 and sample.response.endswith("\\boxed{7}.")
    spans_ok(sample)


def test_eval_runs_the_loop_and_reports_eval_agent_metrics(tmp_path):
    from agent_helpers import write_questions
    ev = EngineEval(engine=ScriptedEngine(tool_calls=1), tokenizer=TOK, reward=BoxedReward(), progress=False,
                    summary=False, generate="agent", agent=agent_settings(),
                    datasets=[{"name": "q", "prompt_data": str(write_questions(tmp_path / "e.jsonl", 3)),
                               "apply_chat_template": False}])
    out = ev(make_args(), 0)
    assert out.metrics["eval/q"] == 1.0 and out.metrics["eval_agent/tool_calls"] == 3
    assert out.metrics["eval_agent/turns_mean"] == 2.0


def test_deterministic_mode_dumps_byte_identical_samples(tmp_path):
    dumps = []
    for i in range(2):
        engine = ScriptedEngine(tool_calls=2, token_delay_jitter=0.002, correct_rate=0.5)
        out, _ = run_agent(tmp_path, engine, n_groups=3, n=2, deterministic=True, reward=BoxedReward(),
                           args={"rollout_temperature": 1.0})
        write_samples(tmp_path / f"d{i}.jsonl", samples_of(out))
        dumps.append((tmp_path / f"d{i}.jsonl").read_bytes())
    assert dumps[0] == dumps[1] and json.loads(dumps[0].splitlines()[0])["metadata"]["agent"]["turns"] == 3


def test_generate_agent_excludes_a_custom_generate():
    from pipeline.rollout.engine_rollout import EngineRollout
    with pytest.raises(ValueError, match="rollout.generate=agent and rollout.custom_generate_path='x.y' both"):
        EngineRollout(engine=ScriptedEngine(), generate="agent", agent=agent_settings(), custom_generate_path="x.y")
    with pytest.raises(ValueError, match="rollout.generate: expected default or agent, got 'loop'"):
        EngineRollout(engine=ScriptedEngine(), generate="loop")
