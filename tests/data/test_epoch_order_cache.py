"""The on-disk cache of large epoch orders: keyed by (seed, epoch, n), int32 on disk, used only
from CACHE_MIN_N rows up, and an unusable entry is recomputed, never trusted."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.data import order as order_mod
from pipeline.data.lengths import ArrayCache
from pipeline.data.order import EpochOrder, epoch_permutation

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> ArrayCache:
    monkeypatch.setattr(order_mod, "CACHE_MIN_N", 10)
    return ArrayCache(tmp_path, "epoch_order")


def files(cache: ArrayCache) -> list:
    return sorted(cache.dir.glob("*.npz")) if cache.dir.exists() else []


def test_cache_entries_are_per_seed_epoch_and_n(cache):
    assert EpochOrder(10, 7, True, cache).order(2).tolist() == epoch_permutation(7, 2, 10)  # n == CACHE_MIN_N
    assert len(files(cache)) == 1
    for n, seed, epoch in [(10, 8, 2), (10, 7, 3), (12, 7, 2)]:
        assert EpochOrder(n, seed, True, cache).order(epoch).tolist() == epoch_permutation(seed, epoch, n)
    assert len(files(cache)) == 4


def test_small_orders_are_not_cached(cache):
    assert EpochOrder(9, 7, True, cache).order(0).tolist() == epoch_permutation(7, 0, 9)
    assert files(cache) == []


def test_cached_orders_are_int32_on_disk_and_int64_in_memory(cache):
    got = EpochOrder(100, 1, True, cache).order(0)
    assert got.dtype == np.int64
    with np.load(files(cache)[0]) as z:
        assert z["order"].dtype == np.int32 and z["order"].tolist() == got.tolist()
    again = EpochOrder(100, 1, True, cache).order(0)
    assert again.dtype == np.int64 and again.tolist() == got.tolist()


@pytest.mark.parametrize("stored", [{"other": np.arange(20)}, {"order": np.arange(3)}])
def test_an_unusable_entry_is_recomputed(cache, stored):
    cache.put(cache.key({"seed": 5, "epoch": 1, "n": 20}), stored)
    assert EpochOrder(20, 5, True, cache).order(1).tolist() == epoch_permutation(5, 1, 20)


def test_the_current_epoch_order_is_computed_once(monkeypatch):
    calls = []

    def counting(seed, epoch, n):
        calls.append(epoch)
        return list(range(n))[::-1]

    monkeypatch.setattr(order_mod, "epoch_permutation", counting)
    order = EpochOrder(5, 0, True)
    for _ in range(3):
        assert order.order(4).tolist() == [4, 3, 2, 1, 0]
    assert calls == [4]
    order.order(5)
    assert calls == [4, 5]
