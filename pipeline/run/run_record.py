"""A run dir owns its experiment: the overrides and composed config it runs with, and every change.

* `<run>/run_record.json`: `{"name", "overrides", "config"}`: the run's command-line overrides
  (as Hydra saw them, secrets redacted), the resolved composed config and the run name. Written
  when a run starts and rewritten when a resume changes a key.
* `<run>/config_changes.jsonl`: one line per resumed session that changed a key:
  `{"rollout_id", "time", "changes": {key: [stored, requested]}, "accepted_by"}`.

`resume=<run dir>` recomposes the stored overrides plus the new ones (`merge_overrides`, done by
`pipeline.run.session` before Hydra composes) and `check_resume_config` diffs the result against the
stored config: keys under `resume_safe_keys` (conf/config.yaml) may change, any other difference
needs `allow_config_change=true`. A difference no override of this command asked for is an
*upgrade* (a key the project added since the run was written, or a default it changed): logged
and recorded as such, never refused; the safe keys are the stored list merged with the
project's, unless the command sets `resume_safe_keys` itself. Run dirs of older versions have no
record: their `.hydra/overrides.yaml` and `.hydra/config.yaml` stand in for it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.process.atomic import atomic_write_text
from pipeline.config.plugins import ConfigError
from pipeline.sinks.redact import REDACTED, redact, redact_text

__all__ = ["CHANGES_FILE", "MOVED_ENTRY_KEYS", "MOVED_KEYS", "OPT_IN", "RECORD_FILE", "SessionOverrides",
           "check_resume_config", "config_changes", "project_upgrades", "resume_safe_list", "merge_overrides", "override_key", "read_changes", "read_record", "record_changes",
           "run_overrides", "upgrade_config", "upgrade_overrides", "write_record"]

logger = logging.getLogger(__name__)

RECORD_FILE = "run_record.json"
CHANGES_FILE = "config_changes.jsonl"
# the opt-in that accepts changes outside resume_safe_keys (a top-level key of conf/config.yaml)
OPT_IN = "allow_config_change"
# overrides that belong to one session, never to the run's stored record
_SESSION_KEYS = ("resume", OPT_IN, "continue_sweep")
# keys a diff leaves out: the session keys, and the run dir itself (a moved or copied run dir)
_NOT_COMPARED = [*_SESSION_KEYS, "paths.output_dir"]
# and every `<part>.cache_dir` (a folder of files rebuilt from the inputs, set per machine or shell
# by ROLLOUT_PIPELINE_CACHE): where the cache lives never changes the experiment
_MACHINE_LOCAL = ".cache_dir"
_ABSENT = "<absent>"
# keys that moved: old spelling -> new. Old overrides (command line, stored) and stored configs of
# earlier runs are read with the new names, with a warning: `over_sampling_factor` left the
# data_source / dynamic_filter groups; the prompt file is `prompt_data` (slime's name), as `path`
# names a function plugin everywhere else
MOVED_KEYS = {"data_source.over_sampling_factor": "over_sampling_factor",
              "dynamic_filter.over_sampling_factor": "over_sampling_factor",
              "data_source.path": "data_source.prompt_data"}
# keys renamed inside each entry of a list: list key -> {old: new}
MOVED_ENTRY_KEYS = {"eval.datasets": {"path": "prompt_data"}}
# how the values of several old keys moved to one new key combine (default: the one value): the
# larger over-sampling factor is what earlier runs used
_COMBINE = {"over_sampling_factor": max}


def override_key(override: str) -> str:
    """The key an override sets: `+a.b=1`, `++a.b=1`, `~a.b` and `a.b=1` all give `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def _moved_entry_key(key: str) -> str | None:
    """The new spelling of a list entry's moved key (`eval.datasets.0.path` -> `...0.prompt_data`)."""
    head, _, old = key.rpartition(".")
    list_key, _, index = head.rpartition(".")
    new = MOVED_ENTRY_KEYS.get(list_key, {}).get(old)
    return f"{head}.{new}" if new and index.isdigit() else None


def upgrade_overrides(overrides: list[str]) -> list[str]:
    """`overrides` with the old spellings of `MOVED_KEYS` rewritten to the new keys (a warning each)."""
    out = []
    for override in overrides:
        key = override_key(override)
        new_key = MOVED_KEYS.get(key) or _moved_entry_key(key)
        if new_key and "=" in override and not override.startswith("~"):
            new = f"{new_key}={override.split('=', 1)[1]}"
            logger.warning("%s: %s moved to %s (the old key is deprecated); read as %s", override, key, new_key, new)
            override = new
        out.append(override)
    return out


def _node(config: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    """The dict holding the last part of `dotted` (None when a part is missing) and that part."""
    *parents, leaf = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), leaf


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored config (earlier layout) with the keys of `MOVED_KEYS` and
    `MOVED_ENTRY_KEYS` under their new names (a key already stored under its new name stays)."""
    config = copy.deepcopy(config)
    moved: dict[str, list[Any]] = {}
    for old, new in MOVED_KEYS.items():
        parent, leaf = _node(config, old)
        if parent is not None and leaf in parent:
            moved.setdefault(new, []).append(parent.pop(leaf))
    for new, values in moved.items():
        parent, leaf = _node(config, new)
        if parent is not None and leaf not in parent:
            parent[leaf] = _COMBINE.get(new, lambda *v: v[0])(*values)
    for list_key, renames in MOVED_ENTRY_KEYS.items():
        parent, leaf = _node(config, list_key)
        entries = parent.get(leaf) if parent is not None else None
        for entry in entries if isinstance(entries, list) else []:
            for old, new in renames.items():
                if isinstance(entry, dict) and old in entry and new not in entry:
                    entry[new] = entry.pop(old)
    return config


def merge_overrides(stored: list[str], new: list[str]) -> list[str]:
    """The stored overrides with those the new ones set again left out, then the new ones; session
    keys (`resume`, `allow_config_change`, `continue_sweep`) and redacted secrets of the stored list
    are dropped."""
    new_keys = {override_key(o) for o in new}
    kept = [o for o in stored if override_key(o) not in new_keys and override_key(o) not in _SESSION_KEYS]
    secrets = [override_key(o) for o in kept if REDACTED in o]
    if secrets:
        logger.warning("resume: the stored overrides of %s are redacted; pass them again on the command line",
                       ", ".join(secrets))
    return [o for o in kept if REDACTED not in o] + list(new)


def _legacy_record(run_dir: Path) -> dict[str, Any] | None:
    """A record from the `.hydra/` files of a run dir written before run records existed."""
    from omegaconf import OmegaConf

    hydra_dir = run_dir / ".hydra"
    if not (hydra_dir / "overrides.yaml").is_file():
        return None
    overrides = [str(o) for o in OmegaConf.load(hydra_dir / "overrides.yaml")]
    config = None
    if (hydra_dir / "config.yaml").is_file():
        cfg = OmegaConf.load(hydra_dir / "config.yaml")
        try:  # `${hydra:...}` does not resolve outside that run: the run dir stands in for it
            cfg.paths.output_dir = str(run_dir)
            config = OmegaConf.to_container(cfg, resolve=True)
        except Exception as exc:  # an interpolation of another version's config
            logger.warning("resume: %s/.hydra/config.yaml does not resolve (%s); config changes are not checked",
                           run_dir, exc)
    return {"name": run_dir.name, "overrides": overrides, "config": config}


def read_record(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run record of `run_dir` (or one rebuilt from its `.hydra/` files); None when neither exists."""
    path = Path(run_dir) / RECORD_FILE
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"resume: {path} is unreadable ({exc}); restore it from a backup, or delete it "
                              f"to fall back to {Path(run_dir) / '.hydra'}") from exc
    return _legacy_record(Path(run_dir))


def run_overrides(run_dir: str | os.PathLike[str]) -> list[str]:
    """The command-line overrides of the run in `run_dir` as it stands (its record, which a resume
    updates, else its `.hydra/overrides.yaml`); [] when it has neither or they are unreadable."""
    try:
        record = read_record(run_dir)
    except ConfigError:
        return []
    return [str(o) for o in (record or {}).get("overrides", [])]


def write_record(run_dir: str | os.PathLike[str], *, name: str, overrides: list[str], config: dict[str, Any]) -> None:
    """Store the run's name, overrides and resolved config (secrets redacted), atomically."""
    record = {"name": redact_text(name), "overrides": [redact_text(o) for o in overrides if override_key(o) not in _SESSION_KEYS],
              "config": redact(config)}
    atomic_write_text(Path(run_dir) / RECORD_FILE, json.dumps(record, indent=1, default=str) + "\n")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a.b": leaf}` for every leaf of a nested dict (lists are leaves)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


def _covered(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def config_changes(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{key: (stored, current)}` for every leaf that differs (redacted stored values, the session
    keys `resume`, `allow_config_change`, the run dir `paths.output_dir` and cache folders do not
    count)."""
    old, new = _flatten(stored), _flatten(current)
    changes = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a != b and a != REDACTED and not _covered(key, _NOT_COMPARED) and not key.endswith(_MACHINE_LOCAL):
            changes[key] = (a, b)
    return changes


@dataclass(frozen=True)
class SessionOverrides:
    """A resumed session's overrides: the run's stored ones, this command's (the stored merged
    with the new, as Hydra composed them) and the config group names (Hydra's choices)."""

    stored: list[str]
    command: list[str]
    groups: frozenset[str]

    def new_keys(self) -> list[str]:
        """The keys this command sets anew (not the stored overrides, not the session keys)."""
        stored = set(self.stored)
        return [override_key(o) for o in self.command if o not in stored and override_key(o) not in _SESSION_KEYS]


def project_upgrades(changes: dict[str, tuple[Any, Any]], overrides: SessionOverrides | None) -> set[str]:
    """The changed keys no override of this command asked for: keys the project added or defaults
    it changed since the run was written. None of them when the overrides are unknown (a `run(cfg)`
    without Hydra) or the command picks a config group anew (it may change any key)."""
    if overrides is None:
        return set()
    new = overrides.new_keys()
    if any(k in overrides.groups or "/" in k for k in new):
        return set()
    return {k for k in changes if not _covered(k, new)}


def resume_safe_list(stored: dict[str, Any], current: dict[str, Any], overrides: SessionOverrides | None) -> list[str]:
    """The keys a resume may change: the stored `resume_safe_keys` merged with the project's
    (current) list; only the stored one when the overrides are unknown or this command sets
    `resume_safe_keys` itself (a resume cannot widen the list for itself)."""
    safe = [str(k) for k in stored.get("resume_safe_keys", current["resume_safe_keys"])]
    if overrides is not None and not _covered("resume_safe_keys", overrides.new_keys()):
        safe += [str(k) for k in current["resume_safe_keys"] if str(k) not in safe]
    return safe


def check_resume_config(stored: dict[str, Any] | None, current: dict[str, Any], run_dir: str,
                        overrides: SessionOverrides | None = None) -> dict[str, tuple[Any, Any]]:
    """The changes a resume makes to the stored config (upgrades included); raises ConfigError
    when a key this command changes lies outside the safe keys (`resume_safe_list`) and
    `allow_config_change` is not true. Upgrades (`project_upgrades`) are never refused."""
    if stored is None:
        return {}
    stored = upgrade_config(stored)
    changes = config_changes(stored, current)
    safe = resume_safe_list(stored, current, overrides)
    upgrades = project_upgrades(changes, overrides)
    refused = {k: v for k, v in changes.items() if k not in upgrades and not _covered(k, safe)}
    if refused and current[OPT_IN] is not True:
        lines = "\n  ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise ConfigError(
            f"resume: the command changes the experiment of {run_dir} (stored config -> requested):\n  {lines}\n"
            f"A resume continues the run with its stored config; drop these overrides to continue it as it was, "
            f"or add {OPT_IN}=true to continue with the change (recorded in {CHANGES_FILE} and the wandb config). "
            f"Keys a resume may change freely: {safe}")
    return changes


def record_changes(run_dir: str | os.PathLike[str], rollout_id: int, changes: dict[str, tuple[Any, Any]],
                   opted_in: bool, accepted_by: str | None = None) -> None:
    """Append one line to `<run>/config_changes.jsonl` (the changes, taking effect at `rollout_id`);
    `accepted_by` defaults to the opt-in or `resume_safe_keys` (`upgrade` for project upgrades)."""
    line = {"rollout_id": rollout_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "changes": {k: [redact({k: a})[k], redact({k: b})[k]] for k, (a, b) in changes.items()},
            "accepted_by": accepted_by or (f"{OPT_IN}=true" if opted_in else "resume_safe_keys")}
    path = Path(run_dir) / CHANGES_FILE
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, default=str) + "\n")


def read_changes(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every line of `<run>/config_changes.jsonl` (empty when the run never changed its config)."""
    path = Path(run_dir) / CHANGES_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
