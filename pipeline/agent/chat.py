"""What the tokenizer's chat template does around tool turns, probed once per tokenizer.

The loop never re-renders text the model produced. It needs three things from the template:
- `turn_end`: what the template writes after an assistant message's content (SmolLM2 / Qwen:
  `<|im_end|>\\n`); the part of it the model did not generate itself (it stopped at `</tool_call>`,
  or with its end-of-turn token) closes the model's turn before the tool turn;
- the tool turn: `render(conv + [assistant, tool...], add_generation_prompt=True)` minus
  `render(conv + [assistant])` (SmolLM2: `<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n`;
  Qwen: a user turn holding `<tool_response>...</tool_response>`), which must be a suffix (the
  prefix property), else `ChatTemplateError` says so and names the tags format as the way out;
- `lists_tools`: whether `apply_chat_template(tools=...)` puts the tool schemas in the prompt;
  where it does not (SmolLM2's template ignores them) the loop adds a Hermes-style system block.
The conversation before the assistant turn is a fixed stand-in (a templates' tool-turn wrapping
depends on the turns around it, not on earlier content).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ChatTemplateError", "ChatTurns", "hermes_tools_block", "with_system_block"]

_USER = "Probe question?"
_ANSWER = "PROBE_ASSISTANT_TURN"
_RESULT = "PROBE_TOOL_RESULT"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_name", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot render tool turns as the loop needs."""


def hermes_tools_block(schemas: list[dict[str, Any]]) -> str:
    """The system-prompt text listing `schemas` and the Hermes call syntax."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return ("# Tools\n\nYou may call the functions below. Their signatures, one JSON object per line, are within "
            f"<tools></tools> tags:\n<tools>\n{lines}\n</tools>\n\nTo call a function, reply with a JSON object "
            "holding its name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>')


def with_system_block(messages: list[dict[str, Any]], block: str) -> list[dict[str, Any]]:
    """`messages` with `block` appended to the system message (one is put first when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{block}".lstrip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


class ChatTurns:
    """The chat template's tool-turn behaviour (module docstring), probed at construction."""

    def __init__(self, tokenizer: Any, chat_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("rollout.agent.format=chat_template: the tokenizer has no chat template; use "
                                    "rollout.agent.format=tags")
        base = [{"role": "user", "content": _USER}]
        opened = self.render(base, True)
        closed = self.render(self._conv(_ANSWER), False)
        if not closed.startswith(opened + _ANSWER):
            raise ChatTemplateError(
                "rollout.agent.format=chat_template: the chat template does not render an assistant turn as the "
                "generation prompt followed by the content (the model's tokens could not be kept as generated); "
                "use rollout.agent.format=tags")
        self.turn_end = closed[len(opened) + len(_ANSWER):]
        try:
            probe = self.tool_turn_text([_RESULT], ["probe_tool_name"])
        except ChatTemplateError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template refusing the tool role
            raise ChatTemplateError(f"rollout.agent.format=chat_template: the chat template cannot render a tool "
                                    f"turn ({type(exc).__name__}: {exc}); use rollout.agent.format=tags") from exc
        if _RESULT not in probe:
            raise ChatTemplateError("rollout.agent.format=chat_template: the chat template drops tool results; use "
                                    "rollout.agent.format=tags")
        self.lists_tools = self.render(base, True, [_PROBE_TOOL]) != opened

    def render(self, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any = None) -> str:
        """`apply_chat_template` to text with the run's chat-template keyword arguments."""
        kwargs = dict(self.chat_kwargs)
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **kwargs)

    @staticmethod
    def _conv(answer: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": _USER}, {"role": "assistant", "content": answer}]

    def tool_turn_text(self, results: list[str], names: list[str]) -> str:
        """The template's tool turn(s) for `results` and the next generation prompt."""
        conv = self._conv(_ANSWER)
        closed = self.render(conv, False)
        tools = [{"role": "tool", "name": n, "content": r} for r, n in zip(results, names)]
        full = self.render(conv + tools, True)
        if not full.startswith(closed):
            raise ChatTemplateError(
                "rollout.agent.format=chat_template: the chat template does not render a tool turn as a suffix of "
                "the conversation before it (the prefix property), so tool tokens cannot be appended to the "
                "model's; use rollout.agent.format=tags")
        return full[len(closed):]

    def closing(self, last_token_text: str) -> str:
        """The rest of `turn_end` after the model's last special token (`last_token_text`, "" when the
        model stopped on a stop string rather than with a special end-of-turn token)."""
        if last_token_text and self.turn_end.startswith(last_token_text):
            return self.turn_end[len(last_token_text):]
        return self.turn_end
