"""Override values on the command line, both ways: what Hydra reads from `key=value`, and a
`key=value` that Hydra (and a shell) read back as the value meant, whatever the characters.

Hydra's override grammar takes plain paths as they are but refuses, unquoted, non-ASCII letters
and characters such as `'`, `,`, `=` or `[`: a run dir named `runs/café` or `my runs/a'b` must be
quoted for Hydra (`"..."`, with `\\"` inside) and then, in a printed command, for the shell.

`added_key_typos` reads the other way: Hydra refuses `n_sample_per_prompt=4` (no such key) and
suggests `+n_sample_per_prompt=4`, which then adds a key nothing reads; pre-flight warns about a
`+key` within a small edit distance of a key the config has beside it.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["added_key_typos", "command_arg", "command_line_overrides", "edit_distance", "hydra_quoted",
           "is_sweep_override", "override_value", "unique_dir_arg"]

# values Hydra's grammar reads back unchanged without quotes
_PLAIN = re.compile(r"[A-Za-z0-9_./:@+~%-]+")


def hydra_quoted(value: str) -> str:
    """`value` as an override value Hydra reads back unchanged: as it is when plain, else in double
    quotes (single ones when it holds a double quote; that quote escaped, and the backslashes before
    it or the closing one doubled)."""
    if _PLAIN.fullmatch(value):
        return value
    q = "'" if '"' in value else '"'
    return q + re.sub(rf"(\\*)({q}|$)", lambda m: m.group(1) * 2 + ("\\" + q if m.group(2) else ""), value) + q


def command_arg(key: str, value: str) -> str:
    """`key=value` as one shell word of a printed command that Hydra reads back as `value`."""
    return shlex.quote(f"{key}={hydra_quoted(value)}")


def unique_dir_arg(key: str, path: str) -> str:
    """`key=${unique_dir:path}` as one shell word of a printed command (a new dir beside `path`):
    the interpolation quoted for Hydra too where its grammar would not take it bare."""
    expr = "${unique_dir:" + hydra_quoted(path) + "}"
    arg = f"{key}={expr}"
    try:
        bare_ok = _parser().parse_override(arg).value() == expr
    except Exception:  # noqa: BLE001 - Hydra's grammar refuses it bare
        bare_ok = False
    return shlex.quote(arg if bare_ok else f"{key}={hydra_quoted(expr)}")


@functools.lru_cache(maxsize=1)
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def override_value(arg: str) -> str:
    """The value of the override `arg` (`key=value`) as Hydra reads it, quotes removed; the raw text
    after `=` where Hydra's grammar refuses it or reads a sweep (`a,b`) or a list."""
    raw = arg.split("=", 1)[1]
    try:
        value = _parser().parse_override(arg).value()
    except Exception:  # noqa: BLE001 - Hydra's grammar refuses it: the text as typed
        return raw
    return value if isinstance(value, str) else raw


def is_sweep_override(arg: str) -> bool:
    """Whether Hydra reads the override `arg` as a sweep (`a,b`, `range(...)`, `glob(...)`); False
    for one it refuses (Hydra reports that itself)."""
    try:
        return _parser().parse_override(arg).is_sweep_override()
    except Exception:  # noqa: BLE001 - a malformed override is not a sweep
        return False


def command_line_overrides() -> list[str]:
    """The running Hydra job's command-line overrides (`key=value`, `+key=value`, ...); empty
    outside a Hydra run (a test composing a config)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [str(o) for o in HydraConfig.get().overrides.task]
    except (ImportError, ValueError):  # ValueError: no Hydra job is running
        return []


def edit_distance(a: str, b: str) -> int:
    """Edits from `a` to `b`: a character inserted, deleted or replaced, or two neighbours swapped,
    counts one (optimal string alignment distance)."""
    before: list[int] = []  # the row before `prev` (read from the second row on)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            d = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                d = min(d, before[j - 2] + 1)
            cur.append(d)
        before, prev = prev, cur
    return prev[-1]


def _typo_limit(key: str) -> int:
    """The largest edit distance that still reads as a typo of a `key`-long name (0: too short to tell)."""
    return 0 if len(key) < 4 else 1 if len(key) <= 6 else 2


def added_key_typos(overrides: Iterable[str], cfg: Mapping[str, Any], extra_known: Iterable[str] = ()) -> list[str]:
    """One warning for each `+key=value` in `overrides` whose key is new and within a small edit
    distance of a key `cfg` has beside it (at the top level also of `extra_known`, slime's names
    that plugins read): "did you mean n_samples_per_prompt?". Keys far from every known key (a
    plugin's own), `+group=option` additions and overrides Hydra's grammar refuses are left alone."""
    added: list[tuple[str, str]] = []
    for arg in overrides:
        try:
            override = _parser().parse_override(arg)
        except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself
            continue
        if override.is_add() and not override.package:
            added.append((arg, override.key_or_group))
    new_keys = {key for _, key in added}
    extra = frozenset(extra_known)
    out = []
    for arg, key in added:
        parent, _, leaf = key.rpartition(".")
        node: Any = cfg
        for part in parent.split(".") if parent else ():
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or leaf not in node or (not parent and leaf in extra):
            continue  # a config group (+experiment=...), or one of slime's names as it is
        limit = _typo_limit(leaf)
        known = {k for k in node if isinstance(k, str) and (f"{parent}.{k}" if parent else k) not in new_keys}
        known |= extra if not parent else set()
        scored = sorted((edit_distance(leaf, k), k) for k in known - {leaf} if abs(len(k) - len(leaf)) <= limit)
        if not scored or scored[0][0] > limit:
            continue
        near = [k for d, k in scored if d == scored[0][0]]  # every nearest key, in order
        names = [f"{parent}.{k}" if parent else k for k in near]
        text = f"{arg} adds a key this config does not have; did you mean {' or '.join(names)}?"
        if near[0] in node:
            value = arg.split("=", 1)[1]  # an added key always has one (maybe empty)
            text += (f" ({names[0]} stays {node[near[0]]!r}; to set it: {names[0]}={value}, without the +). "
                     f"A key that a plugin of your own reads can stay as it is")
        out.append(text)
    return out
