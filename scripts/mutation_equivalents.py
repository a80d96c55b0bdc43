"""Surviving mutants that are equivalent to the original code: mutant name -> why no test can kill it.

`scripts/mutation.py` counts these apart and prints the reason next to the diff. Mutant names
number the mutations inside one function, so an edit to that function renames them: the next
run shows them as survivors again, to be killed by a test or re-explained here.
"""

from __future__ import annotations

_INT64 = "numpy's default integer is int64 on 64-bit Linux, the dtype the code names"
_NEVER_READ = "the initial value is replaced by the first order() call before anything reads it"
_HUGE_N = "the int32/int64 switch only differs at 2**31 rows or more, which no test can build"

EQUIVALENT: dict[str, str] = {
    # pipeline/data/order.py
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_8": "the 'no epoch yet' sentinel only has to differ from every int",
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_9": _NEVER_READ,
    "pipeline.data.order.xǁEpochOrderǁ__init____mutmut_11": _NEVER_READ,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_25": (
        "the default only matters for an entry without 'order'; a 1-row order is [0] either way"),
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_32": _INT64,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_34": _INT64,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_49": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_50": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_52": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁ_permutation__mutmut_53": _HUGE_N,
    "pipeline.data.order.xǁEpochOrderǁorder__mutmut_7": _INT64,
    "pipeline.data.order.xǁEpochOrderǁorder__mutmut_9": _INT64,
    # pipeline/stages/log.py
    "pipeline.stages.log.x__group_rewards__mutmut_11": "the key of an ungrouped sample only has to differ from group indexes",
    "pipeline.stages.log.x__group_rewards__mutmut_12": "the key of an ungrouped sample only has to differ from group indexes",
    "pipeline.stages.log.x_eval_metrics__mutmut_28": (
        "with k == 1 the pass@k block writes eval/<name>-pass@1 = mean(r > 0), which the next line writes again"),
    "pipeline.stages.log.x_log_stage__mutmut_1": "None and False are both falsy; skip is only read as `if not skip`",
    "pipeline.stages.log.x_pass_at_k__mutmut_1": (
        "the early return is a shortcut: when n - c < k, comb(n - c, k) == 0 and the formula gives 1.0 too "
        "(eval calls pass_at_k(k, c, k), so k > n never happens)"),
    "pipeline.stages.log.x_rollout_metrics__mutmut_69": "in a zero-std group every reward equals the first",
}
