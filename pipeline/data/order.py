"""Epoch order (docs/contracts.md §3): the permutation of epoch e depends on (seed, e, N) alone.

`random.Random(seed + epoch).shuffle(list(range(n)))` is exactly what slime gets from
`random.seed(seed + epoch); random.shuffle(p)`, without touching the global `random` state.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = ["epoch_permutation", "EpochOrder"]


def epoch_permutation(seed: int, epoch: int, n: int) -> list[int]:
    """The permutation `p` of epoch `epoch`: the epoch's k-th prompt is row `p[k]`."""
    perm = list(range(n))
    random.Random(seed + epoch).shuffle(perm)
    return perm


# below this many prompts a permutation takes milliseconds and is not cached on disk
CACHE_MIN_N = 100_000


class EpochOrder:
    """Row order of one epoch at a time, as a numpy array of row positions.

    With `shuffle` off every epoch is the identity order. The order of the current epoch is
    computed once and reused until the epoch changes; for large sets it is also kept in
    `cache` (an `ArrayCache`, keyed by seed, epoch and n) so a restart does not redo it.
    """

    def __init__(self, n: int, seed: int, shuffle: bool, cache: Any = None) -> None:
        self.n = n
        self.seed = seed
        self.shuffle = shuffle
        self._cache = cache if n >= CACHE_MIN_N else None
        self._epoch: int | None = None
        self._order: np.ndarray = np.arange(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        key = self._cache.key({"seed": self.seed, "epoch": epoch, "n": self.n}) if self._cache else ""
        cached = self._cache.get(key) if self._cache else None
        if cached is not None and cached.get("order", np.zeros(0)).shape == (self.n,):
            return cached["order"].astype(np.int64)
        order = np.asarray(epoch_permutation(self.seed, epoch, self.n), dtype=np.int64)
        if self._cache:
            self._cache.put(key, {"order": order.astype(np.int32 if self.n < 2**31 else np.int64)})
        return order

    def order(self, epoch: int) -> np.ndarray:
        """Row positions of epoch `epoch` in the order they are handed out."""
        if self._epoch != epoch:
            self._order = self._permutation(epoch) if self.shuffle else np.arange(self.n, dtype=np.int64)
            self._epoch = epoch
        return self._order
