"""slime's type modules for plugins written for slime, where slime itself is not installed.

A function written for slime usually starts with `from slime.utils.types import Sample` (and a
rollout function or dynamic filter with `from slime.rollout.base_types import ...` or
`from slime.rollout.filter_hub.base_types import DynamicFilterOutput`). slime is a training
framework with GPU dependencies, so it is rarely installed beside this pipeline; those imports
would then fail before the function runs. `install()` (called before any plugin is imported,
pipeline/plugins.py) registers an import finder that serves exactly these modules with this
pipeline's equal types (docs/contracts.md §1, §6, §8):

    slime.utils.types                   Sample
    slime.rollout.base_types            RolloutFnTrainOutput, RolloutFnEvalOutput
    slime.rollout.filter_hub.base_types DynamicFilterOutput

(and their parent packages). Any other `slime.` module fails to import with a message that says
slime is not installed, which modules stand in and what running slime's own plugins takes
(`SLIME_NEEDS`: slime's source on PYTHONPATH and `SLIME_PIP_PACKAGES`). Where slime is importable,
nothing is registered: the real slime is used, and its types are accepted by shape
(pipeline/rollout/contracts.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence

__all__ = ["SLIME_NEEDS", "SLIME_PIP_PACKAGES", "STAND_INS", "install", "installed"]

# what slime's own plugins (rm_hub.async_rm, the filter hub, the data source) import beyond this
# pipeline's packages, found by running them from slime @624b824's source: rm_hub imports aiohttp,
# its math grader pylatexenc (torch, sympy and httpx come with this pipeline)
SLIME_PIP_PACKAGES = ("pylatexenc", "aiohttp")
SLIME_NEEDS = (f"slime's source on PYTHONPATH (PYTHONPATH=<your slime checkout> python run.py ...), "
               f"allowed_targets_extra=[slime.] and pip install {' '.join(SLIME_PIP_PACKAGES)} "
               f"(README 'Porting from slime')")

# module -> {name: "pipeline.module:attribute"}; packages on the way are served empty
STAND_INS: dict[str, dict[str, str]] = {
    "slime.utils.types": {"Sample": "pipeline.sample:Sample"},
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
            f"slime's type modules only ({served}; pipeline/slime_compat.py); to run slime's own plugins "
            f"unchanged put {SLIME_NEEDS}", name=fullname)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"rollout-pipeline's stand-in for slime's {module.__name__} (pipeline/slime_compat.py)"
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
