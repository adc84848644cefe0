"""Task-level judges: does the *task* come out the same?

Reduced precision and quantization change numbers but should not change a classifier's answer, a
mask, a decoded sequence or a detector's boxes. :func:`judge` builds one from a spec
(``{"kind": "top1"}``, the kit's ``judge`` entries); each takes the outputs of the model under
test and of the reference and returns one :class:`Judgement` per output judged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.parity._boxes import boxes_agreement, split_detections
from ferry.parity._compare import _as_float64

__all__ = ["JUDGE_KINDS", "Judge", "Judgement", "judge"]


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A judge's verdict on one output.

    Attributes:
        kind: the judge (``top1``, ``cosine``, ``mask``, ``argmax_seq``, ``boxes``, ``labels``,
            ``custom``).
        output: the output judged.
        score: the measured agreement (a fraction, or a cosine similarity).
        threshold: the least score that passes.
        passed: ``score >= threshold`` (and the IoU condition, for masks).
        detail: what was measured, in words.
    """

    kind: str
    output: str
    score: float
    threshold: float
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: A judge: ``(outputs under test, reference outputs) -> one Judgement per output judged``.
Judge = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], list["Judgement"]]

#: What each kind measures (the kit's ``judge_kinds``).
JUDGE_KINDS = {
    "top1": "the argmax of each sample (over all but the first axis) agrees on min_agreement "
    "of the samples (default all); entries within 0.1% of the largest magnitude are ties",
    "cosine": "the cosine similarity of each output, flattened, is >= min (default 0.999)",
    "mask": "(output > threshold) agrees on >= min_agreement of the elements; with min_iou, "
    "the masks' intersection over union is >= min_iou",
    "argmax_seq": "the argmax over the last axis (or axis) agrees at >= min_agreement of the "
    "positions (entries within 0.1% of the largest magnitude are ties)",
    "boxes": "boxes scoring above score_threshold are matched, in any order, to boxes of the "
    "other side at IoU >= iou (default 0.5; same label where labels are given); the matched "
    "share is >= min_agreement (default 0.95). scores: the output of the boxes' scores (else "
    "the boxes' 5th column); labels: their classes (else the 6th column, or the scores' argmax)",
    "labels": "integer labels (an ArgMax's classes) are equal at >= min_agreement of the "
    "positions (default all)",
    "custom": "a function (got, want) -> bool or a score in [0, 1] (passes at >= min, default 1)",
}

_JUDGE_KEYS = {
    "top1": {"min_agreement"},
    "cosine": {"min"},
    "mask": {"threshold", "min_agreement", "min_iou"},
    "argmax_seq": {"min_agreement", "axis"},
    "boxes": {"scores", "labels", "score_threshold", "iou", "min_agreement", "format"},
    "labels": {"min_agreement"},
    "custom": {"function", "min"},
}


def judge(
    spec: Mapping[str, Any] | str,
    *,
    dequantize: Mapping[str, tuple[float, int]] | None = None,
) -> Judge:
    """A judge from its spec.

    Args:
        spec: ``{"kind": "top1" | "cosine" | "mask" | "argmax_seq" | "boxes" | "labels" |
            "custom", ...}`` with the
            kind's settings (see :data:`JUDGE_KINDS`) and optionally ``"output"`` (judge that
            output only; otherwise every output); a bare kind name takes the defaults.
            ``"custom"`` takes ``"function"``: a callable ``(got, want) -> bool | float``.
        dequantize: ``{output: (scale, zero_point)}`` for quantized outputs, which are judged as
            ``(q - zero_point) * scale``.

    Raises:
        InvalidInputError: an unknown kind, an unknown or missing setting.
    """
    if isinstance(spec, str):
        spec = {"kind": spec}
    settings = dict(spec)
    kind = settings.pop("kind", None)
    if kind not in _JUDGE_KEYS:
        raise InvalidInputError(
            f"unknown judge kind {kind!r}; choose one of {', '.join(_JUDGE_KEYS)}"
        )
    output = settings.pop("output", None)
    unknown = sorted(set(settings) - _JUDGE_KEYS[kind])
    if unknown:
        raise InvalidInputError(
            f"judge {kind!r} has no setting {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(_JUDGE_KEYS[kind] | {'output'}))}"
        )
    if kind == "mask" and "threshold" not in settings:
        raise InvalidInputError("judge 'mask' needs a threshold (the value above which it is set)")
    if kind == "custom" and not callable(settings.get("function")):
        raise InvalidInputError("judge 'custom' needs a function (got, want) -> bool or float")
    if kind == "boxes" and output is None:
        raise InvalidInputError("judge 'boxes' needs the output that holds the boxes ('output')")
    measure = _MEASURES.get(kind)
    scales = dict(dequantize or {})

    def run(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> list[Judgement]:
        names = [output] if output is not None else list(got)
        # The boxes judge reads its scores and labels from their own outputs too.
        needed = names + [settings[k] for k in ("scores", "labels") if settings.get(k)]
        for name in needed:
            if name not in got or name not in want:
                raise InvalidInputError(
                    f"judge {kind!r}: output {name!r} is missing; outputs are {sorted(got)}"
                )
        if kind == "boxes":
            return [_boxes(names[0], got, want, settings, scales)]
        assert measure is not None
        verdicts = []
        for name in names:
            g, w = _judged(got[name], scales.get(name)), _judged(want[name], scales.get(name))
            verdicts.append(measure(kind, name, g, w, settings))
        return verdicts

    return run


def _judged(array: Any, quantization: tuple[float, int] | None) -> np.ndarray:
    a = np.asarray(array)
    if quantization is not None:
        scale, zero_point = quantization
        return (a.astype(np.float64) - zero_point) * scale
    return _as_float64(a) if a.dtype.kind != "b" else a.astype(np.float64)


def _agreement(kind: str, name: str, agree: np.ndarray, least: float, what: str) -> Judgement:
    score = float(np.mean(agree)) if agree.size else 1.0
    detail = f"{what} agree on {score:.2%} (needs {least:.2%})"
    return Judgement(kind, name, score, least, score >= least, detail)


#: Two scores closer than this fraction of the reference's largest magnitude are a tie: picking
#: either is agreement (a probability map's background rows are all ~0, a saturated sigmoid's
#: text rows all ~1, and which of the tied entries wins is rounding, not a different answer).
#: Quantized integers tie within one step (their last bit rounds either way across engines).
_TIE = 1e-3


def _argmax_agreement(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per row of the last axis: does the argmax of ``got`` pick a (near-)best entry of ``want``?"""
    want = want.astype(np.float64)
    picked = np.take_along_axis(want, got.argmax(-1)[..., None], axis=-1)[..., 0]
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    margin = max(_TIE * scale, 1.0 if got.dtype.kind in "iu" else 0.0)
    return np.asarray(picked >= want.max(-1) - margin)


def _top1(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    if g.shape != w.shape or g.ndim == 0:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    rows = max(g.shape[0], 1) if g.ndim > 1 else 1
    agree = _argmax_agreement(g.reshape(rows, -1), w.reshape(rows, -1))
    return _agreement(kind, name, agree, least, f"top-1 classes of {rows} sample(s)")


def _argmax_seq(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    if g.shape != w.shape or g.ndim == 0:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    axis = s.get("axis")
    if axis is not None:
        if not -g.ndim <= int(axis) < g.ndim:
            return Judgement(kind, name, 0.0, least, False, f"no axis {axis} in shape {g.shape}")
        g, w = np.moveaxis(g, int(axis), -1), np.moveaxis(w, int(axis), -1)
    agree = _argmax_agreement(g, w)
    what = "argmax positions" if axis is None else f"argmax positions (over axis {axis})"
    return _agreement(kind, name, agree, least, what)


def _labels(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    if g.shape != w.shape:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    return _agreement(kind, name, np.asarray(g == w), least, "labels")


def _cosine(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min", 0.999))
    if g.size != w.size:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    a, b = g.reshape(-1), w.reshape(-1)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        same = bool(np.array_equal(a, b, equal_nan=True))
        score = 1.0 if same else 0.0
        return Judgement(
            kind, name, score, least, same, "non-finite values " + ("agree" if same else "differ")
        )
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if np.array_equal(a, b):
        score = 1.0  # rounding in a @ b would give 0.9999999999999999 for identical outputs
    else:
        score = float(a @ b) / (na * nb) if na and nb else 0.0
        score = min(score, 1.0)
    return Judgement(
        kind, name, score, least, score >= least, f"cosine similarity {score:.6f} (needs {least})"
    )


def _mask(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    threshold = float(s["threshold"])
    if g.shape != w.shape:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    a, b = g > threshold, w > threshold
    verdict = _agreement(kind, name, a == b, least, f"mask elements (> {threshold:g})")
    min_iou = s.get("min_iou")
    if min_iou is None:
        return verdict
    union = int(np.count_nonzero(a | b))
    iou = 1.0 if union == 0 else int(np.count_nonzero(a & b)) / union
    passed = verdict.passed and iou >= float(min_iou)
    detail = f"{verdict.detail}; IoU {iou:.4f} (needs {float(min_iou)})"
    return dataclasses.replace(verdict, passed=passed, detail=detail)


def _boxes(
    name: str,
    got: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    s: dict[str, Any],
    scales: Mapping[str, tuple[float, int]],
) -> Judgement:
    least = float(s.get("min_agreement", 0.95))

    def side(outputs: Mapping[str, np.ndarray]) -> Any:
        scores, labels = s.get("scores"), s.get("labels")
        return split_detections(
            _judged(outputs[name], scales.get(name)),
            None if not scores else _judged(outputs[scores], scales.get(scores)),
            None if not labels else np.asarray(outputs[labels]),
        )

    try:
        score, detail = boxes_agreement(side(got), side(want), s)
    except ValueError as e:
        return Judgement("boxes", name, 0.0, least, False, str(e))
    return Judgement("boxes", name, score, least, score >= least, f"{detail} (needs {least:.2%})")


def _custom(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min", 1.0))
    result = s["function"](g, w)
    score = float(result)
    detail = f"{getattr(s['function'], '__name__', 'function')} gave {result!r}"
    return Judgement(kind, name, score, least, score >= least, detail)


_MEASURES: dict[str, Callable[[str, str, np.ndarray, np.ndarray, dict[str, Any]], Judgement]] = {
    "top1": _top1,
    "cosine": _cosine,
    "mask": _mask,
    "argmax_seq": _argmax_seq,
    "labels": _labels,
    "custom": _custom,
}
