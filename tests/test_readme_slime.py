"""The "Porting from slime" page's flag table (docs/slime.md), checked against `conf/` and the `args` plugins get:
every key it names exists, every override composes, every `args.` name is what a plugin reads
(with the value of the key beside it), and every slime hook key and args mirror is in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.config.args import _DATA_MIRRORS, _REWARD_MIRRORS, SlimeArgs, to_plain

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SECTION = re.search(r"^# Porting from slime\n(.*)", (ROOT / "docs" / "slime.md").read_text(encoding="utf-8"),
                    flags=re.S | re.M)
OVERRIDE = re.compile(r"^[+~]?[\w.]+=\S+$")
KEY = re.compile(r"^[a-z_][\w.]*$")


def rows() -> list[tuple[str, list[str], str | None]]:
    """(slime flag cell, backticked snippets of the `here` cell, args name or None) per row."""
    assert SECTION, "docs/slime.md does not start with '# Porting from slime'"
    out = []
    for line in SECTION.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`") and not cells[0].startswith("any"):
            continue
        snippets = [s.strip("'") for s in re.findall(r"`([^`]+)`", cells[1])]
        name = re.match(r"`(\w+)`", cells[2])
        out.append((cells[0], snippets, name.group(1) if name else None))
    assert len(out) > 40
    return out


def compose_cfg(tmp_path: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[
            f"paths.output_dir={tmp_path}", f"paths.cache_dir={tmp_path}", *overrides])


@pytest.mark.parametrize("flag,snippets,name", rows(), ids=[r[0] for r in rows()])
def test_each_row_names_real_keys_and_the_args_a_plugin_reads(flag, snippets, name, tmp_path):
    overrides = [s for s in snippets if OVERRIDE.match(s)]
    keys = [s for s in snippets if KEY.match(s)]
    assert overrides or keys, f"{flag}: the 'here' cell names no key or override"
    cfg = compose_cfg(tmp_path, overrides)  # every override composes (group options exist)
    for key in keys:
        assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", f"{flag}: no config key {key}"
    if name is None:
        return
    args = SlimeArgs.from_config(to_plain(cfg)).as_dict()
    assert name in args, f"{flag}: plugins do not get args.{name}"
    value = to_plain(OmegaConf.select(cfg, keys[0])) if len(keys) == 1 else None
    if len(keys) == 1 and not (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
        assert args[name] == value, f"{flag}: args.{name} is not {keys[0]}"  # a mirror copies the value
    flag_name = re.match(r"`--([\w-]+)", flag)
    if flag_name and keys == [name]:  # a top-level key with slime's own name
        assert flag_name.group(1).replace("-", "_") == name, f"{flag} is not --{name.replace('_', '-')}"


def test_every_slime_hook_key_and_args_mirror_is_in_the_table():
    named = {s.split("=")[0].lstrip("+") for _, snippets, _ in rows() for s in snippets}
    names = {n for _, _, n in rows() if n}
    top = OmegaConf.load(CONF / "config.yaml")
    hooks = {k for k in top if str(k).endswith("_path")}
    assert hooks and hooks <= named, f"missing from the table: {sorted(hooks - named)}"
    mirrors = set(_DATA_MIRRORS.values()) | set(_REWARD_MIRRORS.values()) | {
        "advantage_estimator", "buffer_filter_path", "dynamic_sampling_filter_path", "eval_prompt_data"}
    assert mirrors <= names, f"args mirrors missing from the table: {sorted(mirrors - names)}"


def test_the_command_for_slime_s_own_async_rm_works_as_written(tmp_path):
    """The page's command for slime's `rm_hub.async_rm`: slime's source on PYTHONPATH, the pip packages
    the error names, and overrides that pass the allowlist. Here slime's source is not on the path, so
    what remains is the import, refused saying what to install (checked once against slime's real
    source, not committed)."""
    import shlex

    from pipeline.config.args import to_plain_lenient
    from pipeline.config.rules import collect_problems
    from pipeline.slime.stand_ins import SLIME_PIP_PACKAGES

    text = SECTION.group(1)
    assert f"pip install {' '.join(SLIME_PIP_PACKAGES)}" in text
    (command,) = [line for line in text.splitlines() if "run.py" in line and "slime.rollout.rm_hub.async_rm" in line]
    words = shlex.split(command.split("#")[0])
    assert words[0].startswith("PYTHONPATH=") and words[1:3] == ["python", "run.py"], command
    cfg = compose_cfg(tmp_path, words[3:])
    problems = [p for p in collect_problems(to_plain_lenient(cfg)) if "slime" in p]
    assert len(problems) == 1 and "is not allowed" not in problems[0], problems
    assert problems[0].startswith("reward.custom_rm_path: reward function (custom_rm_path): cannot import "
                                  "'slime.rollout.rm_hub.async_rm'") and "PYTHONPATH" in problems[0]
