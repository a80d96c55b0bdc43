"""Rollout functions: `fn(args, rollout_id, data_source, evaluation=False)` returning the groups
of samples (or `RolloutFnTrainOutput(samples, metrics)`).

slime form:   rollout=function rollout.path=examples.rollout.oracle_rollout
native form:  rollout=sequential   (examples/conf/rollout/sequential.yaml): a class that gets
              the engine and the reward injected
"""

from __future__ import annotations

from typing import Any

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.rollout.async_loop import run_sync
from pipeline.rollout.contracts import RolloutFnTrainOutput
from pipeline.samples.sample import Sample

__all__ = ["SequentialRollout", "oracle_rollout"]


def oracle_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
    """slime signature, no engine: answers each prompt from its label for every other sample
    (a stand-in for a teacher / a cached generation); the reward is set here, so no reward
    function runs. Tokens are UTF-8 bytes (a real one would load `args.hf_checkpoint`'s tokenizer)."""
    if evaluation:
        raise NotImplementedError("oracle_rollout has no eval branch; use eval=engine")
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for i, sample in enumerate(group):
            right = i % 2 == 0
            text = f"The answer is \\boxed{{{sample.label if right else 'unknown'}}}."
            prompt_ids = list(str(sample.prompt).encode())
            response_ids = list(text.encode())[: args.rollout_max_response_len]
            sample.tokens = prompt_ids
            sample.append_response_tokens(tokens=response_ids, text=text,
                                          meta_info={"finish_reason": {"type": "stop"}})
            sample.reward = 1.0 if right else 0.0
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout/oracle_fraction": 0.5})


class SequentialRollout:
    """A minimal native rollout: one request at a time through the injected engine, scored by
    the injected reward (no over-sampling, no dynamic filter, no abort)."""

    def __init__(self, engine: Any, reward: Any, temperature: float = 1.0, max_new_tokens: int | None = None) -> None:
        self.engine = engine
        self.reward = reward
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens

    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
        """Generate and score `rollout_batch_size` groups."""
        if evaluation:
            raise NotImplementedError("SequentialRollout has no eval branch; use eval=engine")
        groups = data_source.get_samples(args.rollout_batch_size)
        tokens = run_sync(self._generate(args, groups))
        return RolloutFnTrainOutput(samples=groups, metrics={"rollout/sequential_tokens": tokens})

    async def _generate(self, args: Any, groups: list[list[Sample]]) -> int:
        tokenizer = self.engine.tokenizer
        sampling = SamplingParams(temperature=self.temperature,
                                  max_new_tokens=self.max_new_tokens or args.rollout_max_response_len)
        total = 0
        for group in groups:
            for sample in group:
                sample.tokens = tokenizer.encode(str(sample.prompt))
                result = await self.engine.generate(GenerationRequest(
                    request_id=f"{group[0].group_index}-{sample.index}", input_ids=list(sample.tokens),
                    sampling=sampling))
                sample.append_response_tokens(tokens=result.output_ids, log_probs=result.log_probs, text=result.text,
                                              meta_info={"finish_reason": {"type": result.finish_reason}})
                total += len(result.output_ids)
            for sample, reward in zip(group, await self.reward.score(args, group)):
                sample.reward = reward
        return total
