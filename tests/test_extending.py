"""docs/extending.md, run as written: a buffer filter, an engine, a stage and a hook of a user's own
package (the code and YAML blocks of the recipes, written into a temp folder, on PYTHONPATH and the
allowlist), run through the CLI with no edit to pipeline/; each plugin leaves evidence it ran."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.plugins import SLOTS
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
# a fenced block whose first line is a comment naming the file it is
BLOCK = re.compile(r"```(?:python|yaml)\n# ((?:recipepkg|conf)/[\w/.]+)\n(.*?)```", re.S)

pytestmark = pytest.mark.timeout(300)


def recipe_files() -> dict[str, str]:
    """{relative path: text} of every file the recipes show."""
    return {path: body for path, body in BLOCK.findall(DOC.read_text())}


@pytest.fixture(scope="module")
def user_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user")
    (root / "recipepkg").mkdir()
    (root / "recipepkg" / "__init__.py").write_text("")
    for rel, body in recipe_files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(body)
    rows = [{"input": f"What is {i} + {2 * i + 3}?", "label": str(3 * i + 3)} for i in range(40)]
    (root / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=os.pathsep.join([str(root), str(ROOT)]),
               HYDRA_FULL_ERROR="1")
    return subprocess.run([sys.executable, "run.py", f"hydra.searchpath=[file://{root / 'conf'}]",
                           "allowed_targets_extra=[recipepkg.]", f"data_source.prompt_data={root / 'arith.jsonl'}",
                           "logger=jsonl", "rollout.progress=false", "rollout.summary=false", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_the_docs_list_every_row_of_the_table():
    rows = ["| row | config key | kind | call forms | runtime parts | built |", "|---|---|---|---|---|---|"]
    for slot in SLOTS:
        calls = " or ".join(f"`{c.text}`" for c in slot.calls).replace("|", "\\|")
        built = "on demand" if slot.on_demand else "in order"
        rows.append(f"| {slot.name} | `{slot.key}` | {slot.kind} | {calls} | {', '.join(slot.parts)} | {built} |")
    assert "\n".join(rows) in DOC.read_text()


def test_the_recipes_show_every_file_the_test_uses():
    assert set(recipe_files()) == {
        "recipepkg/filters.py", "conf/filter/newest_first.yaml", "recipepkg/engines.py",
        "conf/engine/arithmetic.yaml", "recipepkg/stages.py", "conf/stages_extra/response_chars.yaml",
        "recipepkg/slots.py", "recipepkg/hooks.py", "conf/hooks_extra/sample_note.yaml"}


def test_a_filter_engine_stage_and_hook_of_ones_own_run_through_the_cli(user_tree: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = run_cli(user_tree, "engine=arithmetic", "data_source=buffered", "filter=newest_first",
                   "+stages_extra=response_chars", "+hooks_extra=sample_note", "num_rollout=2",
                   "rollout_batch_size=2", "n_samples_per_prompt=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    samples = [read_samples(run_dir / "samples" / f"rollout_{i}.jsonl") for i in (0, 1)]
    # the engine answered every sample, right (math reward 1)
    assert all(s.response.startswith("arithmetic engine: The answer is") for batch in samples for s in batch)
    assert all(r["rollout/raw_reward"] == 1.0 for r in rows)
    # the stage ran after rewards, timed under its name; the hook's metric came through it
    for row, batch in zip(rows, samples):
        assert row["recipe/response_chars"] == pytest.approx(sum(len(s.response) for s in batch) / len(batch))
        assert row["recipe/completed_samples"] == len(batch)
        assert row["perf/stage/response_chars_time"] >= 0
    # the filter served rollout 1 from rollout 0's surplus (data_source=buffered over-samples 3x)
    assert not any("served_by" in s.metadata for s in samples[0])
    assert any(s.metadata.get("served_by") == "newest_first" for s in samples[1])


def test_the_filters_declared_need_is_checked_before_the_run(user_tree: Path, tmp_path: Path):
    proc = run_cli(user_tree, "engine=arithmetic", "filter=newest_first", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    assert ("filter: 'recipepkg.filters.newest_first' needs a buffer, but the data_source "
            "'pipeline.data.sources.PlainDataSource' has none; use data_source=buffered") in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_hook_with_the_wrong_signature_is_refused_naming_its_key(user_tree: Path, tmp_path: Path):
    proc = run_cli(user_tree, "engine=arithmetic", "+hooks_extra=sample_note",
                   "sample_note_path=recipepkg.filters.newest_first", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    assert "sample_note_path: 'recipepkg.filters.newest_first' has the signature" in proc.stderr
    assert "fn(args, samples) -> dict" in proc.stderr
