"""docs/contracts.md §3: the epoch order equals slime's random.seed(seed+e); random.shuffle(range(N))."""

from __future__ import annotations

import random

import pytest

from pipeline.data.order import EpochOrder, epoch_permutation


@pytest.mark.parametrize(
    ("seed_plus_epoch", "n", "expected"),
    [
        (42, 5, [3, 1, 2, 4, 0]),
        (43, 5, [1, 4, 3, 2, 0]),
        (42, 10, [7, 3, 2, 8, 5, 6, 9, 4, 0, 1]),
        (1234, 8, [1, 3, 2, 4, 5, 6, 0, 7]),
    ],
)
def test_spec_vectors(seed_plus_epoch: int, n: int, expected: list[int]) -> None:
    assert epoch_permutation(seed_plus_epoch, 0, n) == expected
    assert epoch_permutation(seed_plus_epoch - 1, 1, n) == expected


def test_matches_slime_global_random_and_leaves_it_alone() -> None:
    random.seed(7)
    before = random.getstate()
    for seed, epoch, n in [(1, 0, 17), (42, 3, 100), (5, 9, 1)]:
        ours = epoch_permutation(seed, epoch, n)
        state = random.getstate()
        random.seed(seed + epoch)  # what slime does
        p = list(range(n))
        random.shuffle(p)
        random.setstate(state)
        assert ours == p
    assert random.getstate() == before


def test_epoch_order_depends_only_on_seed_epoch_n() -> None:
    a, b = EpochOrder(10, 42, True), EpochOrder(10, 42, True)
    a.order(0), a.order(1)
    assert a.order(3).tolist() == b.order(3).tolist() == epoch_permutation(42, 3, 10)
    assert EpochOrder(4, 42, False).order(5).tolist() == [0, 1, 2, 3]


def test_large_orders_are_cached_and_identical(tmp_path, monkeypatch) -> None:
    from pipeline.data import order as order_mod
    from pipeline.data.lengths import ArrayCache

    monkeypatch.setattr(order_mod, "CACHE_MIN_N", 10)
    cache = ArrayCache(tmp_path, "epoch_order")
    first = EpochOrder(50, 7, True, cache).order(2)
    assert first.tolist() == epoch_permutation(7, 2, 50)
    assert len(list((tmp_path / "epoch_order").glob("*.npz"))) == 1
    monkeypatch.setattr(order_mod, "epoch_permutation", lambda *a: pytest.fail("recomputed"))
    again = EpochOrder(50, 7, True, cache).order(2)
    assert again.tolist() == first.tolist() and again.dtype == first.dtype
