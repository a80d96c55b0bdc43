"""Epoch order (SPEC §3): the permutation of epoch e depends on (seed, e, N) alone.

`random.Random(seed + epoch).shuffle(list(range(n)))` is exactly what slime gets from
`random.seed(seed + epoch); random.shuffle(p)`, without touching the global `random` state.
"""

from __future__ import annotations

import random

import numpy as np

__all__ = ["epoch_permutation", "EpochOrder"]


def epoch_permutation(seed: int, epoch: int, n: int) -> list[int]:
    """The permutation `p` of epoch `epoch`: the epoch's k-th prompt is row `p[k]`."""
    perm = list(range(n))
    random.Random(seed + epoch).shuffle(perm)
    return perm


class EpochOrder:
    """Row order of one epoch at a time, as a numpy array of row positions.

    With `shuffle` off every epoch is the identity order. The order of the current epoch is
    computed once and reused until the epoch changes.
    """

    def __init__(self, n: int, seed: int, shuffle: bool) -> None:
        self.n = n
        self.seed = seed
        self.shuffle = shuffle
        self._epoch: int | None = None
        self._order: np.ndarray = np.arange(0)

    def order(self, epoch: int) -> np.ndarray:
        """Row positions of epoch `epoch` in the order they are handed out."""
        if self._epoch != epoch:
            if self.shuffle:
                self._order = np.asarray(epoch_permutation(self.seed, epoch, self.n), dtype=np.int64)
            else:
                self._order = np.arange(self.n, dtype=np.int64)
            self._epoch = epoch
        return self._order
