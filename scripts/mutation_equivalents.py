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
}
