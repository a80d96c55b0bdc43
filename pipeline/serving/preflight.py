"""Pre-flight checks of `engine.serve_http` (docs/serving.md), run by `pipeline.config.args.validate`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.config.plugins import target_of
from pipeline.serving.args import ABSENT_MODE, SGLANG_TARGET, custom_configured, remote_address

__all__ = ["serving_problems", "serving_warnings"]

_MODES = ("auto", True, False)


def _engine(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    node = cfg.get("engine")
    return node if isinstance(node, Mapping) else {}


def serving_problems(cfg: Mapping[str, Any]) -> list[str]:
    """engine.serve_http must be auto / true / false; with engine=sglang the base_url must be
    `http(s)://host:port` (it is the address slime's generate functions POST to)."""
    node = _engine(cfg)
    mode = node.get("serve_http", ABSENT_MODE)
    out = []
    if not any(mode is m if isinstance(m, bool) else mode == m for m in _MODES):
        out.append(f"engine.serve_http: expected auto, true or false, got {mode!r}")
    if target_of(node) == SGLANG_TARGET and mode is not False and remote_address(node.get("base_url")) is None:
        out.append(f"engine.base_url: {node.get('base_url')!r} is not http(s)://host:port; slime's generate functions "
                   f"POST to http://<sglang_router_ip>:<sglang_router_port>/generate (or set engine.serve_http=false)")
    return out


def serving_warnings(cfg: Mapping[str, Any]) -> list[str]:
    """Deterministic mode holds for HTTP requests only when the generate passes the seed on."""
    rollout = cfg.get("rollout")
    mode = _engine(cfg).get("serve_http", ABSENT_MODE)
    if (mode is not False and isinstance(rollout, Mapping) and rollout.get("deterministic")
            and custom_configured(cfg)):
        return ["rollout.deterministic with a custom generate: a request through the SGLang-compatible /generate "
                "is seeded only when its sampling_params carry the seed the rollout put in the sampling_params "
                "the generate got (sampling_params['seed']; SGLang's sampling_seed works too); a generate that "
                "builds its own sampling_params without it samples at random (docs/serving.md)"]
    return []
