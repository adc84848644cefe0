"""The ``boxes`` judge: does a detector find the same objects, whatever order it lists them in?

An end-to-end detector's outputs are its top K boxes (TopK or NonMaxSuppression inside), and a
reduced-precision run may list the same boxes in another order, or swap two of equal score:
compared element by element they differ (cosine 0.787 on a 300-box DETR export whose boxes were
the same ones reordered). Here the boxes scoring above a threshold on each side are matched to the
other side's by intersection over union, in any order::

    agreement = (reference boxes matched + boxes under test matched) / (both sides' kept boxes)

A box is matched by any box of the other side at IoU >= ``iou`` (and the same label, where labels
are known) whose score is above the threshold less a margin: a box scoring 0.49 against 0.51 is
the same detection on either side of the line, not a missed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["boxes_agreement", "split_detections"]

#: A score within this of the threshold still matches (probabilities; logits take 4x).
_MARGIN = 0.05


def split_detections(
    boxes: np.ndarray, scores: np.ndarray | None, labels: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(boxes [B, K, 4], scores [B, K], labels [B, K] or None)`` from a detector's outputs.

    ``boxes`` is ``[..., K, 4]``, or ``[..., K, 5+]`` holding the score in its 5th column and the
    label in its 6th when ``scores`` is None; ``scores`` is ``[..., K]``, ``[..., K, 1]`` or
    ``[..., K, C]`` (per-class scores: the best one and its class).
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim == 1:
        boxes = boxes[None]
    k, width = boxes.shape[-2], boxes.shape[-1]
    flat = boxes.reshape(-1, k, width)
    if scores is None:
        if width < 5:
            # No scores anywhere: every box counts.
            return flat[..., :4], np.ones(flat.shape[:2]), None
        found = flat[..., 5] if width > 5 and labels is None else labels
        return flat[..., :4], flat[..., 4], found if found is None else np.asarray(found)
    s = np.asarray(scores, dtype=np.float64)
    if s.size == flat.shape[0] * k:
        s = s.reshape(flat.shape[0], k)
    elif s.size % (flat.shape[0] * k) == 0:
        per_class = s.reshape(flat.shape[0], k, -1)
        s = per_class.max(-1)
        if labels is None:
            labels = per_class.argmax(-1)
    else:
        raise ValueError(f"scores of shape {np.shape(scores)} do not fit boxes {boxes.shape}")
    if labels is not None:
        labels = np.asarray(labels).reshape(flat.shape[0], k)
    return flat[..., :4], s, labels


def boxes_agreement(
    got: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    want: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    settings: Mapping[str, Any],
) -> tuple[float, str]:
    """The matched share of the kept boxes of both sides, and what was measured in words.

    Args:
        got / want: :func:`split_detections` of the outputs under test and of the reference.
        settings: ``score_threshold`` (default 0.5 for scores in [0, 1], else 0: a logit's
            even odds), ``iou`` (default 0.5), ``format`` (``xyxy`` or ``cxcywh``; default: xyxy
            unless a reference box has x2 < x1 or y2 < y1).
    """
    (gb, gs, gl), (wb, ws, wl) = got, want
    if gb.shape[0] != wb.shape[0]:
        return 0.0, f"{gb.shape[0]} image(s) of boxes vs {wb.shape[0]}"
    probabilities = bool(np.all((ws >= 0) & (ws <= 1)))
    threshold = float(settings.get("score_threshold", 0.5 if probabilities else 0.0))
    margin = _MARGIN if probabilities else 4 * _MARGIN
    iou_least = float(settings.get("iou", 0.5))
    form = settings.get("format") or _format(wb[ws > threshold])
    matched = kept = 0
    for i in range(wb.shape[0]):
        for side, other in (((wb, ws, wl), (gb, gs, gl)), ((gb, gs, gl), (wb, ws, wl))):
            boxes, scores, labels = side[0][i], side[1][i], None if side[2] is None else side[2][i]
            o_boxes, o_scores = other[0][i], other[1][i]
            o_labels = None if other[2] is None else other[2][i]
            mine = scores > threshold
            theirs = o_scores > threshold - margin
            kept += int(mine.sum())
            if not mine.any():
                continue
            overlap = _iou(_xyxy(boxes[mine], form), _xyxy(o_boxes[theirs], form))
            if labels is not None and o_labels is not None:
                overlap = np.where(labels[mine][:, None] == o_labels[theirs][None, :], overlap, 0)
            if overlap.size:
                matched += int(np.count_nonzero(overlap.max(1) >= iou_least))
    score = 1.0 if kept == 0 else matched / kept
    detail = (
        f"{matched} of {kept} boxes scoring > {threshold:g} matched at IoU >= {iou_least:g} "
        f"in any order ({form})"
    )
    return score, detail


def _format(boxes: np.ndarray) -> str:
    if boxes.size and (np.any(boxes[:, 2] < boxes[:, 0]) or np.any(boxes[:, 3] < boxes[:, 1])):
        return "cxcywh"
    return "xyxy"


def _xyxy(boxes: np.ndarray, form: str) -> np.ndarray:
    if form == "cxcywh":
        c, half = boxes[:, :2], np.abs(boxes[:, 2:4]) / 2
        return np.concatenate([c - half, c + half], axis=1)
    return boxes


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``a [M, 4]`` and ``b [N, 4]`` (x1, y1, x2, y2) -> ``[M, N]``."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    same = np.all(a[:, None, :] == b[None, :, :], axis=-1)  # two equal empty boxes: the same
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), same.astype(float))
