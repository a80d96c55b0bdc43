"""A slime-style multi-turn generate written against SGLang's HTTP API only (the shape of slime's
examples/search-r1 generate): it POSTs `text` + stop strings + return_logprob to
`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`, takes tokens and log-probs
from `meta_info.output_token_logprobs`, stops on `finish_reason.type`, and after each turn that
stopped on the tool stop string injects a "retrieved" span with loss mask 0
(`append_response_tokens(trainable=False)`). It knows nothing of this pipeline."""

from __future__ import annotations

import functools

import httpx

from slime.utils.types import Sample

# the observation injected after each tool turn (masked out of the loss)
RETRIEVED = " <information>doc 1: two plus two is four</information> "
# the string that ends a model turn and asks for the "tool"
TOOL_STOP = "."
MAX_TURNS = 3


@functools.lru_cache(maxsize=4)
def _tokenizer(checkpoint: str, scripted: bool):
    """The served model's tokenizer, as slime's GenerateState loads it (the scripted engine
    serves bytes)."""
    if scripted:
        from pipeline.engines.scripted import ByteTokenizer

        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


def tokenizer_for(args):
    engine = getattr(args, "engine", None) or {}
    return _tokenizer(args.hf_checkpoint, str(engine.get("_target_", "")).endswith("ScriptedEngine"))


async def generate(args, sample: Sample, sampling_params) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    tokenizer = tokenizer_for(args)
    prompt = sample.prompt if isinstance(sample.prompt, str) else tokenizer.apply_chat_template(
        sample.prompt, tokenize=False, add_generation_prompt=True)
    sample.tokens = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    stops = list(dict.fromkeys([*(sampling_params.get("stop") or []), TOOL_STOP]))
    params = {**sampling_params, "stop": stops, "no_stop_trim": True}
    response, turns = "", 0
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        for _ in range(MAX_TURNS):
            resp = await client.post(url, json={"text": prompt + response, "sampling_params": params,
                                                "return_logprob": True})
            resp.raise_for_status()
            output = resp.json()
            turns += 1
            meta = output["meta_info"]
            if meta["finish_reason"]["type"] == "abort":
                sample.status = Sample.Status.ABORTED
                return sample
            items = meta["output_token_logprobs"]
            sample.append_response_tokens(args, tokens=[t[1] for t in items], log_probs=[t[0] for t in items],
                                          trainable=True, meta_info=meta, text=output["text"])
            response += output["text"]
            if meta["finish_reason"]["type"] != "stop" or meta["finish_reason"].get("matched") != TOOL_STOP:
                break
            obs = list(tokenizer(RETRIEVED, add_special_tokens=False)["input_ids"])
            sample.append_response_tokens(args, tokens=obs, trainable=False, text=RETRIEVED)
            response += RETRIEVED
    sample.metadata["http_turns"] = turns
    return sample


async def reward(args, sample: Sample) -> float:
    """1 when the sample went through at least one retrieval, else 0."""
    return float(RETRIEVED in sample.response)
