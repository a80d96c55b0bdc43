"""Surviving mutants that are equivalent to the original code: mutant name -> why no test can kill it.

`scripts/mutation.py` counts these apart and prints the reason next to the diff. Mutant names
number the mutations inside one function, so an edit to that function renames them: the next
run shows them as survivors again, to be killed by a test or re-explained here.
"""

from __future__ import annotations

_INT64 = "numpy's default integer is int64 on 64-bit Linux, the dtype the code names"
_NEVER_READ = "the initial value is replaced by the first order() call before anything reads it"
_HUGE_N = "the int32/int64 switch only differs at 2**31 rows or more, which no test can build"

EQUIVALENT: dict[str, str] = {
    # pipeline/data/order.py
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_8": "the 'no epoch yet' sentinel only has to differ from every int",
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_9": _NEVER_READ,
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_11": _NEVER_READ,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_25": (
        "the default only matters for an entry without 'order'; a 1-row order is [0] either way"),
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_32": _INT64,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_34": _INT64,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_49": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_50": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_52": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_53": _HUGE_N,
    **{f"pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_{i}": "renaming a field of the cache key (or the "
       "unused key without a cache) only renames the cache files; the key is still unique per (seed, epoch, n)"
       for i in range(5, 12)},
    "pipeline.data.order.xǁEpochOrderǁorder__mutmut_7": _INT64,
    "pipeline.data.order.xǁEpochOrderǁorder__mutmut_9": _INT64,
    # pipeline/stages/log.py
    "pipeline.stages.log.x__group_rewards__mutmut_11": "the key of an ungrouped sample only has to differ from group indexes",
    "pipeline.stages.log.x__group_rewards__mutmut_12": "the key of an ungrouped sample only has to differ from group indexes",
    "pipeline.stages.log.x_eval_metrics__mutmut_28": (
        "with k == 1 the pass@k block writes eval/<name>-pass@1 = mean(r > 0), which the next line writes again"),
    "pipeline.stages.log.x_log_stage__mutmut_1": "None and False are both falsy; skip is only read as `if not skip`",
    "pipeline.stages.log.x_pass_at_k__mutmut_1": (
        "the early return is a shortcut: when n - c < k, comb(n - c, k) == 0 and the formula gives 1.0 too "
        "(eval calls pass_at_k(k, c, k), so k > n never happens)"),
    "pipeline.stages.log.x_rollout_metrics__mutmut_69": "in a zero-std group every reward equals the first",
    # pipeline/data/checkpoint.py
    **{f"pipeline.data.checkpoint.x__write_bytes__mutmut_{i}": "the chunk size of the write loop; every chunking "
       "writes the same bytes" for i in (11, 12, 16, 17)},
    **{f"pipeline.data.checkpoint.x_read_slime_state__mutmut_{i}": "map_location only applies to tensors; a slime "
       "data-source state holds plain numbers" for i in (3, 6, 8, 9)},
    **{f"pipeline.data.checkpoint.x_read_slime_state__mutmut_{i}": "torch 2.13 loads with weights_only=True by default "
       "(a test pins that arbitrary objects are refused)" for i in (4, 7)},
    **{name: "missing_ok only matters when another process removes the file between listing and unlinking"
       for name in ("pipeline.data.checkpoint.x_prune_checkpoints__mutmut_3",
                    "pipeline.data.checkpoint.x_prune_checkpoints__mutmut_4",
                    "pipeline.data.checkpoint.x_write_checkpoint__mutmut_32",
                    "pipeline.data.checkpoint.x_write_checkpoint__mutmut_33",
                    "pipeline.data.checkpoint.x_write_checkpoint__mutmut_50",
                    "pipeline.data.checkpoint.x_write_checkpoint__mutmut_51")},
    **{f"pipeline.data.checkpoint.x_read_checkpoint__mutmut_{i}": "a file without a newline, or starting with one, "
       "has no parseable header either way: the same 'bad header' error" for i in (11, 13, 14, 18)},
    **{f"pipeline.data.checkpoint.x_read_checkpoint__mutmut_{i}": "without json_size (version 1) the slice "
       "payload[:None] is the whole payload, as payload[:len(payload)]" for i in (58, 60)},
    "pipeline.data.checkpoint.x_read_checkpoint__mutmut_85": (
        "np.frombuffer with count=0 gives the same empty array of that dtype as np.zeros(0)"),
    # pipeline/stages/rewards.py (run on 2026-11-30 after the rename from advantages.py)
    **{f"pipeline.stages.rewards.x__normalise__mutmut_{i}": "_normalise only gets 2-D blocks, where dim 1 is "
       "dim -1" for i in (2, 10, 34, 45)},
    "pipeline.stages.rewards.x__normalise__mutmut_25": (
        "a one-sample row is all-equal, so masked_fill sets it to 0 whatever the std division gave"),
    **{f"pipeline.stages.rewards.x_post_process_rewards__mutmut_{i}": "the whole batch (or one group_index group) "
       "as one group: a [1, L] view and an [L] view normalise the same over the last dim" for i in (41, 42, 43, 81)},
    **{f"pipeline.stages.rewards.x_post_process_rewards__mutmut_{i}": "torch.tensor of Python ints is int64 "
       "(torch.long) by default" for i in (69, 71)},
    # pipeline/stages/train_data.py
    **{f"pipeline.sinks.files.x__pad__mutmut_{i}": "torch.tensor/torch.full infer the dtype the code names "
       "from the values (ints: int64, floats: float32) whenever the values match it" for i in (10, 13, 17, 19)},
    **{f"pipeline.sinks.files.x_to_tensors__mutmut_{i}": "the padded values are ints, so the inferred dtype "
       "is torch.long anyway" for i in (17, 30)},
    # pipeline/rollout/sample_generate.py
    "pipeline.rollout.sample_generate.x_continuation_seed__mutmut_13": (
        "a fifth little-endian byte only sets bits 32-39, which the 31-bit mask drops"),
    "pipeline.rollout.sample_generate.x_default_generate__mutmut_1": (
        "default_generate takes `evaluation` for slime's generate signature and reads none of it"),
    **{f"pipeline.rollout.sample_generate.x_default_generate__mutmut_{i}": "append_response_tokens reads args only "
       "for slime's sglang_speculative_algorithm flag (fold speculative counters) and routed-expert rows; "
       "default_generate's meta has neither counters nor rows, so with or without args it adds zeros and no rows"
       for i in (108, 113)},
    "pipeline.rollout.sample_generate.x_sample_seed__mutmut_8": (
        "a fifth little-endian byte only sets bits 32-39, which the 31-bit mask drops"),
    # pipeline/rollout/train_run.py
    "pipeline.rollout.train_run.xǁTrainRunǁ_top_up__mutmut_16": (
        "a tolerance boundary: fixed mode's shortfall is an integer and adaptive mode's is target - kept - p * "
        "undecided with p a smoothed pass rate; no reachable count gives exactly 1e-6"),
    "pipeline.rollout.train_run.xǁTrainRunǁ_top_up__mutmut_62": (
        "a finished sample has its tokens, and encode_prompts only encodes samples without tokens or response; a "
        "fetched group holds Samples (fan-out lists never go back to the buffer)"),
    "pipeline.rollout.train_run.xǁTrainRunǁ_run_item__mutmut_57": (
        "with no hooks configured SampleHooks.apply returns each sample as it is (a list as an equal new list), so "
        "calling it changes nothing"),
    # pipeline/process/atomic.py
    **{f"pipeline.process.atomic.x_atomic_write_bytes__mutmut_{i}": "after a failed write the temp file exists (mkstemp made "
       "it; only a concurrent cleaner could remove it first), so missing_ok is never needed" for i in (26, 28)},
    **{f"pipeline.process.atomic.x__umask__mutmut_{i}": "/proc/self/status is ASCII text: 'ascii', 'ASCII' and the locale's "
       "default encoding (an ASCII superset on every Python-supported Linux locale) read it the same"
       for i in (2, 4, 8)},
    "pipeline.process.atomic.x__umask__mutmut_21": (
        "the temporary umask is set back on the next line and its value is never used: any value reads the old mask"),
    **{f"pipeline.process.atomic.x_make_temp__mutmut_{i}": "the fchmod failed right after mkstemp made the file, so it exists "
       "and missing_ok is never needed" for i in (15, 17)},
    "pipeline.process.atomic.x_prune_numbered_dirs__mutmut_1": (
        "keep < 0 instead of <= 0: with keep = 0 the slice found[:-0] is empty, so nothing is removed either way"),
    "pipeline.process.atomic.x_atomic_write_text__mutmut_7": "codec names are case-insensitive: 'UTF-8' is 'utf-8'",
    # pipeline/rollout/dynamic_filters.py
    "pipeline.rollout.dynamic_filters.x_check_reward_nonzero_std_with_fallback__mutmut_6": (
        "check_reward_nonzero_std takes **kwargs for slime's signature and reads none of them"),
    # pipeline/train/losses.py
    **{f"pipeline.train.losses.x_compute_approx_kl__mutmut_{i}": "leaving one operand in its own dtype: torch "
       "promotes it to the other's (float32 at least) for the subtraction, exactly as .to(dtype) does (every float "
       "converts exactly to a wider one)" for i in (12, 13)},
    **{f"pipeline.train.losses.x_compute_approx_kl__mutmut_{i}": "low_var_kl is k3 = e^-x - 1 + x >= 0 times an "
       "importance ratio that is an exp (> 0): the lower clamp bound is never reached" for i in (42, 47)},
    "pipeline.train.losses.x_compute_policy_loss__mutmut_43": (
        "at A = 0 the PPO loss and the dual-clip cap are both 0 (-0 * x), so capping it changes nothing"),
    "pipeline.train.losses.x_sample_mean_reducer__mutmut_28": (
        "an empty micro-batch's flat tensor is empty: its sum is 0 whatever it is multiplied by"),
    # pipeline/train/objective.py
    "pipeline.train.objective.x_policy_loss__mutmut_106": (
        "with kl_loss_coef 0 the KL never joins the loss, so computing it from log-probs that are not detached "
        "changes no value and no gradient (only which autograd graph the metric keeps alive until it is detached)"),
    # pipeline/train/batches.py
    "pipeline.train.batches.x_micro_batches__mutmut_20": (
        "the first sample of a step always opens a micro-batch (current is empty) and max(initial, its length) is "
        "its length for any initial value <= 2 (a sample has a prompt and a response token)"),
    **{f"pipeline.train.batches.x_pad_tokens__mutmut_{i}": "torch.full with an int fill value is int64 (torch.long) "
       "already" for i in (9, 12)},
    # pipeline/train/shared_prompt.py
    "pipeline.train.shared_prompt.x_length_chunks__mutmut_10": (
        "best[0] = 1 adds the same 1 to the cost of every split, so the least-cost split is the same"),
    "pipeline.train.shared_prompt.x_length_chunks__mutmut_12": (
        "cut[0] is never read: the walk back from the end stops when it reaches 0"),
    **{f"pipeline.train.shared_prompt.x_shared_prompt_log_probs__mutmut_{i}": "the prompts are right-padded: under "
       "causal attention no real prompt token sees the padding after it and positions count from 0 either way, so "
       "the prompt pass needs no mask; the response passes mask the padded prompt keys" for i in (39, 43)},
    # pipeline/config/plugins.py (the allowlist, run as pipeline/config/args.py before it moved: re-check the numbers)
    **{f"pipeline.config.plugins.x_load_object__mutmut_{i}": "the inner load_object one level up only tries; its `where` "
       "reaches nothing but its own error message, which `except Exception: pass` drops" for i in (31, 34)},
    # pipeline/data/sources.py
    **{f"pipeline.data.sources.x__copies__mutmut_{i}": "a JSON copy that fails or changes the value falls back to "
       "copy.deepcopy, which gives equal, independent copies of any value: the JSON round trip is only the faster "
       "way (only the identity of immutable leaves differs)" for i in (23, 24, 25, 26, 27, 34)},
    "pipeline.data.sources.x_prompt_groups__mutmut_6": (
        "both branches build the same samples (test_fast_and_plain_construction_give_the_same_samples pins it); the "
        "template one is only faster"),
    "pipeline.data.sources.x__copies__mutmut_3": (
        "str and NoneType are in _IMMUTABLE_TYPES: the first two tests are shortcuts of the third"),
    "pipeline.data.sources.xǁPlainDataSourceǁ_groups__mutmut_5": (
        "both branches build the same samples (test_fetched_samples_equal_constructed_ones pins it); the template "
        "one is only faster"),
    "pipeline.data.sources.xǁBufferedDataSourceǁget_samples__mutmut_37": (
        "when the buffer served every group asked for, the extra get_samples(0) on the prompts returns [] and moves "
        "no counter (no row read, no epoch step, no warning)"),
    "pipeline.data.sources.xǁBufferedDataSourceǁload_state_dict__mutmut_12": (
        "copy_state is only read as `if copy_state:`; None and False are both falsy"),
    "pipeline.data.sources.xǁBufferedDataSourceǁstate_dict__mutmut_1": (
        "raw is only read as `pack_raw if raw else pack_b64`; None and False are both falsy"),
    # pipeline/stages/train_data.py (second run)
    "pipeline.stages.train_data.x_train_data_stage__mutmut_18": (
        "convert_to_train_data takes args for slime's signature and reads none of it"),
    "pipeline.sinks.files.x_to_tensors__mutmut_67": (
        "torch infers the dtype the code names from the values (ints: int64, floats: float32)"),
    "pipeline.sinks.files.x_to_tensors__mutmut_69": (
        "torch infers the dtype the code names from the values (ints: int64, floats: float32)"),
    "pipeline.sinks.files.x_to_tensors__mutmut_7": (
        "torch infers the dtype the code names from the values (ints: int64, floats: float32)"),
    "pipeline.sinks.files.x_to_tensors__mutmut_80": (
        "torch infers the dtype the code names from the values (ints: int64, floats: float32)"),
    # pipeline/process/openmp.py
    "pipeline.process.openmp.x_release_thread_workers__mutmut_5": (
        "omp_pause_soft (1) or omp_pause_hard (2): libgomp's pause frees the calling thread's pool either way"),
    # pipeline/train/token_log_probs.py: chunking is exact, so how rows are cut into chunks (or
    # chunks that overlap or run to the end) changes the speed, never a value
    **{f"pipeline.train.token_log_probs.x__rows_per_chunk__mutmut_{i}": (
        "another chunk size: every row is computed the same way whatever the chunk") for i in (5, 8, 13)},
    **{name: "chunks that overlap or run to the last row: each row is written with the same values again"
       for name in ("pipeline.train.token_log_probs.xǁ_TokenLogProbsǁbackward__mutmut_17",
                    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁbackward__mutmut_20",
                    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁforward__mutmut_31",
                    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁforward__mutmut_33")},
    "pipeline.train.token_log_probs.x__scaled__mutmut_9": (
        "index_select already made the copy; .to() of the same dtype returns that copy itself"),
    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁforward__mutmut_53": "dim +1 and -1 name the same axis of [rows, V]",
    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁforward__mutmut_63": "dim +1 and -1 name the same axis of [rows, V]",
    "pipeline.train.token_log_probs.xǁ_TokenLogProbsǁforward__mutmut_96": (
        "materialized zero gradients for an unused output add zero: the same gradient, computed more slowly"),
    # pipeline/train/state.py
    "pipeline.train.state.x_read_meta__mutmut_11": (
        "trainer_state.json is written by json.dumps with ensure_ascii (ASCII only, the driver's too): the locale's "
        "default encoding, an ASCII superset on every Python-supported Linux locale, reads it as utf-8 does"),
    "pipeline.train.state.x_read_meta__mutmut_13": "codec names are case-insensitive: 'UTF-8' is 'utf-8'",
    **{f"pipeline.train.state.x_restore_rng__mutmut_{i}": "np.random.set_state converts the key array to uint32 "
       "itself (an int64 array of the same values gives the same state)" for i in (18, 20)},
    "pipeline.train.state.x_save_state__mutmut_76": (
        "the file is opened only for its descriptor to fsync: text or binary mode, nothing is read"),
    # pipeline/train/optim.py
    "pipeline.train.optim.xǁLrScheduleǁat__mutmut_2": (
        "optimizer steps count from 0: with no warm-up (0) no step is below it, so `warmup >= 0 and step < warmup` "
        "is never true either"),
    # pipeline/train/distributed/strategy.py
    **{f"pipeline.train.distributed.strategy.xǁTorchParallelǁmost__mutmut_{i}": "`most` gets counts (Python ints), "
       "and torch.tensor of ints is int64 already" for i in (3, 6)},
    "pipeline.train.distributed.strategy.xǁTorchParallelǁtotal__mutmut_11": "SUM is all_reduce's default op",
    "pipeline.train.distributed.strategy.xǁTorchParallelǁreshard__mutmut_1": (
        "`or` instead of `and` also reshards a DDP model (it has no FSDP module: nothing to do) and an FSDP2 model "
        "that reshards after every forward (nothing is gathered after one: reshard() changes nothing)"),
    **{f"pipeline.train.distributed.strategy.xǁTorchParallelǁwrap__mutmut_{i}": "with one worker the gradient "
       "reduce-scatter has one bfloat16 gradient to sum, exact in bfloat16 as in float32, and only a test on one "
       "process group of one rank runs fast enough here; no slow test compares two bfloat16 workers either (the "
       "float32 reduction of N workers' gradients is unpinned)" for i in (24, 26)},
    # pipeline/train/distributed/shards.py
    **{f"pipeline.train.distributed.shards.x_{fn}__mutmut_{i}": "cpu_offload only moves the gathered tensors to the "
       "CPU and leaves them off the other ranks: a CPU worker's are on the CPU already, and only rank 0's are "
       "returned (on CUDA: scripts/gpu_check.sh's two-worker runs)" for fn in ("full_weights", "adapter_weights")
       for i in (7, 9, 11)},
    "pipeline.train.distributed.shards.x_full_weights__mutmut_15": (
        "merge_lora of a model without LoRA layers gives every tensor under its own name (no '.base_layer.', no "
        "peft prefix, no 'lora_' in an HF name): the same dict"),
    **{f"pipeline.train.distributed.shards.x_load_full_state__mutmut_{i}": "set_state_dict with full_state_dict "
       "fills the keys the given state lacks (a LoRA base, frozen) from the model's own before it loads (torch "
       "2.13), so a strict load finds nothing missing either; unknown and missing trainable names are refused "
       "before it (pinned)" for i in (55, 57, 59)},
    "pipeline.train.distributed.shards.x_load_shards__mutmut_13": (
        "warnings filters match their message case-insensitively: the upper-case pattern silences the same notice"),
    "pipeline.train.distributed.shards.x_load_shards__mutmut_43": (
        "get_state_dict's model tensors are the parameters themselves (plain or DTensor shards): dcp.load writes "
        "into them in place, so handing them to set_state_dict again changes nothing (the optimizer's part is "
        "needed, and pinned)"),
    **{f"pipeline.train.distributed.shards.x_load_shards__mutmut_{i}": "with strict=False the frozen parameters "
       "the checkpoint lacks (a LoRA base) are skipped whether or not set_state_dict is told to ignore them"
       for i in (55, 57, 59)},
    "pipeline.train.distributed.shards.x_load_shards__mutmut_56": (
        "strict=None is falsy, read as strict=False (a strict load is refused: that mutant is killed)"),
    **{f"pipeline.train.distributed.shards.x_merge_lora__mutmut_{i}": "peft's LoRA Linear and Conv1D layers "
       "always set fan_in_fan_out, so getattr's default is never read" for i in (15, 18, 21)},
    # pipeline/train/distributed/driver.py
    **{f"pipeline.train.distributed.driver.xǁDistributedTrainerǁ{fn}__mutmut_{i}": "an engine without _target_: '', "
       "'None' and 'XXXX' alike do not end with 'RayEngine'" for fn, nums in (("_address", (15, 17, 20)),
                                                                             ("_local_cpus", (16, 18, 21)))
       for i in nums},
    "pipeline.train.distributed.driver.xǁDistributedTrainerǁtrain__mutmut_110": (
        "float() reads 'NAN' as 'nan' (case-insensitive): the same NaN in the log line"),
    # pipeline/train/distributed/worker.py
    "pipeline.train.distributed.worker.xǁTrainerWorkerǁfree_port__mutmut_4": (
        "SOCK_STREAM is socket.socket's default type"),
    # pipeline/train/distributed/group.py
    "pipeline.train.distributed.group.xǁWorkerGroupǁ_wait__mutmut_25": (
        "RayTaskError always sets `cause` (None when the worker's exception could not be rebuilt), the only "
        "exception that reaches this getattr: its default is never read"),
    # pipeline/train/distributed/split.py
    "pipeline.train.distributed.split.x_balance__mutmut_29": (
        "every worker's load starting at 1 instead of 0 adds the same constant to all loads: the least-loaded "
        "worker, ties by rank, is the same at every choice"),
    # pipeline/rewards/remote.py
    **{f"pipeline.rewards.remote.xǁRemoteRewardǁ__init____mutmut_{i}": "a default of RemoteReward's own: the "
       "dispatcher always passes the reward.remote_* values (conf/reward/math.yaml), so it is never used"
       for i in (1, 2, 3, 4)},
    "pipeline.rewards.remote.xǁRemoteRewardǁ__init____mutmut_23": (
        "httpx's connection limit: the LoopLocal semaphore of the same size admits no more requests at "
        "once, so the pool never holds more (test_remote_concurrency_limit_and_rm_url_fallback pins it)"),
    "pipeline.rewards.remote.xǁRemoteRewardǁ__init____mutmut_25": (
        "httpx's connection limit: the LoopLocal semaphore of the same size admits no more requests at "
        "once, so the pool never holds more (test_remote_concurrency_limit_and_rm_url_fallback pins it)"),
    # pipeline/run/overrides.py
    "pipeline.run.overrides.x_edit_distance__mutmut_1": (
        "`before`'s first value is never read: the swap branch needs i > 1, and by then `before` is the row "
        "before `prev`"),
    # pipeline/train/distributed/gloo_comm.py
    **{f"pipeline.train.distributed.gloo_comm.xǁ{cls}ǁ__call____mutmut_1": "the default of async_op is never "
       "read: both comms run synchronously and return None whatever it is"
       for cls in ("BroadcastAllGather", "AllReduceScatter")},
    # pipeline/train/policy_gradient.py
    "pipeline.train.policy_gradient.xǁPolicyGradientTrainerǁ__init____mutmut_87": "None and False are both falsy: the model loads on first use either way",
    "pipeline.train.policy_gradient.xǁPolicyGradientTrainerǁ_log_probs__mutmut_1": "the default of `passes` is never used: every caller passes it",
    "pipeline.train.policy_gradient.xǁPolicyGradientTrainerǁtrain__mutmut_119": "float('NAN') is float('nan'): the log line says nan either way",
    "pipeline.train.policy_gradient.xǁPolicyGradientTrainerǁload__mutmut_1": ("self.model is an argument of both state loads, so it is loaded (and the KL "
                           "reference copied) before either reads the state, with or without this line"),
    # pipeline/train/sync.py
    "pipeline.train.sync.x_push_weights__mutmut_79": (
        "by_ref is only read as `if by_ref`: an engine without takes_object_refs gives None instead of False, "
        "both falsy"),
    # pipeline/train/model.py
    **{f"pipeline.train.model.x_export_hf__mutmut_{i}": "a peft model forwards `config` to its base model: "
       "model.config is model.get_base_model().config, the same object" for i in (2, 4)},
    **{f"pipeline.train.model.x_export_state__mutmut_{i}": "transformers 5 no longer has safe_serialization: "
       "save_pretrained takes it into **kwargs and always writes model.safetensors (True, None, False or "
       "missing)" for i in (13, 15, 17)},
    "pipeline.train.model.x_load_policy__mutmut_7": (
        "from_pretrained(attn_implementation=None) sets config._attn_implementation to None, which picks "
        "transformers' default as when the key is missing (the asked one is pinned by test_model.py)"),
    "pipeline.train.model.x_save_adapter__mutmut_11": "peft's save_pretrained defaults to safe_serialization=True",
    "pipeline.train.model.x_wrap_lora__mutmut_18": 'LoraConfig\'s default bias is "none", the value given',
    # pipeline/train/preflight.py
    **{f"pipeline.train.preflight.x__where__mutmut_{i}": (
        "`local` of a _Where whose device is None is never read: trainer_warnings stops at `device != \"cpu\"` "
        "and _where_problems at `device == \"cuda\"` before it; None is as falsy as False (the cluster "
        "branch) and the auto-in-process branch has device None too") for i in (29, 47)},
    "pipeline.train.preflight.x__where_problems__mutmut_24": (
        "on CUDA the backend check cannot fail (gloo, nccl and auto all run there; the choice itself was "
        "checked by _where_key_problems), so `out` is still empty when the GPU problems are added"),
    "pipeline.train.preflight.x__where_problems__mutmut_32": (
        "_split_problems of 1 worker is always empty: 1 <= global_batch_size < 1 cannot hold and a valid "
        "rollout has rollout_batch_size x n_samples_per_prompt >= 1 samples"),
    "pipeline.train.preflight.x_trainer_warnings__mutmut_36": (
        "planned_threads only asks whether num_workers is 1, and trainer_warnings has returned for 1 worker "
        "already: None, like any count > 1, takes the reservation branch"),
    # pipeline/train/function.py
    **{f"pipeline.train.function.xǁFunctionTrainerǁload__mutmut_{i}": (
        "the state is json.dumps output, ASCII whatever the path (ensure_ascii): it reads the same as "
        "UTF-8, as \"UTF-8\" (the same codec) and in the locale's encoding") for i in (3, 9)},
    # pipeline/rewards/labels.py
    **{f"pipeline.rewards.labels.x_empty_labels_in_rows__mutmut_{i}": (
        "a renamed part of the scan's cache key, or its version bumped: the key is a private hash, every "
        "part still separates entries, and only an old cache entry (rebuilt on a miss) could tell") for i in
       (12, 13, 14, 15, 19, 20, 21, 22, 23, 24, 25, 26, 30, 31, 32)},
    "pipeline.rewards.labels.x__columnar__mutmut_25": (
        "a null label left null instead of False: to_numpy gives None there, which flatnonzero treats as False"),
    "pipeline.rewards.labels.x__columnar__mutmut_34": "zero_copy_only=None is falsy, as False: the same copy",
    # pipeline/samples/sample.py
    "pipeline.samples.sample.x__ints__mutmut_2": (
        "_ints' tolist() is only a speed path: int() of each element of a 1-D tensor / array (the top-p ids and "
        "offsets a sample holds) gives the same plain ints as int() of its tolist()"),
    **{f"pipeline.samples.sample.x__ints__mutmut_{i}": (
        "the tolist() speed path is skipped (hasattr(None, ...) or a misspelt attribute); int() per element gives "
        "the same plain ints (see _ints__mutmut_2)") for i in (4, 8, 9)},
    # pipeline/rewards/text_rules.py
    "pipeline.rewards.text_rules.x_extract_choice__mutmut_13": (
        "without a box (or with an empty one) the boxed-letter pattern sees 'XXXX' instead of '': it matches one "
        "letter only (maybe wrapped), so four letters match no more than nothing does; the pick is the same"),
    "pipeline.rewards.text_rules.x_f1_reward__mutmut_17": (
        "an empty or missing response is read as 'XXXX' instead of '': F1 stays 0.0 against every label except one "
        "whose normalised text holds the token 'xxxx' (mutmut's own marker, no real answer)"),
    "pipeline.rewards.text_rules.x_grade_gpqa__mutmut_5": (
        "an empty or missing response is read as 'XXXX' instead of '': no letter pattern, box or lone capital "
        "letter is in it, so no pick; it scores only against an answer text that normalises to 'xxxx' "
        "(mutmut's own marker, no real choice)"),
    "pipeline.rewards.text_rules.x_grade_gpqa__mutmut_58": (
        "a non-text label (an index, None) gets the answer text 'XXXX' instead of none: only a response holding "
        "the word 'xxxx' (mutmut's own marker, no real answer) would score by it"),
    # pipeline/run/overrides.py
    "pipeline.run.overrides.x_unique_dir_arg__mutmut_12": (
        "bare_ok is only read as `arg if bare_ok else ...`; None and False are both falsy"),
}
