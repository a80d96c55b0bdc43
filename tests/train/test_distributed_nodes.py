"""Two Ray nodes (Ray's own `ray.cluster_utils.Cluster`, simulated on this machine): the trainer's
2 workers join the cluster by `trainer.address`, one on each node, and train to the weights the
one-process trainer reaches on the same data."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.config.args import SlimeArgs
from pipeline.train.build import policy_gradient_trainer
from test_distributed_trainer import grpo_data, keys, max_diff
from trainer_fixtures import tiny_llama

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes
    if ray.is_initialized():
        ray.shutdown()
    nodes.shutdown()


def test_one_worker_per_node_trains_to_the_one_process_weights(cluster, tmp_path):
    import ray

    folder = tmp_path / "tiny"
    tiny_llama(torch.float32).save_pretrained(folder)
    common = {"hf_checkpoint": str(folder)}
    local = policy_gradient_trainer(**keys(str(folder)))
    args = SlimeArgs({"paths": {"output_dir": str(tmp_path / "run")}, "resume": None})
    dist = policy_gradient_trainer(args=args, **{**keys(str(folder)), "num_workers": 2, "address": cluster.address,
                                                 "placement_strategy": "STRICT_SPREAD", **common})
    try:
        nodes = {w["node_id"] for w in dist.group.where}
        assert len(nodes) == 2  # one worker on each node
        assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        for rollout in range(2):
            a, b = local.train(rollout, grpo_data()), dist.train(rollout, grpo_data())
            assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-6)
        assert max_diff(local.weights_for_engine(), dist.weights_for_engine()) < 1e-5
        dist.save(str(tmp_path / "state"))
        assert (tmp_path / "state" / ".metadata").is_file()
    finally:
        dist.close()
    assert not ray.is_initialized()  # the trainer joined the cluster, and left it
