"""The tour runs as written, in order, with small sizes (docs/getting-started.md, and the README's
short tour is the same commands); the plugin and configuration-reference commands run; the
config-groups table (docs/configuration.md and docs/config_groups.md) is exactly what `conf/`
generates."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.docs import OUTPUTS, PAGE, describe, page_block, render

ROOT = Path(__file__).resolve().parents[1]
README_TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
# appended to every `python run.py` command unless it sets the key itself: no model, tiny sizes
SMALL = {"engine": "scripted", "num_rollout": "2", "rollout_batch_size": "2", "n_samples_per_prompt": "2"}
EXAMPLE_DIR = re.compile(r"outputs/(runs|multirun)/[^\s/]+")


def section(text: str, title: str, where: str = "README") -> str:
    """The text of the section `## <title>` of a Markdown text up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{where} has no section '## {title}'"
    return match.group(1)


def page_section(page: str, title: str) -> str:
    """`section` of docs/<page>."""
    return section((ROOT / "docs" / page).read_text(encoding="utf-8"), title, f"docs/{page}")


def commands(text: str) -> list[str]:
    """The commands of the ```bash blocks of a text, in order (one per non-comment line, a trailing
    `# comment` cut)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [re.split(r"\s+#\s", line.strip())[0] for b in blocks for line in b.splitlines()
            if line.strip() and not line.startswith("#")]


def tour_commands() -> list[str]:
    """The commands of the tour in docs/getting-started.md, in order."""
    return commands(page_section("getting-started.md", "A 5-minute tour"))


class Tour:
    """Runs tour commands, filling in the example run/sweep dirs with the ones the tour made."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.latest = {"runs": None, "multirun": None}
        self.bound: dict[str, str] = {}
        self.env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}

    def fill(self, command: str) -> str:
        """Replace an example dir (outputs/runs/<time>) by the latest dir of that kind the tour made."""
        def sub(m: re.Match) -> str:
            if m.group(0) not in self.bound:
                assert self.latest[m.group(1)], f"{m.group(0)} is used before the tour made a dir of that kind"
                self.bound[m.group(0)] = str(self.latest[m.group(1)])
            return self.bound[m.group(0)]
        return EXAMPLE_DIR.sub(sub, command)

    def run(self, i: int, command: str) -> subprocess.CompletedProcess:
        argv = shlex.split(self.fill(command))
        if argv[:2] == ["python", "run.py"]:
            given = {a.split("=", 1)[0] for a in argv[2:] if "=" in a}
            argv += [f"{k}={v}" for k, v in SMALL.items() if k not in given]
            kind = "multirun" if "-m" in argv else "runs"
            out = self.tmp / f"{kind}_{i}"
            argv.append(f"hydra.{'sweep' if kind == 'multirun' else 'run'}.dir={out}")
            if not any(a.startswith("resume=") for a in argv):
                self.latest[kind] = out
        elif argv[0] == "wandb" and argv[1] == "sync":
            return self._check_wandb_sync(argv[2:])
        if argv[0] == "python":
            argv[0] = sys.executable
        proc = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def _check_wandb_sync(self, patterns: list[str]) -> subprocess.CompletedProcess:
        """No account here: the paths must be offline wandb runs that `wandb sync` accepts."""
        dirs = [d for p in patterns for d in glob.glob(p)]
        assert dirs, f"wandb sync: {patterns} matches nothing"
        assert all(glob.glob(os.path.join(d, "run-*.wandb")) for d in dirs), dirs
        wandb = shutil.which("wandb", path=str(Path(sys.executable).parent))
        assert wandb, "the wandb command is not installed in the virtualenv"
        return subprocess.CompletedProcess(patterns, 0, "", "")


def steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(600)
def test_tour_commands_run_in_order(tmp_path):
    commands = tour_commands()
    assert commands[0] == "python run.py experiment=smoke" and len(commands) >= 7, commands
    assert any(c.startswith("python run.py resume=") for c in commands)
    assert any(c.startswith("wandb sync") for c in commands)
    tour = Tour(tmp_path)
    for i, command in enumerate(commands):
        proc = tour.run(i, command)
        if command.startswith("python run.py") and " -m " not in command:
            assert re.search(r"^rollout \d+ of 0\.\.\d+ \| reward", proc.stdout, flags=re.M), proc.stdout[-2000:]
            assert "| rollout | reward |" in proc.stdout  # the end-of-run summary table
            assert "INFO" not in proc.stdout, "library or pipeline INFO records leaked onto the console"
        if command.startswith("python run.py resume="):
            resumed = Path(tour.bound[EXAMPLE_DIR.search(command).group(0)])
            n = int(re.search(r"num_rollout=(\d+)", command).group(1))
            assert steps(resumed) == list(range(n))
        if " -m " in command:
            sweep = tour.latest["multirun"]
            jobs = sorted(p.parent.name for p in sweep.glob("*/metrics.jsonl"))
            assert len(jobs) == 6 and (sweep / "summary.md").exists()
        if command.startswith("python -m pipeline.report"):
            out = Path(tour.fill(command).split()[-1]) / "report"
            assert (out / "sweep.png").stat().st_size > 10_000
            assert "n_samples_per_prompt" in (out / "report.md").read_text()


def test_the_readme_tour_is_the_getting_started_tour():
    """The README's short tour names the same commands, in the same order, as the page's tour that
    the test above runs, so every command of both is run."""
    assert commands(section(README_TEXT, "A 5-minute tour")) == tour_commands()


def test_config_groups_doc_matches_conf():
    text = render()
    for rel in OUTPUTS:
        assert (ROOT / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run `python -m pipeline.config.docs`"
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    assert page_block(page) == text, f"{PAGE}'s config-groups table is stale: run `python -m pipeline.config.docs`"
    for group in (ROOT / "conf").iterdir():
        if group.is_dir() and group.name != "hydra":
            for option in group.glob("*.yaml"):
                assert f"| `{group.name}` | " in text and option.stem in text


def test_config_docs_follow_a_changed_conf(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "filter" / "lifo.yaml").write_text("# Newest groups first.\npath: mypkg.lifo\n")
    assert "| `filter` | lifo | Newest groups first. |" in render(conf)
    assert "| `filter` | lifo |" not in render()
    (conf / "filter" / "bare.yaml").write_text("path: mypkg.bare\n")
    with pytest.raises(ValueError, match="bare.yaml: no comment"):
        render(conf)
    (conf / "x.yaml").write_text("# a | b <c>\n")
    assert describe(conf / "x.yaml") == "a \\| b &lt;c&gt;"


@pytest.mark.timeout(240)
def test_plugin_commands_run(tmp_path):
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = [b.replace("\\\n", " ").strip() for b in blocks]
    assert len(commands) == 2 and all(c.startswith("python run.py experiment=smoke") for c in commands)
    for i, command in enumerate(commands):
        run_dir = tmp_path / str(i)
        argv = [sys.executable] + shlex.split(command)[1:] + [f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=200,
                              env={**os.environ, "WANDB_MODE": "offline"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert steps(run_dir) == [0, 1]
        config = (run_dir / ".hydra" / "config.yaml").read_text()
        assert "examples." in config  # the example plugins were really selected


@pytest.mark.timeout(120)
def test_configuration_reference_commands_run(tmp_path):
    """The block at the top of docs/configuration.md: --help lists the groups, --cfg job prints the
    composed config, and the smoke overlay runs (no model)."""
    page = (ROOT / PAGE).read_text(encoding="utf-8").split("## Config groups", 1)[0]
    found = commands(page)
    assert [shlex.split(c)[:3] for c in found] == [["python", "run.py", "--help"], ["python", "run.py", "--cfg"],
                                                    ["python", "run.py", "experiment=smoke"]], found
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    outputs = []
    for i, command in enumerate(found):
        argv = [sys.executable] + shlex.split(command)[1:]
        if "--help" not in argv:
            argv.append(f"hydra.run.dir={tmp_path / str(i)}")
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=100)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        outputs.append(proc.stdout)
    assert "data_source" in outputs[0] and "reward_topk" in outputs[0]  # the groups and their options
    assert "rollout_batch_size:" in outputs[1] and "${" not in outputs[1]  # resolved
    assert steps(tmp_path / "2")
