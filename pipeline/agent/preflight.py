"""Pre-flight rules of the agent loop: `rollout.generate` / `eval.generate` and their `agent` block.

Checked before anything heavy starts: the generate choice, the settings (`AgentConfig`), that a
custom generate is not also set, every tool importing through the allowlist with a usable
signature (a tool class is built with its `tool_args`), the tag format's tools taking an
argument, and that `format: chat_template` with `tools_in_prompt` gets raw prompts (the loop
renders them with the tool list; a prompt the data source already templated cannot get it).
"""

from __future__ import annotations

from typing import Any

from pipeline.agent.config import GENERATE_CHOICES, AgentConfig, AgentConfigError
from pipeline.agent.tools import load_tools

__all__ = ["agent_problems"]


def _allowed(cfg: dict[str, Any]) -> list[str]:
    return [x for key in ("allowed_targets", "allowed_targets_extra")
            for x in (cfg.get(key) if isinstance(cfg.get(key), list) else [])]


def _templated(cfg: dict[str, Any], group: str, node: dict[str, Any]) -> str | None:
    """The key that makes the data source render prompts with the chat template (None: none)."""
    ds = cfg.get("data_source")
    default = ds.get("apply_chat_template") if isinstance(ds, dict) else None
    if group == "rollout":
        return "data_source.apply_chat_template" if default is True else None
    for i, d in enumerate(node.get("datasets") or []):
        value = d.get("apply_chat_template") if isinstance(d, dict) else None
        if value is True or (value is None and default is True):
            return f"eval.datasets[{i}].apply_chat_template" if value is True else "data_source.apply_chat_template"
    return None


def _group_problems(cfg: dict[str, Any], group: str, node: dict[str, Any]) -> list[str]:
    choice = node["generate"]
    if choice not in GENERATE_CHOICES:
        return [f"{group}.generate: expected one of {list(GENERATE_CHOICES)}, got {choice!r}"]
    if choice != "agent":
        return []
    out = []
    if node.get("custom_generate_path"):
        out.append(f"{group}.generate=agent and {group}.custom_generate_path={node['custom_generate_path']!r} both "
                   f"name the per-sample generate; keep one (a custom generate may wrap the loop by calling "
                   f"pipeline.rollout.sample_generate.generate)")
    try:
        config = AgentConfig.from_mapping(node.get("agent"), f"{group}.agent")
    except AgentConfigError as exc:
        return out + [str(exc)]
    try:
        tools = load_tools(config.tools, config.tool_args, _allowed(cfg), f"{group}.agent.tools")
    except (ValueError, ImportError) as exc:
        return out + [str(exc)]
    if config.format == "tags":
        out += [f"{group}.agent.tools: {t.name!r} takes no parameter, but format=tags passes the tag's content"
                for t in tools if t.first_param is None]
    elif config.tools_in_prompt:
        key = _templated(cfg, group, node)
        if key is not None:
            out.append(f"{group}.agent: format=chat_template with tools_in_prompt=true renders each prompt with the "
                       f"tool list itself, but {key}=true hands it prompts already rendered by the chat template; set "
                       f"{key}=false (the loop applies the template), or {group}.agent.tools_in_prompt=false when "
                       f"the prompts list the tools themselves")
    return out


def agent_problems(cfg: dict[str, Any]) -> list[str]:
    """Every problem with the agent settings of the rollout and eval nodes of the resolved `cfg`."""
    out: list[str] = []
    for group in ("rollout", "eval"):
        node = cfg.get(group)
        if isinstance(node, dict) and "generate" in node:
            out += _group_problems(cfg, group, node)
    return out
