"""Train data -> samples, optimizer steps, micro-batches, padding and response log-probs
(pipeline.train.batches), on hand-built inputs and a fake model whose logits are known."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pipeline.train.batches import TrainSamples, micro_batches, optimizer_steps, pad_tokens, response_log_probs

VOCAB = 4


def train_data(**over):
    data = dict(tokens=[[5, 6, 7], [5, 8, 9, 10]], response_lengths=[1, 2], loss_masks=[[1], [1, 0]],
                rewards=[1, 0.5], rollout_log_probs=[[-0.5], [-1.0, -2.0]])
    data.update(over)
    return data


def test_samples_from_train_data_keep_slimes_per_sample_layout():
    s = TrainSamples.from_train_data(train_data())
    assert [t.tolist() for t in s.tokens] == [[5, 6, 7], [5, 8, 9, 10]]
    assert all(t.dtype == torch.long for t in s.tokens)
    assert s.response_lengths == [1, 2]
    assert [m.tolist() for m in s.loss_masks] == [[1.0], [1.0, 0.0]]
    assert all(m.dtype == torch.float32 for m in s.loss_masks)
    assert s.rewards == [1.0, 0.5] and all(isinstance(r, float) for r in s.rewards)
    assert [r.tolist() for r in s.rollout_log_probs] == [[-0.5], [-1.0, -2.0]]
    assert all(r.dtype == torch.float32 for r in s.rollout_log_probs)
    assert len(s) == 2 and s.total_lengths == [3, 4] and s.num_tokens() == 7
    assert TrainSamples.from_train_data(train_data(rollout_log_probs=None)).rollout_log_probs is None
    data = train_data()
    del data["rollout_log_probs"]
    assert TrainSamples.from_train_data(data).rollout_log_probs is None


def test_numpy_train_data_gives_long_ids_and_float32_log_probs():
    s = TrainSamples.from_train_data(train_data(
        tokens=[np.array([5, 6, 7], dtype=np.int32), np.array([5, 8, 9, 10], dtype=np.int32)],
        rollout_log_probs=[np.array([-0.5]), np.array([-1.0, -2.0])]))
    assert all(t.dtype == torch.long for t in s.tokens)
    assert all(r.dtype == torch.float32 for r in s.rollout_log_probs)


@pytest.mark.parametrize("key", ["response_lengths", "loss_masks", "rollout_log_probs"])
def test_a_per_sample_list_shorter_than_the_tokens_is_refused(key):
    data = train_data() if key == "rollout_log_probs" else train_data(rollout_log_probs=None)
    data[key] = data[key][:1]
    with pytest.raises(ValueError):
        TrainSamples.from_train_data(data)


@pytest.mark.parametrize("key", ["tokens", "response_lengths", "loss_masks", "rewards"])
def test_missing_train_data_key_is_named(key):
    data = train_data()
    del data[key]
    with pytest.raises(ValueError, match=rf"^train data has no '{key}' \(keys: "):
        TrainSamples.from_train_data(data)


@pytest.mark.parametrize("length", [0, 3])
def test_response_length_needs_a_prompt_token_and_a_response_token(length):
    with pytest.raises(ValueError, match=rf"^sample 0: response_length {length} must be in 1\.\.2 \(it has 3 tokens"):
        TrainSamples.from_train_data(train_data(response_lengths=[length, 2], loss_masks=[[1] * length, [1, 0]]))
    # the bounds themselves: 1 and len - 1 are fine
    TrainSamples.from_train_data(train_data(response_lengths=[2, 1], loss_masks=[[1, 1], [1]],
                                            rollout_log_probs=[[0.0, 0.0], [0.0]]))


def test_mask_and_rollout_log_probs_lengths_are_checked_per_sample():
    with pytest.raises(ValueError, match=r"^sample 1: loss_mask has 1 entries, response_length is 2$"):
        TrainSamples.from_train_data(train_data(loss_masks=[[1], [1]]))
    with pytest.raises(ValueError, match=r"^sample 1: rollout_log_probs has 3 entries, response_length is 2$"):
        TrainSamples.from_train_data(train_data(rollout_log_probs=[[-0.5], [0.0, 0.0, 0.0]]))


def test_optimizer_steps_take_global_batch_size_samples_in_order():
    assert optimizer_steps(5, 2) == [[0, 1], [2, 3], [4]]
    assert optimizer_steps(4, 2) == [[0, 1], [2, 3]]
    assert optimizer_steps(3, 1) == [[0], [1], [2]]
    assert optimizer_steps(3, None) == [[0, 1, 2]]
    assert optimizer_steps(3, 0) == [[0, 1, 2]]
    assert optimizer_steps(3, 8) == [[0, 1, 2]]
    assert optimizer_steps(0, None) == []


def test_micro_batches_by_count():
    assert micro_batches([3, 4, 5, 6, 7], [1] * 8, 2, None) == [[3, 4], [5, 6], [7]]
    assert micro_batches([3, 4], [1] * 8, 0, None) == [[3], [4]]  # a size below 1 is 1
    assert micro_batches([3, 4, 5], [1] * 8, 3, 0) == [[3, 4, 5]]


def test_micro_batches_by_padded_tokens():
    lengths = [4, 2, 3, 8, 1, 1]
    # budget 8: [4, 2] pads to 2 x 4 = 8 (fits); + 3 -> 3 x 4 = 12 (no); [3] then + 8 -> 16 (no);
    # [8] alone; [1, 1] -> 2 x 1
    assert micro_batches(list(range(6)), lengths, 99, 8) == [[0, 1], [2], [3], [4, 5]]
    # a sample longer than the budget gets a micro-batch of its own
    assert micro_batches([0, 3, 4], lengths, 99, 6) == [[0], [3], [4]]
    # the growing longest counts: [1, 1] then 4 -> 3 x 4 = 12 > 9
    assert micro_batches([4, 5, 0, 1], lengths, 99, 9) == [[4, 5], [0, 1]]
    assert micro_batches([], lengths, 99, 8) == []


def test_pad_tokens_right_pads_with_a_mask():
    ids, mask = pad_tokens([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=2)
    assert ids.tolist() == [[5, 6, 7], [8, 2, 2]] and ids.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]] and mask.dtype == torch.long
    ids, _ = pad_tokens([torch.tensor([1]), torch.tensor([1, 1])])
    assert ids.tolist() == [[1, 0], [1, 1]]


class FakeModel:
    """Logits at a position depend on that position's token: logits[v] = (token % 3 + 1) * v / 2."""

    def __init__(self, dtype=torch.float32):
        self.calls = []
        self.dtype = dtype

    def __call__(self, input_ids, attention_mask, logits_to_keep, use_cache):
        self.calls.append(dict(ids=input_ids.tolist(), mask=attention_mask.tolist(), keep=logits_to_keep,
                               use_cache=use_cache))
        self.autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
        scale = (input_ids % 3 + 1).to(torch.float64).unsqueeze(-1) / 2
        logits = (scale * torch.arange(VOCAB, dtype=torch.float64)).to(self.dtype)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:])


def log_softmax(values):
    top = max(values)
    log_z = top + math.log(sum(math.exp(v - top) for v in values))
    return [v - log_z for v in values]


def expected_log_prob(prev_token, token, temperature=1.0):
    logits = [(prev_token % 3 + 1) * v / 2 / temperature for v in range(VOCAB)]
    return log_softmax(logits)[token]


def expected_entropy(prev_token, temperature=1.0):
    lp = log_softmax([(prev_token % 3 + 1) * v / 2 / temperature for v in range(VOCAB)])
    return -sum(math.exp(x) * x for x in lp)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_response_log_probs_read_the_logit_before_each_response_token(temperature):
    # sample 0: prompt [1, 2], response [3, 0]; sample 1: prompt [2, 1, 0], response [2]
    tokens = [torch.tensor([1, 2, 3, 0]), torch.tensor([2, 1, 0, 2])]
    model = FakeModel()
    log_probs, entropy = response_log_probs(model, tokens, [2, 1], temperature, with_entropy=True)
    assert log_probs[0].tolist() == pytest.approx([expected_log_prob(2, 3, temperature),
                                                   expected_log_prob(3, 0, temperature)], rel=1e-5)
    assert log_probs[1].tolist() == pytest.approx([expected_log_prob(0, 2, temperature)], rel=1e-5)
    assert entropy[0].tolist() == pytest.approx([expected_entropy(2, temperature), expected_entropy(3, temperature)],
                                                rel=1e-5)
    assert entropy[1].tolist() == pytest.approx([expected_entropy(0, temperature)], rel=1e-5)
    # only the logits from the first one any response needs (position 1) are asked for; no KV cache
    assert model.calls == [dict(ids=[[1, 2, 3, 0], [2, 1, 0, 2]], mask=[[1, 1, 1, 1], [1, 1, 1, 1]], keep=3,
                                use_cache=False)]


def test_response_log_probs_of_right_padded_samples_and_without_entropy():
    tokens = [torch.tensor([1, 2]), torch.tensor([2, 1, 0, 1, 2])]
    model = FakeModel()
    log_probs, entropy = response_log_probs(model, tokens, [1, 3], 1.0, with_entropy=False)
    assert entropy is None
    assert log_probs[0].tolist() == pytest.approx([expected_log_prob(1, 2)], rel=1e-5)
    assert log_probs[1].tolist() == pytest.approx([expected_log_prob(1, 0), expected_log_prob(0, 1),
                                                   expected_log_prob(1, 2)], rel=1e-5)
    assert model.calls[0]["mask"] == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]] and model.calls[0]["keep"] == 5


def test_response_log_probs_are_float32_at_least():
    tokens = [torch.tensor([1, 2, 3])]
    (lp,), _ = response_log_probs(FakeModel(torch.bfloat16), tokens, [1], 1.0, with_entropy=False)
    assert lp.dtype == torch.float32
    (lp,), _ = response_log_probs(FakeModel(torch.float64), tokens, [1], 1.0, with_entropy=False)
    assert lp.dtype == torch.float64


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_the_forward_runs_under_autocast_only_when_asked_and_in_the_dtype_asked(dtype):
    model = FakeModel()
    response_log_probs(model, [torch.tensor([1, 2, 3])], [1], 1.0, with_entropy=False, autocast_dtype=dtype)
    assert model.autocast[0] is (dtype is not None)
    if dtype is not None:
        assert model.autocast[1] == dtype


# -- issue 31: samples sharing a rollout_id (one trajectory split into several samples) --

def test_optimizer_steps_take_global_batch_size_rollouts_keeping_a_rollouts_samples_together():
    # slime's dp schedule: a step holds global_batch_size rollouts (first-seen order), all their samples
    assert optimizer_steps(5, 2, rollout_ids=[0, 0, 1, 2, 2]) == [[0, 1, 2], [3, 4]]
    assert optimizer_steps(4, 1, rollout_ids=[7, 3, 7, 3]) == [[0, 2], [1, 3]]
    assert optimizer_steps(3, None, rollout_ids=[0, 0, 1]) == [[0, 1, 2]]
    assert optimizer_steps(3, 2, rollout_ids=[4, 5, 6]) == optimizer_steps(3, 2) == [[0, 1], [2]]
    assert optimizer_steps(0, 2, rollout_ids=[]) == []


def test_rollout_weights_are_per_step_mask_totals_and_one_count_per_rollout():
    from pipeline.train.batches import rollout_weights

    # rollout 0: samples 0, 1 (2 + 2 masked tokens); rollout 1: samples 2, 3 (0 + 1)
    sums, counted = rollout_weights([0, 0, 1, 1], [2, 2, 0, 1], [[0, 1, 2, 3]])
    assert sums == [4.0, 4.0, 1.0, 1.0] and counted == [1, 0, 1, 0]
    # a rollout's samples in two steps (explicit steps): each step counts its part once
    sums, counted = rollout_weights([0, 0, 1], [2, 3, 1], [[0], [1, 2]])
    assert sums == [2.0, 3.0, 1.0] and counted == [1, 1, 1]


def test_samples_read_the_rollout_ids_and_weigh_them_as_one_step_or_as_annotated():
    from pipeline.train.batches import annotate

    data = train_data(tokens=[[5, 6, 7], [5, 8, 9, 10], [1, 2]], response_lengths=[1, 2, 1],
                      loss_masks=[[1], [1, 1], [1]], rewards=[1, 0.5, 0], rollout_log_probs=None, rollout_ids=[3, 3, 4])
    s = TrainSamples.from_train_data(data)
    assert s.rollout_ids == [3, 3, 4] and s.rollout_mask_sums == [3.0, 3.0, 1.0] and s.rollout_counted == [1, 0, 1]
    # one rollout per step: each step weighs its own samples
    per_step = s.for_steps([[0], [1], [2]])
    assert per_step.rollout_mask_sums == [1.0, 2.0, 1.0] and per_step.rollout_counted == [1, 1, 1]
    # a worker's slice of annotated train data keeps the whole step's weights
    whole = annotate(data, [[0, 1, 2]])
    part = {k: (v[1:] if isinstance(v, list) else v) for k, v in whole.items()}
    sliced = TrainSamples.from_train_data(part)
    assert sliced.rollout_mask_sums == [3.0, 1.0] and sliced.rollout_counted == [0, 1]
    assert "rollout_counted" not in data  # annotate copies
    plain = TrainSamples.from_train_data(train_data())
    assert plain.rollout_ids is None and plain.rollout_mask_sums is None and plain.rollout_counted is None
    assert annotate(train_data(), [[0, 1]]) == train_data()


def test_workers_shares_of_a_step_add_up_to_the_one_process_loss_sums_and_normaliser():
    # the distributed trainer's normalisers are the whole step's: split a step with rollouts
    # over 2 workers (plan_shares) and the parts add up to the one-process numbers
    from pipeline.train.batches import annotate
    from pipeline.train.distributed.split import plan_shares, prompt_keys, slice_train_data
    from pipeline.train.losses import normalizer_part, sample_mean_reducer

    tokens = [[1, 2, 3], [1, 2, 4, 5], [6, 7, 8, 9, 9], [6, 7, 8, 1], [3, 3, 1], [3, 3, 2, 2, 2, 2]]
    lengths = [1, 2, 2, 1, 1, 4]
    data = {"tokens": tokens, "response_lengths": lengths, "loss_masks": [[1] * n for n in lengths],
            "rewards": [0.0] * 6, "rollout_ids": [0, 1, 1, 2, 0, 2]}
    steps = optimizer_steps(6, None, data["rollout_ids"])
    annotated = annotate(data, steps)
    values = [torch.arange(n, dtype=torch.float64) + 1 for n in lengths]
    mode = "seq-mean-token-mean"

    def sums(samples, values):
        reduce = sample_mean_reducer(samples.response_lengths, samples.loss_masks, mode,
                                     sample_denoms=samples.rollout_mask_sums)
        return (reduce(torch.cat(values)).item() if values else 0.0,
                normalizer_part(samples.loss_masks, mode, samples.rollout_counted))

    whole = sums(TrainSamples.from_train_data(annotated), values)
    assert whole[1] == 3.0  # three rollouts
    shares = plan_shares(steps, [len(t) for t in tokens], prompt_keys(tokens, lengths), 2)
    parts = [sums(TrainSamples.from_train_data(slice_train_data(annotated, s.samples, 6)),
                  [values[i] for i in s.samples]) for s in shares]
    assert all(s.samples for s in shares)
    assert sum(p[0] for p in parts) == pytest.approx(whole[0], rel=1e-15)
    assert sum(p[1] for p in parts) == whole[1]
