"""How many groups each over-sampling round fetches: `fixed` (slime) or `adaptive`.

`fixed` fetches `over_sampling_batch_size` groups whenever (submitted − dropped) falls below
`rollout_batch_size`. `adaptive` fetches ceil(shortfall / p) groups, where p is the dynamic
filter's pass rate estimated from this rollout's decisions so far, blended with the rate carried
over from earlier rollouts (an exponential moving average), clamped to
[min_pass_rate, 1]; the fetch is then clamped to [min_fetch, max_fetch_factor × batch size].
A high pass rate fetches just what is missing; a low one fetches enough up front to avoid
extra rounds.

When to fetch: `fixed` follows slime (docs/contracts.md §6): only once (submitted − dropped) < batch size,
i.e. after in-flight groups have actually been dropped. `adaptive` fetches as soon as the
*projected* count is short: kept + p × (groups in flight, not yet decided) < batch size. The
next round then starts while the current one is still generating instead of after its drops
are known, so generation is pipelined; the price is groups still in flight when the batch
fills, which are aborted (to the buffer with partial_rollout, else dropped).

The look-ahead has a budget: once this rollout has submitted max(over_sampling_batch_size,
ceil(batch size / min_pass_rate)) groups — what the lowest pass rate it assumes would need —
`adaptive` fetches only as `fixed` does, once (submitted − dropped) < batch size (sized as
before). Without it a filter that drops everything (every reward 0) kept 1 / min_pass_rate
batches in flight for ever, and a `keep_when_insufficient` filter (`nonzero_std_fallback`), which
keeps a group only when (submitted − dropped) ≤ batch size, never filled the batch.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["OverSampler"]

_MODES = ("fixed", "adaptive")


class OverSampler:
    """Fetch sizing for the engine rollout; its pass-rate estimate persists across rollouts."""

    ADAPTIVE_KEYS = ("min_fetch", "max_fetch_factor", "min_pass_rate", "prior_pass_rate",
                     "prior_weight", "smoothing")

    def __init__(
        self,
        mode: str = "fixed",
        min_fetch: int = 1,
        max_fetch_factor: float = 4.0,
        min_pass_rate: float = 0.1,
        prior_pass_rate: float = 1.0,
        prior_weight: float = 4.0,
        smoothing: float = 0.5,
    ) -> None:
        """Defaults mirror `conf/rollout/engine.yaml` (documented there)."""
        if mode not in _MODES:
            raise ValueError(f"rollout.over_sampling: expected one of {list(_MODES)}, got {mode!r}")
        if min_fetch < 1:
            raise ValueError(f"rollout.adaptive.min_fetch: expected >= 1, got {min_fetch}")
        if max_fetch_factor < 1:
            raise ValueError(f"rollout.adaptive.max_fetch_factor: expected >= 1, got {max_fetch_factor}")
        for key, value in (("min_pass_rate", min_pass_rate), ("prior_pass_rate", prior_pass_rate),
                           ("smoothing", smoothing)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"rollout.adaptive.{key}: expected a number in (0, 1], got {value}")
        if prior_weight < 0:
            raise ValueError(f"rollout.adaptive.prior_weight: expected >= 0, got {prior_weight}")
        self.mode = mode
        self.min_fetch = int(min_fetch)
        self.max_fetch_factor = float(max_fetch_factor)
        self.min_pass_rate = float(min_pass_rate)
        self.pass_rate = float(prior_pass_rate)
        self.prior_weight = float(prior_weight)
        self.smoothing = float(smoothing)

    def estimate(self, accepted: int, decided: int) -> float:
        """Pass-rate estimate: this rollout's decisions blended with the carried-over rate."""
        w = self.prior_weight
        if decided + w == 0:
            p = self.pass_rate
        else:
            p = (accepted + w * self.pass_rate) / (decided + w)
        return min(1.0, max(self.min_pass_rate, p))

    def look_ahead_budget(self, target: int, over_sampling_batch_size: int) -> int:
        """Groups one rollout submits ahead of its drops at most (`adaptive`): what a pass rate of
        min_pass_rate needs for the batch, and never less than one `fixed` round."""
        return max(int(over_sampling_batch_size), math.ceil(target / self.min_pass_rate - 1e-6))

    def shortfall(self, target: int, submitted: int, dropped: int, kept: int, accepted: int,
                  decided: int, over_sampling_batch_size: int) -> float:
        """Groups missing from the batch; a fetch is due while this is > 0. `fixed`, and
        `adaptive` past its look-ahead budget: target − (submitted − dropped); `adaptive`:
        target − kept − p × (submitted − dropped − kept)."""
        if self.mode == "fixed" or submitted >= self.look_ahead_budget(target, over_sampling_batch_size):
            return float(target - (submitted - dropped))
        undecided = submitted - dropped - kept
        return target - kept - self.estimate(accepted, decided) * undecided

    def fetch_size(self, target: int, over_sampling_batch_size: int, shortfall: float,
                   accepted: int, decided: int, submitted: int) -> int:
        """Groups to fetch now, given `shortfall()` > 0; `adaptive` stops at its look-ahead
        budget (a round never crosses it) and past it fetches as before."""
        if self.mode == "fixed":
            return over_sampling_batch_size
        p = self.estimate(accepted, decided)
        k = math.ceil(shortfall / p - 1e-6)
        upper = max(self.min_fetch, int(self.max_fetch_factor * target))
        k = max(self.min_fetch, min(upper, k))
        left = self.look_ahead_budget(target, over_sampling_batch_size) - submitted
        return min(k, left) if left > 0 else k

    def end_rollout(self, accepted: int, decided: int) -> None:
        """Fold this rollout's observed pass rate into the carried-over estimate."""
        if decided > 0:
            observed = accepted / decided
            self.pass_rate = (1 - self.smoothing) * self.pass_rate + self.smoothing * observed

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (the carried-over pass rate)."""
        return {"mode": self.mode, "pass_rate": self.pass_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output."""
        self.pass_rate = float(state["pass_rate"])
