"""Property: any interleaving of get/add/save→load-into-a-fresh-source equals the uninterrupted run."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import BufferedDataSource, Sample
from pipeline.data.buffer_filters import OldestFirst, pop_first, reward_topk

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.integers(0, 9)),
        st.tuples(st.just("add"), st.integers(0, 255)),
        st.tuples(st.just("reload"), st.just(0)),
    ),
    max_size=14,
)
FILTERS = {"pop_first": lambda: pop_first, "reward_topk": lambda: reward_topk,
           "oldest_first": lambda: OldestFirst(max_staleness=2)}


def enrich(group: list[Sample], step: int) -> None:
    """Deterministic rollout-like changes made before a group goes back to the buffer."""
    for j, s in enumerate(group):
        s.append_response_tokens(tokens=[step, j], log_probs=[-0.5, -float(j)], text=f"r{step}",
                                 meta_info={"finish_reason": {"type": "abort"}})
        s.reward = float((step * 7 + j) % 3)
        s.metadata.setdefault("start_rollout_id", step)


def snapshot(groups: list[list[Any]]) -> list[list[dict[str, Any]]]:
    return [[s.to_dict() for s in g] for g in groups]


def run(path: str, seed: int, n: int, shuffle: bool, filt: str, ops: list[tuple[str, int]],
        save_dir: Path | None) -> tuple[list[Any], list[Any]]:
    def make() -> BufferedDataSource:
        return BufferedDataSource(prompt_data=path, n_samples_per_prompt=n, seed=seed, shuffle=shuffle,
                                  save_dir=save_dir, buffer_filter=FILTERS[filt](), label_key=None, apply_chat_template=False)

    src = make()
    handed: list[Any] = []
    from_buffer: list[Any] = []
    last: list[list[Sample]] = []
    for step, (op, arg) in enumerate(ops):
        src.begin_rollout(step)
        if op == "get":
            before = src.get_buffer_length()
            last = src.get_samples(arg)
            handed += [(g[0].prompt, g[0].group_index, [s.index for s in g]) for g in last]
            taken = before - src.get_buffer_length()
            from_buffer.append(snapshot(last[:max(taken, 0)]))
        elif op == "add":
            chosen = [g for i, g in enumerate(last) if arg >> (i % 8) & 1]
            for g in chosen:
                enrich(g, step)
            src.add_samples(chosen)
            last = []
        elif save_dir is not None:  # reload into a fresh source
            src.save(step)
            src = make()
            assert src.load() == step
            last = []
        else:
            last = []
    handed.append(("buffer at end", snapshot(src.buffer)))
    return handed, from_buffer


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_rows=st.integers(1, 7), seed=st.integers(0, 10_000), n=st.integers(1, 3), shuffle=st.booleans(),
       filt=st.sampled_from(sorted(FILTERS)), ops=OPS)
def test_interrupted_equals_uninterrupted(n_rows: int, seed: int, n: int, shuffle: bool, filt: str,
                                          ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.jsonl"
        path.write_text("".join(f'{{"input": "p{i}", "metadata": {{"row": {i}}}}}\n' for i in range(n_rows)))
        ref = run(str(path), seed, n, shuffle, filt, ops, None)
        got = run(str(path), seed, n, shuffle, filt, ops, Path(tmp) / "ck")
        assert got[0] == ref[0]  # (prompt, group_index, indices) sequence and the final buffer
        assert got[1] == ref[1]  # buffered groups come back intact, field for field
