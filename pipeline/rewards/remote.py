"""Remote reward: POST `{"prompt", "response", "label"}` (slime's `remote_rm` payload, plus
`metadata`) to an HTTP endpoint and use its JSON answer as the reward (a number, or a dict read
with `reward_key`). Retries with backoff, a timeout per attempt and a concurrency limit."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from pipeline.engines.http_util import LoopLocal, with_retries

__all__ = ["RemoteReward"]

logger = logging.getLogger(__name__)


class RemoteReward:
    """Client of a reward server (see module docstring)."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_retries: int = 3,
                 backoff_s: float = 0.5, max_concurrency: int = 16) -> None:
        if not url:
            raise ValueError("remote reward: reward.remote_url (or args.rm_url) is not set")
        self.url = url
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._http = LoopLocal(lambda: httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(max_connections=max_concurrency)),
            max_concurrency)

    @staticmethod
    def payload(sample: Any) -> dict[str, Any]:
        """The JSON body for one sample."""
        prompt = sample.prompt
        return {"prompt": prompt, "response": sample.response, "label": sample.label,
                "metadata": dict(getattr(sample, "metadata", None) or {})}

    async def __call__(self, sample: Any) -> Any:
        """The server's answer for `sample`."""
        client, semaphore = self._http.get()
        body = self.payload(sample)

        async def once() -> Any:
            resp = await client.post(self.url, json=body)
            resp.raise_for_status()
            return resp.json()

        async with semaphore:
            value = await with_retries(once, max_retries=self.max_retries, backoff_s=self.backoff_s,
                                       what=f"remote reward for sample {sample.index} at {self.url}")
        if not isinstance(value, (int, float, dict)) or isinstance(value, bool):
            raise ValueError(f"remote reward at {self.url} answered {value!r:.200}; expected a "
                             f"number or a JSON object")
        return value

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()
