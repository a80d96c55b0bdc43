"""The epoch cursor on tiny datasets: a one-row set crosses an epoch on every prompt.

A wrong step in the cursor loop turns into an endless loop here; the short timeout (and the
memory guard in tests/conftest.py) makes that a quick failure instead of a machine-wide stall.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.data.order import EpochOrder, epoch_permutation
from pipeline.data.sources import BufferedDataSource, PlainDataSource

pytestmark = pytest.mark.timeout(20)


def source(tmp_path: Path, n_rows: int, **kw) -> PlainDataSource:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(f'{{"input": "p{i}"}}\n' for i in range(n_rows)))
    return PlainDataSource(prompt_data=str(path), n_samples_per_prompt=kw.pop("n", 1),
                           **{"label_key": None, "apply_chat_template": False, **kw})


def prompts(groups) -> list[str]:
    return [g[0].prompt for g in groups]


def test_one_row_dataset_crosses_an_epoch_per_prompt(tmp_path):
    src = source(tmp_path, 1, shuffle=True, seed=3)
    assert prompts(src.get_samples(5)) == ["p0"] * 5
    # the cursor moves to the next epoch only when it needs a row from it
    assert (src.epoch_id, src.sample_offset) == (4, 1)
    assert prompts(src.get_samples(1)) == ["p0"] and (src.epoch_id, src.sample_offset) == (5, 1)


def test_cursor_crosses_epochs_in_the_middle_of_a_request(tmp_path):
    src = source(tmp_path, 3, shuffle=False, n=2)
    got = src.get_samples(2)
    assert prompts(got) == ["p0", "p1"] and (src.epoch_id, src.sample_offset) == (0, 2)
    got = src.get_samples(5)  # p2 | p0 p1 p2 | p0
    assert prompts(got) == ["p2", "p0", "p1", "p2", "p0"]
    assert (src.epoch_id, src.sample_offset) == (2, 1)
    assert [g[0].group_index for g in got] == [2, 3, 4, 5, 6]
    assert [[s.index for s in g] for g in got][:2] == [[4, 5], [6, 7]]
    assert src.get_samples(0) == [] and (src.epoch_id, src.sample_offset) == (2, 1)


def test_shuffled_epochs_follow_the_epoch_permutation(tmp_path):
    src = source(tmp_path, 4, shuffle=True, seed=11)
    got = prompts(src.get_samples(10))
    expected = [f"p{i}" for e in range(3) for i in epoch_permutation(11, e, 4)][:10]
    assert got == expected


def test_buffered_source_on_one_row_set(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"input": "only"}\n')
    src = BufferedDataSource(prompt_data=str(path), n_samples_per_prompt=2, shuffle=True, seed=0, label_key=None, apply_chat_template=False)
    got = src.get_samples(3)
    assert prompts(got) == ["only"] * 3 and src.epoch_id == 2
    src.add_samples(got[:1])
    again = src.get_samples(2)
    assert [g[0].group_index for g in again] == [0, 3]


def test_epoch_order_identity_without_shuffle_and_permutation_with():
    assert EpochOrder(5, seed=1, shuffle=False).order(3).tolist() == [0, 1, 2, 3, 4]
    order = EpochOrder(5, seed=1, shuffle=True)
    assert order.order(2).tolist() == epoch_permutation(1, 2, 5)
    assert order.order(3).tolist() == epoch_permutation(1, 3, 5)
    assert order.order(2).tolist() == epoch_permutation(1, 2, 5)  # back to an earlier epoch
    assert epoch_permutation(1, 2, 5) != epoch_permutation(2, 2, 5) or epoch_permutation(1, 3, 5) != epoch_permutation(2, 3, 5)
