"""docs/contracts.md §5: lossless, atomic, checksummed, fingerprinted checkpoints of the data source."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import struct
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline import BufferedDataSource, PlainDataSource, Sample
from pipeline.data import checkpoint as ckpt
from pipeline.data.buffer_filters import OldestFirst
from pipeline.data.errors import CheckpointError, DataFingerprintMismatch
from pipeline.samples.versions import reset_serving_version, set_serving_version
from tests.data.conftest import make_rows, write_jsonl


def rich_sample(i: int) -> Sample:
    s = Sample(group_index=i // 2, index=i, rollout_id=i, prompt=[{"role": "user", "content": f"p{i}"}],
               tokens=[1, 2, 3, 2**40], response="r", label="L", reward={"acc": 0.5, "fmt": [1, 2]},
               weight_versions=["v1"], status=Sample.Status.ABORTED, metadata={"start_rollout_id": 3, "x": [1.5]},
               multimodal_inputs={"image": ["a.png"]}, train_metadata={"t": 1}, session_id="s",
               custom_rm_path="m.f", generate_function_path="g.h", remove_sample=True)
    s.append_response_tokens(tokens=[7, 8], log_probs=[-0.1, -1e-300], meta_info={"finish_reason": {"type": "abort"}})
    s.append_response_tokens(tokens=[9], trainable=False)
    s.extra_note = {"kept": True}  # unknown attribute, as from_dict keeps them
    return s


def test_encode_groups_is_lossless() -> None:
    groups = [[rich_sample(0), rich_sample(1)], [Sample(), Sample(tokens=[1], loss_mask=None)],
              [Sample(tokens=[0.5], rollout_log_probs=[1, 2.0]), Sample(rollout_log_probs=[float("inf")])]]
    before = [[s.to_dict() for s in g] for g in groups]
    enc = json.loads(json.dumps(ckpt.encode_groups(groups)))
    after = ckpt.decode_groups(enc)
    assert [[s.to_dict() for s in g] for g in after] == before
    assert [[type(x) for x in s.tokens] for g in after for s in g] == [[type(x) for x in s.tokens] for g in groups for s in g]
    assert after[0][0].status is Sample.Status.ABORTED and after[0][0].extra_note == {"kept": True}
    assert after[0][0].loss_mask == [1, 1, 0] and after[0][0].rollout_log_probs == [-0.1, -1e-300, 0.0]
    assert after[0][0].metadata is not after[0][1].metadata


@pytest.mark.parametrize("raw", [False, True])
def test_all_ones_masks_and_identical_rows_are_stored_once_yet_lossless(raw: bool) -> None:
    def make() -> list[list[Sample]]:
        return [[Sample(index=i, tokens=[1, 2, 3], loss_mask=[1, 1], rollout_log_probs=[-0.0, float("nan")])
                 for i in range(3)]]

    groups = make()
    enc = ckpt.encode_groups(groups, raw=raw)
    arrays = enc["arrays"]
    assert arrays["loss_mask"]["fill"] == 1 and "data" not in arrays["loss_mask"]
    assert arrays["tokens"]["same_rows"] and arrays["rollout_log_probs"]["same_rows"]
    after = ckpt.decode_groups(enc if raw else json.loads(json.dumps(enc)))[0]
    assert [(s.tokens, s.loss_mask) for s in after] == [([1, 2, 3], [1, 1])] * 3
    lp = after[2].rollout_log_probs
    assert math.copysign(1, lp[0]) == -1 and math.isnan(lp[1])  # bit-exact: -0.0 stays -0.0
    # every sample gets its own lists
    assert len({id(x) for s in after for x in (s.tokens, s.loss_mask, s.rollout_log_probs)}) == 9
    after[0].tokens.append(4), after[0].loss_mask.append(0)
    assert after[1].tokens == [1, 2, 3] and after[1].loss_mask == [1, 1]
    # rows that differ in one bit (0.0 vs -0.0), bools in a mask, a None mask: not collapsed, still exact
    groups = make()
    groups[0][1].rollout_log_probs = [0.0, float("nan")]
    groups[0][0].loss_mask, groups[0][1].loss_mask = [True, 1], None
    enc = json.loads(json.dumps(ckpt.encode_groups(groups)))
    assert "same_rows" not in enc["arrays"]["rollout_log_probs"] and "loss_mask" not in enc["arrays"]
    after = ckpt.decode_groups(enc)[0]
    assert [math.copysign(1, s.rollout_log_probs[0]) for s in after] == [-1, 1, -1]
    assert [s.loss_mask for s in after] == [[True, 1], None, [1, 1]] and after[0].loss_mask[0] is True
    # a NaN with a payload float32 cannot hold is stored as float64, bit for bit
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    enc = ckpt.encode_groups([[Sample(rollout_log_probs=[nan, -0.5]), Sample(rollout_log_probs=[0.25, 1.0])]])
    assert enc["arrays"]["rollout_log_probs"]["dtype"] == "<f8"
    got = ckpt.decode_groups(json.loads(json.dumps(enc)))[0][0].rollout_log_probs[0]
    assert struct.pack("<d", got) == struct.pack("<d", nan)
    groups = make()
    groups[0][1].loss_mask = None
    enc = ckpt.encode_groups(groups)
    assert enc["arrays"]["loss_mask"]["fill"] == 1
    assert [s.loss_mask for s in ckpt.decode_groups(json.loads(json.dumps(enc)))[0]] == [[1, 1], None, [1, 1]]


def grown(prompt: list[Any], response: list[Any]) -> Sample:
    s = Sample(tokens=list(prompt))
    s.append_response_tokens(tokens=response)
    return s


@pytest.mark.parametrize("raw", [False, True])
def test_a_prompt_shared_by_a_group_is_stored_once_yet_lossless(raw: bool) -> None:
    shared = [[grown([500, 501, 502], [7] * k) for k in (1, 3, 0)], [grown([9, 2**33], [4, 5]), grown([9, 2**33], [6])]]
    enc = ckpt.encode_groups(shared, raw=raw)
    assert "prefix" in enc["arrays"]["tokens"]
    data, dtype = enc["arrays"]["tokens"]["data"], enc["arrays"]["tokens"]["dtype"]
    rest = data if raw else np.frombuffer(base64.b64decode(data), dtype=dtype)
    assert rest.tolist() == [7, 7, 7, 7, 4, 5, 6]  # the responses only
    after = ckpt.decode_groups(enc if raw else json.loads(json.dumps(enc)))
    assert [[s.to_dict() for s in g] for g in after] == [[s.to_dict() for s in g] for g in shared]
    assert after[0][0].tokens is not after[0][1].tokens  # a fresh list per sample
    # differing prompts, bools, a response longer than the tokens: no sharing, still lossless
    odd = [[grown([1, 2], [3]), grown([1, 5], [3])], [grown([True, 2], [3]), grown([1, 2], [3])]]
    odd[1][1].response_length = 9
    for groups in (odd, [[grown([True, 2], [3]), grown([True, 2], [3])]]):
        enc = ckpt.encode_groups(groups, raw=raw)
        after = ckpt.decode_groups(enc if raw else json.loads(json.dumps(enc)))
        assert [[s.to_dict() for s in g] for g in after] == [[s.to_dict() for s in g] for g in groups]
        assert [type(x) for g in after for s in g for x in s.tokens] == \
            [type(x) for g in groups for s in g for x in s.tokens]


def buffered(path: str, save_dir: Path, **kw: Any) -> BufferedDataSource:
    return BufferedDataSource(prompt_data=path, n_samples_per_prompt=2, seed=5, save_dir=save_dir,
                              **{"label_key": None, "apply_chat_template": False, **kw})


def test_round_trip_restores_everything(tmp_path: Path, data5: str) -> None:
    f = OldestFirst(max_staleness=2)
    src = buffered(data5, tmp_path / "ck", buffer_filter=f)
    groups = src.get_samples(7)
    for g in groups[:3]:
        for s in g:  # made by weight version 0
            s.append_response_tokens(tokens=[7], meta_info={"weight_version": "0", "finish_reason": {"type": "stop"}})
            s.metadata["start_rollout_id"] = 0
    src.add_samples([[rich_sample(0), rich_sample(1)]] + groups[:3])
    src.begin_rollout(5)
    src.metadata["note"] = [1, 2]
    token = set_serving_version(3)
    src.get_samples(1)  # at version 3: drops the 3 stale groups, hands out the rich one
    reset_serving_version(token)
    src.add_samples(groups[3:5])
    src.save(5)
    fresh = buffered(data5, tmp_path / "ck", buffer_filter=OldestFirst(max_staleness=2))
    assert fresh.load() == 5
    assert fresh.state_dict() == src.state_dict()
    assert fresh.buffer_filter.dropped == 3 and fresh.metadata == {"note": [1, 2]}
    assert [[s.to_dict() for s in g] for g in fresh.buffer] == [[s.to_dict() for s in g] for g in src.buffer]
    assert [[s.index for s in g] for g in fresh.get_samples(4)] == [[s.index for s in g] for g in src.get_samples(4)]


def test_keep_last_k_and_newest_valid(tmp_path: Path, data5: str, caplog: pytest.LogCaptureFixture) -> None:
    src = buffered(data5, tmp_path, keep_checkpoints=2)
    for rid in range(4):
        src.get_samples(1)
        src.save(rid)
    assert [r for r, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3]
    newest = tmp_path / "rollout_3.json"
    newest.write_bytes(newest.read_bytes()[:-10])  # truncated
    fresh = buffered(data5, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert fresh.load() == 2
    assert "truncated checkpoint" in caplog.text and fresh.sample_group_index == 3
    with pytest.raises(CheckpointError, match="rollout_3.json: truncated checkpoint"):
        fresh.load(3)


def test_corruption_is_detected(tmp_path: Path, data5: str) -> None:
    src = buffered(data5, tmp_path)
    path = src.save(0)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        buffered(data5, tmp_path).load(0)
    path.write_text("{}")
    with pytest.raises(CheckpointError, match="bad header"):
        buffered(data5, tmp_path).load(0)
    assert buffered(data5, tmp_path).load() is None  # nothing valid left
    assert buffered(data5, tmp_path).load(41) is None  # absent: start fresh, as slime


def test_fingerprint_mismatch_is_refused_unless_allowed(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", make_rows(6))
    src = PlainDataSource(prompt_data=data, n_samples_per_prompt=2, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    src.get_samples(3)
    src.save(1)
    write_jsonl(tmp_path / "d.jsonl", make_rows(4))
    other = PlainDataSource(prompt_data=data, n_samples_per_prompt=3, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    with pytest.raises(DataFingerprintMismatch) as err:
        other.load()
    msg = str(err.value)
    assert "rollout_1.json was written for different data" in msg
    assert "files[0].sha256" in msg and "n_samples_per_prompt: checkpoint has 2, now 3" in msg
    assert "num_prompts: checkpoint has 6, now 4" in msg and "allow_data_change=true" in msg
    lenient = PlainDataSource(prompt_data=data, n_samples_per_prompt=3, save_dir=tmp_path / "ck", allow_data_change=True, label_key=None, apply_chat_template=False)
    assert lenient.load() == 1 and lenient.sample_group_index == 3 and lenient.sample_offset == 3


def test_moving_the_data_file_is_not_a_change(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a" / "d.jsonl", make_rows(3)) if (tmp_path / "a").mkdir() is None else ""
    src = PlainDataSource(prompt_data=a, n_samples_per_prompt=1, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    src.get_samples(2)
    src.save(0)
    (tmp_path / "b").mkdir()
    b = write_jsonl(tmp_path / "b" / "d.jsonl", make_rows(3))
    moved = PlainDataSource(prompt_data=b, n_samples_per_prompt=1, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    assert moved.load() == 0 and moved.sample_offset == 2


def test_no_pickle_json_plus_raw_arrays(tmp_path: Path, data5: str) -> None:
    src = buffered(data5, tmp_path)
    groups = src.get_samples(2)
    for g in groups:
        for s in g:
            s.append_response_tokens(tokens=[5, 6, 70000 + s.index], log_probs=[-0.5, -0.25, -1e-9])
    src.add_samples(groups)
    path = src.save(3)
    want = [t for s in chain.from_iterable(groups) for t in [5, 6, 70000 + s.index]]
    raw = path.read_bytes()
    head, _, payload = raw.partition(b"\n")
    header = json.loads(head)
    assert header["magic"] == ckpt.MAGIC and header["version"] == ckpt.VERSION == 4
    state = json.loads(payload[:header["json_size"]])  # the JSON line
    assert state["buffer"]["group_sizes"] == [2, 2] and payload[header["json_size"] - 1:header["json_size"]] == b"\n"
    # the rest is exactly the raw arrays the header lists (no pickle, nothing else)
    arrays = {tuple(a["path"]): a for a in header["arrays"]}
    tokens = arrays[("buffer", "arrays", "tokens", "data")]
    assert tokens["dtype"] == "<u4" and tokens["shape"] == [12]
    data = np.frombuffer(payload, dtype="<u4", count=12, offset=tokens["offset"])
    assert data.tolist() == want
    assert header["size"] == len(payload) == max(a["offset"] + a["nbytes"] for a in header["arrays"])
    assert not list(tmp_path.glob("*.tmp"))
    # the JSON state holds no array: the array places are null until read_checkpoint fills them
    assert state["buffer"]["arrays"]["tokens"]["data"] is None
    assert ckpt.read_checkpoint(path)["buffer"]["arrays"]["tokens"]["data"].tolist() == want


def partially_generated_buffer(data5: str, tmp_path: Path) -> tuple[BufferedDataSource, list[list[Any]]]:
    """A buffered source holding 2 groups whose samples have 2 response tokens each."""
    src = buffered(data5, tmp_path)
    groups = src.get_samples(2)
    for g in groups:
        for s in g:
            s.append_response_tokens(tokens=[1, 2], log_probs=[-0.5, -0.1])
    src.add_samples(groups)
    return src, groups


def test_reads_a_version_1_checkpoint(tmp_path: Path, data5: str) -> None:
    """Files of the first format (one JSON payload, base64 arrays) still load."""
    src, groups = partially_generated_buffer(data5, tmp_path)
    payload = json.dumps({**src.state_dict(), "rollout_id": 4}).encode()
    header = {"magic": ckpt.MAGIC, "version": 1, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (tmp_path / "rollout_4.json").write_bytes(json.dumps(header).encode() + b"\n" + payload)
    fresh = buffered(data5, tmp_path)
    assert fresh.load() == 4
    assert [[s.to_dict() for s in g] for g in fresh.buffer] == [[s.to_dict() for s in g] for g in src.buffer]


def test_reads_a_version_2_checkpoint(tmp_path: Path, data5: str) -> None:
    """Files of format 2 (flat `data` arrays only, no `fill` / `same_rows`) still load."""
    src, groups = partially_generated_buffer(data5, tmp_path)
    state = {**src.state_dict(), "rollout_id": 4}
    flat = list(chain.from_iterable(groups))
    for name, values in (("tokens", [s.tokens for s in flat]), ("loss_mask", [s.loss_mask for s in flat]),
                         ("rollout_log_probs", [s.rollout_log_probs for s in flat])):
        data = np.array(list(chain.from_iterable(values)), dtype="<f8" if name == "rollout_log_probs" else "<i4")
        state["buffer"]["arrays"][name] = {"dtype": data.dtype.str, "lengths": np.array(list(map(len, values)), "<u1"),
                                           "lengths_dtype": "<u1", "data": data}
    ckpt.write_checkpoint(tmp_path / "rollout_4.json", state)
    raw = (tmp_path / "rollout_4.json").read_bytes()
    head, _, payload = raw.partition(b"\n")
    header = {**json.loads(head), "version": 2}
    (tmp_path / "rollout_4.json").write_bytes(json.dumps(header).encode() + b"\n" + payload)
    fresh = buffered(data5, tmp_path)
    assert fresh.load() == 4
    assert [[s.to_dict() for s in g] for g in fresh.buffer] == [[s.to_dict() for s in g] for g in src.buffer]


def test_reads_a_slime_state_file(tmp_path: Path, data5: str) -> None:
    import torch

    torch.save({"sample_offset": 3, "epoch_id": 2, "sample_group_index": 13, "sample_index": 26,
                "metadata": {"k": 1}}, tmp_path / "global_dataset_state_dict_7.pt")
    src = PlainDataSource(prompt_data=data5, n_samples_per_prompt=2, seed=42, load_dir=tmp_path, label_key=None, apply_chat_template=False)
    assert src.load(7) == 7
    g = src.get_samples(1)[0]
    assert (g[0].group_index, g[0].index, src.epoch_id, src.metadata) == (13, 26, 2, {"k": 1})
    from pipeline.data.order import epoch_permutation
    assert g[0].prompt == f"q{epoch_permutation(42, 2, 5)[3]}"


def test_foreign_samples_are_checkpointed_by_shape(tmp_path: Path, data5: str) -> None:
    class SlimeLikeSample:  # slime's own Sample: same core fields, its own class and enum
        def __init__(self, index: int) -> None:
            self.index, self.group_index, self.tokens, self.response_length = index, 0, [1, 2], 0
            self.status, self.reward, self.metadata, self.prompt = Sample.Status.COMPLETED, 1.0, {"k": index}, "p"
            self.slime_only = index  # an attribute our Sample does not have

        def to_dict(self) -> dict[str, Any]:
            return dict(self.__dict__)

    src = buffered(data5, tmp_path)
    src.add_samples([[SlimeLikeSample(0), SlimeLikeSample(1)]])
    src.save(0)
    fresh = buffered(data5, tmp_path)
    assert fresh.load() == 0
    got = fresh.buffer[0]
    assert [type(s) for s in got] == [Sample, Sample]
    assert [(s.index, s.tokens, s.status, s.metadata, s.weight_versions) for s in got] == [
        (0, [1, 2], Sample.Status.COMPLETED, {"k": 0}, []), (1, [1, 2], Sample.Status.COMPLETED, {"k": 1}, [])]
    assert [s.slime_only for s in got] == [0, 1]


def test_in_memory_state_round_trip_shares_nothing(data5: str) -> None:
    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=2, label_key=None, apply_chat_template=False)
    src.add_samples(src.get_samples(1))
    state = src.state_dict()
    other = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=2, label_key=None, apply_chat_template=False)
    other.load_state_dict(state)
    other.buffer[0][0].metadata["x"] = 1
    assert "x" not in src.buffer[0][0].metadata and other.state_dict()["buffer"] != state["buffer"]


def test_state_from_read_checkpoint_loads_with_copy(tmp_path: Path, data5: str) -> None:
    """`load_state_dict(read_checkpoint(path))` (the default copy) takes the raw arrays too."""
    src = buffered(data5, tmp_path)
    groups = src.get_samples(2)
    for g in groups:
        for s in g:
            s.append_response_tokens(tokens=[3, 4], log_probs=[-0.5, -0.1])
    src.add_samples(groups)
    state = ckpt.read_checkpoint(src.save(2))
    fresh = buffered(data5, tmp_path)
    fresh.load_state_dict(state)
    assert [[s.to_dict() for s in g] for g in fresh.buffer] == [[s.to_dict() for s in g] for g in src.buffer]
