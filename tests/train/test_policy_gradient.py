"""The policy-gradient trainer on a tiny random Llama (float64 where exactness matters)."""

import argparse
import copy
import re
from types import SimpleNamespace

import pytest
import torch

from pipeline.config.args import SlimeArgs
from pipeline.train.policy_gradient import PolicyGradientTrainer
from tests.plugins import trainer_hooks
from trainer_fixtures import tiny_llama, train_data, yaml_keys

torch.set_num_threads(1)

METRICS = {"train/loss", "train/pg_loss", "train/pg_clipfrac", "train/kl", "train/entropy", "train/grad_norm",
           "train/lr", "train/train_rollout_logprob_abs_diff", "perf/train_time", "perf/train_tokens_per_sec"}


def trainer(model=None, **overrides):
    return PolicyGradientTrainer(model=model if model is not None else tiny_llama(), **yaml_keys(**overrides))


def flat_grad(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_gradient_matches_finite_differences():
    # off-policy (one big step first), clip-higher, dual clip, KL (k3) and entropy terms all on
    t = trainer(lr=0.005, eps_clip=0.1, eps_clip_high=0.15, eps_clip_c=3.0, use_kl_loss=True, kl_loss_coef=0.3,
                kl_loss_type="k3", entropy_coef=0.01, micro_batch_size=2)
    prepared = t.prepare(train_data())
    t.train(0, train_data())
    indices = list(range(4))
    t.optimizer.zero_grad(set_to_none=True)
    t.accumulate(prepared, indices, backward=True)
    params = dict(t.model.named_parameters())
    generator = torch.Generator().manual_seed(0)
    checked = nonzero = 0
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                 "lm_head.weight", "model.embed_tokens.weight"):
        p = params[name]
        for flat in torch.randint(0, p.numel(), (3,), generator=generator).tolist():
            h = 1e-5
            with torch.no_grad():
                p.view(-1)[flat] += h
                up = t.accumulate(prepared, indices, backward=False)["loss"]
                p.view(-1)[flat] -= 2 * h
                down = t.accumulate(prepared, indices, backward=False)["loss"]
                p.view(-1)[flat] += h
            numeric = (up - down) / (2 * h)
            assert p.grad.view(-1)[flat].item() == pytest.approx(numeric, rel=1e-4, abs=1e-8), name
            checked += 1
            nonzero += abs(numeric) > 1e-7
    assert checked == 12 and nonzero >= 6
    metrics = t.accumulate(prepared, indices, backward=False)
    assert 0.0 < metrics["pg_clipfrac"] < 1.0  # off-policy: some tokens clipped, not all


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_does_not_depend_on_micro_batches(mode):
    grads = []
    for split in ({"micro_batch_size": 4}, {"micro_batch_size": 1},
                  {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 14}):
        t = trainer(loss_agg_mode=mode, **split)
        prepared = t.prepare(train_data())
        t.optimizer.zero_grad(set_to_none=True)
        t.accumulate(prepared, [0, 1, 2, 3], backward=True)
        grads.append(flat_grad(t.model))
    assert torch.allclose(grads[0], grads[1], rtol=1e-10, atol=1e-13)
    assert torch.allclose(grads[0], grads[2], rtol=1e-10, atol=1e-13)


def test_train_updates_weights_version_and_reports_metrics():
    t = trainer(lr=1e-3)
    before = {k: v.clone() for k, v in t.weights_for_engine().items()}
    metrics = t.train(0, train_data())
    assert set(metrics) == METRICS
    assert t.weight_version == 1 and t.optimizer_step == 1
    after = t.weights_for_engine()
    assert set(after) == set(before)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["train/lr"] == 1e-3 and metrics["perf/train_tokens_per_sec"] > 0
    # old log-probs recomputed by the trainer: on-policy, ratio 1, nothing clipped, no drift
    assert metrics["train/pg_clipfrac"] == 0.0 and metrics["train/kl"] == pytest.approx(0.0, abs=1e-12)
    t.train(1, train_data(with_rollout_log_probs=False))
    assert t.weight_version == 2


def test_auto_threads_in_one_process_are_its_cpus_and_each_round_sets_them(monkeypatch):
    """trainer.num_threads=auto (the shipped default) in this process: its CPUs, whatever
    trainer.num_cpus_per_worker says; train() sets the count again (the engine may have set its own)."""
    from pipeline.process import threads

    monkeypatch.setattr(threads, "process_cpus", lambda: 3)
    before = torch.get_num_threads()
    try:
        t = trainer(num_threads="auto", num_cpus_per_worker=8)
        assert t.keys["num_threads"] == 3
        torch.set_num_threads(1)
        t.train(0, train_data())
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_global_batch_size_gives_one_optimizer_step_per_batch_and_warmup():
    t = trainer(lr=1e-3, global_batch_size=2, lr_warmup_iters=4)
    metrics = t.train(0, train_data())
    assert t.optimizer_step == 2 and t.weight_version == 1
    assert metrics["train/lr"] == pytest.approx(1e-3 * 1 / 4)  # the lr of the last step (step 1)


def test_use_rollout_logprobs_takes_the_engines_and_needs_them():
    t = trainer(use_rollout_logprobs=True)
    data = train_data()
    prepared = t.prepare(data)
    flat = [x for lp in prepared.old_log_probs for x in lp.tolist()]
    assert flat == pytest.approx([x for row in data["rollout_log_probs"] for x in row])
    with pytest.raises(ValueError, match="^trainer.use_rollout_logprobs needs rollout_log_probs in the train data$"):
        t.prepare(train_data(with_rollout_log_probs=False))


def test_tis_weights_and_metrics():
    data = train_data()
    metrics = trainer(use_tis=True, tis_clip=1.5, tis_clip_low=0.5).train(0, data)
    assert {"train/tis", "train/tis_clipfrac", "train/tis_abs"} <= set(metrics)
    # the tiny model's log-probs are near -log(32) = -3.47, the fixture's rollout ones -3.3 ... -3.6
    assert metrics["train/tis_clipfrac"] == 0.0 and 0.8 < metrics["train/tis"] < 1.2
    # rollout log-probs of -1 make every ratio about exp(-2.5) < tis_clip_low: all clipped
    data["rollout_log_probs"] = [[-1.0] * n for n in data["response_lengths"]]
    metrics = trainer(use_tis=True, tis_clip=1.5, tis_clip_low=0.5).train(0, data)
    assert metrics["train/tis_clipfrac"] == pytest.approx(1.0) and metrics["train/tis"] < 0.5


def test_slime_hooks_by_dotted_path():
    trainer_hooks.CALLS.clear()
    hooks = "tests.plugins.trainer_hooks."
    t = trainer(custom_advantage_function_path=hooks + "double_advantages", use_tis=True,
                custom_tis_function_path=hooks + "half_tis",
                custom_pg_loss_reducer_function_path=hooks + "constant_reducer")
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."],
                           "n_samples_per_prompt": 4}))
    assert t.args.n_samples_per_prompt == 4 and t.args.eps_clip == 0.2
    prepared = t.prepare(train_data())
    assert prepared.advantages[1].tolist() == [-2.0] * 4
    metrics = t.train(0, train_data())
    assert {"advantage", "tis", "reducer"} <= set(trainer_hooks.CALLS)
    assert metrics["train/half"] == pytest.approx(0.5)


def test_custom_loss_gets_slime_packed_logits():
    trainer_hooks.CALLS.clear()
    t = trainer(loss_type="custom_loss", custom_loss_function_path="tests.plugins.trainer_hooks.sft_like_loss")
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]}))
    metrics = t.train(0, train_data())
    assert trainer_hooks.CALLS == ["loss"] and metrics["train/nll"] > 0


def test_hook_outside_the_allowlist_is_refused():
    t = trainer(custom_tis_function_path="tests.plugins.trainer_hooks.half_tis")
    with pytest.raises(Exception, match="trainer.custom_tis_function_path"):
        t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": []}))


def test_bad_keys_are_named():
    with pytest.raises(ValueError, match="trainer.kl_loss_type"):
        trainer(kl_loss_type="k9")
    with pytest.raises(ValueError, match="trainer.loss_agg_mode"):
        trainer(loss_agg_mode="sum")
    with pytest.raises(ValueError, match="lr_decay_style"):
        trainer(lr_decay_style="step")


def test_save_and_load_continue_bit_identically(tmp_path):
    base = tiny_llama(torch.float32)
    straight = trainer(copy.deepcopy(base), lr=1e-2, lr_warmup_iters=2)
    for rollout_id in range(3):
        straight.train(rollout_id, train_data())

    first = trainer(copy.deepcopy(base), lr=1e-2, lr_warmup_iters=2)
    first.train(0, train_data())
    first.train(1, train_data())
    first.save(str(tmp_path / "state"))
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "optimizer.safetensors", "policy.safetensors", "trainer_state.json"]
    resumed = trainer(tiny_llama(torch.float32, seed=7), lr=1e-2, lr_warmup_iters=2)
    resumed.load(str(tmp_path / "state"))
    assert resumed.weight_version == 2 and resumed.optimizer_step == 2
    resumed.train(2, train_data())
    a, b = straight.weights_for_engine(), resumed.weights_for_engine()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a second save replaces the folder in place
    resumed.save(str(tmp_path / "state"))
    assert [p.name for p in tmp_path.iterdir()] == ["state"]


def test_resumed_kl_reference_is_the_initial_policy(tmp_path):
    base = tiny_llama(torch.float32)
    first = trainer(copy.deepcopy(base), lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1)
    first.train(0, train_data())
    first.save(str(tmp_path / "state"))
    straight = first.train(1, train_data())
    resumed = trainer(copy.deepcopy(base), lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1)
    resumed.load(str(tmp_path / "state"))
    again = resumed.train(1, train_data())
    assert again["train/kl_loss"] == straight["train/kl_loss"] != 0.0


def test_lora_trains_adapters_only_and_merges_for_the_engine():
    from transformers import LlamaForCausalLM

    base = tiny_llama(torch.float32)
    plain_names = set(base.state_dict())
    t = trainer(copy.deepcopy(base), lora_rank=4, lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1)
    merged0 = t.weights_for_engine()
    assert set(merged0) == plain_names
    assert all(torch.equal(merged0[k], base.state_dict()[k]) for k in plain_names)  # B starts at 0
    t.train(0, train_data())
    t.train(1, train_data())
    merged = t.weights_for_engine()
    changed = [k for k in plain_names if not torch.equal(merged[k], base.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)
    # a plain HF model with the merged weights computes what the LoRA model computes
    engine = LlamaForCausalLM(base.config).eval()
    engine.load_state_dict(merged)
    ids = torch.tensor([train_data()["tokens"][1]])
    with torch.no_grad():
        assert torch.allclose(engine(ids).logits, t.model(input_ids=ids).logits, atol=1e-5)


def test_bf16_autocast_gives_nearly_the_float32_gradient():
    base = tiny_llama(torch.float32)
    grads = []
    for bf16 in (False, True):
        t = trainer(copy.deepcopy(base), bf16=bf16)
        prepared = t.prepare(train_data())
        t.optimizer.zero_grad(set_to_none=True)
        metrics = t.accumulate(prepared, [0, 1, 2, 3], backward=True)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        grads.append(flat_grad(t.model))
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0).item()
    assert grads[0].dtype == grads[1].dtype == torch.float32  # master weights stay float32
    assert 0.95 < cosine < 1.0  # close, and not the same computation


@pytest.mark.parametrize("shared", [True, False])
def test_first_step_takes_old_log_probs_from_its_own_forward(shared):
    # before the first update the weights are those of the rollout, so the recompute forward is
    # skipped for the first step's samples; gradients and metrics equal the recomputing path
    model = tiny_llama()
    full, skipping = (trainer(copy.deepcopy(model), micro_batch_size=2, share_prompt_forward=shared)
                      for _ in range(2))
    forwards = []
    skipping.model.register_forward_hook(lambda *_: forwards.append(1))
    recomputed = full.prepare(train_data())
    reused = skipping.prepare(train_data(), first_step=[0, 1, 2, 3])
    assert all(lp is not None for lp in recomputed.old_log_probs)
    assert reused.old_log_probs == [None] * 4 and not forwards
    results = []
    for t, prepared in ((full, recomputed), (skipping, reused)):
        t.optimizer.zero_grad(set_to_none=True)
        results.append((t.accumulate(prepared, [0, 1, 2, 3], backward=True), flat_grad(t.model)))
    # one training pass per micro-batch, nothing else (a shared-prompt pass: prompts, then responses)
    assert len(forwards) == 2 * (2 if shared else 1)
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12, abs=1e-15)
    assert torch.allclose(results[0][1], results[1][1], rtol=1e-12, atol=1e-15)


def test_only_the_first_step_skips_the_recompute():
    t = trainer(global_batch_size=2)
    prepared = t.prepare(train_data(), first_step=[0, 1])
    assert prepared.old_log_probs[:2] == [None, None]
    assert all(lp is not None for lp in prepared.old_log_probs[2:])
    with_hook = trainer(custom_advantage_function_path="tests.plugins.trainer_hooks.double_advantages")
    with_hook.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]}))
    assert all(lp is not None for lp in with_hook.prepare(train_data(), first_step=[0, 1, 2, 3]).old_log_probs)


# -- the loop's promises, one at a time -----------------------------------------------------


def exactly(message: str) -> str:
    """A pytest.raises pattern of the whole message."""
    return f"^{re.escape(message)}$"


def one_sample():
    return {"tokens": [[1, 5, 7]], "response_lengths": [1], "loss_masks": [[1]], "rewards": [1.0]}


@pytest.mark.parametrize("mode,expected,alone", [("token-mean", 0.05, -1.0), ("seq-mean-token-mean", 0.0, -1.0),
                                                 ("seq-mean-token-sum-norm", 0.5 / 32, -1 / 8)])
def test_on_policy_pg_loss_is_the_batch_mean_of_minus_the_advantage(mode, expected, alone):
    # first step: ratio 1, so the PPO loss of a token is -A; the batch's normaliser decides the mean
    # (masked tokens per sample 2, 3, 3, 2; rewards 1, -1, 0.5, -0.5; loss_agg_norm_len 8)
    metrics = trainer(loss_agg_mode=mode).train(0, train_data())
    assert metrics["train/pg_loss"] == pytest.approx(expected, abs=1e-7)
    # one sample of one token of advantage 1: a normaliser of 1 (token-mean: 1 token; else 1 sample)
    assert trainer(loss_agg_mode=mode).train(0, one_sample())["train/pg_loss"] == pytest.approx(alone)


def test_step_metrics_are_the_mean_over_the_rollouts_steps():
    # lr 0: both steps see the first weights; token-mean pg_loss 0.2 (samples 0, 1) and -0.1 (2, 3)
    metrics = trainer(lr=0.0, global_batch_size=2, loss_agg_mode="token-mean").train(0, train_data())
    assert metrics["train/pg_loss"] == pytest.approx(0.05, abs=1e-7)


def test_train_runs_no_extra_forward_for_the_first_steps_old_log_probs():
    t = trainer(micro_batch_size=2, share_prompt_forward=False)
    forwards = []
    t.model.register_forward_hook(lambda *_: forwards.append(1))
    t.train(0, train_data())
    assert len(forwards) == 2  # the two training micro-batches, nothing recomputed


def test_dynamic_batch_size_cuts_micro_batches_by_padded_tokens_only_when_on():
    # 4 samples of 5, 7, 6, 6 tokens: at most 14 padded tokens per micro-batch gives [0, 1], [2, 3]
    for dynamic, calls in ((True, 2), (False, 1)):
        t = trainer(micro_batch_size=4, share_prompt_forward=False, use_dynamic_batch_size=dynamic,
                    max_tokens_per_gpu=14)
        forwards = []
        t.model.register_forward_hook(lambda *_: forwards.append(1))
        prepared = t.prepare(train_data(), first_step=[0, 1, 2, 3])
        t.accumulate(prepared, [0, 1, 2, 3], backward=False)
        assert len(forwards) == calls, dynamic


@pytest.mark.parametrize("entropy_coef", [0.01, 1.0])
def test_the_entropy_term_has_its_gradient_in_both_forwards(entropy_coef):
    grads = []
    for shared in (True, False):
        t = trainer(entropy_coef=entropy_coef, share_prompt_forward=shared)
        prepared = t.prepare(train_data())
        t.optimizer.zero_grad(set_to_none=True)
        t.accumulate(prepared, [0, 1, 2, 3], backward=True)
        grads.append(flat_grad(t.model))
    assert torch.allclose(grads[0], grads[1], rtol=1e-9, atol=1e-12)
    without = trainer(entropy_coef=0.0)
    prepared = without.prepare(train_data())
    without.accumulate(prepared, [0, 1, 2, 3], backward=True)
    assert not torch.allclose(grads[0], flat_grad(without.model), rtol=1e-6, atol=1e-9)


def test_bf16_autocast_reaches_the_per_sample_forward_too():
    base = tiny_llama(torch.float32)
    grads = []
    for bf16 in (False, True):
        t = trainer(copy.deepcopy(base), bf16=bf16, share_prompt_forward=False)
        prepared = t.prepare(train_data())
        t.accumulate(prepared, [0, 1, 2, 3], backward=True)
        grads.append(flat_grad(t.model))
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0).item()
    assert 0.95 < cosine < 1.0


def test_train_times_itself_and_reports_tokens_per_second(monkeypatch):
    import pipeline.train.policy_gradient as pg

    clock = iter([10.0, 12.5])
    monkeypatch.setattr(pg, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    metrics = trainer().train(0, train_data())
    assert metrics["perf/train_time"] == 2.5 and metrics["perf/train_tokens_per_sec"] == 24 / 2.5
    clock = iter([3.0, 3.0])
    metrics = trainer().train(0, train_data())
    assert metrics["perf/train_time"] == 0.0 and metrics["perf/train_tokens_per_sec"] == 0.0


def test_train_logs_one_line_per_rollout_on_rank_zero(caplog):
    caplog.set_level("INFO", logger="pipeline.train.policy_gradient")
    t = trainer(global_batch_size=2)
    metrics = t.train(3, train_data())
    assert caplog.messages == [f"rollout 3: 2 optimizer step(s), loss {metrics['train/loss']:.4g}, weight version 1"]
    caplog.clear()
    assert t.train(4, {"tokens": [], "response_lengths": [], "loss_masks": [], "rewards": []}) == {}
    assert caplog.messages == ["rollout 4: no train samples; the trainer skips this rollout"]
    caplog.clear()
    t.parallel.rank = 1  # another worker of the group: quiet
    t.train(5, train_data())
    assert caplog.messages == []


def test_args_given_at_construction_are_bound_and_a_namespace_works_too():
    t = trainer(args=SlimeArgs({"n_samples_per_prompt": 8}))
    assert t.args.n_samples_per_prompt == 8 and t.args.eps_clip == 0.2
    t.bind_args(argparse.Namespace(n_samples_per_prompt=3, allowed_targets=["pipeline."]))
    assert t.args.n_samples_per_prompt == 3


def test_bad_settings_are_refused_with_the_whole_message(monkeypatch):
    from pipeline.cluster import devices

    with pytest.raises(ValueError, match=exactly("trainer.loss_type must be policy_loss or custom_loss, got 'sft'")):
        trainer(loss_type="sft")
    with pytest.raises(ValueError, match=exactly(
            "trainer.loss_type=custom_loss needs trainer.custom_loss_function_path")):
        trainer(loss_type="custom_loss").bind_args(SlimeArgs({}))
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    with pytest.raises(devices.DeviceError, match=r"^trainer\.device=cuda, but this machine has no CUDA device"):
        trainer(device="cuda")


def test_bf16_auto_is_resolved_once_for_this_machine():
    from pipeline.process.precision import resolve_bf16

    assert trainer(bf16="auto").keys["bf16"] is resolve_bf16("auto")


def test_the_lr_decays_over_lr_decay_iters():
    metrics = trainer(lr=1e-3, global_batch_size=2, lr_decay_style="linear", lr_decay_iters=2).train(0, train_data())
    assert metrics["train/lr"] == pytest.approx(0.5e-3)  # step 1 of a 2-step linear decay to 0


def test_the_custom_advantage_hook_gets_slimes_rollout_data_and_its_values_become_float32():
    trainer_hooks.SEEN.clear()
    t = trainer(custom_advantage_function_path="tests.plugins.trainer_hooks.record_advantages", use_kl_loss=True,
                kl_loss_coef=0.1)
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."],
                           "marker": 5}))
    data = train_data()
    prepared = t.prepare(data)
    args, seen = trainer_hooks.SEEN["advantage"]
    assert args.marker == 5
    assert set(seen) == {"rewards", "loss_masks", "response_lengths", "total_lengths", "tokens", "log_probs",
                         "ref_log_probs", "rollout_log_probs", "advantages"}
    assert seen["rewards"] == data["rewards"] and seen["response_lengths"] == data["response_lengths"]
    assert seen["total_lengths"] == [len(x) for x in data["tokens"]]
    assert [m.tolist() for m in seen["loss_masks"]] == data["loss_masks"]
    assert [x.tolist() for x in seen["tokens"]] == data["tokens"]
    assert all(torch.equal(a, b) for a, b in zip(seen["log_probs"], prepared.old_log_probs))
    assert all(torch.equal(a, b) for a, b in zip(seen["ref_log_probs"], prepared.ref_log_probs))
    assert [v for x in seen["rollout_log_probs"] for v in x.tolist()] == pytest.approx(
        [v for row in data["rollout_log_probs"] for v in row])
    assert all(a.dtype == torch.float32 and a.tolist() == [1.0] * len(a) for a in prepared.advantages)


def test_the_custom_loss_gets_slimes_batch_and_logits_in_the_asked_precision():
    base = tiny_llama(torch.float32)
    hooks = dict(loss_type="custom_loss", custom_loss_function_path="tests.plugins.trainer_hooks.record_loss",
                 use_kl_loss=True, kl_loss_coef=0.1, micro_batch_size=4)
    allow = SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."], "marker": 6})
    ids = torch.tensor([train_data()["tokens"][1]])
    with torch.no_grad():
        full = base(input_ids=ids).logits[0]
    logits = {}
    for bf16 in (False, True):
        trainer_hooks.SEEN.clear()
        t = trainer(copy.deepcopy(base), bf16=bf16, **hooks)
        t.bind_args(allow)
        data = train_data()
        prepared = t.prepare(data)
        t.accumulate(prepared, [0, 1, 2, 3], backward=False)
        args, batch, packed = trainer_hooks.SEEN["loss"]
        assert args.marker == 6
        assert set(batch) == {"unconcat_tokens", "total_lengths", "response_lengths", "loss_masks", "advantages",
                              "log_probs", "ref_log_probs", "rollout_log_probs", "rollout_mask_sums"}
        assert batch["rollout_mask_sums"] is None  # no rollout_ids: slime's per-sample fallback
        assert [m.tolist() for m in batch["loss_masks"]] == data["loss_masks"]
        assert [a.tolist() for a in batch["advantages"]] == [[r] * n for r, n in zip(data["rewards"],
                                                                                  data["response_lengths"])]
        assert all(torch.equal(a, b) for a, b in zip(batch["log_probs"], prepared.old_log_probs))
        assert all(torch.equal(a, b) for a, b in zip(batch["ref_log_probs"], prepared.ref_log_probs))
        assert all(torch.equal(a, b) for a, b in zip(batch["rollout_log_probs"], prepared.samples.rollout_log_probs))
        logits[bf16] = packed[0, 5:12]  # sample 1 of the packed [1, sum(total_lengths), vocab]
    assert torch.allclose(logits[False], full, atol=1e-6)
    assert not torch.allclose(logits[True], full, atol=1e-4) and torch.allclose(logits[True], full, atol=0.1)


def test_the_export_copies_the_checkpoints_tokenizer(tmp_path, monkeypatch):
    import pipeline.train.policy_gradient as pg

    source = tmp_path / "ckpt"
    tiny_llama(torch.float32).save_pretrained(source)
    (source / "tokenizer.json").write_text('{"stand-in": true}')
    asked = []
    real = pg.resolve_checkpoint
    monkeypatch.setattr(pg, "resolve_checkpoint", lambda ckpt, cache=None: asked.append((ckpt, cache))
                        or real(ckpt, cache))
    t = PolicyGradientTrainer(**yaml_keys(hf_checkpoint=str(source), cache_dir=str(tmp_path / "cache")))
    t.export_hf(str(tmp_path / "policy"))
    assert (tmp_path / "policy" / "tokenizer.json").read_text() == '{"stand-in": true}'
    assert asked[-1] == (str(source), str(tmp_path / "cache"))


def test_a_load_says_what_it_loaded(tmp_path, caplog):
    t = trainer(lr=1e-2)
    t.train(0, train_data())
    t.save(str(tmp_path / "state"))
    caplog.set_level("INFO", logger="pipeline.train.policy_gradient")
    trainer().load(str(tmp_path / "state"))
    assert caplog.messages == [f"trainer state loaded from {tmp_path / 'state'} (weight version 1)"]


def test_samples_sharing_a_rollout_id_are_one_rollout_in_the_mean_and_in_the_steps():
    # slime: a trajectory split into samples is averaged over its tokens, the batch over rollouts.
    # First step, ratio 1: a token's PPO loss is -A. Samples 0 and 1 are rollout 0 (masked tokens
    # 2 and 3, rewards 1 and -1): (-2 + 3) / 5 = 0.2; rollouts 1 and 2: -0.5 and 0.5
    data = {**train_data(), "rollout_ids": [0, 0, 1, 2]}
    metrics = trainer().train(0, data)
    assert metrics["train/pg_loss"] == pytest.approx((0.2 - 0.5 + 0.5) / 3, abs=1e-7)
    # token-mean is per token either way (slime's per-token loss): (-2 + 3 - 1.5 + 1) / 10
    assert trainer(loss_agg_mode="token-mean").train(0, data)["train/pg_loss"] == pytest.approx(0.05, abs=1e-7)
    # global_batch_size counts rollouts: steps [0, 1, 2] and [3]; lr 0 keeps the first weights
    metrics = trainer(lr=0.0, global_batch_size=2).train(0, data)
    assert metrics["train/pg_loss"] == pytest.approx(((0.2 - 0.5) / 2 + 0.5) / 2, abs=1e-7)


def test_opsm_mismatch_metrics_and_icepop_by_slimes_names_in_the_trainer():
    # first step: new = old, so no sequence drifted (opsm_clipfrac 0) and ois is 1; mismatch
    # metrics leave the loss as it is
    plain = trainer().train(0, train_data())
    metrics = trainer(get_mismatch_metrics=True, use_opsm=True).train(0, train_data())
    assert metrics["train/loss"] == pytest.approx(plain["train/loss"], rel=1e-12)
    assert metrics["train/opsm_clipfrac"] == 0.0 and metrics["train/ois"] == pytest.approx(1.0)
    assert {"train/tis", "train/tis_clipfrac", "train/tis_abs"} <= set(metrics)
    # IcePop through slime's hook key: rollout log-probs of -1 put every ratio (about e^-2.5) below
    # tis_clip_low, so every token drops out of the pg loss
    data = {**train_data(), "rollout_log_probs": [[-1.0] * n for n in train_data()["response_lengths"]]}
    t = trainer(use_tis=True, tis_clip_low=0.5, custom_tis_function_path="pipeline.train.losses.icepop_function")
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."]}))
    metrics = t.train(0, data)
    assert metrics["train/pg_loss"] == 0.0 and metrics["train/tis_clipfrac"] == pytest.approx(1.0)


def test_each_steps_gradients_start_from_none(monkeypatch):
    """zero_grad(set_to_none=True): no step holds the previous step's gradients while it runs
    (their memory is free for the forward), and a parameter that takes no gradient in a step is
    skipped by AdamW (None) instead of being moved by its momentum (zeros)."""
    t = trainer(global_batch_size=1)
    seen = []
    real = t.accumulate

    def accumulate(prepared, indices, backward):
        seen.append(all(p.grad is None for p in t.model.parameters()))
        return real(prepared, indices, backward)

    monkeypatch.setattr(t, "accumulate", accumulate)
    t.train(0, train_data())
    assert seen == [True] * 4  # 4 optimizer steps of one sample, the 2nd to 4th after a step's gradients


def test_the_log_line_says_nan_for_a_custom_loss_without_a_loss_metric(caplog):
    caplog.set_level("INFO", logger="pipeline.train.policy_gradient")
    t = trainer(loss_type="custom_loss",
                custom_loss_function_path="tests.plugins.trainer_hooks.nll_without_a_loss_metric")
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]}))
    metrics = t.train(2, train_data())
    assert "train/loss" not in metrics and "train/nll" in metrics
    assert caplog.messages == ["rollout 2: 1 optimizer step(s), loss nan, weight version 1"]


def test_the_custom_loss_forward_is_one_padded_call_without_a_kv_cache_in_bfloat16(monkeypatch):
    """One model call per micro-batch: right-padded ids with their attention mask, no KV cache
    (use_cache=False: nothing kept for a later token), in bfloat16 autocast when bf16 is on even
    where autocast's default dtype is another (CUDA's is float16: here set for the CPU)."""
    t = trainer(loss_type="custom_loss", custom_loss_function_path="tests.plugins.trainer_hooks.sft_like_loss",
                bf16=True, micro_batch_size=4)
    t.bind_args(SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]}))
    calls = []

    def record(module, args, kwargs):
        calls.append((dict(kwargs), torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))

    prepared = t.prepare(train_data())  # (its old log-probs: the shared-prompt forward, not recorded)
    handle = t.model.register_forward_pre_hook(record, with_kwargs=True)
    default = torch.get_autocast_dtype("cpu")
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        t.accumulate(prepared, [0, 1, 2, 3], backward=False)
    finally:
        torch.set_autocast_dtype("cpu", default)
        handle.remove()
    data = train_data()
    (kwargs, dtype), = calls
    width = max(len(x) for x in data["tokens"])
    assert kwargs["use_cache"] is False and dtype == torch.bfloat16
    assert kwargs["input_ids"].tolist() == [x + [0] * (width - len(x)) for x in data["tokens"]]
    assert kwargs["attention_mask"].tolist() == [[1] * len(x) + [0] * (width - len(x)) for x in data["tokens"]]


def test_advantages_are_float32_on_the_trainers_device_whatever_torchs_defaults():
    """The reward per token, and a custom advantage hook's plain lists, become float32 tensors on
    the trainer's device, not on torch's default device or in its default dtype (both changed
    here: the meta device, float64)."""
    allow = SlimeArgs({"allowed_targets": ["pipeline."], "allowed_targets_extra": ["tests.plugins."]})
    for hook in (None, "tests.plugins.trainer_hooks.list_advantages"):
        t = trainer(use_rollout_logprobs=True, custom_advantage_function_path=hook)
        t.bind_args(allow)
        _ = t.model
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with torch.device("meta"):
                prepared = t.prepare(train_data())
        finally:
            torch.set_default_dtype(default)
        data = train_data()
        assert all(a.device == t.device and a.dtype == torch.float32 for a in prepared.advantages), hook
        assert [a.tolist() for a in prepared.advantages] == [[r] * n for r, n in zip(data["rewards"],
                                                                                 data["response_lengths"])]


@pytest.mark.parametrize("shared", [True, False])
def test_old_log_probs_compute_no_entropy_and_the_entropy_has_a_gradient_only_when_it_is_trained(
        shared, monkeypatch):
    from pipeline.train import policy_gradient as pg

    asked = []
    real_shared = pg.shared_prompt_log_probs
    monkeypatch.setattr(pg, "shared_prompt_log_probs",
                        lambda *a, **k: (asked.append((a[4], k["entropy_grad"])), real_shared(*a, **k))[1])
    real_per_sample = pg.batches.response_log_probs
    monkeypatch.setattr(pg.batches, "response_log_probs",
                        lambda *a, **k: (asked.append((a[4], k["entropy_grad"])), real_per_sample(*a, **k))[1])
    for coef in (0.0, 0.01):
        asked.clear()
        t = trainer(share_prompt_forward=shared, entropy_coef=coef, global_batch_size=2)
        prepared = t.prepare(train_data(), first_step=[0, 1])  # old log-probs of samples 2 and 3
        assert asked and all(with_entropy is False for with_entropy, _ in asked)
        asked.clear()
        _, entropy = t._log_probs(t.model, prepared.samples.tokens[:2], prepared.samples.response_lengths[:2], True)
        assert asked == [(True, coef != 0.0)]
        assert all(e.requires_grad == (coef != 0.0) for e in entropy)


def test_one_process_makes_no_padding_passes(monkeypatch):
    """Responses of one token need no response pass: one model call (the prompt pass) per
    micro-batch, none to match a peer's count (there is none)."""
    data = {"tokens": [[1, 5, 7], [1, 5, 9], [2, 4, 6]], "response_lengths": [1, 1, 1],
            "loss_masks": [[1], [1], [1]], "rewards": [1.0, -1.0, 0.5]}
    t = trainer(share_prompt_forward=True, micro_batch_size=4)
    calls = []
    t.model.register_forward_hook(lambda *_: calls.append(1))
    t.train(0, data)
    assert len(calls) == 1  # the first step's old log-probs are its own forward's: one call in all
