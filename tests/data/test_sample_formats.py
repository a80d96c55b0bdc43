"""slime-shaped samples (every field set) through checkpoints, and the formats of earlier code:
a format-3 checkpoint and a sample dump written at commit e673a26 (tests/fixtures/v3_formats)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import BufferedDataSource, Sample
from pipeline.data import checkpoint as ckpt
from pipeline.sinks.files import read_samples
from tests.data.slime_samples import SlimeStatus, assert_same_sample, full_sample

V3 = Path(__file__).resolve().parents[1] / "fixtures" / "v3_formats"
NEW_FIELDS = ("multimodal_train_input_id", "apply_chat_template_kwargs", "rollout_top_p_token_ids",
              "rollout_top_p_token_offsets", "rollout_routed_experts", "teacher_log_probs", "non_generation_time",
              "spec_info", "prefix_cache_info")


def slime_groups() -> list[list[Sample]]:
    """Groups of 2: full samples, a fresh one beside a full one, and one whose records were never read."""
    groups = [[full_sample(0), full_sample(1)], [full_sample(2), Sample(index=5)]]
    lazy = Sample(index=6, status=SlimeStatus.ABORTED)
    lazy.append_response_tokens(tokens=[1, 2], log_probs=[-0.5, -0.25],
                                meta_info={"top_p_token_ids": [1, 4, 2], "top_p_token_offsets": [0, 2, 3]})
    groups.append([lazy, full_sample(7)])
    return groups


@pytest.mark.parametrize("raw", [False, True])
def test_encode_groups_keeps_every_field(raw: bool) -> None:
    groups = slime_groups()
    enc = ckpt.encode_groups(groups, raw=raw)
    if not raw:
        enc = json.loads(json.dumps(enc))
    assert "rollout_top_p_token_offsets" in enc["arrays"] and "teacher_log_probs" in enc["arrays"]
    back = ckpt.decode_groups(enc)
    assert vars(back[2][0])["spec_info"] is None  # never made stays never made (read below: made)
    for got, want in zip(back, groups, strict=True):
        for a, b in zip(got, want, strict=True):
            assert_same_sample(a, b)
    assert back[0][0].spec_info is not back[0][1].spec_info  # a record object per sample


def test_equal_records_in_every_sample_come_back_as_one_object_each() -> None:
    group = [Sample(index=i, spec_info={"spec_verify_ct": 2}, prefix_cache_info={"cached_tokens": 1}) for i in range(3)]
    enc = ckpt.encode_groups([group])
    assert enc["columns"]["spec_info"]["records"] == list(Sample.SpecInfo().to_dict())  # one column per counter
    back = ckpt.decode_groups(json.loads(json.dumps(enc)))[0]
    assert [s.spec_info.spec_verify_ct for s in back] == [2, 2, 2]
    assert len({id(s.spec_info) for s in back}) == 3 and len({id(s.prefix_cache_info) for s in back}) == 3


def test_tensors_from_a_plugin_are_stored_as_lists() -> None:
    torch = pytest.importorskip("torch")
    s = Sample(index=1, response_length=2, rollout_top_p_token_ids=torch.tensor([3, 4], dtype=torch.int32),
               rollout_top_p_token_offsets=np.array([0, 1, 2]), teacher_log_probs=torch.tensor([-0.5, -0.25]),
               rollout_routed_experts=torch.tensor([[[1]], [[2]]]))
    got = ckpt.decode_groups(json.loads(json.dumps(ckpt.encode_groups([[s]]))))[0][0]
    assert (got.rollout_top_p_token_ids, got.rollout_top_p_token_offsets) == ([3, 4], [0, 1, 2])
    assert got.teacher_log_probs == [-0.5, -0.25] and got.rollout_routed_experts == [[[1]], [[2]]]


def test_checkpoint_round_trip_field_by_field(tmp_path: Path) -> None:
    src = BufferedDataSource(prompt_data=str(V3 / "prompts.jsonl"), n_samples_per_prompt=2, save_dir=tmp_path, label_key=None, apply_chat_template=False)
    groups = slime_groups()
    src.add_samples(groups)
    path = src.save(4)
    fresh = BufferedDataSource(prompt_data=str(V3 / "prompts.jsonl"), n_samples_per_prompt=2, save_dir=tmp_path, label_key=None, apply_chat_template=False)
    assert fresh.load() == 4 and ckpt.read_checkpoint(path)  # the file itself verifies
    for got, want in zip(fresh.buffer, groups, strict=True):
        for a, b in zip(got, want, strict=True):
            assert_same_sample(a, b)


def expected_v3() -> list[dict]:
    """What the format-3 code wrote (its `to_dict`), plus the defaults of the fields added since."""
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(Sample) if f.name in NEW_FIELDS}
    defaults["spec_info"], defaults["prefix_cache_info"] = Sample.SpecInfo(), Sample.PrefixCacheInfo()
    return [{**row, **defaults} for row in json.loads((V3 / "expected.json").read_text())]


def check_against_v3(got: Sample, want: dict) -> None:
    fields = {f.name for f in dataclasses.fields(Sample)}
    for name, value in want.items():
        assert getattr(got, name) == value, name
    assert got.status is Sample.Status(want["status"])
    assert set(vars(got)) - fields == set(want) - fields  # the extra attribute (extra_note) and no other
    got.append_response_tokens(tokens=[1], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "9"})
    assert got.weight_versions[-1] == "9"  # a loaded old sample grows as a new one does


def test_a_format_3_checkpoint_still_loads(tmp_path: Path) -> None:
    shutil.copytree(V3 / "checkpoints", tmp_path / "ck")
    src = BufferedDataSource(prompt_data=str(V3 / "prompts.jsonl"), n_samples_per_prompt=2, seed=7, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    assert json.loads((tmp_path / "ck" / "rollout_3.json").read_bytes().split(b"\n")[0])["version"] == 3
    assert src.load() == 3
    want = expected_v3()
    got = [s for g in src.buffer for s in g]
    assert len(got) == 4
    for s, w in zip(got, want):
        check_against_v3(s, w)
    assert (src.sample_group_index, src.sample_index) == (2, 4)
    src.save(4)  # and it is written back in today's format, losslessly
    again = BufferedDataSource(prompt_data=str(V3 / "prompts.jsonl"), n_samples_per_prompt=2, seed=7,
                               save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    assert again.load() == 4
    for a, b in zip((s for g in again.buffer for s in g), got):
        assert_same_sample(a, b)


def test_a_sample_dump_of_format_3_code_still_reads() -> None:
    got = read_samples(V3 / "rollout_3.jsonl")
    want = expected_v3()
    assert len(got) == len(want) == 5
    for s, w in zip(got, want):
        check_against_v3(s, w)
