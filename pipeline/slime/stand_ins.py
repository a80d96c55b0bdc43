"""slime's type modules for plugins written for slime, where slime itself is not installed.

A function written for slime usually starts with `from slime.utils.types import Sample` (and a
rollout function or dynamic filter with `from slime.rollout.base_types import ...` or
`from slime.rollout.filter_hub.base_types import DynamicFilterOutput`). slime is a training
framework with GPU dependencies, so it is rarely installed beside this pipeline; those imports
would then fail before the function runs. `install()` (called before any plugin is imported,
pipeline/config/plugins.py) registers an import finder that serves exactly these modules with this
pipeline's equal types (docs/contracts.md §1, §6, §8):

    slime.utils.types                   Sample
    slime.rollout.base_types            RolloutFnTrainOutput, RolloutFnEvalOutput
    slime.rollout.filter_hub.base_types DynamicFilterOutput

(and their parent packages). Any other `slime.` module fails to import with a message that says
slime is not installed, which modules stand in and what running slime's own plugins takes
(`SLIME_NEEDS`: slime's source on PYTHONPATH and `SLIME_PIP_PACKAGES`). Where slime is importable,
nothing is registered: the real slime is used, and its types are accepted by shape
(pipeline/rollout/contracts.py).

Where slime is importable, a plugin may check `isinstance(sample, slime.utils.types.Sample)`
(search-r1's reward does), which our Sample is not. At the custom generate and custom reward
boundaries (pipeline/rollout/sample_generate.py, pipeline/rewards/dispatch.py) the sample is
therefore handed over as an instance of slime's own class (`to_slime_sample`: field by field,
the status as slime's enum member, the counters as slime's nested classes, extra attributes
kept) and what comes back is turned into ours again (`from_slime_sample`: into the original
object when the plugin returned the one it got, tensors as lists). Without slime both are the
identity (docs/serving.md, "slime's own Sample class").
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["SLIME_NEEDS", "SLIME_PIP_PACKAGES", "STAND_INS", "from_slime_sample", "install", "installed",
           "slime_sample_class", "to_slime_sample"]

# what slime's own plugins (rm_hub.async_rm, the filter hub, the data source) import beyond this
# pipeline's packages, found by running them from slime @624b824's source: rm_hub imports aiohttp,
# its math grader pylatexenc (torch, sympy and httpx come with this pipeline)
SLIME_PIP_PACKAGES = ("pylatexenc", "aiohttp")
SLIME_NEEDS = (f"slime's source on PYTHONPATH (PYTHONPATH=<your slime checkout> python run.py ...), "
               f"allowed_targets_extra=[slime.] and pip install {' '.join(SLIME_PIP_PACKAGES)} "
               f"(docs/slime.md, Porting from slime)")

# module -> {name: "pipeline.module:attribute"}; packages on the way are served empty
STAND_INS: dict[str, dict[str, str]] = {
    "slime.utils.types": {"Sample": "pipeline.samples.sample:Sample"},
    "slime.rollout.base_types": {"RolloutFnTrainOutput": "pipeline.rollout.contracts:RolloutFnTrainOutput",
                                 "RolloutFnEvalOutput": "pipeline.rollout.contracts:RolloutFnEvalOutput"},
    "slime.rollout.filter_hub.base_types": {"DynamicFilterOutput": "pipeline.rollout.contracts:DynamicFilterOutput"},
}
# slime, slime.utils, slime.rollout, slime.rollout.filter_hub
_PACKAGES = {".".join(module.split(".")[:i]) for module in STAND_INS for i in range(1, module.count(".") + 1)}

_lock = threading.Lock()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the STAND_INS modules and their packages; refuses every other `slime.` module."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "slime" and not fullname.startswith("slime."):
            return None
        if fullname in STAND_INS or fullname in _PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname in _PACKAGES)
        served = ", ".join(sorted(STAND_INS))
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: slime is not installed here. rollout-pipeline stands in for "
            f"slime's type modules only ({served}; pipeline/slime/stand_ins.py); to run slime's own plugins "
            f"unchanged put {SLIME_NEEDS}", name=fullname)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"rollout-pipeline's stand-in for slime's {module.__name__} (pipeline/slime/stand_ins.py)"
        for name, where in STAND_INS.get(module.__name__, {}).items():
            module_name, _, attribute = where.partition(":")
            setattr(module, name, getattr(importlib.import_module(module_name), attribute))


_finder: _StandInFinder | None = None


def installed() -> bool:
    """Whether the stand-ins are registered in this process."""
    return _finder is not None and _finder in sys.meta_path


def install() -> bool:
    """Register the stand-ins unless slime is importable (idempotent). True when registered."""
    global _finder
    with _lock:
        if installed():
            return True
        if "slime" in sys.modules or _slime_importable():
            return False
        _finder = _StandInFinder()
        sys.meta_path.append(_finder)  # after every real finder: an installed slime always wins
        return True


def _slime_importable() -> bool:
    try:
        return importlib.util.find_spec("slime") is not None
    except (ImportError, ValueError):
        return False


# ------------------------------------------------------------------ slime's own Sample class
_sample_class: list[Any] = []  # [slime's Sample class or None], decided once per process
_COUNTERS = ("spec_info", "prefix_cache_info")


def slime_sample_class() -> type | None:
    """slime's own `slime.utils.types.Sample` when the real slime is importable, else None
    (slime absent, or served by the stand-ins, whose Sample is ours)."""
    if not _sample_class:
        ours = importlib.import_module("pipeline.samples.sample").Sample
        try:
            cls = getattr(importlib.import_module("slime.utils.types"), "Sample", None)
        except ImportError:
            cls = None
        _sample_class.append(cls if isinstance(cls, type) and cls is not ours
                             and dataclasses.is_dataclass(cls) else None)
    return _sample_class[0]


def _counters(value: Any, cls: type) -> Any:
    """A counters record (`spec_info` / `prefix_cache_info`) as an instance of `cls`."""
    return cls(**{f.name: getattr(value, f.name) for f in dataclasses.fields(cls) if hasattr(value, f.name)})


def _plain(value: Any) -> Any:
    """Tensors (slime keeps top-p spans and routed experts as int32 tensors) as lists."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (list, tuple)) else value


def _copy_into(target: Any, source: Any, status_cls: type, tensors_to_lists: bool) -> None:
    """Every dataclass field of `target` that `source` has, then `source`'s extra attributes."""
    names = set()
    for f in dataclasses.fields(target):
        names.add(f.name)
        if not hasattr(source, f.name):
            continue
        value = getattr(source, f.name)
        if f.name == "status":
            value = status_cls(getattr(value, "value", value))
        elif f.name in _COUNTERS:
            value = _counters(value, type(getattr(target, f.name)))
        elif tensors_to_lists:
            value = _plain(value)
        setattr(target, f.name, value)
    source_fields = {f.name for f in dataclasses.fields(source)} if dataclasses.is_dataclass(source) else set()
    for key, value in vars(source).items():
        if key not in names and key not in source_fields and not key.startswith("_"):
            setattr(target, key, value)


def to_slime_sample(sample: Any) -> Any:
    """`sample` as an instance of slime's own Sample class where slime is importable (else, or
    when it is one already, `sample` itself)."""
    cls = slime_sample_class()
    if cls is None or isinstance(sample, cls) or not dataclasses.is_dataclass(sample):
        return sample
    theirs = cls()
    _copy_into(theirs, sample, cls.Status, tensors_to_lists=False)
    return theirs


def from_slime_sample(out: Any, handed: Any, original: Any) -> Any:
    """What a plugin returned (`out`: a Sample or a list of them) as our Samples: the one it was
    `handed` (by `to_slime_sample`) is copied back into `original`, any other slime Sample into a
    new one of `original`'s class; anything else is returned as it is."""
    cls = slime_sample_class()
    if cls is None:
        return out
    if isinstance(out, list):
        return [from_slime_sample(item, handed, original) for item in out]
    if not isinstance(out, cls):
        return out
    target = original if out is handed else type(original)()
    _copy_into(target, out, type(original.status), tensors_to_lists=True)
    return target
