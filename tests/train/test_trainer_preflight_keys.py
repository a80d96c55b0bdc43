"""Pre-flight problems of the trainer node name the key and what is expected."""

from omegaconf import OmegaConf

from pipeline.train.preflight import trainer_problems
from trainer_fixtures import YAML, yaml_keys


def node(**overrides):
    keys = yaml_keys(**overrides)
    keys["_target_"] = OmegaConf.load(YAML)["_target_"]
    return {"trainer": keys}


def test_the_shipped_yaml_passes():
    assert trainer_problems(node()) == []
    assert trainer_problems({"trainer": {"_target_": None}}) == []


def test_num_threads_is_a_positive_integer_or_auto():
    assert OmegaConf.load(YAML)["num_threads"] == "auto"
    for good in ("auto", 1, 16):
        assert trainer_problems(node(num_threads=good)) == [], good
    for bad in (0, -1, 2.5, True, "4", "Auto", None):
        assert trainer_problems(node(num_threads=bad)) == [
            f"trainer.num_threads={bad!r}: expected an integer >= 1 or auto (this process's CPUs in one process; "
            f"each worker's trainer.num_cpus_per_worker over N workers)"], bad


def test_each_bad_value_is_named():
    problems = trainer_problems(node(kl_loss_type="k5", loss_agg_mode="sum", micro_batch_size=0, lr=-1.0,
                                     global_batch_size=0, use_dynamic_batch_size=True, eps_clip_c=0.5,
                                     loss_type="custom_loss", use_rollout_logprobs=True, use_tis=True))
    text = "\n".join(problems)
    for key in ("trainer.kl_loss_type='k5'", "trainer.loss_agg_mode='sum'", "trainer.micro_batch_size=0",
                "trainer.lr=-1.0", "trainer.global_batch_size=0", "trainer.max_tokens_per_gpu",
                "trainer.eps_clip_c=0.5", "trainer.custom_loss_function_path", "trainer.use_tis together"):
        assert key in text, key
    assert len(problems) == 9


def test_dr_grpo_needs_a_length_and_function_needs_a_path():
    assert "loss_agg_norm_len" in trainer_problems(node(loss_agg_mode="seq-mean-token-sum-norm",
                                                        loss_agg_norm_len=None))[0]
    assert "trainer.train_function_path" in trainer_problems(
        {"trainer": {"_target_": "pipeline.train.function.FunctionTrainer", "path": None}})[0]


def test_switches_must_be_booleans():
    """`bf16: "no"` would be truthy: every on/off key of the trainer takes true or false only
    (bf16 also auto)."""
    assert trainer_problems(node(bf16="auto")) == []
    problems = trainer_problems(node(bf16="no", share_prompt_forward=1, use_tis=None))
    assert problems == ["trainer.bf16='no': expected true, false or auto",
                        "trainer.share_prompt_forward=1: expected true or false",
                        "trainer.use_tis=None: expected true or false"]


def test_attention_implementation_is_a_name_or_null():
    assert trainer_problems(node(attn_implementation=None)) == []
    assert trainer_problems(node(attn_implementation="sdpa")) == []
    assert trainer_problems(node(attn_implementation=1)) == [
        "trainer.attn_implementation=1: expected null (transformers' default) or a name such as eager or sdpa"]


def test_opsm_and_mismatch_metric_keys_are_checked():
    # slime's --use-opsm / --opsm-delta / --get-mismatch-metrics, defaults as slime's
    keys = yaml_keys()
    assert (keys["use_opsm"], keys["opsm_delta"], keys["get_mismatch_metrics"]) == (False, 1e-4, False)
    assert trainer_problems(node(use_opsm=True, get_mismatch_metrics=True)) == []
    assert trainer_problems(node(use_opsm="yes", get_mismatch_metrics=1, opsm_delta=-0.5)) == [
        "trainer.use_opsm='yes': expected true or false",
        "trainer.get_mismatch_metrics=1: expected true or false",
        "trainer.opsm_delta=-0.5: expected a number >= 0"]
    assert trainer_problems(node(opsm_delta="small")) == ["trainer.opsm_delta='small': expected a number >= 0"]


def test_function_trainer_without_a_path_is_refused_word_for_word():
    function = "pipeline.train.function.FunctionTrainer"
    assert trainer_problems({"trainer": {"_target_": function}}) == [
        "trainer=function needs trainer.train_function_path=<pkg.module.train> (your train(args, rollout_id, "
        "train_data) -> metrics)"]
    assert trainer_problems({"trainer": {"_target_": function, "train_function_path": "pkg.mod.train"}}) == []


def test_dynamic_batch_size_needs_max_tokens_per_gpu_of_at_least_one():
    for tokens in (1, 4096):
        assert trainer_problems(node(use_dynamic_batch_size=True, max_tokens_per_gpu=tokens)) == [], tokens
    for tokens in (0, None, 1.5):
        assert trainer_problems(node(use_dynamic_batch_size=True, max_tokens_per_gpu=tokens)) == [
            f"trainer.use_dynamic_batch_size=true needs trainer.max_tokens_per_gpu >= 1 (got {tokens!r})"]
    assert trainer_problems(node(use_dynamic_batch_size=False, max_tokens_per_gpu=None)) == []


def test_the_dual_clip_bound_must_be_a_number_above_one():
    for bound in (None, 1.5, 3, 10.0):
        assert trainer_problems(node(eps_clip_c=bound)) == [], bound
    for bound in (1.0, 1, 0.5, "3", True):
        assert trainer_problems(node(eps_clip_c=bound)) == [
            f"trainer.eps_clip_c={bound!r}: the dual-clip bound must be > 1 (or null: off)"], bound


def test_only_dr_grpo_needs_a_norm_length_of_at_least_one():
    for length in (1, 8):
        assert trainer_problems(node(loss_agg_mode="seq-mean-token-sum-norm", loss_agg_norm_len=length)) == []
    for length in (0, None, 2.0):
        assert trainer_problems(node(loss_agg_mode="seq-mean-token-sum-norm", loss_agg_norm_len=length)) == [
            f"trainer.loss_agg_mode=seq-mean-token-sum-norm needs trainer.loss_agg_norm_len >= 1 (got {length!r})"]
    for mode in ("token-mean", "seq-mean-token-mean"):  # the length is read by dr-grpo's mode only
        assert trainer_problems(node(loss_agg_mode=mode, loss_agg_norm_len=None)) == [], mode
        assert trainer_problems(node(loss_agg_mode=mode, loss_agg_norm_len=0)) == [], mode


def test_custom_loss_needs_its_function_path_word_for_word():
    assert trainer_problems(node(loss_type="custom_loss", custom_loss_function_path="pkg.module.fn")) == []
    assert trainer_problems(node(loss_type="custom_loss", custom_loss_function_path=None)) == [
        "trainer.loss_type=custom_loss needs trainer.custom_loss_function_path=<pkg.module.fn>"]
    assert trainer_problems(node(loss_type="policy_loss", custom_loss_function_path=None)) == []


def test_rollout_logprobs_and_tis_are_refused_together_only():
    assert trainer_problems(node(use_rollout_logprobs=True, use_tis=False)) == []
    assert trainer_problems(node(use_rollout_logprobs=False, use_tis=True)) == []
    assert trainer_problems(node(use_rollout_logprobs=True, use_tis=True)) == [
        "trainer.use_rollout_logprobs and trainer.use_tis together: TIS weighs the trainer's old log-probs against "
        "the rollout's, which are then the same (slime refuses this too)"]
