"""Rule-based text rewards with slime's rm_type names `f1` and `gpqa`.

`f1` (the SQuAD / HotpotQA answer F1): both texts are lower-cased, stripped of punctuation and
of the articles a / an / the, and split on whitespace; the reward is the harmonic mean of token
precision and recall over the multiset of shared tokens (0.0 when nothing is shared). A yes / no /
noanswer answer on either side scores 0.0 unless both sides are that same word. A label that is a
list of acceptable answers scores the best of them.

`gpqa` (multiple choice): the chosen letter is read from the text after the last `</think>`:
"answer is C", "Answer: (C)", "final answer: C", "C is correct", else a lone letter in the last
`\\boxed{}` (any case: `\\boxed{b}`, `\\boxed{\\text{(b)}}`), else the last standalone capital letter
among the valid ones (never one inside a word: "It" is not I). Valid letters: `metadata["valid_letters"]`, else A.. as
many as `metadata["choices"]`, else A-J. The right letter: `metadata["correct_letter"]`, else a
one-letter label, else a numeric label as an index, else the choice whose text equals the label.
Without a letter on either side, the response still scores when it contains the right choice's
text (or `metadata["correct_answer"]` / `["answer_text"]`, or a textual label) as whole words.
Reward 1.0 or 0.0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from pipeline.rewards.math import last_boxed

__all__ = ["extract_choice", "f1_reward", "grade_gpqa", "squad_normalize"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_EXCLUSIVE = ("yes", "no", "noanswer")

_LETTER_PATTERNS = (
    re.compile(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*[(\[]?([A-Za-z])[)\]]?(?![A-Za-z])", re.IGNORECASE),
    re.compile(r"\b([A-Z])[)\]]?\s+is\s+(?:the\s+)?correct\b"),
)
_STANDALONE = re.compile(r"\b([A-Z])\b")
# a boxed pick: one letter, maybe in parentheses and / or a \text{} / \textbf{} / \mathrm{} wrapper
_BOXED_LETTER = re.compile(r"^\s*(?:\\(?:text|textbf|mathrm)\s*\{)?\s*\(?\s*([A-Za-z])\s*\)?\s*\}?\s*$")
_DEFAULT_LETTERS = tuple(string.ascii_uppercase[:10])


def squad_normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1_one(prediction: str, truth: str) -> float:
    pred, gold = squad_normalize(prediction), squad_normalize(truth)
    if (pred in _EXCLUSIVE or gold in _EXCLUSIVE) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    shared = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_reward(response: str, label: Any) -> float:
    """Token F1 of `response` against `label` (see module docstring)."""
    if label is None:
        raise ValueError("rm_type f1 needs a label (set data_source.label_key)")
    truths = label if isinstance(label, (list, tuple)) else [label]
    return max((_f1_one(response or "", str(t)) for t in truths), default=0.0)


def _after_thinking(text: str) -> str:
    """The text after the last `</think>` (all of it when there is none)."""
    return text.rpartition("</think>")[2]


def _choice_texts(metadata: dict[str, Any]) -> list[str]:
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        return [str(c) for c in choices.values()]
    return [str(c) for c in choices] if choices else []


def _valid_letters(metadata: dict[str, Any], choices: list[str]) -> list[str]:
    given = metadata.get("valid_letters")
    if given:
        return [str(x).strip().upper() for x in given]
    if choices:
        return list(string.ascii_uppercase[: len(choices)])
    return list(_DEFAULT_LETTERS)


def extract_choice(response: str, valid: list[str]) -> str | None:
    """The option letter a response picks, or None."""
    text = _after_thinking(response)
    for pattern in _LETTER_PATTERNS:
        for match in pattern.finditer(text):
            letter = match.group(1).upper()
            if letter in valid:
                return letter
    boxed = _BOXED_LETTER.match(last_boxed(text) or "")
    if boxed is not None and boxed.group(1).upper() in valid:
        return boxed.group(1).upper()
    for letter in reversed(_STANDALONE.findall(text)):
        if letter in valid:
            return letter
    return None


def _right_letter(label: Any, metadata: dict[str, Any], valid: list[str], choices: list[str]) -> str | None:
    """The right option letter: metadata's `correct_letter`, a one-letter label, a numeric label as an index
    into `valid`, or the letter of the choice whose text equals the label; None without one."""
    given = metadata.get("correct_letter")
    if isinstance(given, str) and given.strip():
        return given.strip().upper()
    if isinstance(label, (int, float)) and not isinstance(label, bool):
        return valid[int(label)] if 0 <= int(label) < len(valid) else None
    if label is None:
        return None
    text = str(label).strip()
    if len(text) == 1 and text.upper() in valid:
        return text.upper()
    wanted = _alnum_words(text)
    for letter, choice in zip(valid, choices):
        if wanted and _alnum_words(choice) == wanted:
            return letter
    return None


def _alnum_words(text: str) -> str:
    """Lower-case alphanumerics separated by single spaces (GPQA's text comparison)."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", str(text).lower()).split())


def grade_gpqa(response: str, label: Any, metadata: dict[str, Any] | None = None) -> float:
    """GPQA multiple-choice reward (see module docstring)."""
    metadata = metadata or {}
    response = response or ""
    choices = _choice_texts(metadata)
    valid = _valid_letters(metadata, choices)
    right = _right_letter(label, metadata, valid, choices)
    picked = extract_choice(response, valid)
    if picked is not None and right is not None:
        return 1.0 if picked == right else 0.0
    targets = []
    if right is not None and right in valid and valid.index(right) < len(choices):
        targets.append(choices[valid.index(right)])
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    label_text = str(label).strip() if isinstance(label, str) else ""
    if label_text and not (len(label_text) == 1 and label_text.upper() in valid):
        targets.append(label_text)
    said = f" {_alnum_words(_after_thinking(response))} "
    # (slime's last rule, a picked letter equal to the label when no right letter is known, cannot
    # fire: such a label is a one-letter valid label, which `_right_letter` already made the right one)
    return 1.0 if any(t and f" {t} " in said for t in map(_alnum_words, targets)) else 0.0
