"""Pre-flight checks of the reward config against the prompt files (called by `validate`).

When the rollout or eval part takes the reward (a rollout function named by `path` scores its
samples itself), the dispatcher is the built-in one and `reward.custom_rm_path` is not set,
every rm_type a run can meet, the global `reward.rm_type` and each `metadata["rm_type"]` in the
training and eval prompt files, must be a known type: this is found before any engine, model or
data source is built. Also checked: a type whose grader needs a missing package (`ifbench`),
`remote` without a URL, rows without an rm_type when there is no global one, `dapo` (slime's
dict reward) without `reward_key` or mixed with number rewards, and rows with an empty label
(`""`, `" "`, `\\boxed{}`) whose rm_type compares with one (`labels.py`).
"""

from __future__ import annotations

from typing import Any

from pipeline.data.errors import DataError
from pipeline.config.plugins import accepts, allowed_targets, load_object
from pipeline.rewards.ifbench import ifbench_available, ifbench_missing_message
from pipeline.rewards.labels import empty_labels_in_rows, needs_label
from pipeline.rewards.rm_types import rm_type_problem, rm_types_in_rows, split_rm_type

__all__ = ["reward_problems"]


def _prompt_files(cfg: dict[str, Any]) -> list[tuple[str, str, Any, bool, Any]]:
    """(config key, file spec, metadata key, is training data, label key) of every prompt file to scan."""
    ds = cfg.get("data_source")
    ds = ds if isinstance(ds, dict) else {}
    metadata_key, label_key = ds.get("metadata_key", "metadata"), ds.get("label_key", "label")
    files: list[tuple[str, str, Any, bool, Any]] = []
    paths = ds.get("prompt_data")
    for p in paths if isinstance(paths, list) else [paths]:
        if isinstance(p, str) and p:
            files.append(("data_source.prompt_data", p, metadata_key, True, label_key))
    ev = cfg.get("eval")
    datasets = ev.get("datasets") if isinstance(ev, dict) else None
    for i, d in enumerate(datasets if isinstance(datasets, list) else []):
        if isinstance(d, dict) and isinstance(d.get("prompt_data"), str):
            key = d.get("metadata_key") or metadata_key
            files.append((f"eval.datasets[{i}].prompt_data", d["prompt_data"], key, False,
                          d.get("label_key") or label_key))
    return files


def _empty_labels(cfg: dict[str, Any], file: tuple[str, str, Any, bool, Any], types: set[Any],
                  out: list[str]) -> None:
    """Refuse rows with an empty label whose rm_type (one of `types`, this file's) compares with one."""
    key, spec, metadata_key, _, label_key = file
    graded = sorted(str(t) for t in types if needs_label(t))
    if not graded:
        return
    if label_key is None:
        where = "data_source.label_key" if key.startswith("data_source") else f"{key.rpartition('.')[0]}.label_key"
        out.append(f"{key}: {where} is null (no labels), but rm_type {graded[0]} compares the response with a "
                   f"label; set {where}=<the label column>")
        return
    reward = cfg.get("reward") if isinstance(cfg.get("reward"), dict) else {}
    ds = cfg.get("data_source") if isinstance(cfg.get("data_source"), dict) else {}
    try:
        count, where, label, rm_type = empty_labels_in_rows(
            spec, label_key, reward.get("label_field"), metadata_key, reward.get("rm_type"),
            len(graded) < len(types), ds.get("cache_dir"))
    except (DataError, OSError, ValueError):
        return  # a missing or unreadable file is reported by the data checks
    if count:
        out.append(f"{key}: {where}: the label is empty ({label!r:.80}) but rm_type {rm_type} compares the "
                   f"response with a label; {count} rows of {spec} have an empty label: fix or remove the row "
                   f"(slime scores such rows 0; a run here refuses them instead of training on them)")


def _scan(cfg: dict[str, Any], global_type: Any, out: list[str]) -> dict[str, str]:
    """Known training rm_types -> where first seen; problems of every file appended to `out`.
    `global_type`: `reward.rm_type` (None: not set; "" when set but unknown, already reported)."""
    used: dict[str, str] = {}
    files = _prompt_files(cfg)
    ds = cfg.get("data_source")
    cache_dir = ds.get("cache_dir") if isinstance(ds, dict) else None
    for file in files:
        key, spec, metadata_key, training, _ = file
        try:
            found, missing = rm_types_in_rows(spec, metadata_key, cache_dir)
        except (DataError, OSError, ValueError):
            continue  # a missing or unreadable file is reported by the data checks
        known = {v for v in found if rm_type_problem(v) is None}
        _empty_labels(cfg, file, known | ({global_type} if missing and global_type else set()), out)
        for value, where in found.items():
            problem = rm_type_problem(value)
            if problem is not None:
                out.append(f'{key}: {where}: metadata["rm_type"]: {problem}; fix the row, or set '
                           f"reward.custom_rm_path to a reward function")
            elif training:
                used.setdefault(value, f"{key}: {where}")
        if missing and global_type is None:
            out.append(f"{key}: {missing} rows of {spec} have no metadata rm_type and reward.rm_type is "
                       f"null; set reward.rm_type (e.g. reward.rm_type=math) or reward.custom_rm_path")
        if missing and training and global_type:
            used.setdefault(global_type, "reward.rm_type")
    if not any(f[3] for f in files) and global_type:
        used.setdefault(global_type, "reward.rm_type")
    return used


def _uses_reward(cfg: dict[str, Any]) -> bool:
    """True when the rollout or eval part is a class that takes the `reward` (a slime rollout
    function named by `path` scores its samples itself). Only allowed targets are imported."""
    for group in ("rollout", "eval"):
        node = cfg.get(group)
        target = node.get("_target_") if isinstance(node, dict) else None
        if not isinstance(target, str):
            continue
        try:
            if accepts(load_object(target, allowed_targets(cfg), group), "reward"):
                return True
        except Exception:  # noqa: BLE001 - cannot tell; building it reports the real problem
            return True
    return False


def reward_problems(cfg: dict[str, Any]) -> list[str]:
    """Every reward problem of the resolved run config `cfg` (see module docstring); call it only
    when the config passed the allowlist check (it imports the rollout and eval targets)."""
    reward = cfg.get("reward")
    if not isinstance(reward, dict) or not str(reward.get("_target_", "")).endswith("RewardDispatcher"):
        return []
    if not _uses_reward(cfg):
        return []
    custom = reward.get("custom_rm_path")
    if isinstance(custom, str) and custom and custom != "???":
        return []  # a reward function replaces every rm_type
    out: list[str] = []
    global_type = reward.get("rm_type")
    if global_type is not None and rm_type_problem(global_type) is not None:
        out.append(f"reward.rm_type: {rm_type_problem(global_type)}")
        global_type = ""
    used = _scan(cfg, global_type, out)
    bases = {split_rm_type(t)[1]: where for t, where in used.items()}
    if "ifbench" in bases and not ifbench_available():
        out.append(f"{bases['ifbench']}: {ifbench_missing_message()}")
    remote = [bases[b] for b in ("remote", "remote_rm") if b in bases]
    if remote and not reward.get("remote_url") and not cfg.get("rm_url"):
        out.append(f"{remote[0]}: rm_type remote needs the reward server's URL: set "
                   f"reward.remote_url=http://host:port/path")
    if "dapo" in bases:
        others = sorted(b for b in bases if b != "dapo")
        if others:
            out.append(f"{bases['dapo']}: rm_type dapo gives dict rewards but the training data also uses "
                       f"{others} (numbers); reward_key applies to every sample, so keep dapo rows apart")
        elif not cfg.get("reward_key"):
            out.append(f"{bases['dapo']}: rm_type dapo gives slime's dict reward {{score, acc, pred}}; set "
                       f"reward_key=score (slime: --reward-key score)")
    return out
