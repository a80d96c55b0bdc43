"""Weights across processes as numpy arrays (`as_arrays` / `as_tensors`): the values round-trip,
bfloat16 stays a tensor, read-only arrays (Ray's zero-copy views) give tensors an engine can copy
from and a safetensors writer can save, with no warning."""

import warnings

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from pipeline.engines.weight_sync import as_arrays, as_tensors, copy_into_model


def test_round_trip_read_only_views_into_a_model_and_a_file(tmp_path):
    model = torch.nn.Linear(3, 2)
    state = {"weight": torch.randn(2, 3), "bias": torch.randn(2), "half": torch.randn(4).to(torch.bfloat16)}
    arrays = as_arrays(state)
    assert isinstance(arrays["weight"], np.ndarray) and isinstance(arrays["half"], torch.Tensor)
    for value in arrays.values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)  # as Ray hands them out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensors = as_tensors(arrays)
    assert all(torch.equal(tensors[k], state[k]) for k in state)
    copy_into_model(model, {k: tensors[k] for k in ("weight", "bias")}, version=1, at=0)
    assert torch.equal(model.weight.detach(), state["weight"])
    save_file(tensors, str(tmp_path / "m.safetensors"))
    assert all(torch.equal(v, state[k]) for k, v in load_file(str(tmp_path / "m.safetensors")).items())
