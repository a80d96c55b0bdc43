"""The policy-gradient trainer on a tiny random Llama (float64 where exactness matters)."""

import copy

import pytest
import torch

from pipeline.config import SlimeArgs
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
    with pytest.raises(ValueError, match="use_rollout_logprobs needs rollout_log_probs"):
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
