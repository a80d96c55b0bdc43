"""Remote reward: POST `{"prompt", "response", "label"}` (slime's `remote_rm` payload, plus
`metadata`) to an HTTP endpoint and use its JSON answer as the reward (a number, or a dict read
with `reward_key`). Retries with backoff, a timeout per attempt and a concurrency limit.

Other answers, per JSON type: `true` / `false` score 1.0 / 0.0; `null` is a failure of the
server scored 0.0, counted (`null_answers`, the `reward/remote_null_answers` metric) and logged;
a string or a list is an error naming the URL and the value (slime passes any answer through,
and the rollout fails later, far from the server that sent it)."""

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
        self.null_answers = 0
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
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if value is None:
            self.null_answers += 1
            if self.null_answers & (self.null_answers - 1) == 0:  # the 1st, 2nd, 4th, 8th, ...
                logger.warning("remote reward at %s answered null for sample %s; scored 0.0 (%d null answers "
                               "so far, metric reward/remote_null_answers)", self.url, sample.index,
                               self.null_answers)
            return 0.0
        if not isinstance(value, (int, float, dict)):
            raise ValueError(f"remote reward at {self.url} answered {value!r:.200} for sample {sample.index}; "
                             f"expected a number or a JSON object read with reward_key (true / false count "
                             f"as 1 / 0, null as a failure scored 0)")
        return value

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()
