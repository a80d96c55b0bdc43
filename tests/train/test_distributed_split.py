"""The driver's decisions without Ray: how a rollout's samples are dealt out to the workers, and
what a local Ray started for them declares."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cluster.devices import DeviceError
from pipeline.train.distributed import driver as driver_module
from pipeline.train.distributed.driver import DistributedTrainer
from pipeline.train.distributed.split import balance, plan_shares, prompt_keys, slice_train_data
from trainer_fixtures import yaml_keys


def test_groups_stay_together_when_there_are_enough_prompts():
    # 4 prompts x 2 samples over 2 workers: whole groups, 2 each, token-balanced
    tokens = [[1, 2, 9], [1, 2, 8], [3, 9, 9, 9], [3, 8, 8, 8], [4, 5], [4, 6], [7, 7, 7, 1], [7, 7, 7, 2]]
    lengths = [1, 1, 3, 3, 1, 1, 1, 1]
    prompts = prompt_keys(tokens, lengths)
    parts = balance(range(8), [len(t) for t in tokens], prompts, 2)
    assert sorted(i for p in parts for i in p) == list(range(8))
    for part in parts:
        assert {prompts[i] for i in part} and all(
            sum(prompts[j] == prompts[i] for j in part) == 2 for i in part)  # no group is cut
    loads = [sum(len(tokens[i]) for i in p) for p in parts]
    assert loads == [14, 12] or loads == [12, 14]


def test_prompt_keys_are_the_tokens_before_the_response_and_refuse_lists_of_different_lengths():
    assert prompt_keys([[1, 2, 3], [4, 5, 6, 7]], [1, 3]) == [(1, 2), (4,)]
    with pytest.raises(ValueError):  # a sample without a response length is an error, not dropped
        prompt_keys([[1, 2, 3], [4, 5, 6, 7]], [1])
    with pytest.raises(ValueError):
        prompt_keys([[1, 2, 3]], [1, 1])


def test_fewer_prompts_than_workers_split_by_sample_and_largest_first():
    lengths_total = [10, 2, 7, 3]
    parts = balance([0, 1, 2, 3], lengths_total, [(1,)] * 4, 3)
    assert parts == [[0], [2], [1, 3]]  # 10 | 7 | 2 + 3


def test_a_step_smaller_than_the_workers_leaves_some_with_nothing():
    shares = plan_shares([[0, 1, 2], [3]], [5, 5, 5, 5], [(0,), (1,), (2,), (3,)], 2)
    assert [s.samples for s in shares] == [[0, 2, 3], [1]] or [s.samples for s in shares] == [[0, 3], [1, 2]]
    assert any(step == [] for s in shares for step in s.steps)
    for s in shares:  # positions point back at the share's own samples, step by step
        assert sorted(p for step in s.steps for p in step) == list(range(len(s.samples)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), min_size=1, max_size=24),
       st.integers(1, 5), st.sampled_from([None, 1, 3, 7]))
def test_every_sample_goes_to_exactly_one_worker_in_every_step(rows, workers, gbs):
    tokens = [[p, p, p] + [9] * n for p, n in rows]
    lengths = [n for _, n in rows]
    steps = [list(range(i, min(i + (gbs or len(rows)), len(rows)))) for i in range(0, len(rows), gbs or len(rows))]
    shares = plan_shares(steps, [len(t) for t in tokens], prompt_keys(tokens, lengths), workers)
    assert len(shares) == workers
    for k, step in enumerate(steps):
        got = sorted(s.samples[p] for s in shares for p in s.steps[k])
        assert got == step
        if len(step) >= workers:
            assert all(s.steps[k] for s in shares)  # nobody idles while there is enough
    loads = [s.num_tokens([len(t) for t in tokens]) for s in shares]
    assert sum(loads) == sum(len(t) for t in tokens)


def test_slice_cuts_per_sample_lists_and_keeps_the_rest():
    data = {"tokens": [[1], [2], [3]], "rewards": [0.1, 0.2, 0.3], "round_number": 7, "pair": [1, 2]}
    assert slice_train_data(data, [2, 0], 3) == {"tokens": [[3], [1]], "rewards": [0.3, 0.1], "round_number": 7,
                                                 "pair": [1, 2]}
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        balance([0], [1], [()], 0)


def driver(engine=None, **overrides):
    t = DistributedTrainer(**yaml_keys(**{"num_workers": 2, **overrides}))
    t._args = {"engine": engine or {}}
    return t


def test_a_local_ray_declares_cpus_for_the_workers_and_ray_replicas(monkeypatch):
    monkeypatch.setattr(driver_module.os, "cpu_count", lambda: 2)
    assert driver()._local_cpus() == 2
    assert driver(num_workers=3, num_cpus_per_worker=1.5)._local_cpus() == 5
    ray_engine = {"_target_": "pipeline.engines.ray_pool.RayEngine", "num_replicas": 2, "num_cpus_per_replica": 1,
                  "num_cpus": None}
    assert driver(engine=ray_engine)._local_cpus() == 4
    assert driver(engine={**ray_engine, "num_cpus": 8})._local_cpus() == 8


def test_cuda_workers_leave_the_engine_its_own_gpu(monkeypatch):
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: 4)
    hf = {"_target_": "pipeline.engines.hf.HFEngine", "device": "cuda", "colocate": False}
    t = driver(engine=hf)
    assert t._local_gpus("cpu", None) is None and t._local_gpus("cuda", "auto") is None
    assert t._local_gpus("cuda", None) == 3
    assert driver(engine={**hf, "colocate": True})._local_gpus("cuda", None) == 4
    assert driver(engine={**hf, "device": "cpu"})._local_gpus("cuda", None) == 4
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: 1)
    with pytest.raises(DeviceError, match="set engine.colocate=true"):
        driver(engine=hf)._local_gpus("cuda", None)


def test_bad_worker_settings_are_refused_before_ray():
    with pytest.raises(ValueError, match="trainer.num_workers must be an integer >= 1"):
        DistributedTrainer(**yaml_keys(num_workers=0))
    with pytest.raises(ValueError, match=r"trainer.strategy must be one of \['fsdp2', 'ddp'\]"):
        DistributedTrainer(**yaml_keys(num_workers=2, strategy="zero3"))
