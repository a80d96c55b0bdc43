"""The real model through rollout.generate=agent with the calculator (SmolLM2-135M, greedy, a
two-shot prompt that makes it call the tool): each sample's tokens decode to the exact conversation
(model turns as generated, tool turns as the chat template renders them) and the loss mask is 0
exactly on the tool tokens."""

import json

import pytest
from hydra import compose, initialize_config_dir

from pipeline.agent.chat import ChatTurns, hermes_tools_block, with_system_block
from pipeline.agent.tools import tool_from
from pipeline.agent.calculator import calculator
from pipeline.run.app import run
from pipeline.engines.assets import default_cache_dir, load_tokenizer, resolve_checkpoint
from pipeline.sinks.files import read_samples
from test_agent_config import CONF

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
SYSTEM = 'You can call the calculator tool: <tool_call>\n{"name": "calculator", "arguments": {"expression": ...}}\n</tool_call>'


def two_shot(question: str) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    for q, e, r in (("What is 2 + 3?", "2 + 3", "5"), ("What is 7 * 8?", "7 * 8", "56")):
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": CALL % e},
                     {"role": "tool", "content": r}, {"role": "assistant", "content": f"The answer is \\boxed{{{r}}}."}]
    return messages + [{"role": "user", "content": question}]


def test_real_model_conversation_round_trips_with_masks_on_tool_tokens(tmp_path):
    rows = [{"input": two_shot(f"What is {a} + {b}?"), "label": str(a + b)} for a, b in ((17, 25), (40, 13))]
    data = tmp_path / "shots.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={data}", "engine=hf",
                 "engine.num_threads=1", "logger=jsonl", "rollout.progress=false", "rollout.summary=false",
                 "rollout_batch_size=2", "n_samples_per_prompt=1", "num_rollout=1", "rollout_temperature=0",
                 "rollout_max_response_len=80", "data_source.apply_chat_template=false", "data_source.shuffle=false",
                 "rollout.generate=agent", "advantage.rewards_normalization=false"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        metrics = run(compose(config_name="config", overrides=overrides))
    tok = load_tokenizer(resolve_checkpoint("smollm2-135m-instruct", default_cache_dir()))
    turns = ChatTurns(tok)
    samples = sorted(read_samples(tmp_path / "run" / "samples" / "rollout_0.jsonl"), key=lambda s: s.index)
    assert metrics["agent/tool_calls"] >= 1, "the two-shot prompt makes the model call the calculator"
    block = hermes_tools_block([tool_from(calculator).schema])
    called = 0
    for s, row in zip(samples, rows):
        spans = s.metadata["agent"]["spans"]
        assert s.loss_mask == [1 if k == "model" else 0 for k, n in spans for _ in range(n)]
        assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)
        # rebuild the conversation as messages and render it with the chat template
        messages = with_system_block(row["input"], block)
        pos = len(s.tokens) - s.response_length
        prompt_text = turns.render(messages, True)
        assert tok.decode(s.tokens[:pos], skip_special_tokens=False) == prompt_text
        for kind, n in spans:
            ids = s.tokens[pos:pos + n]
            pos += n
            if kind == "model":
                messages.append({"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)})
            else:
                called += 1
                result = tok.decode(ids, skip_special_tokens=False).split("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0]
                messages.append({"role": "tool", "content": result})
                assert result == calculator(json.loads(messages[-2]["content"].split("<tool_call>")[1]
                                                       .split("</tool_call>")[0])["arguments"]["expression"])
        full = turns.render(messages, False)
        text = tok.decode(s.tokens, skip_special_tokens=False)
        last = s.tokens[-1]
        rest = turns.closing(tok.decode([last], skip_special_tokens=False) if last in tok.all_special_ids else "")
        assert text + rest == full, "the tokens decode to the conversation the chat template renders"
    assert called == metrics["agent/tool_calls"]
