"""`pipeline.BufferedDataSource` used from slime itself, as `--data-source-path`: driven exactly as
slime's RolloutManager (slime/ray/rollout.py) and train loop (train.py, slime/ray/placement_group.py)
drive their data source, from an argparse namespace holding slime's defaults (slime/utils/arguments.py)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline import BufferedDataSource, Sample
from pipeline.data.errors import DataError
from tests.data.conftest import make_rows, write_jsonl


def slime_args(*argv: str) -> argparse.Namespace:
    """slime's own argument names, flags and defaults for everything the data source and the
    rollout manager read."""
    p = argparse.ArgumentParser()
    p.add_argument("--data-source-path", default="slime.rollout.data_source.RolloutDataSourceWithBuffer")
    p.add_argument("--prompt-data", default=None)
    p.add_argument("--disable-rollout-global-dataset", dest="rollout_global_dataset", action="store_false")
    p.add_argument("--input-key", default="input")
    p.add_argument("--label-key", default=None)
    p.add_argument("--metadata-key", default="metadata")
    p.add_argument("--tool-key", default="tools")
    p.add_argument("--multimodal-keys", type=json.loads, default=None)
    p.add_argument("--apply-chat-template", action="store_true", default=False)
    p.add_argument("--apply-chat-template-kwargs", type=json.loads, default={})
    p.add_argument("--rollout-shuffle", action="store_true", default=False)
    p.add_argument("--rollout-seed", type=int, default=42)
    p.add_argument("--rollout-max-prompt-len", type=int, default=None)
    p.add_argument("--n-samples-per-prompt", type=int, default=1)
    p.add_argument("--rollout-batch-size", type=int, required=True)
    p.add_argument("--buffer-filter-path", default=None)
    p.add_argument("--hf-checkpoint", default=None)
    p.add_argument("--dump-details", default=None)
    p.add_argument("--reward-key", default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--load", default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--start-rollout-id", type=int, default=None)
    p.add_argument("--num-rollout", type=int, default=None)
    p.add_argument("--num-epoch", type=int, default=None)
    return p.parse_args(list(argv))


def load_function(path: str) -> Any:
    """slime.utils.misc.load_function."""
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """A slime rollout function: fetch one group more than the batch, answer every group, give
    the batch back and put the extra (unfinished) group in the buffer, as partial rollout does.
    Without a prompt file the samples come empty and the function writes the prompt itself."""
    groups = data_source.get_samples(args.rollout_batch_size + 1)
    for group in groups:
        for s in group:
            if not s.prompt:
                s.prompt = f"fixed prompt {s.group_index}"
            s.append_response_tokens(tokens=[s.index], log_probs=[-0.5], text=f"r{rollout_id}",
                                     meta_info={"finish_reason": {"type": "abort"}, "weight_version": str(rollout_id)})
    data_source.add_samples(groups[-1:])
    return groups[:-1]


class RolloutManager:
    """The data-source side of slime's RolloutManager, without Ray and engines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        data_source_cls = load_function(self.args.data_source_path)
        self.data_source = data_source_cls(args)

    def get_num_rollout_per_epoch(self) -> int:
        assert self.args.rollout_global_dataset
        return len(self.data_source) // self.args.rollout_batch_size

    def generate(self, rollout_id: int) -> list[list[Sample]]:
        return generate_rollout(self.args, rollout_id, self.data_source, evaluation=False)

    def save(self, rollout_id: int) -> None:
        self.data_source.save(rollout_id)

    def load(self, rollout_id: int | None = None) -> None:
        self.data_source.load(rollout_id)


def train(args: argparse.Namespace, start_rollout_id: int) -> dict[int, list[list[dict]]]:
    """slime's train loop as far as the data source goes; returns each rollout's samples."""
    manager = RolloutManager(args)
    if args.num_rollout is None:
        args.num_rollout = manager.get_num_rollout_per_epoch() * args.num_epoch
    if args.start_rollout_id is None:
        args.start_rollout_id = start_rollout_id  # slime: from the Megatron checkpoint under args.load
    if args.rollout_global_dataset:
        manager.load(args.start_rollout_id - 1)
    out = {}
    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        out[rollout_id] = [[s.to_dict() for s in g] for g in manager.generate(rollout_id)]
        if args.save_interval is not None and (rollout_id + 1) % args.save_interval == 0:
            manager.save(rollout_id)
    return out


def test_dataset_mode_resumes_to_the_sample_with_the_buffer(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "prompts.jsonl", make_rows(7))
    common = ["--data-source-path", "pipeline.BufferedDataSource", "--prompt-data", data, "--label-key", "label",
              "--rollout-shuffle", "--rollout-seed", "3", "--n-samples-per-prompt", "2", "--rollout-batch-size", "2",
              "--save-interval", "1", "--num-epoch", "2"]
    whole = train(slime_args(*common, "--save", str(tmp_path / "a")), start_rollout_id=0)
    assert sorted(whole) == [0, 1, 2, 3, 4, 5]  # 7 prompts // batch 2 = 3 per epoch, x2 epochs
    assert sorted(p.name for p in (tmp_path / "a" / "rollout").iterdir()) == [
        "rollout_3.json", "rollout_4.json", "rollout_5.json"]  # slime's layout: <save>/rollout/, newest 3 kept
    # killed after rollout 3 was saved; slime restarts with --load and start_rollout_id 4
    first = train(slime_args(*common, "--save", str(tmp_path / "b"), "--num-rollout", "4"), start_rollout_id=0)
    resumed = train(slime_args(*common, "--save", str(tmp_path / "b"), "--load", str(tmp_path / "b")),
                    start_rollout_id=4)
    assert {**first, **resumed} == whole  # the unfinished group came back from the buffer, too
    served = [s["metadata"].get("i") for g in whole[4] for s in g]
    assert whole[4][0][0]["response"] == "r3r4" and served[0] == served[1]  # continued from rollout 3


@pytest.mark.parametrize("build", ["positional", "keyword"])
def test_buffer_only_mode(tmp_path: Path, build: str) -> None:
    """--disable-rollout-global-dataset: no prompt file; add_samples feeds it, empty samples fill up."""
    args = slime_args("--disable-rollout-global-dataset", "--prompt-data", "ignored.jsonl",
                      "--n-samples-per-prompt", "2", "--rollout-batch-size", "2", "--save", str(tmp_path))
    src = BufferedDataSource(args) if build == "positional" else BufferedDataSource(args=args)
    assert src.dataset is None and len(src) == 0 and src.get_buffer_length() == 0
    fresh = src.get_samples(num_samples=2)
    assert [[(s.group_index, s.index, s.prompt) for s in g] for g in fresh] == [
        [(0, 0, ""), (0, 1, "")], [(1, 2, ""), (1, 3, "")]]
    fed = [[Sample(group_index=70, index=700 + j, prompt="from an agent") for j in range(2)]]
    src.add_samples(samples=fed)
    got = src.get_samples(2)
    assert got[0][0] is fed[0][0] and [s.index for s in got[1]] == [4, 5]  # buffer first, then fresh indices
    assert [s.group_index for s in got[1]] == [2, 2]
    src.update_metadata({"seen": 3})
    src.add_samples(got[:1])
    src.save(5)
    assert (tmp_path / "rollout" / "rollout_5.json").is_file()
    back = BufferedDataSource(args=slime_args("--disable-rollout-global-dataset", "--n-samples-per-prompt", "2",
                                              "--rollout-batch-size", "2", "--load", str(tmp_path)))
    back.load(5)  # unlike slime, the buffer survives a restart
    assert [s.prompt for s in back.buffer[0]] == ["from an agent"] * 2 and back.get_metadata() == {"seen": 3}
    assert [s.index for g in back.get_samples(2)[1:] for s in g] == [6, 7]
    with pytest.raises(DataError, match="group 0 has 1 samples, expected n_samples_per_prompt=2"):
        back.add_samples([[Sample()]])


def test_the_slime_forms_build_the_same_source(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "p.jsonl", make_rows(5))
    args = slime_args("--prompt-data", data, "--rollout-shuffle", "--n-samples-per-prompt", "3",
                      "--rollout-batch-size", "1", "--buffer-filter-path", "pipeline.data.buffer_filters.reward_topk")
    a, b, c = BufferedDataSource(args), BufferedDataSource(args=args), BufferedDataSource.from_args(args)
    picks = [[s.prompt for g in src.get_samples(4) for s in g] for src in (a, b, c)]
    assert picks[0] == picks[1] == picks[2] and len(picks[0]) == 12
    assert a.buffer_filter is b.buffer_filter is c.buffer_filter
    assert a.buffer_filter.__name__ == "reward_topk" and len(a) == 5 and a.args is args
    with pytest.raises(DataError, match="prompt_data is required; without a prompt file use the buffered source"):
        from pipeline import PlainDataSource

        PlainDataSource(args=slime_args("--rollout-batch-size", "1"))


@pytest.mark.parametrize("cls_name", ["PlainDataSource", "BufferedDataSource"])
def test_the_constructor_reads_args_first_as_slime_s_plugin_contract_checks(tmp_path: Path, cls_name: str) -> None:
    """slime's plugin-contract test reads `inspect.signature(cls.__init__)` and wants ("self", "args")
    first; `cls(args)`, `cls(args=args)` and our keyword form all still build a source."""
    import inspect

    import pipeline

    cls = getattr(pipeline, cls_name)
    params = inspect.signature(cls.__init__).parameters
    assert tuple(params)[:2] == ("self", "args")
    assert params["args"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    data = write_jsonl(tmp_path / "p.jsonl", make_rows(3))
    args = slime_args("--prompt-data", data, "--n-samples-per-prompt", "2", "--rollout-batch-size", "1")
    by_position, by_keyword = cls(args), cls(args=args)
    assert by_position.args is args and by_keyword.args is args
    assert [s.prompt for g in by_position.get_samples(3) for s in g] == \
        [s.prompt for g in by_keyword.get_samples(3) for s in g]
    filter_args = argparse.Namespace(reward_key=None)  # the keyword form: args is what buffer filters get
    native = cls(args=filter_args, prompt_data=data, n_samples_per_prompt=2, label_key=None,
                 apply_chat_template=False)
    assert native.args is filter_args and native.n_samples_per_prompt == 2 and len(native) == 3
