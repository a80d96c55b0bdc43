"""The trainer's policy (pipeline/train/model.py): load_policy's checkpoint, dtype and attention,
wrap_lora's adapter config, and save_adapter's refusal of a full model."""

import json
import re

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.engines.assets import _DONE_MARKER
from pipeline.train.model import is_lora, load_policy, save_adapter, wrap_lora
from trainer_fixtures import tiny_llama

torch.set_num_threads(1)

BUNDLED = "smollm2-135m-instruct"


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.get_base_model().named_modules() if isinstance(module, LoraLayer)}


def _bundled_folder(cache, layers):
    """A converted bundled model in `cache` (as resolve_checkpoint leaves it): a tiny bf16 Llama."""
    folder = cache / "models" / BUNDLED
    model = tiny_llama(torch.bfloat16)
    model.config.num_hidden_layers = layers
    model.model.layers = model.model.layers[:layers]
    model.save_pretrained(str(folder))
    (folder / _DONE_MARKER).write_text("")
    return folder


def test_load_policy_reads_the_bundled_model_from_the_given_cache_in_float32(tmp_path, monkeypatch, caplog):
    """The cache_dir argument wins over the default cache; a bf16 checkpoint loads as float32
    master weights, in eval mode; the log names the folder."""
    caplog.set_level("INFO", logger="pipeline.train.model")
    given = _bundled_folder(tmp_path / "given", layers=2)
    _bundled_folder(tmp_path / "default", layers=1)
    monkeypatch.setenv("ROLLOUT_PIPELINE_CACHE", str(tmp_path / "default"))
    model = load_policy(BUNDLED, str(tmp_path / "given"), 0, 16, 0.0, "all-linear")
    assert model.config.num_hidden_layers == 2 and len(model.model.layers) == 2
    assert {p.dtype for p in model.parameters()} == {torch.float32} and not model.training
    assert not is_lora(model)
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.train.model"] == [
        f"trainer policy loaded from {given}"]


def test_load_policy_uses_the_asked_attention_else_transformers_default(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_llama(torch.float32).save_pretrained(str(tmp_path))
    default = AutoModelForCausalLM.from_pretrained(str(tmp_path)).config._attn_implementation
    assert default != "eager"
    assert load_policy(str(tmp_path), None, 0, 16, 0.0, "all-linear",
                       attn_implementation="eager").config._attn_implementation == "eager"
    assert load_policy(str(tmp_path), None, 0, 16, 0.0, "all-linear").config._attn_implementation == default
    lora = load_policy(str(tmp_path), None, 2, 4, 0.0, "all-linear", attn_implementation="eager")
    assert is_lora(lora) and lora.config._attn_implementation == "eager"


def test_wrap_lora_all_linear_rank_alpha_and_dropout(tmp_path):
    """Every linear layer but the output head gets an adapter of the asked rank, scaled alpha / r;
    the dropout and the task type reach the adapter folder an engine loads."""
    from peft import PeftModelForCausalLM

    model = wrap_lora(tiny_llama(torch.float32), 2, 6, 0.25, "all-linear")
    assert isinstance(model, PeftModelForCausalLM) and not model.training
    layers = _lora_layers(model)
    assert sorted({name.rsplit(".", 1)[-1] for name in layers}) == [
        "down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert len(layers) == 14
    q = layers["model.layers.0.self_attn.q_proj"]
    assert q.lora_A["default"].weight.shape == (2, 16) and q.lora_B["default"].weight.shape == (16, 2)
    assert q.lora_dropout["default"].p == 0.25
    # the adapter's output is x A^T B^T * alpha / r on top of the base layer's
    torch.manual_seed(1)
    torch.nn.init.normal_(q.lora_B["default"].weight)
    x = torch.randn(3, 16)
    base = q.get_base_layer()
    with torch.no_grad():
        want = base(x) + x @ q.lora_A["default"].weight.T @ q.lora_B["default"].weight.T * (6 / 2)
        assert torch.allclose(q(x), want, atol=1e-6)
    folder = save_adapter(model, str(tmp_path / "adapter"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert folder == str(tmp_path / "adapter")
    assert config["r"] == 2 and config["lora_alpha"] == 6 and config["lora_dropout"] == 0.25
    assert config["task_type"] == "CAUSAL_LM" and config["bias"] == "none"


def test_wrap_lora_takes_a_hydra_list_of_target_modules_and_rank_one(tmp_path):
    """A list override (Hydra's ListConfig) names the wrapped layers and saves as JSON; rank 1 is LoRA."""
    targets = OmegaConf.create(["k_proj", "down_proj"])
    model = wrap_lora(tiny_llama(torch.float32), 1, 2, 0.0, targets)
    assert is_lora(model)
    layers = _lora_layers(model)
    assert sorted(layers) == ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.k_proj",
                              "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.k_proj"]
    assert layers["model.layers.0.self_attn.k_proj"].lora_A["default"].weight.shape[0] == 1
    save_adapter(model, str(tmp_path / "adapter"))
    assert sorted(json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_modules"]) == [
        "down_proj", "k_proj"]
    plain = tiny_llama(torch.float32)
    assert wrap_lora(plain, 0, 2, 0.0, targets) is plain and not is_lora(plain)


def test_save_adapter_refuses_a_full_model(tmp_path):
    with pytest.raises(ValueError, match="^" + re.escape("save_adapter needs a LoRA trainer (trainer.lora_rank > 0)")
                       + "$"):
        save_adapter(tiny_llama(torch.float32), str(tmp_path / "adapter"))
    assert not (tmp_path / "adapter").exists()
