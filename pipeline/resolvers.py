"""OmegaConf resolvers the YAML configs use; registered when `pipeline` is imported.

* `${multiply:a,b}`: a x b rounded up to an integer (e.g. `over_sampling_batch_size` as
  `rollout_batch_size` times the dynamic filter's `over_sampling_factor`).
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

__all__ = ["multiply", "register_resolvers"]


def multiply(a: Any, b: Any) -> int | str:
    """`a * b` rounded up to an integer. When either is not a number the result is a string
    saying so, left for `validate(cfg)` to report next to the key that holds the bad value."""
    for value in (a, b):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{a!r} x {b!r} (not numbers)"
    return int(math.ceil(a * b - 1e-9))


def register_resolvers() -> None:
    """Register every resolver above (idempotent)."""
    if not OmegaConf.has_resolver("multiply"):
        OmegaConf.register_new_resolver("multiply", multiply)
