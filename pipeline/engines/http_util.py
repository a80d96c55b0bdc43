"""HTTP helpers shared by the HTTP engines and the remote reward: retries with backoff, and
per-event-loop clients/semaphores (asyncio objects are bound to the loop that made them)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

__all__ = ["RETRYABLE_STATUS", "is_retryable", "with_retries", "LoopLocal"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# server overload / transient failures worth another try
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def is_retryable(exc: BaseException) -> bool:
    """True for transport errors, timeouts, retryable HTTP status codes and malformed JSON
    answers (a truncated or garbled body from an overloaded server or proxy)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in RETRYABLE_STATUS
    return isinstance(exc, (httpx.TransportError, httpx.TimeoutException, json.JSONDecodeError))


async def with_retries(
    call: Callable[[], Awaitable[T]], *, max_retries: int, backoff_s: float, what: str,
    max_backoff_s: float = 10.0,
) -> T:
    """Run `call`, retrying retryable failures up to `max_retries` times with exponential
    backoff (full jitter), each logged as a WARNING with the attempt number. The last error is
    raised with a note naming `what` and the number of attempts."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:  # noqa: BLE001 - filtered by is_retryable
            if attempt >= max_retries or not is_retryable(exc):
                exc.add_note(f"{what}: gave up after {attempt + 1} attempt(s) "
                             f"({type(exc).__name__}); check that the server is up and answers "
                             f"valid JSON, or raise the retries / timeout in the config")
                raise
            delay = min(max_backoff_s, backoff_s * (2 ** attempt)) * random.uniform(0.5, 1.0)
            attempt += 1
            logger.warning("%s failed (%s: %s); retry %d/%d in %.2fs", what,
                           type(exc).__name__, exc, attempt, max_retries, delay)
            await asyncio.sleep(delay)


class LoopLocal:
    """An httpx.AsyncClient and an asyncio.Semaphore for the running event loop."""

    def __init__(self, make_client: Callable[[], httpx.AsyncClient], concurrency: int) -> None:
        self._make_client = make_client
        self._concurrency = concurrency
        self._loop: Any = None
        self.client: httpx.AsyncClient | None = None
        self.semaphore: asyncio.Semaphore | None = None

    def get(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The client and semaphore of the running loop (new ones for a new loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self.client is None or self.semaphore is None:
            self._loop = loop
            self.client = self._make_client()
            self.semaphore = asyncio.Semaphore(self._concurrency)
        return self.client, self.semaphore

    def close(self) -> None:
        """Close the client if its loop is still usable; otherwise just drop it."""
        client, loop = self.client, self._loop
        self.client, self.semaphore, self._loop = None, None, None
        if client is None or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(client.aclose())
        elif not loop.is_running():
            loop.run_until_complete(client.aclose())
