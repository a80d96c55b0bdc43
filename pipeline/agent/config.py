"""The settings of the agent loop (`rollout.agent` / `eval.agent`, conf/rollout/engine.yaml).

`AgentConfig.from_mapping(node, where)` checks a config node and names the key and what was
expected on any problem; the defaults live in the YAML, so every key must be present.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

__all__ = ["AgentConfig", "AgentConfigError", "FORMATS", "GENERATE_CHOICES", "ON_TOOL_ERROR"]

# the per-sample generate of the engine rollout and eval (`rollout.generate`)
GENERATE_CHOICES = ("default", "agent")
# tool-call formats: the chat template's (Hermes <tool_call>{json}</tool_call>, tool-role turns)
# or search-r1's tags (<tool>argument</tool> -> <result_tag>...</result_tag>)
FORMATS = ("chat_template", "tags")
# what a tool error does: its text goes back to the model as the tool result, or the sample FAILS
ON_TOOL_ERROR = ("message", "fail")


class AgentConfigError(ValueError):
    """A `rollout.agent` setting is invalid; the message names the key."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class AgentConfig:
    """One agent loop's settings (each documented in conf/rollout/engine.yaml)."""

    format: str
    max_turns: int
    max_tokens_per_turn: int | None
    tools: tuple[Any, ...]
    tool_args: dict[str, dict[str, Any]]
    tools_in_prompt: bool
    stop_at_call: bool
    call_tag: str | None
    result_tag: str
    tool_timeout_s: float
    max_concurrent_tools: int
    retries: int
    retry_on: tuple[str, ...]
    retry_backoff_s: float
    on_tool_error: str
    max_result_chars: int

    @classmethod
    def from_mapping(cls, node: Mapping[str, Any] | None, where: str = "rollout.agent") -> AgentConfig:
        """Check `node` (every key present, no unknown key, each value of its kind)."""
        if not isinstance(node, Mapping):
            raise AgentConfigError(f"{where}: expected a mapping of the agent settings "
                                   f"(conf/rollout/engine.yaml), got {node!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(node) - set(names))
        missing = [n for n in names if n not in node]
        problems = []
        if unknown:
            problems.append(f"{where}: unknown keys {unknown}; expected {names}")
        if missing:
            problems.append(f"{where}: missing keys {missing} (their defaults are in conf/rollout/engine.yaml)")
        if problems:
            raise AgentConfigError("; ".join(problems))
        v = dict(node)
        checks = [
            ("format", v["format"] in FORMATS, f"one of {list(FORMATS)}"),
            ("max_turns", _is_int(v["max_turns"]) and v["max_turns"] >= 1, "an integer >= 1"),
            ("max_tokens_per_turn", v["max_tokens_per_turn"] is None
             or (_is_int(v["max_tokens_per_turn"]) and v["max_tokens_per_turn"] >= 1), "an integer >= 1 or null"),
            ("tools", isinstance(v["tools"], (list, tuple)) and bool(v["tools"])
             and all(isinstance(t, str) and "." in t for t in v["tools"]),
             "a non-empty list of dotted paths like [pipeline.agent.calculator.calculator]"),
            ("tool_args", isinstance(v["tool_args"], Mapping)
             and all(isinstance(a, Mapping) for a in v["tool_args"].values()),
             "a mapping of tool name -> keyword arguments ({} for none)"),
            ("tools_in_prompt", isinstance(v["tools_in_prompt"], bool), "true or false"),
            ("stop_at_call", isinstance(v["stop_at_call"], bool), "true or false"),
            ("call_tag", v["call_tag"] is None or (isinstance(v["call_tag"], str) and v["call_tag"].isidentifier()),
             "null or a tag name such as search"),
            ("result_tag", isinstance(v["result_tag"], str) and v["result_tag"].isidentifier(),
             "a tag name such as information"),
            ("tool_timeout_s", _is_num(v["tool_timeout_s"]) and v["tool_timeout_s"] > 0, "a number of seconds > 0"),
            ("max_concurrent_tools", _is_int(v["max_concurrent_tools"]) and v["max_concurrent_tools"] >= 1,
             "an integer >= 1"),
            ("retries", _is_int(v["retries"]) and v["retries"] >= 0, "an integer >= 0"),
            ("retry_on", isinstance(v["retry_on"], (list, tuple)) and all(isinstance(x, str) and x for x in v["retry_on"]),
             "a list of exception class names like [ConnectionError] ([] for none)"),
            ("retry_backoff_s", _is_num(v["retry_backoff_s"]) and v["retry_backoff_s"] >= 0, "a number of seconds >= 0"),
            ("on_tool_error", v["on_tool_error"] in ON_TOOL_ERROR, f"one of {list(ON_TOOL_ERROR)}"),
            ("max_result_chars", _is_int(v["max_result_chars"]) and v["max_result_chars"] >= 16, "an integer >= 16"),
        ]
        bad = [f"{where}.{key}: expected {what}, got {v[key]!r}" for key, ok, what in checks if not ok]
        if v["call_tag"] is not None and v["format"] == "tags" and isinstance(v["tools"], (list, tuple)) \
                and len(v["tools"]) > 1:
            bad.append(f"{where}.call_tag: {v['call_tag']!r} names the call tag of a single tool, but "
                       f"{len(v['tools'])} tools are configured; set call_tag=null (each tool's tag is its name)")
        if bad:
            raise AgentConfigError("; ".join(bad))
        return cls(**{**v, "tools": tuple(v["tools"]), "retry_on": tuple(v["retry_on"]),
                      "tool_args": {str(k): dict(a) for k, a in v["tool_args"].items()},
                      "tool_timeout_s": float(v["tool_timeout_s"]), "retry_backoff_s": float(v["retry_backoff_s"])})
