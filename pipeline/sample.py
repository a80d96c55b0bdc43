"""The `Sample`: one generated (or to-be-generated) trajectory, field-compatible with slime.

Field order and defaults follow SPEC §1 exactly, so code that builds a Sample positionally
(as slime plugins sometimes do) keeps working.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Sample"]

_FINISH_TO_STATUS = {"length": "truncated", "abort": "aborted", "stop": "completed"}


@dataclass
class Sample:
    """One trajectory: prompt, response tokens, reward and bookkeeping (SPEC §1)."""

    class Status(str, Enum):
        """Lifecycle of a sample; the values are the strings used in dumps and checkpoints."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None  # any JSON value: a string, number, list or dict
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Sample.Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: every field (status as its string) plus any extra attributes."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        out["status"] = Sample.Status(self.status).value
        for key, value in self.__dict__.items():
            if key not in out:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """Invert `to_dict`; keys that are not fields are kept as attributes."""
        names = _field_names()
        known = {k: v for k, v in data.items() if k in names}
        if "status" in known:
            known["status"] = Sample.Status(known["status"])
        sample = cls(**known)
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    # ------------------------------------------------------------------ reward
    def get_reward_value(self, args: Any) -> Any:
        """The raw reward, or `reward[args.reward_key]` when a reward key is set."""
        key = getattr(args, "reward_key", None) if args is not None else None
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
    ) -> None:
        """Grow the response: tokens, response_length, loss_mask and log-probs move together.

        `trainable=False` marks tool/environment tokens (loss mask 0). A
        `meta_info["finish_reason"]["type"]` of length/abort/stop sets the status.
        Raises ValueError when loss_mask / rollout_log_probs lengths disagree with
        response_length, or when log_probs does not match tokens.
        """
        self.check_lengths()  # an already inconsistent sample fails before anything changes
        tokens = list(tokens)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(
                f"sample {self.index}: {len(log_probs)} log-probs for {len(tokens)} tokens"
            )
        if self.rollout_log_probs is None and log_probs is not None and self.response_length:
            raise ValueError(
                f"sample {self.index}: log-probs given now but not for the "
                f"{self.response_length} earlier response tokens"
            )
        self.tokens = list(self.tokens) + tokens
        mask = list(self.loss_mask) if self.loss_mask is not None else [1] * self.response_length
        mask.extend([1 if trainable else 0] * len(tokens))
        self.loss_mask = mask
        if log_probs is not None:
            self.rollout_log_probs = list(self.rollout_log_probs or []) + [float(x) for x in log_probs]
        elif self.rollout_log_probs is not None:
            # tool tokens carry no log-probs; keep alignment with zeros
            self.rollout_log_probs = list(self.rollout_log_probs) + [0.0] * len(tokens)
        self.response_length += len(tokens)
        if text is not None:
            self.response += text
        if meta_info is not None:
            finish = meta_info.get("finish_reason")
            kind = finish.get("type") if isinstance(finish, dict) else finish
            if kind in _FINISH_TO_STATUS:
                self.status = Sample.Status(_FINISH_TO_STATUS[kind])
        self.check_lengths()

    def check_lengths(self) -> None:
        """Raise ValueError when loss_mask / rollout_log_probs disagree with response_length."""
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


def _field_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(Sample))
