"""The slime args of the SGLang-compatible endpoint, and when it starts (docs/serving.md).

A slime HTTP generate reads `args.sglang_router_ip` / `args.sglang_router_port` (the URL it
POSTs to) and slime's client and `GenerateState` read `sglang_server_concurrency`,
`rollout_num_gpus`, `rollout_num_gpus_per_engine` (slime's HTTP client is created only when
they give at least one engine), `rollout_skip_special_tokens`, `sglang_dp_size` and
`use_distributed_post`. `ServingArgs` answers those names for `pipeline.config.args.SlimeArgs` when
the config has no key of that name (a `+name=value` or `slime_args:` entry wins):

* engine=sglang: the router address is the engine's `base_url`; nothing is started.
* every other engine: an `SGLangServer` (pipeline/serving/server.py) on 127.0.0.1, started once
  per run: at build time with `engine.serve_http=true`, or with `auto` when a custom generate or
  rollout / eval function is configured, else on the first read of the router address; stopped
  when the run closes its parts. `engine.serve_http=false`: reading the address is an
  AttributeError saying how to turn the endpoint on.

When slime's own `slime.utils.http_utils` is loaded and its client was never created (slime's
RolloutManager creates it; here nobody else does), reading the address calls its
`init_http_client(args)`, so `slime.utils.http_utils.post` works.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pipeline.config.plugins import target_of

__all__ = ["SERVED_ARGS", "ABSENT_MODE", "DEFAULT_CONCURRENCY", "SGLANG_TARGET", "ServingArgs", "custom_configured",
           "remote_address"]

logger = logging.getLogger(__name__)

# the slime args this module answers
SERVED_ARGS = ("sglang_router_ip", "sglang_router_port", "sglang_server_concurrency", "rollout_num_gpus",
               "rollout_num_gpus_per_engine", "rollout_skip_special_tokens", "sglang_dp_size", "use_distributed_post")
# the address: reading one starts the server
_ADDRESS = ("sglang_router_ip", "sglang_router_port")
# engine.serve_http of an engine node of your own that has no such key
ABSENT_MODE = "auto"
# sglang_server_concurrency for an engine node that states neither max_concurrency nor max_batch_size
DEFAULT_CONCURRENCY = 64
# the engine whose own server is the endpoint (its base_url gives the address)
SGLANG_TARGET = "pipeline.engines.sglang.SGLangEngine"


def remote_address(base_url: Any) -> tuple[str, int] | None:
    """(host, port) of an SGLang `base_url` (`http://host:port`), None when it is not one."""
    if not isinstance(base_url, str):
        return None
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return parts.hostname, port if port is not None else (443 if parts.scheme == "https" else 80)


def custom_configured(plain: Mapping[str, Any]) -> bool:
    """Whether the config names a custom generate, or a rollout / eval function by path."""
    for key in ("rollout", "eval"):
        node = plain.get(key)
        if isinstance(node, Mapping) and (node.get("custom_generate_path") or node.get("path")):
            return True
    return False


class ServingArgs:
    """The served slime args of one run (see module docstring)."""

    def __init__(self, mode: Any, static: dict[str, Any], remote: tuple[str, int] | None, eager: bool) -> None:
        self.mode = mode
        self.static = dict(static)
        self.remote = remote
        self.eager = eager
        self._engine_provider: Callable[[], Any] | None = None
        self._server: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, plain: Mapping[str, Any]) -> ServingArgs:
        """From a resolved run config (its `engine` node and the rollout / eval nodes)."""
        node = plain.get("engine") if isinstance(plain.get("engine"), Mapping) else {}
        mode = node.get("serve_http", ABSENT_MODE)
        sglang = target_of(node) == SGLANG_TARGET
        concurrency = node.get("max_concurrency") or node.get("max_batch_size") or DEFAULT_CONCURRENCY
        static = {
            "sglang_server_concurrency": int(concurrency),
            # slime's engine count is rollout_num_gpus // rollout_num_gpus_per_engine: one per replica
            "rollout_num_gpus": int(node.get("num_replicas") or 1),
            "rollout_num_gpus_per_engine": 1,
            "rollout_skip_special_tokens": bool(node.get("skip_special_tokens")) if sglang else False,
            "sglang_dp_size": 1,
            "use_distributed_post": False,
        }
        remote = remote_address(node.get("base_url")) if sglang else None
        return cls(mode, static, remote, eager=mode is True or (mode == "auto" and custom_configured(plain)))

    @property
    def enabled(self) -> bool:
        """False with `engine.serve_http=false`."""
        return self.mode is not False

    def bind(self, engine_provider: Callable[[], Any]) -> None:
        """Where the server gets the run's engine (called once the run builds its parts)."""
        self._engine_provider = engine_provider

    def start_if_eager(self) -> None:
        """Start the server now when the config asks for it (`true`, or `auto` with a custom
        generate / rollout function); engine=sglang starts nothing."""
        if self.enabled and self.eager and self.remote is None:
            self.address()

    def address(self) -> tuple[str, int]:
        """(ip, port) of the endpoint, starting the server on first use."""
        if self.remote is not None:
            return self.remote
        with self._lock:
            if self._server is None:
                if self._engine_provider is None:
                    raise AttributeError("args.sglang_router_ip: the SGLang-compatible endpoint starts with a run "
                                         "(pipeline.run.app.run); this args view was built outside one")
                from pipeline.serving.server import SGLangServer  # aiohttp, only when the endpoint starts

                self._server = SGLangServer(self._engine_provider)
            server = self._server
        port = server.start()
        return server.host, port

    def value(self, name: str, args: Any) -> Any:
        """The served arg `name` (one of SERVED_ARGS) for `args`; raises AttributeError when the
        endpoint is off."""
        if not self.enabled:
            raise AttributeError(
                f"args has no attribute {name!r}: engine.serve_http=false turns the SGLang-compatible /generate "
                f"endpoint off (docs/serving.md); set engine.serve_http=auto (or true) to serve it, or set "
                f"+{name}=<value> to point your generate at a server of your own")
        if name not in _ADDRESS:
            return self.static[name]
        ip, port = self.address()
        _init_slime_client(args)
        return ip if name == "sglang_router_ip" else port

    def started_values(self) -> dict[str, Any]:
        """The served values known without starting anything (for a pickled copy of args)."""
        out = dict(self.static) if self.enabled else {}
        if self.enabled and (self.remote is not None or (self._server is not None and self._server.port)):
            out["sglang_router_ip"], out["sglang_router_port"] = (
                self.remote or (self._server.host, self._server.port))
        return out

    @property
    def server(self) -> Any:
        """The started `SGLangServer`, or None."""
        return self._server

    def close(self) -> None:
        """Stop the server if one was started (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()


def _init_slime_client(args: Any) -> None:
    """slime's `init_http_client(args)` when slime's http_utils is loaded without its client."""
    module = sys.modules.get("slime.utils.http_utils")
    init = getattr(module, "init_http_client", None)
    if callable(init) and getattr(module, "_http_client", True) is None:
        logger.info("creating slime's HTTP client (slime.utils.http_utils.init_http_client)")
        init(args)
