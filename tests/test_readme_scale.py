"""Every `python run.py` line of the bash blocks of README.md and docs/ that no other test runs
whole (the tour, the plugin and configuration-reference commands) passes pre-flight on this CPU
machine, or is refused only for what this machine lacks (a GPU), in words that say so. Lines with
a placeholder of yours (`<run dir>`, `mypkg.`, a `/models/` folder) are reported as skipped."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.cluster import devices
from pipeline.config.args import ConfigError, validate

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# (page, section heading) -> the test that runs the section's blocks whole, command by command
RUN_WHOLE = {
    ("README.md", "## A 5-minute tour"): "tests/test_readme.py::test_the_readme_tour_is_the_getting_started_tour",
    ("getting-started.md", "## A 5-minute tour"): "tests/test_readme.py::test_tour_commands_run_in_order",
    ("plugins.md", "## Both forms on the command line"): "tests/test_readme.py::test_plugin_commands_run",
    ("configuration.md", "# Configuration reference"): "tests/test_readme.py::test_configuration_reference_commands_run",
}
TRAINING_AT_SCALE = "## Training at scale: N workers on torch.distributed, GPUs, several nodes"
# what a reader fills in with their own: a run dir, a package, a model folder
PLACEHOLDER = re.compile(r"<[^>]+>|\bmypkg\b|/models/")


def blocks() -> list[tuple[str, str, str]]:
    """(page name, the heading above it, text) of every ```bash block."""
    out = []
    for page in PAGES:
        heading = ""
        # fenced blocks first, so that a `# comment` inside one is not taken for a heading
        for part in re.split(r"(^```[^\n]*\n.*?^```|^#{1,4} [^\n]*)", page.read_text(encoding="utf-8"),
                             flags=re.M | re.S):
            if re.match(r"#{1,4} ", part):
                heading = part.strip()
            elif part.startswith("```bash\n"):
                out.append((page.name, heading, part[len("```bash\n"):-3]))
    return out


def commands() -> list[str]:
    """The `python run.py` lines (continuations joined, trailing comments cut) to check."""
    out = []
    for page, heading, text in blocks():
        if (page, heading) in RUN_WHOLE:
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = re.split(r"\s+#\s", line.strip())[0].strip()
            if line.startswith("python run.py") and " -m " not in f"{line} ":
                out.append(line)
    return out


def test_the_pages_have_their_commands():
    found = commands()
    assert len(found) >= 15, found
    scale = [t for page, heading, t in blocks() if page == "training.md" and heading == TRAINING_AT_SCALE]
    assert scale and sum(line.startswith("python run.py") for line in scale[0].splitlines()) >= 6
    assert any("trainer.num_workers=2" in c for c in found) and any("train_async=true" in c for c in found)


@pytest.mark.parametrize("command", commands())
def test_each_command_passes_pre_flight_or_names_what_this_machine_lacks(command, tmp_path, monkeypatch):
    if PLACEHOLDER.search(command):
        pytest.skip(f"a placeholder of the reader's: {PLACEHOLDER.search(command).group(0)}")
    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    overrides = shlex.split(command)[2:] + [f"paths.output_dir={tmp_path}/out", f"paths.cache_dir={tmp_path}/c"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    # with a cluster address the nodes' GPUs count, not this machine's (the workers check them)
    needs_gpu = "device=cuda" in command and "address=" not in command
    if not needs_gpu:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match="cuda, but this machine has no CUDA device"):
        validate(cfg)
