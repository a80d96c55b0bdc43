"""The policy-gradient trainer as one worker of N (pipeline/train/policy_gradient.py with a
`Parallel` other than the one-process one): the empty micro-batches a worker runs to its peers'
count add nothing, an empty micro-batch carries the optional tensors of the real ones, FSDP2's
gathered parameters go after the old log-probs, the one-process refusals, and the in-process
trainer resuming a sharded (distributed) state. Fast: these run per mutant of policy_gradient.py
(scripts/mutation.py); tests/train/test_distributed_fast.py has the strategy and shards themselves."""

from __future__ import annotations

import contextlib
import copy
import json
import re

import pytest
import torch
import torch.distributed as dist

from pipeline.config.args import SlimeArgs
from pipeline.train.distributed import shards
from pipeline.train.parallel import Parallel
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.state import FORMAT_VERSION, rng_state
from test_distributed_fast import built, keys, max_diff, one_rank, plain  # the one-rank trainer builders
from trainer_fixtures import group, tiny_llama, train_data  # noqa: F401 (group: a fixture)

torch.set_num_threads(1)

pytestmark = pytest.mark.timeout(60)

CPU = torch.device("cpu")


def exactly(message: str) -> str:
    """A pytest.raises pattern of the whole message (re.search would accept any text around it)."""
    return f"^{re.escape(message)}$"


def snapshot(model, lora: bool) -> dict:
    return {k: v.clone() for k, v in shards.full_weights(model, lora).items()}


class PeerParallel(Parallel):  # not LocalParallel: the trainer asks it what its peers need
    """This process as one worker of a group whose other worker runs `peer_count` micro-batches
    (with `shared`: `peer_passes` response passes in each) and adds nothing to the normalisers.
    `_plan` asks `most` for the micro-batch count, then (shared) for the passes of each."""

    def __init__(self, peer_count: int, peer_passes: int = 0, shared: bool = False):
        self.peer_count, self.peer_passes, self.shared = peer_count, peer_passes, shared
        self._passes_next = False
        self.asked, self.syncs = [], []

    @contextlib.contextmanager
    def micro_batch_sync(self, last: bool):
        self.syncs.append(last)
        yield

    def most(self, values):
        self.asked.append(list(values))
        if self._passes_next:
            self._passes_next = False
            return [max(int(v), self.peer_passes) for v in values]
        self._passes_next = self.shared
        (count,) = values
        return [max(int(count), self.peer_count)]


@pytest.mark.parametrize("shared", [True, False])
def test_a_worker_runs_empty_micro_batches_to_its_peers_count_and_they_add_nothing(shared):
    base = tiny_llama()
    t = PolicyGradientTrainer(model=copy.deepcopy(base), parallel=PeerParallel(4, 3, shared),
                              **keys(share_prompt_forward=shared))
    reference = plain(base, share_prompt_forward=shared)
    forwards = []
    t.model.register_forward_hook(lambda *_: forwards.append(1))
    prepared, expected = t.prepare(train_data()), reference.prepare(train_data())
    # micro-batches of 2: 2 of its own and 2 empty ones the peer's count asks for
    per_call = 1 + 3 if shared else 1  # the shared pass: a prompt pass, then the peer's 3 response passes
    assert len(forwards) == 4 * per_call
    assert all(torch.equal(x, y) for x, y in zip(prepared.old_log_probs, expected.old_log_probs))
    forwards.clear()
    t.optimizer.zero_grad(set_to_none=True)
    reference.optimizer.zero_grad(set_to_none=True)
    metrics = t.accumulate(prepared, [0, 1, 2, 3], backward=True)
    assert len(forwards) == 4 * per_call
    assert metrics == pytest.approx(reference.accumulate(expected, [0, 1, 2, 3], backward=True), rel=1e-12)
    for (name, p), q in zip(t.model.named_parameters(), reference.model.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-14), name


def test_an_empty_share_of_a_step_still_runs_its_peers_micro_batches_and_changes_nothing():
    base = tiny_llama()
    t = PolicyGradientTrainer(model=copy.deepcopy(base), parallel=PeerParallel(1),
                              **keys(share_prompt_forward=False, weight_decay=0.1))
    forwards = []
    t.model.register_forward_hook(lambda *_: forwards.append(1))
    before = {k: v.clone() for k, v in t.weights_for_engine().items()}
    metrics = t.train(0, train_data(), steps=[[]])
    # old log-probs of its 4 samples (2 micro-batches), then no micro-batch of its own in the
    # step: one empty one for the peer; no gradient, so AdamW's decay is the only change, and no
    # metric but the step's own is counted
    assert len(forwards) == 2 + 1 and t.optimizer_step == 1 and t.weight_version == 1
    assert set(metrics) == {"train/grad_norm", "train/lr", "perf/train_time", "perf/train_tokens_per_sec"}
    assert metrics["train/grad_norm"] == 0.0
    after = t.weights_for_engine()
    assert all(torch.allclose(after[k], before[k] * (1 - 1e-2 * 0.1), rtol=1e-12, atol=0) for k in before)


@pytest.mark.parametrize("kl,rollout", [(False, True), (True, False)])
def test_an_empty_micro_batch_carries_the_optional_tensors_of_the_real_ones(kl, rollout):
    from pipeline.train.prepared import empty_micro_batch

    t = plain(tiny_llama(), use_kl_loss=kl)
    prepared = t.prepare(train_data(with_rollout_log_probs=rollout))
    batch, tokens = empty_micro_batch(prepared, CPU)
    assert [x.tolist() for x in tokens] == [[0, 0]] and tokens[0].dtype == torch.long
    assert (batch.response_lengths, batch.total_lengths) == ([1], [2])
    zero = [[0.0]]
    assert [x.tolist() for x in batch.loss_masks] == zero == [x.tolist() for x in batch.advantages]
    assert [x.tolist() for x in batch.old_log_probs] == zero and batch.loss_masks[0].dtype == torch.float32
    assert (batch.ref_log_probs is None) != kl and (batch.rollout_log_probs is None) != rollout
    if kl:
        assert [x.tolist() for x in batch.ref_log_probs] == zero
    if rollout:
        assert [x.tolist() for x in batch.rollout_log_probs] == zero


def test_fsdp2_old_log_probs_let_the_gathered_parameters_go(group):
    t = one_rank(tiny_llama(torch.float32), "fsdp2", {"reshard_after_forward": False}, use_kl_loss=True)
    t.prepare(train_data(), first_step=[0])
    assert all(type(q).__name__ == "DTensor" for q in t.model.parameters())


def test_the_one_process_trainer_refuses_workers_and_fsdp2_precision():
    with pytest.raises(ValueError, match=exactly(
            "trainer.num_workers=2: this class trains in one process; N workers are built by _target_: "
            "pipeline.train.build.policy_gradient_trainer (the default of trainer=policy_gradient)")):
        PolicyGradientTrainer(model=tiny_llama(), **keys(num_workers=2))
    with pytest.raises(ValueError, match=exactly(
            "trainer.param_dtype=bfloat16: FSDP2's mixed precision needs trainer.num_workers > 1 and "
            "trainer.strategy=fsdp2; in one process use trainer.bf16=true (autocast)")):
        PolicyGradientTrainer(model=tiny_llama(), **keys(param_dtype="bfloat16"))
    # on a process group both are the group's business
    PolicyGradientTrainer(model=tiny_llama(), parallel=PeerParallel(0), **keys(num_workers=2,
                                                                               param_dtype="bfloat16"))




def test_the_in_process_trainer_loads_a_sharded_state(group, tmp_path):
    base = tiny_llama(torch.float32)
    t = one_rank(base, "fsdp2", lr_warmup_iters=2)
    t.train(0, train_data())
    shards.save_shards(t.model, t.optimizer, tmp_path / "s")
    (tmp_path / "s" / "trainer_state.json").write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "weight_version": 1, "optimizer_step": 1, "rng": [rng_state()]}))
    continued = t.train(1, train_data())
    weights = snapshot(t.model, False)
    dist.destroy_process_group()
    single = plain(tiny_llama(torch.float32, seed=5), lr_warmup_iters=2)
    single.load(str(tmp_path / "s"))
    assert (single.weight_version, single.optimizer_step) == (1, 1)
    resumed = single.train(1, train_data())
    assert resumed["train/loss"] == pytest.approx(continued["train/loss"], rel=1e-6)
    assert resumed["train/lr"] == continued["train/lr"]
    assert max_diff(single.weights_for_engine(), weights) < 1e-6


def test_a_worker_tells_its_peers_how_many_response_passes_each_micro_batch_needs():
    from pipeline.train.shared_prompt import response_passes

    parallel = PeerParallel(3, 0, shared=True)
    t = PolicyGradientTrainer(model=tiny_llama(), parallel=parallel, **keys())
    t.prepare(train_data())
    # micro-batches of 2: samples 0, 1 (responses of 2 and 4 tokens) and 2, 3 (3 and 2), then the
    # peer's third; the worker asks for its count, then for its passes
    assert parallel.asked == [[2], [response_passes([2, 4]), response_passes([3, 2]), 0]]
    assert min(parallel.asked[1][:2]) >= 1


def test_gradients_sync_on_each_steps_last_micro_batch_only():
    parallel = PeerParallel(6, 0, shared=True)
    t = PolicyGradientTrainer(model=tiny_llama(), parallel=parallel, **keys(micro_batch_size=1, global_batch_size=2))
    t.train(0, train_data())
    # two steps of 2 samples: 2 micro-batches of its own and 4 empty ones each
    assert parallel.syncs == [False] * 5 + [True] + [False] * 5 + [True]


def test_an_empty_micro_batch_lives_on_the_workers_device_in_float32():
    """Its tensors are made where the worker computes (on CUDA: its GPU; here the meta device, one
    that is not the default) and in float32 whatever torch's default dtype is."""
    from pipeline.train.prepared import empty_micro_batch

    t = plain(tiny_llama(), use_kl_loss=True)
    prepared = t.prepare(train_data(with_rollout_log_probs=True))
    meta = torch.device("meta")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        batch, tokens = empty_micro_batch(prepared, meta)
    finally:
        torch.set_default_dtype(default)
    tensors = [*batch.loss_masks, *batch.advantages, *batch.old_log_probs, *batch.ref_log_probs,
               *batch.rollout_log_probs]
    assert all(x.device == meta and x.dtype == torch.float32 and x.shape == (1,) for x in tensors)
    assert tokens[0].device == meta and tokens[0].dtype == torch.long and tokens[0].shape == (2,)


def test_a_workers_empty_micro_batches_add_nothing_even_to_a_loss_that_reads_no_mask():
    """Their loss is multiplied by 0 (not by the step's scale): a custom loss that ignores the
    loss masks gets no gradient from them either."""
    base = tiny_llama()
    hook = dict(loss_type="custom_loss", custom_loss_function_path="tests.plugins.trainer_hooks.mask_blind_loss",
                share_prompt_forward=True)
    allow = SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]})
    t = PolicyGradientTrainer(model=copy.deepcopy(base), parallel=PeerParallel(4, 0, shared=True), args=allow,
                              **keys(**hook))
    reference = PolicyGradientTrainer(model=copy.deepcopy(base), args=allow, **keys(**hook))
    prepared, expected = t.prepare(train_data()), reference.prepare(train_data())
    t.optimizer.zero_grad(set_to_none=True)
    reference.optimizer.zero_grad(set_to_none=True)
    t.accumulate(prepared, [0, 1, 2, 3], backward=True)  # 2 micro-batches of its own, 2 empty ones
    reference.accumulate(expected, [0, 1, 2, 3], backward=True)
    for (name, p), q in zip(t.model.named_parameters(), reference.model.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-14), name
    # the old log-probs' shared pass agrees on the micro-batches and their response passes; the
    # custom loss makes one plain forward per micro-batch: the peers agree on the count only
    asked = t.parallel.asked
    assert len(asked) == 3 and asked[0] == [2] and len(asked[1]) == 4 and asked[2] == [2]


def test_empty_micro_batches_and_their_tokens_are_made_on_the_trainers_device(monkeypatch):
    from pipeline.train import prepared as pg

    devices = []
    real_tokens, real_batch = pg.empty_tokens, pg.empty_micro_batch
    monkeypatch.setattr(pg, "empty_tokens", lambda device: (devices.append(("tokens", device)),
                                                            real_tokens(device))[1])
    monkeypatch.setattr(pg, "empty_micro_batch", lambda prepared, device: (devices.append(("batch", device)),
                                                                           real_batch(prepared, device))[1])
    t = PolicyGradientTrainer(model=tiny_llama(), parallel=PeerParallel(3), **keys(share_prompt_forward=False))
    t.train(0, train_data())
    assert ("tokens", t.device) in devices and ("batch", t.device) in devices
    assert all(device == t.device for _, device in devices)


def test_the_old_log_probs_of_empty_micro_batches_compute_no_entropy_either(monkeypatch):
    t = PolicyGradientTrainer(model=tiny_llama(), parallel=PeerParallel(3), **keys(share_prompt_forward=False))
    asked = []
    real = t._log_probs
    monkeypatch.setattr(t, "_log_probs", lambda model, tokens, lengths, with_entropy, passes=0: (
        asked.append((len(tokens), with_entropy)), real(model, tokens, lengths, with_entropy, passes))[1])
    t.prepare(train_data())  # its 2 micro-batches of 2, then 1 empty one for the peer's 3
    assert asked == [(2, False), (2, False), (1, False)]
    assert all(with_entropy is False for _, with_entropy in asked)
