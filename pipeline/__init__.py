"""rollout-pipeline: a declarative, Hydra-configured rollout data pipeline for LLM RL.

Public names users build on are re-exported here.

Module paths from before the subpackage layout (issue #32: `pipeline.sample`, `pipeline.plugins`,
`pipeline.data.slime_compat`, ...) still import, for stored run configs, pickles and user plugins
that name them: `MOVED` maps each to its new home, and an import finder registered here serves
the new module under the old name (the same module object) with one DeprecationWarning.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

# old dotted module path -> its home since issue #32 (`pipeline.config` is a package now and
# resolves its old names itself, pipeline/config/__init__.py)
MOVED: dict[str, str] = {
    "pipeline.app": "pipeline.run.app",
    "pipeline.session": "pipeline.run.session",
    "pipeline.run_record": "pipeline.run.run_record",
    "pipeline.run_lock": "pipeline.run.run_lock",
    "pipeline.sweep_resume": "pipeline.run.sweep_resume",
    "pipeline.overrides": "pipeline.run.overrides",
    "pipeline.runner": "pipeline.loop.runner",
    "pipeline.runner_async": "pipeline.loop.runner_async",
    "pipeline.parts": "pipeline.loop.parts",
    "pipeline.config_rules": "pipeline.config.rules",
    "pipeline.config_docs": "pipeline.config.docs",
    "pipeline.resolvers": "pipeline.config.resolvers",
    "pipeline.plugins": "pipeline.config.plugins",
    "pipeline.sample": "pipeline.samples.sample",
    "pipeline.sample_meta": "pipeline.samples.meta",
    "pipeline.sample_versions": "pipeline.samples.versions",
    "pipeline.malloc": "pipeline.process.malloc",
    "pipeline.openmp": "pipeline.process.openmp",
    "pipeline.precision": "pipeline.process.precision",
    "pipeline.logging_setup": "pipeline.process.logging_setup",
    "pipeline.atomic": "pipeline.process.atomic",
    "pipeline.slime_compat": "pipeline.slime.stand_ins",
    "pipeline.data.slime_compat": "pipeline.slime.args",
    "pipeline.estimators": "pipeline.rewards.estimators",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves each old path in MOVED as the module at its new path (with a DeprecationWarning)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        # the new file as origin: `python -m <old path>` runs it with its own __file__
        return importlib.machinery.ModuleSpec(fullname, self, origin=importlib.util.find_spec(MOVED[fullname]).origin)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        # stacklevel 2 skips the import machinery's frames: the warning names the importing line
        warnings.warn(f"{spec.name} moved to {new}; import {new} instead (the old path is deprecated)",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)  # registered under the old name too, by the import system
        spec.loader_state = module.__spec__  # the import system sets the alias spec on it: put it back
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run (the new module ran on its own import); restore its own `__spec__`."""
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname: str) -> types.CodeType | None:
        """The new module's code, for `python -m <old path>` (runpy asks the loader for it)."""
        new = MOVED[fullname]
        warnings.warn(f"{fullname} moved to {new}; run `python -m {new}` instead", DeprecationWarning, stacklevel=2)
        return importlib.util.find_spec(new).loader.get_code(new)


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())

from pipeline.config.resolvers import register_resolvers
from pipeline.samples.sample import Sample
from pipeline.data.sources import BufferedDataSource, PlainDataSource
from pipeline.rollout.contracts import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput

# the YAML configs use them (`${multiply:...}`): register before any config is composed
register_resolvers()

__all__ = [
    "Sample",
    "PlainDataSource",
    "BufferedDataSource",
    "RolloutFnTrainOutput",
    "RolloutFnEvalOutput",
    "DynamicFilterOutput",
    "load_train_data",
]


def __getattr__(name: str):
    """Lazy public names (keep `import pipeline` light: no torch until needed)."""
    if name == "load_train_data":
        from pipeline.sinks.files import load_train_data

        return load_train_data
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
