"""The `Sample`: one generated (or to-be-generated) trajectory, field-compatible with slime.

Field order and defaults follow docs/contracts.md §1 exactly, so code that builds a Sample positionally
(as slime plugins sometimes do) keeps working.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pipeline.samples.versions import as_version, call_versions, extend_runs
from pipeline.samples.meta import (LazyRecord, PrefixCacheInfo, SampleStatus, SpecInfo, StatusAttribute,
                                  routed_experts_rows, top_p_spans)

__all__ = ["Sample"]

_FINISH_TO_STATUS = {"length": "truncated", "abort": "aborted", "stop": "completed"}


@dataclass
class Sample:
    """One trajectory: prompt, response tokens, reward and bookkeeping (docs/contracts.md §1).

    `status` accepts any `Sample.Status`-valued enum member or string (slime's own enum too) and
    always holds ours. `spec_info` / `prefix_cache_info` are made on first read.
    """

    Status = SampleStatus
    SpecInfo = SpecInfo
    PrefixCacheInfo = PrefixCacheInfo

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: Any = None  # any JSON value: a string, number, list or dict
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    # top-p replay: response token i kept rollout_top_p_token_ids[offsets[i]:offsets[i + 1]]
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[Any]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: SampleStatus = StatusAttribute(SampleStatus.PENDING)  # type: ignore[assignment]
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = LazyRecord(SpecInfo)  # type: ignore[assignment]
    prefix_cache_info: PrefixCacheInfo = LazyRecord(PrefixCacheInfo)  # type: ignore[assignment]

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain data in field order: status as its string, `spec_info` / `prefix_cache_info` as
        dicts, then any extra attributes (JSON-able when the field values are)."""
        out: dict[str, Any] = {}
        for name in _FIELD_ORDER:
            out[name] = getattr(self, name)
        out["status"] = self.status.value
        out["spec_info"] = self.spec_info.to_dict()
        out["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        for key, value in self.__dict__.items():
            if key not in out:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Invert `to_dict` (dumps of earlier versions too: missing fields take their defaults);
        keys that are not fields are kept as attributes."""
        names = _field_names()
        known = {k: v for k, v in data.items() if k in names}
        sample = cls(**known)
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    # ------------------------------------------------------------------ reward
    def get_reward_value(self, args: Any) -> Any:
        """The raw reward, or `reward[args.reward_key]` when a reward key is set."""
        key = args.reward_key if args is not None else None
        if key:
            if not isinstance(self.reward, dict):
                raise ValueError(
                    f"sample {self.index}: reward_key={key!r} is set but the reward is "
                    f"{type(self.reward).__name__} ({self.reward!r}), expected a dict with that key"
                )
            if key not in self.reward:
                raise ValueError(
                    f"sample {self.index}: reward dict has no key {key!r} "
                    f"(keys: {sorted(self.reward)})"
                )
            return self.reward[key]
        return self.reward

    # ------------------------------------------------------------------ response growth
    @property
    def effective_response_length(self) -> int:
        """Number of trainable response tokens (sum of the loss mask, or all of them)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: list[int],
        log_probs: list[float] | None = None,
        trainable: bool = True,
        meta_info: dict[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Grow the response: tokens, response_length, loss_mask, log-probs and top-p spans move together.

        `trainable=False` marks tool/environment tokens (loss mask 0, log-prob 0, an empty top-p
        span; log-probs given for them are refused, as slime does). Unlike slime, trainable tokens
        may come without log-probs (an engine that returns none): rollout_log_probs then stays None. `meta_info` is an engine's answer metadata, folded in as slime does: top-p replay
        spans (`top_p_token_ids` / `top_p_token_offsets`, base64 int32 or lists) and
        `routed_experts` extend their fields; with a `finish_reason` (and `update_terminal_info`),
        its type length/abort/stop sets the status, `weight_version` is appended to
        `weight_versions` (after any other version of `token_weight_versions`, one version per new
        token, which also extends `metadata["weight_version_runs"]`, see
        `pipeline.samples.versions`), and the prefix-cache counters are added, and the speculative-decoding
        ones too when `args.sglang_speculative_algorithm` is set (only then, as slime: counters an engine
        reports without it are left out).
        Raises ValueError, changing nothing, when the lengths would disagree.
        """
        self.check_lengths()  # an already inconsistent sample fails before anything changes
        tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        log_probs = log_probs.tolist() if hasattr(log_probs, "tolist") else log_probs
        meta = meta_info or {}
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(
                f"sample {self.index}: {len(log_probs)} log-probs for {len(tokens)} tokens"
            )
        if log_probs is not None and tokens and not trainable:
            raise ValueError(f"sample {self.index}: non-trainable response tokens should not pass rollout log "
                             f"probabilities: {len(log_probs)} given for {len(tokens)} tool / environment tokens, whose "
                             f"log-prob is 0 (pass log_probs only with trainable=True, as in slime)")
        versions = meta.get("token_weight_versions")
        call_version = as_version(meta.get("weight_version"))
        if versions is None and trainable and call_version is not None:  # one version for the call (slime)
            versions = [call_version] * len(tokens)
        if versions is not None and len(versions) != len(tokens):
            raise ValueError(f"sample {self.index}: {len(versions)} token_weight_versions for {len(tokens)} tokens")
        if self.rollout_log_probs is None and log_probs is not None and self.response_length:
            raise ValueError(
                f"sample {self.index}: log-probs given now but not for the "
                f"{self.response_length} earlier response tokens"
            )
        top_p = self._grown_top_p(meta, len(tokens), trainable)
        # None without meta_info["routed_experts"] (args is read only when they are there)
        experts = routed_experts_rows(meta, args, len(self.tokens) + len(tokens), self.rollout_routed_experts)
        self.tokens = list(self.tokens) + tokens
        mask = list(self.loss_mask) if self.loss_mask is not None else [1] * self.response_length
        mask.extend([1 if trainable else 0] * len(tokens))
        self.loss_mask = mask
        if log_probs is not None:
            self.rollout_log_probs = list(self.rollout_log_probs or []) + [float(x) for x in log_probs]
        elif self.rollout_log_probs is not None:
            # tool tokens carry no log-probs; keep alignment with zeros
            self.rollout_log_probs = list(self.rollout_log_probs) + [0.0] * len(tokens)
        extend_runs(self, versions, len(tokens))
        self.response_length += len(tokens)
        if text is not None:
            self.response += text
        if top_p is not None:
            self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = top_p
        if experts is not None:
            self.rollout_routed_experts = experts
        if update_terminal_info and "finish_reason" in meta:
            self._fold_terminal_info(args, meta)
        self.check_lengths()

    def _grown_top_p(self, meta: dict[str, Any], new: int, trainable: bool) -> tuple[list[int], list[int]] | None:
        """The top-p replay fields after appending `new` tokens (None: unchanged)."""
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        spans = top_p_spans(meta, new) if new and meta else None
        if spans is not None:
            if offsets is None:
                if self.response_length:
                    raise ValueError(f"sample {self.index}: top-p spans given now but not for the "
                                     f"{self.response_length} earlier response tokens")
                return spans
            end = int(offsets[-1])
            return _ints(ids) + spans[0], _ints(offsets) + [end + o for o in spans[1][1:]]
        if offsets is None or not new:
            return None
        if trainable:
            raise ValueError(f"sample {self.index}: {new} trainable tokens without top-p spans, but the "
                             f"sample replays top-p (meta_info needs top_p_token_ids and top_p_token_offsets)")
        return _ints(ids), _ints(offsets) + [int(offsets[-1])] * new  # tool tokens: empty spans

    def _fold_terminal_info(self, args: Any, meta: dict[str, Any]) -> None:
        """Status, weight version and counters of an engine answer that finished a call."""
        # slime's switch, and only it (slime's test_spec_info_only_updated_when_speculative_enabled); a flag
        # this config lacks unless set with +sglang_speculative_algorithm=<algorithm>: getattr
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta)
        if "cached_tokens" in meta or "prompt_tokens" in meta:
            self.prefix_cache_info.add(meta)
        added = call_versions(meta)
        if added:
            self.weight_versions = [*self.weight_versions, *added]
        finish = meta["finish_reason"]
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if kind in _FINISH_TO_STATUS:
            self.status = _FINISH_TO_STATUS[kind]

    def check_lengths(self) -> None:
        """Raise ValueError when loss_mask / rollout_log_probs / top-p offsets disagree with
        response_length, or the top-p offsets with their token ids."""
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"sample {self.index}: loss_mask has {len(self.loss_mask)} entries but "
                f"response_length is {self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: rollout_log_probs has {len(self.rollout_log_probs)} entries "
                f"but response_length is {self.response_length}"
            )
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if ids is None and offsets is None:
            return
        if ids is None or offsets is None:
            raise ValueError(f"sample {self.index}: top-p replay needs both rollout_top_p_token_ids and "
                             f"rollout_top_p_token_offsets")
        if len(offsets) != self.response_length + 1 or int(offsets[-1]) != len(ids):
            raise ValueError(
                f"sample {self.index}: {len(offsets)} top-p offsets ending at {int(offsets[-1]) if len(offsets) else None} "
                f"for response_length {self.response_length} and {len(ids)} token ids "
                f"(expected response_length + 1 offsets ending at the number of ids)"
            )


def _ints(values: Any) -> list[int]:
    """A fresh int list of `values` (a list or a tensor / array)."""
    return [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(Sample))


def _field_names() -> frozenset[str]:
    return frozenset(_FIELD_ORDER)
