"""Tool-call formats: how calls are read from a model turn and how results go back.

- `chat_template` (`HermesFormat`): calls are `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  (Hermes / Qwen); the tools are listed in the prompt through `apply_chat_template(tools=...)` (or a
  Hermes system block where the template ignores them); each result is a `tool`-role message
  rendered by the chat template (`pipeline.agent.chat.ChatTurns`).
- `tags` (`TagsFormat`, search-r1's): a call is `<name>argument</name>` (the tag is the tool's
  name, or `call_tag` for a single tool) and the result follows inline as
  `\\n\\n<result_tag>...</result_tag>\\n\\n` in the same assistant turn; the prompt is left as
  the data gives it (it describes the tags).
A call that cannot run (bad JSON, an unknown tool, arguments that do not fit, an unterminated
call) becomes a `ToolCall` with `error` set: its message is the model's tool result.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.agent.chat import ChatTurns, hermes_tools_block, with_system_block
from pipeline.agent.tools import ToolRegistry, check_arguments

__all__ = ["HermesFormat", "TagsFormat", "ToolCall", "make_format"]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """One call read from a model turn; `error` (the model's tool result) when it cannot run."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _checked(registry: ToolRegistry, name: Any, arguments: Any) -> ToolCall:
    if not isinstance(name, str) or name not in registry.tools:
        return ToolCall(str(name), error=f"Error: unknown tool {name!r}; the tools are {sorted(registry.tools)}")
    problem = check_arguments(registry.tools[name], arguments)
    if problem:
        return ToolCall(name, error=f"Error: wrong arguments for {name}: {problem}")
    return ToolCall(name, dict(arguments))


class HermesFormat:
    """The chat template's tool format (module docstring)."""

    name = "chat_template"

    def __init__(self, registry: ToolRegistry, tokenizer: Any, chat_kwargs: dict[str, Any], tools_in_prompt: bool,
                 stop_at_call: bool) -> None:
        self.registry = registry
        self.tokenizer = tokenizer
        self.turns = ChatTurns(tokenizer, chat_kwargs)
        self.tools_in_prompt = tools_in_prompt
        self.stop = ("</tool_call>",) if stop_at_call else ()

    def prompt_text(self, prompt: Any, row_tools: Any) -> str | None:
        """The prompt rendered with the tools listed (None: keep the sample's own tokens)."""
        if not self.tools_in_prompt:
            return None
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        schemas = self.registry.schemas + [t for t in (row_tools or []) if isinstance(t, dict)]
        if self.turns.lists_tools:
            return self.turns.render(messages, True, schemas)
        return self.turns.render(with_system_block(messages, hermes_tools_block(schemas)), True)

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in one model turn's text, in order."""
        calls = []
        for body in _HERMES.findall(text):
            try:
                data = json.loads(body.strip())
            except json.JSONDecodeError as exc:
                calls.append(ToolCall("?", error=f"Error: the tool call is not valid JSON ({exc.msg} at character "
                                                  f"{exc.pos}); write <tool_call>{{\"name\": ..., \"arguments\": "
                                                  f"{{...}}}}</tool_call>"))
                continue
            if not isinstance(data, dict) or "name" not in data:
                calls.append(ToolCall("?", error='Error: a tool call must be a JSON object with "name" and '
                                                 '"arguments"'))
                continue
            arguments = data.get("arguments", data.get("parameters", {}))
            if isinstance(arguments, str):  # some models send the arguments as JSON text
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            calls.append(_checked(self.registry, data["name"], arguments))
        tail = text.rsplit("</tool_call>", 1)[-1]
        if "<tool_call>" in tail:
            calls.append(ToolCall("?", error="Error: the tool call has no closing </tool_call>"))
        return calls

    def result_text(self, last_token_text: str, results: list[str], names: list[str]) -> str:
        """The text appended after the model's turn: its closing, the tool turn(s), the next prompt."""
        return self.turns.closing(last_token_text) + self.turns.tool_turn_text(results, names)


class TagsFormat:
    """search-r1's tag format (module docstring)."""

    name = "tags"

    def __init__(self, registry: ToolRegistry, call_tag: str | None, result_tag: str, stop_at_call: bool) -> None:
        self.registry = registry
        self.result_tag = result_tag
        for tool in registry.tools.values():
            if tool.first_param is None:
                raise ValueError(f"rollout.agent.format=tags: tool {tool.name!r} takes no parameter for the tag's "
                                 f"content")
        self.tags = {call_tag: next(iter(registry.tools))} if call_tag else {n: n for n in registry.tools}
        names = "|".join(re.escape(t) for t in self.tags)
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.DOTALL)
        self._open = re.compile(rf"<({names})>")
        self.stop = tuple(f"</{t}>" for t in self.tags) if stop_at_call else ()

    def prompt_text(self, prompt: Any, row_tools: Any) -> str | None:
        """None: the prompt keeps the data's own text (it describes the tags)."""
        return None

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in one model turn's text, in order."""
        calls = []
        end = 0
        for m in self._call.finditer(text):
            tool = self.registry.tools[self.tags[m.group(1)]]
            calls.append(_checked(self.registry, tool.name, {tool.first_param: m.group(2).strip()}))
            end = m.end()
        m = self._open.search(text, end)
        if m:
            calls.append(ToolCall(m.group(1), error=f"Error: <{m.group(1)}> has no closing </{m.group(1)}>"))
        return calls

    def result_text(self, last_token_text: str, results: list[str], names: list[str]) -> str:
        """The results inline, each within the result tag."""
        tag = self.result_tag
        return "".join(f"\n\n<{tag}>{r}</{tag}>\n\n" for r in results)


def make_format(config: Any, registry: ToolRegistry, tokenizer: Any, chat_kwargs: dict[str, Any]) -> Any:
    """The format object `config.format` names."""
    if config.format == "chat_template":
        return HermesFormat(registry, tokenizer, chat_kwargs, config.tools_in_prompt, config.stop_at_call)
    return TagsFormat(registry, config.call_tag, config.result_tag, config.stop_at_call)
