"""A scripted engine that acts like a search agent, for running slime's examples/search-r1 against
the SGLang-compatible endpoint: it searches first (`<search>...</search>`) and answers once the
prompt holds retrieved `<information>`; it speaks the served model's own tokenizer, so the token
ids slime's generate gets back are that tokenizer's."""

from __future__ import annotations

import random
from typing import Any

from pipeline.engines.assets import load_tokenizer, resolve_checkpoint
from pipeline.engines.scripted import ScriptedEngine


class SearchScriptEngine(ScriptedEngine):
    """`ScriptedEngine` with a search-agent script and the checkpoint's tokenizer."""

    def __init__(self, hf_checkpoint: str, cache_dir: str | None = None, **kw: Any) -> None:
        super().__init__(tokenizer=load_tokenizer(resolve_checkpoint(hf_checkpoint, cache_dir)), **kw)
        self.hf_checkpoint, self.cache_dir = hf_checkpoint, cache_dir

    def script_for(self, prompt_text: str, rng: random.Random) -> str:
        """Search until something was retrieved, then answer with what the documents say."""
        turn = prompt_text.rsplit("<|im_start|>assistant", 1)[-1]  # the instructions name the tags too
        if "<information>" not in turn:
            return " <think>I should look this up.</think>\n<search>capital of France</search> and more"
        return " <think>The documents say Paris.</think>\n<answer>Paris</answer> trailing"
