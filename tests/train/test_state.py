"""The trainer state folder (pipeline/train/state.py): what each file holds, what a load restores
(weights, AdamW state, hyper-parameters, random streams), and the refusals, each naming the file."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pipeline.train import state
from pipeline.train.state import (FORMAT_VERSION, load_state, read_meta, read_state, restore_rng, rng_state,
                                  save_state, seed_rngs)


def exactly(message: str) -> str:
    """A pytest.raises pattern of the whole message (re.search would accept any text around it)."""
    return f"^{re.escape(message)}$"


class Tiny(torch.nn.Module):
    """Two trainable tensors and a frozen one."""

    def __init__(self, fill: float = 0.0):
        super().__init__()
        self.a = torch.nn.Linear(2, 3)
        self.frozen = torch.nn.Parameter(torch.full((2,), 7.0), requires_grad=False)
        self.b = torch.nn.Parameter(torch.full((3,), fill))


def trained(steps: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    model = Tiny(1.0)
    # the optimizer's order differs from named_parameters' (b first)
    optimizer = torch.optim.AdamW([model.b, model.a.weight, model.a.bias], lr=0.1, betas=(0.8, 0.9))
    for _ in range(steps):
        optimizer.zero_grad()
        (model.a(torch.ones(1, 2)).sum() * model.b.sum()).backward()
        optimizer.step()
    return model, optimizer


def draws():
    return torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random()


def test_seed_rngs_seeds_torch_numpy_and_python():
    seed = 2**32 + 5  # numpy takes seeds below 2**32: the seed modulo that
    seed_rngs(seed)
    got = draws()
    torch.manual_seed(seed)
    np.random.seed(5)
    random.seed(seed)
    assert got == draws()


def test_the_folder_holds_the_trainable_weights_adamw_state_and_the_counters(tmp_path):
    model, optimizer = trained()
    seed_rngs(3)
    torch_state = torch.get_rng_state()
    py_state, np_state = random.getstate(), np.random.get_state()
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 4, "optimizer_step": 2})
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "optimizer.safetensors", "policy.safetensors", "trainer_state.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
    policy = load_file(tmp_path / "s" / "policy.safetensors")
    assert set(policy) == {"a.weight", "a.bias", "b"}  # not the frozen one
    assert all(torch.equal(policy[n], p.detach()) for n, p in model.named_parameters() if n in policy)
    tensors = load_file(tmp_path / "s" / "optimizer.safetensors")
    assert set(tensors) == {"rng/torch"} | {f"{n}/{k}" for n in ("a.weight", "a.bias", "b")
                                             for k in ("exp_avg", "exp_avg_sq", "step")}
    assert torch.equal(tensors["rng/torch"], torch_state)
    assert torch.equal(tensors["b/exp_avg"], optimizer.state[model.b]["exp_avg"])
    assert torch.equal(tensors["a.weight/exp_avg_sq"], optimizer.state[model.a.weight]["exp_avg_sq"])
    assert float(tensors["b/step"]) == 2.0
    meta = json.loads((tmp_path / "s" / "trainer_state.json").read_text())
    assert meta["format_version"] == FORMAT_VERSION == 1
    assert (meta["weight_version"], meta["optimizer_step"]) == (4, 2)
    (group,) = meta["param_groups"]
    assert "params" not in group and group["lr"] == 0.1 and group["betas"] == [0.8, 0.9]
    assert meta["rng"]["python"] == json.loads(json.dumps(py_state))
    assert meta["rng"]["numpy"][0] == np_state[0] and meta["rng"]["numpy"][1] == np_state[1].tolist()
    assert meta["rng"]["numpy"][2:] == [int(np_state[2]), int(np_state[3]), float(np_state[4])]
    assert set(meta) == {"format_version", "weight_version", "optimizer_step", "param_groups", "rng"}


def test_read_state_gives_the_parts_by_name(tmp_path):
    model, optimizer = trained()
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 1, "optimizer_step": 2, "extra": "x"})
    saved = read_state(str(tmp_path / "s"))
    assert set(saved) == {"policy", "optimizer", "param_groups", "rng", "counters"}
    assert set(saved["policy"]) == {"a.weight", "a.bias", "b"}
    assert set(saved["optimizer"]) == {"a.weight", "a.bias", "b"}
    assert set(saved["optimizer"]["b"]) == {"exp_avg", "exp_avg_sq", "step"}
    assert torch.equal(saved["optimizer"]["b"]["exp_avg"], optimizer.state[model.b]["exp_avg"])
    assert saved["counters"] == {"weight_version": 1, "optimizer_step": 2, "extra": "x"}
    assert saved["param_groups"][0]["betas"] == [0.8, 0.9]
    assert set(saved["rng"]) == {"torch", "python", "numpy"} and isinstance(saved["rng"]["torch"], list)


def test_a_load_restores_weights_adamw_state_hyper_parameters_and_streams(tmp_path):
    model, optimizer = trained()
    seed_rngs(9)
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 3, "optimizer_step": 2})
    expected = draws()
    # the straight run's next step
    optimizer.zero_grad()
    (model.a(torch.ones(1, 2)).sum() * model.b.sum()).backward()
    optimizer.step()

    fresh = Tiny(5.0)
    fresh_opt = torch.optim.AdamW([fresh.b, fresh.a.weight, fresh.a.bias], lr=0.5, betas=(0.1, 0.2))
    fresh_opt.state[fresh.b] = {"junk": torch.ones(1)}
    counters = load_state(tmp_path / "s", fresh, fresh_opt)
    assert counters == {"weight_version": 3, "optimizer_step": 2}
    assert draws() == expected
    group = fresh_opt.param_groups[0]
    assert group["lr"] == 0.1 and group["betas"] == (0.8, 0.9) and type(group["betas"]) is tuple
    assert set(fresh_opt.state[fresh.b]) == {"exp_avg", "exp_avg_sq", "step"}
    assert torch.equal(fresh.frozen, torch.full((2,), 7.0))
    fresh_opt.zero_grad()
    (fresh.a(torch.ones(1, 2)).sum() * fresh.b.sum()).backward()
    fresh_opt.step()
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), name


def test_a_parameter_without_saved_state_starts_fresh(tmp_path):
    model = Tiny(1.0)
    optimizer = torch.optim.AdamW([model.b, model.a.weight], lr=0.1)
    model.b.grad = torch.ones(3)
    optimizer.step()  # state for b only (a.weight had no gradient)
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 1, "optimizer_step": 1})
    fresh = Tiny()
    fresh_opt = torch.optim.AdamW([fresh.b, fresh.a.weight], lr=0.1)
    fresh_opt.state[fresh.a.weight] = {"exp_avg": torch.ones(3, 2)}
    load_state(tmp_path / "s", fresh, fresh_opt)
    assert set(fresh_opt.state) == {fresh.b}


def test_a_state_of_another_model_is_refused_naming_the_file(tmp_path):
    model, optimizer = trained()
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 1, "optimizer_step": 1})

    class Other(Tiny):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Parameter(torch.zeros(1))
            del self.b

    other = Other()
    with pytest.raises(ValueError, match=exactly(
            f"{tmp_path / 's'}/policy.safetensors does not match the model: missing ['c'], unknown ['b'] "
            f"(another model or LoRA setting?)")):
        load_state(tmp_path / "s", other, torch.optim.AdamW(other.parameters()))
    # a frozen parameter the state lacks is fine (a LoRA base)
    frozen = Other()
    frozen.c.requires_grad_(False)
    frozen.b = torch.nn.Parameter(torch.zeros(3))
    load_state(tmp_path / "s", frozen, torch.optim.AdamW([frozen.b]))
    assert torch.equal(frozen.b, model.b.detach())


def test_a_state_missing_a_trainable_parameter_or_holding_an_unknown_one_is_refused(tmp_path):
    model, optimizer = trained()
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 1, "optimizer_step": 1})
    more = Tiny()
    more.c = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match=re.escape("missing ['c'], unknown [] ")):
        load_state(tmp_path / "s", more, torch.optim.AdamW(more.parameters()))
    fewer = Tiny()
    del fewer.b
    with pytest.raises(ValueError, match=re.escape("missing [], unknown ['b'] ")):
        load_state(tmp_path / "s", fewer, torch.optim.AdamW(fewer.parameters()))


def test_a_parameter_name_with_a_slash_keeps_its_adamw_state(tmp_path):
    model = torch.nn.Module()
    model.d = torch.nn.ParameterDict({"w/1": torch.nn.Parameter(torch.ones(2))})
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model.d["w/1"].grad = torch.ones(2)
    optimizer.step()
    save_state(tmp_path / "s", model, optimizer, {"weight_version": 1, "optimizer_step": 1})
    assert set(read_state(tmp_path / "s")["optimizer"]) == {"d.w/1"}
    fresh = torch.nn.Module()
    fresh.d = torch.nn.ParameterDict({"w/1": torch.nn.Parameter(torch.zeros(2))})
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_state(tmp_path / "s", fresh, fresh_opt)
    assert torch.equal(fresh_opt.state[fresh.d["w/1"]]["exp_avg"], optimizer.state[model.d["w/1"]]["exp_avg"])


def test_at_most_five_names_of_each_kind_are_listed(tmp_path):
    class Wide(torch.nn.Module):
        def __init__(self, prefix):
            super().__init__()
            for i in range(7):
                self.register_parameter(f"{prefix}{i}", torch.nn.Parameter(torch.zeros(1)))

    saved = Wide("p")
    save_state(tmp_path / "s", saved, torch.optim.AdamW(saved.parameters()), {"weight_version": 0,
                                                                               "optimizer_step": 0})
    other = Wide("q")
    with pytest.raises(ValueError) as err:
        load_state(tmp_path / "s", other, torch.optim.AdamW(other.parameters()))
    assert f"missing {[f'q{i}' for i in range(5)]}, unknown {[f'p{i}' for i in range(5)]} " in str(err.value)


def test_a_folder_without_state_or_of_another_format_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=exactly(
            f"{tmp_path}: no trainer state (trainer_state.json missing)")):
        read_state(tmp_path)
    (tmp_path / "trainer_state.json").mkdir()
    with pytest.raises(FileNotFoundError, match="trainer_state.json missing"):
        read_meta(str(tmp_path))
    folder = tmp_path / "v2"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"format_version": 2}), encoding="utf-8")
    with pytest.raises(ValueError, match=exactly(
            f"{folder / 'trainer_state.json'}: trainer state format 2, expected 1")):
        read_state(folder)
    (folder / "trainer_state.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match=re.escape("trainer state format None, expected 1")):
        read_meta(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"format_version": 1, "layout": "dcp", "é": "ü"}),
                                               encoding="utf-8")
    assert read_meta(folder) == {"format_version": 1, "layout": "dcp", "é": "ü"}


def test_random_streams_round_trip_as_json(monkeypatch):
    seed_rngs(17)
    saved = json.loads(json.dumps(rng_state()))
    assert set(saved) == {"torch", "python", "numpy"}  # no CUDA here
    expected = draws()
    draws()
    restore_rng(saved)
    assert draws() == expected
    # a state with a CUDA stream loads where CUDA is missing (the CPU streams only)
    restore_rng({**saved, "cuda": [0, 1]})
    assert draws() == expected


def test_the_cuda_stream_is_saved_and_restored_where_cuda_is(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: torch.tensor([1, 2], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda t: calls.append(t))
    saved = rng_state()
    assert saved["cuda"] == [1, 2]
    restore_rng(saved)
    assert len(calls) == 1 and calls[0].dtype == torch.uint8 and calls[0].tolist() == [1, 2]
    # initialised or not decides whether there is one to save
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert "cuda" not in rng_state()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "cuda" not in rng_state()
    restore_rng(saved)
    assert len(calls) == 1


def test_numpy_numbers_and_tuples_become_json_and_lists_become_tuples_again():
    value = {"a": (np.int64(3), [np.float32(0.5), (1, "x")]), "b": np.float64(2.5), "c": None}
    plain = state._jsonable(value)
    assert plain == {"a": [3, [0.5, [1, "x"]]], "b": 2.5, "c": None}
    assert type(plain["a"][0]) is int and type(plain["b"]) is float and type(plain["a"][1][0]) is float
    assert json.loads(json.dumps(plain)) == plain
    assert state._tuples([1, [2, [3]], "s"]) == (1, (2, (3,)), "s")
    assert state._tuples(4) == 4
