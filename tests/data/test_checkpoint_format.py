"""The checkpoint file format (pipeline/data/checkpoint.py): what each error says, the byte
layout (compact JSON, 8-byte aligned little-endian arrays), housekeeping, fingerprint diffs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.data.checkpoint import (
    VERSION, diff_fingerprints, prune_checkpoints, read_checkpoint, read_slime_state, write_checkpoint,
)
from pipeline.data.errors import CheckpointError

pytestmark = pytest.mark.timeout(30)


def header_and_payload(path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    end = raw.index(b"\n")
    return json.loads(raw[:end]), raw[end + 1:]


def test_layout_compact_json_then_aligned_little_endian_arrays(tmp_path):
    path = tmp_path / "deep" / "er" / "rollout_1.json"  # folders are created
    state = {"a": 1, "odd": np.arange(3, dtype=">i2"), "nested": {"f": np.array([1.5, 2.5], dtype="<f8")},
             "empty": np.zeros(0, dtype="<i4")}
    write_checkpoint(path, state)
    header, payload = header_and_payload(path)
    assert payload.startswith(b'{"a":1,"odd":null,"nested":{"f":null},"empty":null}\n')
    assert header["json_size"] == len(b'{"a":1,"odd":null,"nested":{"f":null},"empty":null}\n')
    offsets = [a["offset"] for a in header["arrays"]]
    assert all(o % 8 == 0 for o in offsets) and offsets[0] == 56  # 53-byte JSON line, padded to 56
    assert header["arrays"][0]["dtype"] == "<i2"  # stored little-endian whatever the input order
    back = read_checkpoint(path)
    assert back["odd"].tolist() == [0, 1, 2] and back["nested"]["f"].tolist() == [1.5, 2.5]
    assert back["empty"].shape == (0,) and back["empty"].dtype == np.dtype("<i4")
    matrix = np.arange(6, dtype="<i8").reshape(2, 3)
    write_checkpoint(path, {"m": matrix})
    assert read_checkpoint(path)["m"].tolist() == matrix.tolist()


def test_a_version_one_file_without_layout_reads_as_json(tmp_path):
    import hashlib

    payload = b'{"x":[1,2]}\n'
    header = {"magic": json.loads(header_line(tmp_path))["magic"], "version": 1, "size": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    path = tmp_path / "rollout_0.json"
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    assert read_checkpoint(path) == {"x": [1, 2]}


def header_line(tmp_path) -> bytes:
    probe = tmp_path / "probe" / "rollout_9.json"
    write_checkpoint(probe, {})
    return probe.read_bytes().split(b"\n", 1)[0]


def test_error_messages_name_the_file_and_the_problem(tmp_path):
    path = tmp_path / "rollout_2.json"
    with pytest.raises(CheckpointError, match=r"rollout_2.json: cannot read checkpoint \("):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"rollout_2.json: the data-source state is not JSON-serialisable \("):
        write_checkpoint(path, {"x": object()})
    assert list(tmp_path.iterdir()) == []  # nothing half-written
    write_checkpoint(path, {"x": 1})
    header, payload = header_and_payload(path)
    for bad in (b"", b"no newline", b"[1]\n" + payload, b'{"magic": "other"}\n' + payload):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match=r"rollout_2.json: not a rollout-pipeline checkpoint \(bad header\)"):
            read_checkpoint(path)
    path.write_bytes(json.dumps(header).encode())  # a valid header line without its newline
    with pytest.raises(CheckpointError, match=r"rollout_2.json: not a rollout-pipeline checkpoint \(bad header\)"):
        read_checkpoint(path)
    path.write_bytes(json.dumps({**header, "version": 99}).encode() + b"\n" + payload)
    with pytest.raises(CheckpointError, match=rf"rollout_2.json: checkpoint version 99, expected {VERSION}"):
        read_checkpoint(path)
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload[:-2])
    with pytest.raises(CheckpointError, match=rf"truncated checkpoint \({len(payload) - 2} payload bytes, "
                                              rf"header says {len(payload)}\)"):
        read_checkpoint(path)
    import hashlib

    junk = b'{"x":1}\n'
    layout = {**header, "size": len(junk), "sha256": hashlib.sha256(junk).hexdigest(),
              "arrays": [{"path": ["missing", "y"], "dtype": "<i4", "shape": [1], "offset": 0}]}
    path.write_bytes(json.dumps(layout).encode() + b"\n" + junk)
    with pytest.raises(CheckpointError, match=r"rollout_2.json: malformed checkpoint layout \("):
        read_checkpoint(path)


def test_stale_temp_files_are_removed_and_prune_keeps_the_newest(tmp_path):
    (tmp_path / ".rollout_3.json.999.tmp").write_bytes(b"half")
    (tmp_path / "other.tmp").write_bytes(b"not ours")
    for i in range(4):
        write_checkpoint(tmp_path / f"rollout_{i}.json", {"i": i})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["other.tmp", "rollout_0.json", "rollout_1.json", "rollout_2.json", "rollout_3.json"]
    (tmp_path / "rollout_1.json").unlink()
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("rollout_*")) == ["rollout_2.json", "rollout_3.json"]


class Pickled:
    """Not a tensor or a plain container: `torch.load(weights_only=True)` refuses it."""


def test_slime_state_errors(tmp_path):
    ok = tmp_path / "global_dataset_state_dict_0.pt"
    torch.save({"sample_offset": 1, "epoch_id": 0, "sample_group_index": 1, "sample_index": 2}, ok)
    assert read_slime_state(ok)["sample_index"] == 2
    torch.save({"sample_offset": 1, "epoch_id": 0, "sample_group_index": 1, "sample_index": 2, "x": Pickled()}, ok)
    with pytest.raises(CheckpointError, match="cannot read slime data-source state"):  # no arbitrary unpickling
        read_slime_state(ok)
    bad = tmp_path / "global_dataset_state_dict_1.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"global_dataset_state_dict_1.pt: cannot read slime data-source state \("):
        read_slime_state(bad)
    torch.save({"epoch_id": 1}, bad)
    with pytest.raises(CheckpointError, match=r"needs keys \['sample_offset', 'epoch_id', 'sample_group_index', "
                                              r"'sample_index'\]"):
        read_slime_state(bad)
    torch.save([1, 2], bad)
    with pytest.raises(CheckpointError, match="needs keys"):
        read_slime_state(bad)


def test_diff_fingerprints_names_every_difference():
    saved = {"path": "a.jsonl", "rows": 5, "cols": ["input", "label"], "meta": {"n": 1, "gone": True}}
    now = {"path": "a.jsonl", "rows": 6, "cols": ["input", "answer"], "meta": {"n": 1, "new": 2}}
    assert diff_fingerprints(saved, now) == [
        "cols[1]: checkpoint has 'label', now 'answer'",
        "meta.gone: checkpoint has True, now None",
        "meta.new: checkpoint has None, now 2",
        "rows: checkpoint has 5, now 6",
    ]
    assert diff_fingerprints(saved, saved) == []
    assert diff_fingerprints([1, 2], [1, 2, 3], "x") == ["x: checkpoint has [1, 2], now [1, 2, 3]"]
    assert diff_fingerprints({"a": 1}, [1]) == [": checkpoint has {'a': 1}, now [1]"]
    assert diff_fingerprints({1: "a", "b": 2}, {1: "a", "b": 3}) == ["b: checkpoint has 2, now 3"]
