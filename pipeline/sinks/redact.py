"""Secrets out of logs and dumped configs.

A config key is secret when its name contains `api_key` / `apikey`, `secret`, `password`,
`passwd`, `authorization` or `credential`, or ends in `token` (`hf_token`, `auth_token`;
`max_tokens`, `token_ids` and `tokenizer` are not secrets), case-insensitive. `redact(obj)` replaces
the values of such keys by `REDACTED`; `redact_text(s)` does the same inside `key=value` override
strings and hides the password of `scheme://user:password@host` URLs.

`RedactHydraFiles` is a Hydra callback that rewrites `<run dir>/.hydra/{config,hydra,overrides}.yaml`
(which Hydra writes before the job starts) with secrets redacted.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.process.atomic import atomic_write_text

__all__ = ["REDACTED", "RedactHydraFiles", "is_secret_key", "redact", "redact_text"]

logger = logging.getLogger(__name__)

REDACTED = "***REDACTED***"
_SECRET = re.compile(r"api_?key|secret|passw(or)?d|authorization|credential|token$", re.I)
# key=value inside an override or an override_dirname (comma separated)
_ASSIGN = re.compile(r"(?P<key>[\w.+~/-]+)=(?P<value>[^,]*)")
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@/\s]+@", re.I)


def is_secret_key(key: Any) -> bool:
    """True when a config key's last dotted component names a secret (module docstring)."""
    return isinstance(key, str) and bool(_SECRET.search(key.rsplit(".", 1)[-1]))


def redact_text(text: str) -> str:
    """`text` with secret `key=value` values and URL passwords replaced by REDACTED."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", text)

    def sub(m: re.Match[str]) -> str:
        return f"{m.group('key')}={REDACTED}" if is_secret_key(m.group("key")) else m.group(0)

    return _ASSIGN.sub(sub, text)


def _is_interpolation(value: Any) -> bool:
    """`${oc.env:KEY}` and the like name where a secret comes from, not the secret."""
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def _is_value(value: Any) -> bool:
    """A secret-named key holding this is redacted: a scalar, not None, not an interpolation
    (a node under such a name, e.g. `headers`, is walked instead)."""
    return value is not None and not isinstance(value, (dict, list, tuple)) and not _is_interpolation(value)


def redact(obj: Any) -> Any:
    """A copy of a (nested) plain config with secret values replaced; other values unchanged."""
    if isinstance(obj, (DictConfig, ListConfig)):
        obj = OmegaConf.to_container(obj, resolve=False)
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and _is_value(v) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def redact_hydra_dir(hydra_dir: str | Path) -> list[Path]:
    """Rewrite the YAML files of a `.hydra` folder with secrets redacted; returns the files changed."""
    changed = []
    for path in sorted(Path(hydra_dir).glob("*.yaml")):
        original = OmegaConf.load(path)
        clean = OmegaConf.create(redact(original))
        if OmegaConf.to_yaml(clean) != OmegaConf.to_yaml(original):
            atomic_write_text(path, OmegaConf.to_yaml(clean))
            changed.append(path)
    return changed


class RedactHydraFiles(Callback):
    """Hydra callback: redact the job's `.hydra/*.yaml` as soon as the job starts."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra has written the files by now (hydra.core.utils.run_job)."""
        subdir = config.hydra.output_subdir
        if subdir is None:
            return
        changed = redact_hydra_dir(Path(config.hydra.runtime.output_dir) / subdir)
        if changed:
            logger.debug("redacted secrets in %s", ", ".join(p.name for p in changed))
