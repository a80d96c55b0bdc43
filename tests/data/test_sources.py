"""docs/contracts.md §4: plain and buffered data sources."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import BufferedDataSource, PlainDataSource, Sample
from pipeline.data.errors import DataError

from tests.data.conftest import make_rows, write_jsonl


def trace(groups: list[list[Sample]]) -> list[tuple[str, int, list[int]]]:
    return [(g[0].prompt, g[0].group_index, [s.index for s in g]) for g in groups]


def test_spec_trace(data5: str) -> None:
    src = PlainDataSource(prompt_data=data5, n_samples_per_prompt=2, seed=42, shuffle=True, label_key=None, apply_chat_template=False)
    calls = [trace(src.get_samples(2)) for _ in range(4)]
    assert calls == [
        [("q3", 0, [0, 1]), ("q1", 1, [2, 3])],
        [("q2", 2, [4, 5]), ("q4", 3, [6, 7])],
        [("q0", 4, [8, 9]), ("q1", 5, [10, 11])],
        [("q4", 6, [12, 13]), ("q3", 7, [14, 15])],
    ]
    assert src.epoch_id == 1 and src.sample_offset == 3


def test_no_shuffle_is_file_order(data5: str) -> None:
    src = PlainDataSource(prompt_data=data5, n_samples_per_prompt=1, shuffle=False, label_key=None, apply_chat_template=False)
    assert [g[0].prompt for g in src.get_samples(7)] == ["q0", "q1", "q2", "q3", "q4", "q0", "q1"]


def test_request_larger_than_several_epochs_returns_full_count(data5: str) -> None:
    src = PlainDataSource(prompt_data=data5, n_samples_per_prompt=3, seed=1, label_key=None, apply_chat_template=False)
    groups = src.get_samples(13)
    assert len(groups) == 13 and all(len(g) == 3 for g in groups)
    assert [s.index for g in groups for s in g] == list(range(39))
    # each full epoch holds every prompt once
    prompts = [g[0].prompt for g in groups]
    assert sorted(prompts[:5]) == sorted(prompts[5:10]) == [f"q{i}" for i in range(5)]
    assert src.epoch_id == 2 and src.sample_offset == 3
    # same as fetching one at a time
    one = PlainDataSource(prompt_data=data5, n_samples_per_prompt=3, seed=1, label_key=None, apply_chat_template=False)
    assert [g[0].prompt for _ in range(13) for g in one.get_samples(1)] == prompts


def test_samples_share_no_mutable_state(tmp_path: Path) -> None:
    rows = [{"input": [{"role": "user", "content": "hi"}], "label": {"a": [1]},
             "metadata": {"nested": {"x": [1, 2]}, "flat": 1}, "tools": '[{"name": "calc"}]'}]
    src = PlainDataSource(prompt_data=write_jsonl(tmp_path / "m.jsonl", rows), n_samples_per_prompt=3,
                          label_key="label", apply_chat_template=False)
    g = src.get_samples(1)[0]
    g[0].metadata["nested"]["x"].append(3)
    g[0].metadata["tools"][0]["name"] = "changed"
    g[0].prompt[0]["content"] = "changed"
    g[0].label["a"].append(9)
    g[0].tokens.append(5)
    g[0].weight_versions.append("v")
    for s in g[1:]:
        assert s.metadata == {"nested": {"x": [1, 2]}, "flat": 1, "tools": [{"name": "calc"}]}
        assert s.prompt == [{"role": "user", "content": "hi"}] and s.label == {"a": [1]}
        assert s.tokens == [] and s.weight_versions == []
    again = src.get_samples(1)[0][0]
    assert again.metadata["nested"]["x"] == [1, 2] and again.prompt[0]["content"] == "hi"


def test_immutable_values_are_shared_and_mutable_ones_copied() -> None:
    """A group of n samples holds one prompt string, not n; containers are per sample, equal to
    the decoded value whatever it holds (parquet gives bytes and, for map columns, tuples)."""
    from pipeline.data.sources import _copies

    for value in ("a long prompt " * 4, 1.5, 10**12, True, None):
        assert all(c is value for c in _copies(value, 3))
    flat = {"s": "text " * 4, "i": 10**12, "f": 0.5, "b": True, "n": None}  # every immutable type
    copies = _copies(flat, 3)
    assert copies[0] is flat and all(c == flat and c is not flat and c["s"] is flat["s"] for c in copies[1:])
    cases = [({"tags": ["a"], "img": [b"\x00"]}, lambda v: v["tags"]),  # not JSON: deep copies
             ({"pairs": [("k", 1)]}, lambda v: v["pairs"]),               # a parquet map column: tuples stay
             ({"by_id": {1: ["x"]}}, lambda v: v["by_id"][1]),            # int keys stay
             ([{"role": "user", "content": ["hi"]}], lambda v: v[0]["content"])]
    for value, inner in cases:
        copies = _copies(value, 3)
        assert copies[0] is value and all(c == value for c in copies), value
        inner(copies[1]).append("changed")
        assert inner(copies[0]) != inner(copies[1]) and inner(copies[2]) == inner(value), value
    assert _copies({"a": [1]}, 1) == [{"a": [1]}]
    pair = _copies({"a": [1]}, 2)
    assert pair == [{"a": [1]}] * 2 and pair[1]["a"] is not pair[0]["a"]


def test_get_samples_refuses_a_bad_count_and_notes_a_wrapping_request_once(data5: str, caplog) -> None:
    src = PlainDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    for bad in (-1, True, 2.0, "2"):
        with pytest.raises(DataError, match=rf"^get_samples: num_groups must be a non-negative integer, got "
                                            rf"{re.escape(repr(bad))}$"):
            src.get_samples(bad)
    with caplog.at_level("WARNING", logger="pipeline.data.sources"):
        src.get_samples(2)
        src.get_samples(5)  # the whole dataset: no wrap inside one batch
        assert caplog.records == []
        src.get_samples(7)
        src.get_samples(6)
    assert [r.getMessage() for r in caplog.records] == [
        f"{data5}: a request for 7 groups is larger than the dataset (5 prompts): the epoch wraps inside one batch, "
        "so the same prompts appear more than once in it (noted once; lower rollout_batch_size / "
        "over_sampling_batch_size or add prompts)"]


def test_flat_metadata_copies_are_independent(data5: str) -> None:
    g = PlainDataSource(prompt_data=data5, n_samples_per_prompt=2, label_key=None, apply_chat_template=False).get_samples(1)[0]
    g[0].metadata["i"] = -1
    assert g[1].metadata["i"] != -1 and g[0].metadata is not g[1].metadata


def test_plain_add_samples_raises(data5: str) -> None:
    src = PlainDataSource(prompt_data=data5, n_samples_per_prompt=2, label_key=None, apply_chat_template=False)
    with pytest.raises(TypeError, match=r"^PlainDataSource is read-only: add_samples needs a buffer; use "
                                        r"pipeline\.BufferedDataSource \(data_source=buffered\)$"):
        src.add_samples(src.get_samples(1))
    assert src.get_buffer_length() == 0 and len(src) == 5


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ("not a list", r"^add_samples expects a list of groups \(lists of Samples\), got str$"),
        ([Sample(), Sample()], "item 0 is a Sample, expected a group"),
        ([[Sample()]], "group 0 has 1 samples, expected n_samples_per_prompt=2"),
        ([[Sample(), Sample()], [Sample(), Sample(), Sample()]], "group 1 has 3 samples"),
        ([[Sample(), "x"]], "group 0 item 1 is a str, expected a Sample"),
    ],
)
def test_add_samples_validation(data5: str, groups: Any, match: str) -> None:
    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=2, label_key=None, apply_chat_template=False)
    with pytest.raises(DataError, match=match):
        src.add_samples(groups)
    assert src.buffer == []


def test_buffered_groups_come_first_and_filter_gets_rollout_id(data5: str) -> None:
    seen: list[Any] = []

    def spy(args: Any, rollout_id: Any, buffer: list, num: int) -> list:
        seen.append((args.n_samples_per_prompt, rollout_id, len(buffer), num))
        out = buffer[:1]
        del buffer[:1]
        return out

    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=2, seed=42, buffer_filter=spy, label_key=None, apply_chat_template=False)
    first = src.get_samples(3)
    src.add_samples(first[1:])
    src.begin_rollout(7)
    got = src.get_samples(2)
    assert seen == [(2, 7, 2, 2)]
    assert got[0][0] is first[1][0] and trace(got)[1] == ("q4", 3, [6, 7])
    src.get_samples(2, rollout_id=9)
    assert seen[-1] == (2, 9, 1, 2) and src.get_buffer_length() == 0


def test_buffer_filter_returning_too_much_is_an_error(data5: str) -> None:
    def greedy(args: Any, rid: Any, buffer: list, num: int) -> list:
        out = list(buffer)
        buffer.clear()
        return out

    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=1, buffer_filter=greedy, label_key=None, apply_chat_template=False)
    src.add_samples(src.get_samples(3))
    with pytest.raises(DataError, match="returned 3 groups for a request of 1"):
        src.get_samples(1)


def slime_doc_buffer_filter(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """A buffer filter as slime's own docs describe one (docs/en/get_started/customization.md §5: this
    signature, "implementing priority-based sample selection"; .claude/skills/add-dynamic-filter:
    `return selected_groups`), written as a new user would: nothing there says to remove the groups."""
    selected_groups = sorted(buffer, key=lambda group: -sum(s.reward for s in group))[:num_samples]
    return selected_groups


def test_a_buffer_filter_that_leaves_its_groups_in_the_buffer_fails_on_the_second_hand_out(data5: str, caplog) -> None:
    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=2, buffer_filter=slime_doc_buffer_filter,
                             label_key=None, apply_chat_template=False)
    groups = src.get_samples(4)
    for k, group in enumerate(groups):
        for s in group:
            s.reward = float(k)
    src.add_samples(groups)  # e.g. the surplus of an over-sampling round
    src.begin_rollout(1)
    with caplog.at_level("WARNING", logger="pipeline.data.sources"):
        first = src.get_samples(2)
    assert [g[0].group_index for g in first] == [3, 2] and src.get_buffer_length() == 4
    assert "did not remove them from the buffer" in caplog.text and "slime_doc_buffer_filter" in caplog.text
    src.begin_rollout(2)
    with pytest.raises(DataError) as err:
        src.get_samples(2)  # the same two groups again: they never left the buffer
    message = str(err.value)
    assert re.match(r"buffer filter (tests\.data\.)?test_sources\.slime_doc_buffer_filter handed out group 3 "
                    r"\(sample indices \[6, 7\]\) again in rollout 2 while it is still in the buffer: ", message)
    assert "must remove the groups it returns from `buffer` (in place" in message


def test_groups_that_come_back_to_the_buffer_may_be_served_again(data5: str, caplog) -> None:
    """Partial rollouts: a served group that add_samples puts back is served again, and a filter that
    keeps what it did not return is fine; neither is the unremoved-group error."""
    src = BufferedDataSource(prompt_data=data5, n_samples_per_prompt=1, label_key=None, apply_chat_template=False)
    src.add_samples(src.get_samples(3))
    for rollout in range(4):
        served = src.get_samples(2, rollout_id=rollout)
        src.add_samples(served)  # the same Sample objects back (unfinished), served again next time
    assert src.get_buffer_length() == 3 and "did not remove" not in caplog.text


class KeepAll:
    """A callable buffer filter object (no __qualname__ of its own: errors name its class)."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def __call__(self, args: Any, rid: Any, buffer: list, num: int) -> Any:
        return self.out


def test_a_buffer_filter_returning_something_else_than_groups_is_named(data5: str) -> None:
    def as_tuple(args: Any, rid: Any, buffer: list, num: int) -> Any:
        return tuple(buffer[:num])

    cases = [(as_tuple, r"buffer filter test_a_buffer_filter_returning_something_else_than_groups_is_named"
                        r"\.<locals>\.as_tuple must return a list of groups \(lists\), got tuple$"),
             (KeepAll("groups"), r"^buffer filter KeepAll must return a list of groups \(lists\), got str$"),
             (KeepAll([Sample()]), r"^buffer filter KeepAll must return a list of groups \(lists\), got list$"),
             (KeepAll([[Sample()]] * 2), r"^buffer filter KeepAll returned 2 groups for a request of 1$")]
    for buffer_filter, match in cases:
        src = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1, buffer_filter=buffer_filter)
        src.add_samples(src.get_samples(2))
        with pytest.raises(DataError, match=match):
            src.get_samples(1)


def test_load_state_dict_names_its_source_and_copies_by_default(data5: str) -> None:
    from pipeline.data.checkpoint import CheckpointError

    src = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    with pytest.raises(CheckpointError, match=r"^state: not a data-source state \(format 'bogus'\)$"):
        src.load_state_dict({"format": "bogus"})
    with pytest.raises(CheckpointError, match=r"^ckpt\.json: not a data-source state"):
        src.load_state_dict({"format": None}, source="ckpt.json")
    a = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    a.add_samples(a.get_samples(1))
    a.update_metadata({"seen": {"ids": [1]}})
    state = a.state_dict()
    b = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    b.load_state_dict(state)  # a copy: the caller's dict stays the caller's
    state["metadata"]["seen"]["ids"].append(2)
    assert b.get_metadata() == {"seen": {"ids": [1]}} and b.get_buffer_length() == 1
    c = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    c.load_state_dict(state, copy_state=False)  # load() of a freshly read file: taken as it is, no copy
    assert c.get_metadata()["seen"] is state["metadata"]["seen"]


def test_a_plain_state_or_another_filter_resumes_in_a_buffered_source(data5: str) -> None:
    """Resuming with other overrides: a plain run's state (no buffer) or a state written with a
    stateless filter, loaded by a buffered source with a stateful filter."""
    from pipeline.data.buffer_filters import OldestFirst

    plain = PlainDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)
    plain.get_samples(3)
    state = plain.state_dict()
    assert "buffer" not in state
    for stateful in (OldestFirst(max_staleness=0), None):
        src = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1, buffer_filter=stateful)
        src.load_state_dict(state)
        assert src.get_buffer_length() == 0 and src.sample_offset == 3
    buffered = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1)  # pop_first: no filter state
    buffered.add_samples(buffered.get_samples(1))
    assert buffered.state_dict()["buffer_filter"] is None
    src = BufferedDataSource(prompt_data=data5, label_key=None, apply_chat_template=False, n_samples_per_prompt=1, buffer_filter=OldestFirst(max_staleness=0))
    src.load_state_dict(buffered.state_dict())
    assert src.get_buffer_length() == 1 and src.buffer_filter.state_dict() == OldestFirst(max_staleness=0).state_dict()


def test_from_args_and_slime_style_constructor(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": f"p{i}", "answer": i} for i in range(6)])
    args = SimpleNamespace(prompt_data=path, input_key="text", label_key="answer", metadata_key="metadata",
                           tool_key=None, rollout_shuffle=True, rollout_seed=3, n_samples_per_prompt=2,
                           rollout_max_prompt_len=None, apply_chat_template=False,
                           apply_chat_template_kwargs={}, hf_checkpoint=None,
                           buffer_filter_path="pipeline.data.buffer_filters.reward_topk",
                           save=str(tmp_path / "ck"), load=None)
    a = BufferedDataSource.from_args(args)
    b = BufferedDataSource(args)
    ref = PlainDataSource(prompt_data=path, n_samples_per_prompt=2, seed=3, input_key="text", label_key="answer", apply_chat_template=False)
    assert trace(a.get_samples(4)) == trace(b.get_samples(4)) == trace(ref.get_samples(4))
    assert a.args is args and a.buffer_filter.__name__ == "reward_topk"
    assert a.save_dir == str(tmp_path / "ck" / "rollout")
    assert a.get_samples(1)[0][0].label in set(range(6))  # labels stay JSON values


def test_bad_buffer_filter_path(data5: str) -> None:
    with pytest.raises(DataError, match="cannot import 'nope.missing'"):
        BufferedDataSource(prompt_data=data5, n_samples_per_prompt=1, buffer_filter="nope.missing", label_key=None, apply_chat_template=False)


def test_metrics_and_tokenizer_from_args(tmp_path: Path, tokenizer_dir: str) -> None:
    from pipeline.data.buffer_filters import OldestFirst

    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "w1 " * i} for i in range(1, 6)])
    args = SimpleNamespace(hf_checkpoint=tokenizer_dir)
    src = BufferedDataSource(prompt_data=path, n_samples_per_prompt=1, max_prompt_len=3, args=args,
                             buffer_filter=OldestFirst(max_staleness=0), label_key=None, apply_chat_template=False)
    assert len(src) == 3  # the tokenizer came from args.hf_checkpoint
    src.add_samples(src.get_samples(2))
    assert src.metrics() == {"buffer/size": 2.0, "data/epoch": 0.0, "data/skipped_rows": 0.0,
                             "data/too_long_prompts": 2.0, "buffer/stale_dropped": 0.0}


def test_fetched_samples_equal_constructed_ones(data5: str) -> None:
    """The template path of `get_samples` builds exactly what `Sample(...)` builds."""
    from pipeline.data import sources

    assert sources._FAST_INIT  # the fast path is the one under test
    for g in PlainDataSource(prompt_data=data5, n_samples_per_prompt=3, seed=2, label_key=None, apply_chat_template=False).get_samples(4):
        for s in g:
            made = Sample(group_index=s.group_index, index=s.index, prompt=s.prompt, label=s.label,
                          metadata=dict(s.metadata))
            assert type(s) is Sample and s.__dict__ == made.__dict__ and list(vars(s)) == list(vars(made))
        assert len({id(s.tokens) for s in g} | {id(s.weight_versions) for s in g} | {id(s.metadata) for s in g}) == 9
