"""Override values on the command line, both ways: what Hydra reads from `key=value`, and a
`key=value` that Hydra (and a shell) read back as the value meant, whatever the characters.

Hydra's override grammar takes plain paths as they are but refuses, unquoted, non-ASCII letters
and characters such as `'`, `,`, `=` or `[`: a run dir named `runs/café` or `my runs/a'b` must be
quoted for Hydra (`"..."`, with `\\"` inside) and then, in a printed command, for the shell.
"""

from __future__ import annotations

import functools
import re
import shlex
from typing import Any

__all__ = ["command_arg", "hydra_quoted", "is_sweep_override", "override_value", "unique_dir_arg"]

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
