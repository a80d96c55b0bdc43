"""Weight sync from a trainer to fake engines, the function trainer, adapter folders and the HF export."""

import copy
import json
import time

import pytest
import torch

from pipeline.config.args import SlimeArgs
from pipeline.train.function import FunctionTrainer
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.sync import push_weights
from trainer_fixtures import tiny_llama, train_data, yaml_keys

torch.set_num_threads(1)


class FullEngine:
    def __init__(self):
        self.updates = []

    def update_weights(self, state, version):
        self.updates.append(({k: v.clone() for k, v in state.items()}, version))


class LoraEngine:
    def __init__(self):
        self.updates = []

    def update_lora(self, adapter_path, version):
        self.updates.append((adapter_path, version))


class FrozenEngine:
    pass


class AdapterServerEngine(LoraEngine):
    """Like the openai engine: declares weight_sync "lora" and refuses full weights."""

    weight_sync = "lora"

    def update_weights(self, state, version):
        raise RuntimeError("cannot take full weights")


def test_full_weights_reach_the_engine_with_the_version():
    base = tiny_llama(torch.float32)
    t = PolicyGradientTrainer(model=copy.deepcopy(base), **yaml_keys(lr=1e-2))
    engine = FullEngine()
    t.train(0, train_data())
    metrics = push_weights(t, engine, None)
    assert "perf/weight_sync_time" in metrics
    state, version = engine.updates[-1]
    assert version == 1 and set(state) == set(base.state_dict())
    # a plain model with the pushed weights computes what the trainer's policy computes
    follower = copy.deepcopy(base)
    follower.load_state_dict(state)
    ids = torch.tensor([train_data()["tokens"][0]])
    with torch.no_grad():
        assert torch.equal(follower(ids).logits, t.model(input_ids=ids).logits)
        assert not torch.equal(base(ids).logits, follower(ids).logits)


def test_lora_adapter_folder_for_engines_that_load_adapters(tmp_path):
    from peft import PeftModel

    base = tiny_llama(torch.float32)
    t = PolicyGradientTrainer(model=copy.deepcopy(base), **yaml_keys(lr=1e-2, lora_rank=4))
    t.train(0, train_data())
    engine = LoraEngine()
    push_weights(t, engine, str(tmp_path))
    folder, version = engine.updates[-1]
    assert version == 1 and folder == str(tmp_path / "lora_adapters" / "v1")
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    ids = torch.tensor([train_data()["tokens"][2]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, t.model(input_ids=ids).logits, atol=1e-6)
    # later versions: the newest two adapter folders stay (the served one and the one before)
    for rollout_id in (1, 2):
        t.train(rollout_id, train_data())
        push_weights(t, engine, str(tmp_path))
    assert [v for _, v in engine.updates] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "lora_adapters").iterdir()) == ["v2", "v3"]


def test_an_engine_declaring_lora_sync_gets_the_adapter_not_the_full_weights(tmp_path):
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys(lr=1e-2, lora_rank=2))
    t.train(0, train_data())
    engine = AdapterServerEngine()
    push_weights(t, engine, str(tmp_path))
    assert engine.updates == [(str(tmp_path / "lora_adapters" / "v1"), 1)]


def test_an_engine_that_cannot_follow_is_an_error_and_no_engine_is_fine():
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys())
    with pytest.raises(RuntimeError, match="FrozenEngine cannot take the trainer's weights"):
        push_weights(t, FrozenEngine(), None)
    assert push_weights(t, None, None) == {}


@pytest.mark.parametrize("lora_rank, tied", [(2, False), (0, True)], ids=["lora", "full-tied-embeddings"])
def test_export_is_a_plain_hf_folder(tmp_path, lora_rank, tied):
    """The export (built on the meta device, then given the trained tensors) reloads as the
    trained policy; tied input and output embeddings stay one tensor, as in SmolLM2."""
    from transformers import AutoModelForCausalLM

    t = PolicyGradientTrainer(model=tiny_llama(torch.float32, tie_word_embeddings=tied),
                              **yaml_keys(lr=1e-2, lora_rank=lora_rank))
    t.train(0, train_data())
    folder = t.export_hf(str(tmp_path / "policy"))
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    if tied:
        assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([train_data()["tokens"][1]])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, t.model(input_ids=ids).logits, atol=1e-5)
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]


def user_train(args, rollout_id, train_data):
    """A user's trainer for trainer=function."""
    return {"seen": float(len(train_data["tokens"])), "custom/rollout": float(rollout_id + args.offset)}


def test_function_trainer_calls_the_user_function(tmp_path):
    t = FunctionTrainer(train_function_path="test_train_sync.user_train")
    t.bind_args(SlimeArgs({"offset": 10}))
    metrics = t.train(3, train_data())
    assert metrics["train/seen"] == 4.0 and metrics["custom/rollout"] == 13.0 and "perf/train_time" in metrics
    assert t.weight_version == 1 and t.weights_for_engine() is None
    assert push_weights(t, FullEngine(), None) == {}
    t.save(str(tmp_path))
    again = FunctionTrainer(train_function_path="test_train_sync.user_train")
    again.load(str(tmp_path))
    assert again.weight_version == 1
    assert json.loads((tmp_path / "trainer_state.json").read_text())["weight_version"] == 1


def test_function_trainer_errors():
    with pytest.raises(ValueError, match="trainer.train_function_path"):
        FunctionTrainer()
    t = FunctionTrainer(fn=lambda args, rollout_id, data: [1.0])
    with pytest.raises(TypeError, match="expected a dict of metrics"):
        t.train(0, train_data())
    with pytest.raises(Exception, match="trainer.train_function_path"):
        FunctionTrainer(train_function_path="os.path.join").bind_args(SlimeArgs({"allowed_targets": ["pipeline."],
                                                                  "allowed_targets_extra": []}))


def test_restore_trainer_without_and_with_missing_state(tmp_path):
    from pipeline.stages.train import restore_trainer, save_trainer

    t = FunctionTrainer(fn=user_train)
    restore_trainer(t, None, str(tmp_path), 3)  # no trainer/ at all: a run that had none; fresh start
    assert t.weight_version == 0
    t.weight_version = 5
    save_trainer(t, str(tmp_path), 1)
    with pytest.raises(FileNotFoundError, match=r"rollout_3 has no trainer state .*\['rollout_1'\]"):
        restore_trainer(t, None, str(tmp_path), 3)
    fresh = FunctionTrainer(fn=user_train)
    engine = FullEngine()
    restore_trainer(fresh, engine, str(tmp_path), 1)
    assert fresh.weight_version == 5 and engine.updates == []  # a function trainer pushes nothing


class RefEngine:
    """Like engine=ray: takes a distributed trainer's object ref of the weights (kept as given)."""

    takes_object_refs = True

    def __init__(self):
        self.updates = []

    def update_weights(self, state, version):
        self.updates.append((state, version))


class BothEngine(FullEngine, LoraEngine):
    """Has update_weights and update_lora but declares full sync (an openai engine without an adapter name)."""

    weight_sync = "full"


class RefTrainer:
    """A distributed trainer's sync surface: its weights as a dict and as an object ref."""

    weight_version = 4

    def __init__(self):
        self.state = {"w": torch.ones(2)}
        self.ref = object()

    def weights_for_engine(self):
        return self.state

    def weights_ref_for_engine(self):
        return self.ref


def test_an_engine_taking_object_refs_gets_a_distributed_trainers_ref_and_others_the_weights():
    ref_engine, trainer = RefEngine(), RefTrainer()
    push_weights(trainer, ref_engine, None)
    assert len(ref_engine.updates) == 1 and ref_engine.updates[0][0] is trainer.ref
    assert ref_engine.updates[0][1] == 4
    # an engine without takes_object_refs gets the weights themselves, not the ref
    plain = FullEngine()
    push_weights(trainer, plain, None)
    assert [(list(state), version) for state, version in plain.updates] == [(["w"], 4)]
    assert torch.equal(plain.updates[0][0]["w"], trainer.state["w"])
    # a one-process trainer (no weights_ref_for_engine) still feeds an engine that takes refs
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys())
    ref_engine = RefEngine()
    push_weights(t, ref_engine, None)
    state, version = ref_engine.updates[-1]
    assert version == 0 and set(state) == set(t.model.state_dict())


def test_an_engine_with_both_updates_that_declares_full_sync_gets_the_full_weights(tmp_path):
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys(lr=1e-2, lora_rank=2))
    engine = BothEngine()
    push_weights(t, engine, str(tmp_path))
    (state, version), = engine.updates
    assert version == 0 and "model.layers.0.self_attn.q_proj.weight" in state
    assert not any("lora_" in name for name in state) and not (tmp_path / "lora_adapters").exists()


def test_a_function_trainer_syncs_nothing_to_an_adapter_engine():
    t = FunctionTrainer(fn=user_train)
    engine = LoraEngine()
    assert push_weights(t, engine, None) == {} and engine.updates == []


def test_adapter_sync_needs_a_run_dir_and_clears_half_written_adapter_folders(tmp_path):
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys(lr=1e-2, lora_rank=2))
    with pytest.raises(RuntimeError, match=r"^weight sync through update_lora needs a run dir for the adapter "
                                           r"folders$"):
        push_weights(t, LoraEngine(), None)
    # a killed writer's temp folder of an adapter goes; another file's temp folder stays
    stale, other = tmp_path / "lora_adapters" / ".v7.abc123", tmp_path / "lora_adapters" / ".keep.abc123"
    stale.mkdir(parents=True)
    other.mkdir()
    push_weights(t, LoraEngine(), str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "lora_adapters").iterdir()) == [".keep.abc123", "v0"]


def test_the_sync_time_and_the_log_line_name_the_served_version(caplog):
    caplog.set_level("INFO", logger="pipeline.train.sync")
    t = PolicyGradientTrainer(model=tiny_llama(torch.float32), **yaml_keys(lr=1e-2))
    t.train(0, train_data())
    before = time.perf_counter()
    metrics = push_weights(t, FullEngine(), None)
    elapsed = time.perf_counter() - before
    assert 0 <= metrics["perf/weight_sync_time"] <= elapsed
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.train.sync"] == [
        "engine now serves weight version 1"]
