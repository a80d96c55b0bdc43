"""slime's rollout sample hooks (`rollout_sample_hook_path`): per-sample post-processing.

Each hook is `fn(args, sample[, rollout_id=..., evaluation=...]) -> Sample | None`, sync or
async; the keywords are passed only when the hook names them (or takes `**kwargs`). The default
rollout and eval run every hook, in the configured order, on each sample they generated, right
after generation and before its reward; a fan-out (a list of samples) keeps its shape and each of
its samples goes through the hooks. A hook edits the sample in place (returns None) or returns the
Sample that replaces it; anything else is an error naming the hook.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from pipeline.config.plugins import accepted_keywords
from pipeline.rollout.contracts import PluginOutputError, is_sample_like

__all__ = ["SampleHooks"]

_KEYWORDS = ("rollout_id", "evaluation")


class SampleHooks:
    """The configured hooks, as (dotted path, function) pairs in call order."""

    def __init__(self, hooks: list[tuple[str, Callable[..., Any]]] | None = None) -> None:
        self.hooks = [(path, fn, accepted_keywords(fn, _KEYWORDS)) for path, fn in (hooks or [])]

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def __len__(self) -> int:
        return len(self.hooks)

    async def apply(self, args: Any, value: Any, *, rollout_id: int, evaluation: bool) -> Any:
        """Run every hook on each sample of `value` (a Sample or a list of them, nested lists
        kept); returns `value` with replaced samples in place of the originals."""
        if isinstance(value, list):
            return [await self.apply(args, item, rollout_id=rollout_id, evaluation=evaluation) for item in value]
        if not is_sample_like(value):
            raise PluginOutputError(f"rollout sample hooks: expected a Sample or a list, got {type(value).__name__}")
        sample = value
        given = {"rollout_id": rollout_id, "evaluation": evaluation}
        for path, fn, keywords in self.hooks:
            try:
                result = fn(args, sample, **{k: given[k] for k in keywords})
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                exc.add_note(f"raised by the rollout sample hook {path!r} (rollout_sample_hook_path) on "
                             f"sample {getattr(sample, 'index', '?')}")
                raise
            if result is None:
                continue
            if not is_sample_like(result):
                raise PluginOutputError(
                    f"rollout sample hook {path!r} returned {type(result).__name__}; expected None (the "
                    f"sample edited in place) or the Sample that replaces it")
            sample = result
        return sample
