"""Built-in rollouts of this package: sft, replay; the shipped dynamic filters."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.engines.scripted import ByteTokenizer
from pipeline.rollout.contracts import as_filter_output
from pipeline.rollout.dynamic_filters import check_reward_nonzero_std, check_reward_nonzero_std_with_fallback
from pipeline.rollout.replay import ReplayRollout
from pipeline.rollout.sft import SftRollout, tokens_and_loss_mask
from pipeline.samples.sample import Sample
from pipeline.sinks.files import write_samples

ARGS = SimpleNamespace(reward_key=None, rollout_batch_size=2, n_samples_per_prompt=1)


class ListSource:
    """get_samples over fixed prompts, one sample per group."""

    def __init__(self, prompts):
        self.prompts, self.pos = prompts, 0

    def get_samples(self, n):
        out = []
        for _ in range(n):
            out.append([Sample(group_index=self.pos, index=self.pos, prompt=self.prompts[self.pos], metadata={})])
            self.pos += 1
        return out


def test_loss_mask_covers_assistant_content_only():
    tok = ByteTokenizer()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2!"}]
    tokens, mask = tokens_and_loss_mask(tok, msgs)
    full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert tok.decode(tokens) == full
    trained = "".join(chr(t) for t, m in zip(tokens, mask) if m)
    assert trained == "A1A2!"


def test_sft_rollout_fills_tokens_mask_reward():
    tok = ByteTokenizer()
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "z"}]
    out = SftRollout(tokenizer=tok)(ARGS, 0, ListSource([conv, conv[:2]]))
    (s0,), (s1,) = out.samples
    assert s1.response == "yo" and s1.loss_mask == [1, 1] and s1.reward == 0
    assert s0.response_length == len(s0.loss_mask) and s0.loss_mask[0] == 1 and s0.loss_mask[-1] == 1
    assert "".join(chr(t) for t, m in zip(s0.tokens[-s0.response_length:], s0.loss_mask) if m) == "yoz"
    with pytest.raises(ValueError, match="expected a message list"):
        SftRollout(tokenizer=tok)(ARGS, 0, ListSource(["plain text", "x"]))
    with pytest.raises(ValueError, match="no assistant message"):
        SftRollout(tokenizer=tok)(ARGS, 0, ListSource([conv[:1], conv[:1]]))


def test_replay_regroups_dumped_samples(tmp_path):
    s = [Sample(group_index=i // 2, index=i, prompt=f"q{i // 2}", reward=float(i % 2)) for i in range(4)]
    write_samples(tmp_path / "samples" / "rollout_1.jsonl", s)
    out = ReplayRollout(source_dir=str(tmp_path))(ARGS, 1, None)
    assert out.samples == [s[:2], s[2:]]
    assert ReplayRollout(source_dir=str(tmp_path), offset=1)(ARGS, 0, None).samples == [s[:2], s[2:]]
    with pytest.raises(FileNotFoundError, match="rollout_5.jsonl"):
        ReplayRollout(source_dir=str(tmp_path))(ARGS, 5, None)
    with pytest.raises(ValueError, match="rollout.source_dir"):
        ReplayRollout(source_dir=None)
    # JSON only on the load path
    assert json.loads((tmp_path / "samples" / "rollout_1.jsonl").read_text().splitlines()[0])["index"] == 0


def test_nonzero_std_filter():
    def group(*rewards):
        return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]

    assert check_reward_nonzero_std(ARGS, group(1, 0)).keep is True
    out = check_reward_nonzero_std(ARGS, group(1, 1, 1))
    assert (out.keep, out.reason, out.keep_when_insufficient) == (False, "zero_std_1.0", False)
    assert check_reward_nonzero_std(ARGS, group(0.04, 0.04)).reason == "zero_std_0.0"
    # FIX: one sample per group is kept (slime's NaN std dropped everything forever)
    assert check_reward_nonzero_std(ARGS, group(1)).keep is True
    fb = as_filter_output(check_reward_nonzero_std_with_fallback(ARGS, group(0, 0)), "t")
    assert (fb.keep, fb.reason, fb.keep_when_insufficient) == (False, "zero_std_0.0", True)
