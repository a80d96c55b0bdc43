"""Runnable plugin examples (docs/plugins.md): each role in two forms.

Native form: a class named by `_target_` in a YAML option under `examples/conf/<group>/`, picked
with `hydra.searchpath=[file://examples/conf] <group>=<option>`; its `__init__` parameters come
from the YAML, and runtime parts (`engine`, `reward`, `args`, ...) are injected when named.
slime form: a plain function in slime's signature, named by dotted path on the command line.
Both need `allowed_targets_extra=[examples.]`.
"""
