"""Config and plugins: the slot table and allowlist (`plugins`, the ground floor), the pre-flight
rules (`rules`), `validate` and the slime `args` view (`args`), the `${...}` resolvers
(`resolvers`) and the config-groups table (`docs`, `python -m pipeline.config.docs`).

`pipeline.config` was a module until the layout of issue #32; its names (`validate`, `SlimeArgs`,
...) still resolve here, lazily (importing the package stays light: `plugins` is imported first
by everything), with a DeprecationWarning naming `pipeline.config.args`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# the names the old `pipeline.config` module had, now in pipeline.config.args
_OLD_MODULE_NAMES = frozenset({"ConfigError", "SlimeArgs", "missing_arg_message", "to_plain", "to_plain_lenient",
                               "validate", "_DATA_MIRRORS", "_REWARD_MIRRORS"})


def __getattr__(name: str) -> Any:
    """`pipeline.config.<name>` of the old module, from pipeline.config.args (deprecated)."""
    if name in _OLD_MODULE_NAMES:
        warnings.warn(f"pipeline.config.{name} moved to pipeline.config.args.{name}; import it from there",
                      DeprecationWarning, stacklevel=2)
        value = getattr(importlib.import_module("pipeline.config.args"), name)
        globals()[name] = value  # warned once: later look-ups find it here
        return value
    raise AttributeError(f"module 'pipeline.config' has no attribute {name!r}")
