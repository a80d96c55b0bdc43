"""One real rollout with the hf engine and the bundled model: real text, real rewards, partial
rollout continued on the real engine (tiny: 2 groups x 2 samples, 16 tokens)."""

from __future__ import annotations

import pytest

from pipeline.data.sources import BufferedDataSource
from pipeline.engines.assets import default_cache_dir, resolve_checkpoint
from pipeline.engines.hf import HFEngine
from pipeline.rewards.dispatch import RewardDispatcher
from pipeline.rollout.engine_rollout import EngineRollout
from pipeline.samples.sample import Sample

from rollout_helpers import make_args, write_prompts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def cut_to_partial(group: list[Sample], tok) -> None:
    """Turn a carried completed group into an aborted one with 3 response tokens each."""
    for s in group:
        drop = s.response_length - 3
        s.tokens = s.tokens[: len(s.tokens) - drop]
        s.response_length = 3
        s.loss_mask = s.loss_mask[:3]
        s.rollout_log_probs = s.rollout_log_probs[:3]
        s.response = tok.decode(s.tokens[-3:], skip_special_tokens=True)
        s.status = Sample.Status.ABORTED
        s.reward = None


def test_hf_rollout_end_to_end_with_partial_continuation(tmp_path):
    import torch

    threads = torch.get_num_threads()  # the engine sets it process-wide; restored below
    path = resolve_checkpoint("smollm2-135m-instruct", default_cache_dir())
    # 1 thread: on the shared, oversubscribed CI cores 2 OpenMP threads are several times slower
    engine = HFEngine(path, num_threads=1, max_batch_size=8)
    try:
        engine.start()
        tok = engine.tokenizer
        src = BufferedDataSource(prompt_data=str(write_prompts(tmp_path / "p.jsonl", 16)), n_samples_per_prompt=2,
                                 shuffle=False, label_key="label", apply_chat_template=True, tokenizer=tok)
        rollout = EngineRollout(engine=engine, reward=RewardDispatcher(rm_type="math"), progress=False)
        args = make_args(rollout_batch_size=1, n_samples_per_prompt=2, over_sampling_batch_size=2,
                         rollout_max_response_len=16, partial_rollout=True, rm_type="math",
                         custom_rm_path=None)
        out = rollout(args, 0, src)
        assert len(out.samples) == 1
        for group in out.samples:
            for s in group:
                assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
                assert s.response.strip() and s.response_length > 0
                assert s.tokens[-s.response_length:] and len(s.rollout_log_probs) == s.response_length
                assert tok.decode(s.tokens[-s.response_length:], skip_special_tokens=True).strip() == s.response.strip()
                assert s.reward in (0, 1, 0.0, 1.0)
        m = out.metrics
        assert m["rollout/tokens_generated"] > 0
        assert m["rollout/aborted_groups_to_buffer"] + m["rollout/surplus_groups_carried"] == 1
        if not any(s.status == Sample.Status.ABORTED and s.response_length for g in src.buffer for s in g):
            cut_to_partial(src.buffer[0], tok)  # every group finished before the abort landed
        partial = {s.index: (list(s.tokens), s.response_length)
                   for g in src.buffer for s in g if s.status == Sample.Status.ABORTED and s.response_length}
        out1 = rollout(args, 1, src)
        assert partial and out1.metrics["rollout/continued_samples"] == len(partial)
        got = {s.index: s for g in out1.samples for s in g}
        for idx, (tokens, rlen) in partial.items():
            assert got[idx].tokens[: len(tokens)] == tokens, "continued on the real engine, not restarted"
            assert got[idx].response_length <= 16
    finally:
        engine.close()
        torch.set_num_threads(threads)
