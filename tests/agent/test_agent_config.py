"""rollout.generate=agent from the command line: pre-flight names each bad key before anything
starts, and a whole run (scripted engine) logs agent/* metrics and dumps multi-turn samples."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.agent.config import AgentConfig, AgentConfigError
from pipeline.run.app import run
from pipeline.config.args import ConfigError, validate
from pipeline.sinks.files import read_samples
from agent_helpers import agent_settings, write_questions

CONF = Path(__file__).resolve().parents[2] / "conf"
RAW = "data_source.apply_chat_template=false"


def cfg(tmp_path, *extra):
    data = write_questions(tmp_path / "q.jsonl", 12)
    overrides = [f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={data}", "engine=scripted",
                 "logger=jsonl", "rollout.progress=false", "rollout.summary=false", "rollout_batch_size=2",
                 "n_samples_per_prompt=2", "num_rollout=1", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("extra, message", [
    (["rollout.generate=agent"], "rollout.agent: format=chat_template with tools_in_prompt=true renders each prompt "
                                 "with the tool list itself, but data_source.apply_chat_template=true"),
    (["rollout.generate=loop"], r"rollout.generate: expected one of \['default', 'agent'\], got 'loop'"),
    (["rollout.generate=agent", RAW, "rollout.custom_generate_path=tests.plugins.slime_plugins.generate_rollout",
      "allowed_targets_extra=[tests.]"], "rollout.generate=agent and rollout.custom_generate_path=.* both"),
    (["rollout.generate=agent", RAW, "rollout.agent.format=xml"], r"rollout.agent.format: expected one of"),
    (["rollout.generate=agent", RAW, "rollout.agent.max_turns=0"], "rollout.agent.max_turns: expected an integer >= 1"),
    (["rollout.generate=agent", RAW, "rollout.agent.on_tool_error=ignore"], "rollout.agent.on_tool_error: expected"),
    (["rollout.generate=agent", RAW, "rollout.agent.tools=[os.system]"], r"target 'os.system' is not allowed"),
    (["rollout.generate=agent", RAW, "rollout.agent.tools=[pipeline.agent.nothing.here]"],
     r"rollout.agent.tools\[0\] .*cannot import 'pipeline.agent.nothing.here'"),
    (["rollout.generate=agent", RAW, "rollout.agent.tools=[pipeline.agent.sandbox.PythonTool]",
      "rollout.agent.tool_args.python.network=wifi"], "tool_args.python.network: expected one of"),
    (["rollout.generate=agent", "rollout.agent.format=tags", "rollout.agent.call_tag=search",
      "rollout.agent.tools=[pipeline.agent.calculator.calculator,pipeline.agent.sandbox.PythonTool]"],
     "rollout.agent.call_tag: 'search' names the call tag of a single tool"),
    (["rollout.generate=agent", RAW, "eval=engine", "eval_interval=1", "+eval.datasets.0.apply_chat_template=true"],
     "eval.agent: format=chat_template .* but eval.datasets\\[0\\].apply_chat_template=true"),
    (["rollout.generate=agent", RAW], None),
    (["rollout.generate=agent", "rollout.agent.format=tags"], None),
    (["rollout.generate=agent", RAW, "rollout.agent.tools=[pipeline.agent.sandbox.PythonTool]"], None),
])
def test_preflight_names_the_key(tmp_path, extra, message):
    if message is None:
        validate(cfg(tmp_path, *extra))
        return
    with pytest.raises(ConfigError, match=message):
        validate(cfg(tmp_path, *extra))


def test_every_key_is_required_and_unknown_ones_are_refused():
    with pytest.raises(AgentConfigError, match=r"rollout.agent: unknown keys \['turns'\].*missing keys \['max_turns'\]"):
        AgentConfig.from_mapping({**{k: v for k, v in agent_settings().items() if k != "max_turns"}, "turns": 2})
    assert AgentConfig.from_mapping(agent_settings()).max_turns == 4


def test_a_run_with_the_agent_logs_its_metrics_and_dumps_multi_turn_samples(tmp_path, caplog):
    caplog.set_level("INFO", logger="pipeline.progress")
    last = run(cfg(tmp_path, "rollout.generate=agent", RAW, "engine.tool_calls=1", "rollout_max_response_len=400"))
    assert last["agent/tool_calls"] == 4 and last["agent/turns_mean"] == 2.0 and last["agent/tool_errors"] == 0
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["agent/tool_calls"] == 4 and 0 < row["agent/tool_token_share"] < 1
    samples = read_samples(tmp_path / "run" / "samples" / "rollout_0.jsonl")
    for s in samples:
        spans = s.metadata["agent"]["spans"]
        assert [k for k, _ in spans] == ["model", "tool", "model"]
        assert s.loss_mask == [1] * spans[0][1] + [0] * spans[1][1] + [1] * spans[2][1]
    line = next(m for m in caplog.messages if m.startswith("rollout 0"))
    assert "| turns 2.00 | tools 4 | tool errs 0+0" in line
