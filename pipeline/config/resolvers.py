"""OmegaConf resolvers the YAML configs use; registered when `pipeline` is imported.

* `${multiply:a,b}`: a x b rounded up to an integer (e.g. `over_sampling_batch_size` as
  `rollout_batch_size` times `over_sampling_factor`).
* `${unique_dir:base}`: `base`, or `base_2`, `base_3`, ...: the first that does not exist, created
  on the spot (`os.mkdir` is atomic), so two runs started in the same second get two run dirs.
  Cached per config (and copied into each sweep job's config by Hydra, as `${now:}` is).
* `${pick:flag,a,b}`: `a` if `flag` is true, else `b` (e.g. the hf engine's dtype: float32 in
  deterministic mode, auto otherwise).
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

from omegaconf import OmegaConf

__all__ = ["multiply", "pick", "register_resolvers", "unique_dir"]


def multiply(a: Any, b: Any) -> int | str:
    """`a * b` rounded up to an integer. When either is not a number the result is a string
    saying so, left for `validate(cfg)` to report next to the key that holds the bad value."""
    for value in (a, b):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{a!r} x {b!r} (not numbers)"
    return int(math.ceil(a * b - 1e-9))


def unique_dir(base: str) -> str:
    """Create and return `base` or, when it exists, the first free `base_<n>` (n = 2, 3, ...)."""
    parent = os.path.dirname(base)
    if parent:
        os.makedirs(parent, exist_ok=True)
    for n in itertools.count(1):
        path = base if n == 1 else f"{base}_{n}"
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def pick(flag: Any, if_true: Any, if_false: Any) -> Any:
    """`if_true` when `flag` is true (a bool, or the string "true"), else `if_false`."""
    return if_true if flag is True or str(flag).lower() == "true" else if_false


def register_resolvers() -> None:
    """Register every resolver above (idempotent)."""
    if not OmegaConf.has_resolver("multiply"):
        OmegaConf.register_new_resolver("multiply", multiply)
    if not OmegaConf.has_resolver("unique_dir"):
        OmegaConf.register_new_resolver("unique_dir", unique_dir, use_cache=True)
    if not OmegaConf.has_resolver("pick"):
        OmegaConf.register_new_resolver("pick", pick)
