"""Choosing the next token from a step's logits: greedy, or sampled after a repetition penalty,
temperature, top-k and top-p (nucleus), each applied as transformers' logits processors apply
them, in the same order, so a seed-free comparison with ``transformers.generate`` holds step by
step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError

__all__ = [
    "Sampler",
    "SamplingOptions",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "sampling_options",
]

#: The options :func:`sampling_options` takes, each with the range it accepts (for the errors).
RANGES: dict[str, str] = {
    "temperature": "a float >= 0 (0: greedy)",
    "top_k": "an int >= 0 (0: off)",
    "top_p": "a float in (0, 1] (1: off)",
    "repetition_penalty": "a float > 0 (1: off)",
    "seed": "None or an int >= 0",
}


@dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen; made (and validated) by :func:`sampling_options`.

    Attributes:
        temperature: 0 for greedy (argmax, deterministic); else the logits are divided by it.
        top_k: keep the k most likely tokens (ties with the k-th kept too); 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose probability reaches top_p; 1
            keeps all.
        repetition_penalty: divide positive and multiply negative logits of ids already seen
            (prompt and generated); 1 is off.
        seed: the random generator's seed: the same seed gives the same tokens; None draws one.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_options(**options: Any) -> SamplingOptions:
    """Validated :class:`SamplingOptions` from keyword options.

    Raises:
        InvalidInputError: an unknown option (the known ones are listed), or a value out of its
            range (the option and its range are named).
    """
    unknown = sorted(set(options) - set(RANGES))
    if unknown:
        raise InvalidInputError(
            f"unknown sampling option {', '.join(map(repr, unknown))}; "
            f"the known ones are {', '.join(RANGES)}"
        )
    temperature = _number(options, "temperature", 0.0, lambda v: v >= 0)
    top_p = _number(options, "top_p", 1.0, lambda v: 0 < v <= 1)
    penalty = _number(options, "repetition_penalty", 1.0, lambda v: v > 0)
    top_k = _integer(options, "top_k", 0)
    seed = options.get("seed")
    if seed is not None:
        seed = _integer(options, "seed", 0)
    return SamplingOptions(float(temperature), top_k, float(top_p), float(penalty), seed)


def _bad(name: str, value: Any) -> InvalidInputError:
    return InvalidInputError(f"{name}={value!r} is out of range: it takes {RANGES[name]}")


def _number(options: dict[str, Any], name: str, default: float, ok: Any) -> float:
    value = options.get(name, default)
    # bool is an int to Python; True as a temperature is a slip, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise _bad(name, value)
    if not math.isfinite(float(value)) or not ok(float(value)):
        raise _bad(name, value)
    return float(value)


def _integer(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise _bad(name, value)
    return int(value)


def apply_repetition_penalty(
    logits: np.ndarray, seen: np.ndarray | list[int], penalty: float
) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor on one row: the logits of ``seen`` ids,
    divided by ``penalty`` where positive and multiplied where negative (a copy)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or len(seen) == 0:
        return out
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    picked = out[ids]
    out[ids] = np.where(picked < 0, picked * penalty, picked / penalty)
    return out


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """transformers' TemperatureLogitsWarper: the logits divided by ``temperature`` (> 0)."""
    return (np.asarray(logits, dtype=np.float32) / np.float32(temperature)).astype(np.float32)


def apply_top_k(logits: np.ndarray, top_k: int) -> np.ndarray:
    """transformers' TopKLogitsWarper: every logit below the k-th largest set to -inf (those
    equal to it kept); ``top_k`` 0 or not below the vocabulary keeps all."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if top_k <= 0 or top_k >= out.shape[-1]:
        return out
    kth = np.partition(out, -top_k)[-top_k]
    out[out < kth] = -np.inf
    return out


def apply_top_p(logits: np.ndarray, top_p: float) -> np.ndarray:
    """transformers' TopPLogitsWarper: sorted ascending, the tokens whose cumulative probability
    stays at or below ``1 - top_p`` set to -inf, the most likely one always kept."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if top_p >= 1.0:
        return out
    order = np.argsort(out, kind="stable")
    ascending = out[order]
    probs = _softmax(ascending)
    cumulative = np.cumsum(probs, dtype=np.float32)
    remove = cumulative <= np.float32(1.0 - top_p)
    remove[-1] = False
    out[order[remove]] = -np.inf
    return out


def _softmax(logits: np.ndarray) -> np.ndarray:
    top = np.max(logits)
    e = np.exp(logits - top, dtype=np.float32)
    return (e / e.sum(dtype=np.float32)).astype(np.float32)


class Sampler:
    """Picks each next id under one :class:`SamplingOptions`; one per generation, so a seed
    replays the same draws."""

    def __init__(self, options: SamplingOptions) -> None:
        self.options = options
        self._rng = np.random.default_rng(options.seed)

    def __call__(self, logits: np.ndarray, seen: np.ndarray | list[int]) -> int:
        """The next id from one row of logits ``[vocab]``, given the ids seen so far (prompt
        and generated, for the repetition penalty)."""
        o = self.options
        scores = apply_repetition_penalty(logits, seen, o.repetition_penalty)
        if o.greedy:
            return int(np.argmax(scores))
        scores = apply_temperature(scores, o.temperature)
        scores = apply_top_k(scores, o.top_k)
        scores = apply_top_p(scores, o.top_p)
        # Drawn in float64 so the cumulative sum reaches 1 without float32's drift.
        finite = np.isfinite(scores)
        shifted = np.where(finite, scores - scores[finite].max(), -np.inf).astype(np.float64)
        weights = np.exp(shifted)
        cumulative = np.cumsum(weights)
        draw = self._rng.random() * cumulative[-1]
        return int(min(np.searchsorted(cumulative, draw, side="right"), len(cumulative) - 1))
