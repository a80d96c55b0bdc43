"""Surviving mutants that are equivalent to the original code: mutant name -> why no test can kill it.

`scripts/mutation.py` counts these apart and prints the reason next to the diff. Mutant names
number the mutations inside one function, so an edit to that function renames them: the next
run shows them as survivors again, to be killed by a test or re-explained here.
"""

from __future__ import annotations

EQUIVALENT: dict[str, str] = {
}
