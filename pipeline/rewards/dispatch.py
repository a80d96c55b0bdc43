"""RewardDispatcher: one reward per sample, resolved per sample (docs/contracts.md §6 "Rewards").

Resolution order: `sample.custom_rm_path`, `args.custom_rm_path` (= `reward.custom_rm_path`),
`sample.metadata["rm_type"]`, `args.rm_type` (= `reward.rm_type`). Custom functions are
`async fn(args, sample)`, or `async fn(args, samples)` in group mode (`group_rm`, slime's name):
then each function gets the list of the samples that resolved to it, in order. Sync functions
work too. Built-in rm types (slime's names, `rm_types.RM_TYPES`): `math`, `deepscaler`, `dapo`,
`f1`, `gpqa`, `ifbench`, `random`, `remote` / `remote_rm`. A `boxed_` prefix grades only the
content of the last `\\boxed{...}` (math: no box scores 0; other types receive the boxed content,
or "" without a box, as the response). The sympy-based and IFBench graders run in a thread pool
with a timeout so the event loop never blocks.
The dispatcher sets nothing: the caller assigns `sample.reward`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pipeline.slime import stand_ins
from pipeline.config.plugins import SLOTS_BY_NAME, allowed_targets, check_call, load_object
from pipeline.rewards.ifbench import grade_ifbench
from pipeline.rewards.labels import is_empty_label
from pipeline.rewards.math import grade, last_boxed
from pipeline.rewards.math_rules import grade_dapo, grade_deepscaler
from pipeline.rewards.remote import RemoteReward
from pipeline.rewards.rm_types import RM_TYPES, rm_type_problem, split_rm_type
from pipeline.rewards.text_rules import f1_reward, grade_gpqa

__all__ = ["RewardDispatcher", "BUILTIN_RM_TYPES", "grading_label", "reward_counts"]

logger = logging.getLogger(__name__)

BUILTIN_RM_TYPES = tuple(RM_TYPES)


class RewardDispatcher:
    """Scores samples (see module docstring)."""

    def __init__(
        self,
        rm_type: str | None = "math",
        custom_rm_path: str | None = None,
        group_rm: bool = False,
        remote_url: str | None = None,
        remote_timeout_s: float = 30.0,
        remote_max_retries: int = 3,
        remote_backoff_s: float = 0.5,
        remote_max_concurrency: int = 16,
        grade_timeout_s: float = 10.0,
        grade_workers: int = 2,
        timeout_reward: float = 0.0,
        label_field: str | None = None,
    ) -> None:
        self.rm_type = rm_type
        self.custom_rm_path = custom_rm_path
        self.group_rm = group_rm
        self.remote_url = remote_url
        self._remote_kwargs = dict(timeout_s=remote_timeout_s, max_retries=remote_max_retries,
                                   backoff_s=remote_backoff_s, max_concurrency=remote_max_concurrency)
        self.grade_timeout_s = grade_timeout_s
        self.grade_workers = grade_workers
        self.timeout_reward = timeout_reward
        self.label_field = label_field
        self._pool: ThreadPoolExecutor | None = None
        self._remote: RemoteReward | None = None
        self._fns: dict[str, Any] = {}
        self.timeouts = 0

    # -- public API ---------------------------------------------------------------------------

    async def score(self, args: Any, samples: list[Any]) -> list[Any]:
        """Rewards for `samples`, in order."""
        results: list[Any] = [None] * len(samples)
        group_rm = bool(_arg(args, "group_rm", self.group_rm))
        by_path: dict[str, list[int]] = {}
        tasks: list[Any] = []
        for i, sample in enumerate(samples):
            path = (getattr(sample, "custom_rm_path", None) or _arg(args, "custom_rm_path", None)
                    or self.custom_rm_path)
            if path:
                if group_rm:
                    by_path.setdefault(path, []).append(i)
                else:
                    tasks.append(self._one_custom(args, path, sample, results, i))
                continue
            tasks.append(self._one_builtin(args, sample, results, i))
        for path, idx in by_path.items():
            tasks.append(self._group_custom(args, path, [samples[i] for i in idx], results, idx))
        await asyncio.gather(*tasks)
        return results

    def close(self) -> None:
        """Shut the grading pool and the remote client down."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._remote is not None:
            self._remote.close()

    # -- custom functions ---------------------------------------------------------------------

    def _load(self, args: Any, path: str) -> Any:
        if path not in self._fns:
            slot = SLOTS_BY_NAME["custom_rm"]
            fn = load_object(path, allowed_targets(args), slot.where)
            check_call(fn, path, slot.where, slot.calls)
            self._fns[path] = fn
        return self._fns[path]

    async def _one_custom(self, args: Any, path: str, sample: Any, out: list[Any], i: int) -> None:
        fn = self._load(args, path)
        theirs = stand_ins.to_slime_sample(sample)  # slime's own Sample where slime is importable
        try:
            out[i] = await _maybe_await(fn(_args_for_custom(args), theirs))
            stand_ins.from_slime_sample(theirs, theirs, sample)
        except Exception as exc:
            exc.add_note(f"raised by the reward function {path!r} (custom_rm_path) on sample "
                         f"{getattr(sample, 'index', '?')}")
            raise

    async def _group_custom(self, args: Any, path: str, group: list[Any], out: list[Any],
                            idx: list[int]) -> None:
        fn = self._load(args, path)
        theirs = [stand_ins.to_slime_sample(s) for s in group]
        try:
            rewards = await _maybe_await(fn(_args_for_custom(args), theirs))
            for handed, sample in zip(theirs, group):
                stand_ins.from_slime_sample(handed, handed, sample)
        except Exception as exc:
            exc.add_note(f"raised by the group reward function {path!r} (custom_rm_path)")
            raise
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(group):
            raise ValueError(f"group reward function {path} returned {rewards!r:.200}; expected a "
                             f"list of {len(group)} rewards (one per sample)")
        for i, r in zip(idx, rewards):
            out[i] = r

    # -- built-in types -----------------------------------------------------------------------

    async def _one_builtin(self, args: Any, sample: Any, out: list[Any], i: int) -> None:
        metadata = getattr(sample, "metadata", None)
        metadata = metadata if isinstance(metadata, dict) else {}
        rm_type, source = metadata.get("rm_type"), 'sample.metadata["rm_type"]'
        if not rm_type:
            rm_type, source = _arg(args, "rm_type", None) or self.rm_type, "rm_type"
        if not rm_type:
            raise ValueError(f"sample {sample.index}: no reward configured (set reward.rm_type, "
                             f"reward.custom_rm_path or the sample's metadata rm_type)")
        problem = rm_type_problem(rm_type, source)
        if problem is not None:
            raise ValueError(f"sample {sample.index}: {problem}; or set custom_rm_path to a reward "
                             f"function 'pkg.mod.fn'")
        boxed, base = split_rm_type(rm_type)
        response = sample.response or ""
        if boxed and base != "math":
            response = last_boxed(response) or ""
        if base in ("remote", "remote_rm"):
            out[i] = await self._remote_client(args)(_with_response(sample, response) if boxed else sample)
        elif base == "random":
            out[i] = _seeded_coin(_arg(args, "seed", 0), sample.index, response)
        elif base == "f1":
            out[i] = f1_reward(response, sample.label)
        elif base == "gpqa":
            out[i] = grade_gpqa(response, sample.label, metadata)
        elif base == "dapo":
            out[i] = grade_dapo(response, grading_label(sample, self.label_field, base))
        else:  # math, deepscaler, ifbench: may be slow, so they run in the pool with a timeout
            out[i] = await self._in_pool(sample, base, response, boxed, metadata)

    async def _in_pool(self, sample: Any, base: str, response: str, boxed: bool, metadata: dict[str, Any]) -> Any:
        if base == "math":
            call = functools.partial(grade, response, grading_label(sample, self.label_field, base), boxed)
        elif base == "deepscaler":
            call = functools.partial(grade_deepscaler, response, grading_label(sample, self.label_field, base))
        else:
            call = functools.partial(grade_ifbench, response, sample.label, metadata)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.grade_workers, thread_name_prefix="reward-grade")
        future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        try:
            return await asyncio.wait_for(future, self.grade_timeout_s)
        except asyncio.TimeoutError:
            self.timeouts += 1
            logger.warning("%s grading of sample %s took over %.1fs; reward %s", base, sample.index,
                           self.grade_timeout_s, self.timeout_reward)
            return self.timeout_reward

    def _remote_client(self, args: Any) -> RemoteReward:
        if self._remote is None:
            url = self.remote_url or _arg(args, "rm_url", None)
            self._remote = RemoteReward(url, **self._remote_kwargs)
        return self._remote


def grading_label(sample: Any, label_field: str | None, reward: str) -> str | int | float:
    """The label a text-grading reward compares with: `sample.label`, or its `label_field` entry
    when the label is a dict (`reward.label_field`). Labels stay JSON values end to end, so a
    dict or list label (or a missing one) is a clear error naming the sample, not graded as text."""
    label = getattr(sample, "label", None)
    where = f"sample {getattr(sample, 'index', '?')} (group {getattr(sample, 'group_index', '?')})"
    if label_field is not None:
        if not isinstance(label, dict) or label_field not in label:
            keys = f"its keys are {sorted(label)}" if isinstance(label, dict) else f"it is a {type(label).__name__}"
            raise ValueError(f"{where}: reward.label_field={label_field!r} picks an entry of a dict label, "
                             f"but the label is {label!r:.200} ({keys})")
        label = label[label_field]
    if label is None or is_empty_label(label):
        # pre-flight refuses such rows of the prompt files (labels.py): this one came from elsewhere
        raise ValueError(f"{where}: the {reward} reward needs a label to compare with, but the label is empty "
                         f"({label!r:.80}); set data_source.label_key, or give the sample a label")
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        hint = (f"set reward.label_field=<key> to grade one entry (keys: {sorted(label)})" if isinstance(label, dict)
                else "grade it with a reward function of your own (reward=custom)")
        raise ValueError(f"{where}: the {reward} reward compares the answer with a string or number "
                         f"label, but the label is a {type(label).__name__}: {label!r:.200}; {hint}")
    return label


def reward_counts(reward: Any) -> dict[str, int]:
    """The counted reward failures of `reward` so far, as metrics (`reward/<name>`): grading timeouts
    (scored `timeout_reward`) and null answers of the remote reward model (scored 0). Empty for a
    reward object that is not a `RewardDispatcher`."""
    if not isinstance(reward, RewardDispatcher):
        return {}
    remote = reward._remote
    return {"reward/remote_null_answers": remote.null_answers if remote is not None else 0,
            "reward/grade_timeouts": reward.timeouts}


def _arg(args: Any, name: str, default: Any) -> Any:
    """`args.name` when the namespace has it (SlimeArgs raises on unknown names): the dispatcher also
    grades for slime itself (a custom_rm_path), whose args lack this config's keys."""
    if args is None:
        return default
    try:
        value = getattr(args, name)
    except AttributeError:
        return default
    return default if value is None else value


def _args_for_custom(args: Any) -> Any:
    """The args a custom reward function sees: `custom_rm_path` None, as slime's own dispatcher
    sees it, so a dispatcher named as the custom reward (slime's `rm_hub.async_rm`, which calls
    `args.custom_rm_path` when set) grades by rm_type instead of calling itself forever."""
    if _arg(args, "custom_rm_path", None) is None:
        return args
    replace = getattr(args, "replace", None)
    if callable(replace):  # SlimeArgs
        return replace(custom_rm_path=None)
    view = copy.copy(args)  # an argparse / SimpleNamespace stand-in
    view.custom_rm_path = None
    return view


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _with_response(sample: Any, response: str) -> Any:
    """A shallow view of `sample` with another response (the sample itself is not changed)."""
    try:
        return replace(sample, response=response)
    except TypeError:  # not a dataclass (e.g. a duck-typed sample)
        import copy

        clone = copy.copy(sample)
        clone.response = response
        return clone


def _seeded_coin(seed: Any, index: Any, response: str) -> int:
    """slime's `random` reward (0 or 1), reproducible: drawn from (seed, sample index, response)."""
    digest = hashlib.sha256(f"{seed}|{index}|{response}".encode()).digest()
    return digest[0] & 1
