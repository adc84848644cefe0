"""The judge a model's task calls for, read from its outputs and the tail of its graph.

Before -> After::

    (model, its outputs on one input, optional) -> ([judge spec per judged output], one line why)

A quantized or reduced-precision model is right when the *task* comes out the same, and what the
task is shows in the outputs: a classifier's softmax over classes (top-1), a CTC recognizer's or
tagger's per-step classes (argmax sequence), a segmenter's per-pixel classes, a sigmoid map
(mask), a detector's boxes (matched by IoU in any order), an encoder's embedding (cosine). Cosine
on everything, the old default, kept every node of an OCR model float and still passed, passed a
segmenter at 98.45% per-pixel class agreement, and refused a detector whose top-300 boxes were
the same ones reordered.

How an output is read:

1. Its *head*: walking up from the output through ops that move or rescale values but do not
   change what they mean (Reshape, Transpose, Squeeze, Cast, Q/DQ, Resize, a bias Add or a scale
   Mul by a constant), the first op that computes: Softmax/LogSoftmax, Sigmoid, ArgMax, a linear
   op (Conv, Gemm, MatMul and their quantized forms), a normalization, anything else.
2. Its shape (the outputs given, else the declared one): where the classes are, how many.
3. Its siblings: boxes ``[.., K, 4]`` beside scores of the same K (or TopK/NonMaxSuppression
   feeding them) are a detector; a linear output beside a class output is a regression (cosine);
   per-step values beside a decoded sequence ride on it (not judged); recurrent state
   (``state_out:*``) and inputs passed through are not judged.

Thresholds are the kit's (``tests/real/kit/kit.json``): top1 on every sample, argmax agreement
and masks on 99% of the positions, cosine 0.999, boxes 95% matched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry._state_names import STATE_OUTPUT_PREFIX
from ferry.graph import constant, reduced_precision
from ferry.parity._budget import DEFAULT_BUDGET

__all__ = ["default_budget", "infer_judge", "task_judge_at"]

#: Ops that move, copy or rescale values without changing what they mean.
_TRANSPARENT = frozenset(
    {
        "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Cast",
        "CastLike", "QuantizeLinear", "DequantizeLinear", "Dropout", "Resize", "Upsample",
        "Slice", "Split", "Gather",
    }
)  # fmt: skip
#: Of those, the ones that may move the class axis.
_MOVING = frozenset({"Reshape", "Flatten", "Transpose", "Gather", "Squeeze", "Unsqueeze"})
#: Elementwise ops that are a bias or a scale when their other operand is a constant.
_AFFINE = frozenset({"Add", "Sub", "Mul", "Div"})
_LINEAR = frozenset(
    {
        "Conv", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "ConvInteger",
        "QLinearConv", "QLinearMatMul", "Einsum", "FusedMatMul", "BatchNormalization",
    }
)  # fmt: skip
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
_SIGMOID = frozenset({"Sigmoid", "HardSigmoid"})
_NORMALIZE = frozenset({"LpNormalization"})
_DETECTING = frozenset({"TopK", "NonMaxSuppression"})
#: A map's channel counts that may be values, not classes: an image's (1 or 3), a flow field's or
#: an offset map's 2. Such a map is judged by cosine (its numbers are the task).
_VALUES = (1, 2, 3)
#: Output names that say "an embedding" whatever op made them.
_EMBEDDING_NAME = re.compile(
    r"embed|emb$|^emb|feat|hidden|pool|vector|descriptor|latent|encod", re.I
)

#: The thresholds a judge passes at when nobody named one (the kit's).
THRESHOLDS: dict[str, tuple[str, float]] = {
    "top1": ("min_agreement", 1.0),
    "argmax_seq": ("min_agreement", 0.99),
    "mask": ("min_agreement", 0.99),
    "labels": ("min_agreement", 0.99),
    "boxes": ("min_agreement", 0.95),
    "cosine": ("min", 0.999),
}


class _Output:
    """One graph output as inference sees it."""

    def __init__(self, value: ir.Value, array: np.ndarray | None, opset: int) -> None:
        self.name = value.name or ""
        self.value = value
        self.opset = opset
        if array is not None:
            self.shape: tuple[int | None, ...] | None = tuple(np.shape(array))
            self.dtype: np.dtype[Any] | None = np.asarray(array).dtype
        else:
            self.shape = (
                None
                if value.shape is None
                else tuple(d if isinstance(d, int) else None for d in value.shape)
            )
            self.dtype = _np_dtype(value.dtype)
        self.head, self.moved, self.quantized_by, self.rescaled = _head(value)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def describe(self, noun: str) -> str:
        """``a [1, 40, 6625] sequence``: the shape (``?`` where unknown) and what it is."""
        if self.shape is None:
            return f"a {noun} of unknown shape"
        return "a [" + ", ".join("?" if d is None else str(d) for d in self.shape) + f"] {noun}"

    @property
    def is_float(self) -> bool:
        return self.dtype is None or self.dtype.kind == "f"


def infer_judge(
    model: ir.Model, outputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The judge specs ``model``'s task calls for, and one line saying why.

    Args:
        model: the model (its graph's tail is read; nothing is run).
        outputs: its outputs on one input, by output name or in output order (better than the
            declared shapes, which exporters get wrong); None: the declared shapes.

    Returns:
        ``(specs, reason)``: one spec per judged output for :func:`ferry.parity.judge` (each
        names its ``output``; a ``boxes`` spec also its ``scores`` and ``labels``), and e.g.
        ``"argmax_seq on 'softmax_0' (a [1, 40, 6625] sequence: Softmax over 6625 classes)"``.
        A model whose outputs say nothing gets ``[{"kind": "cosine", "min": 0.999}]``.
    """
    arrays = _by_name(model, outputs)
    opset = model.opset_imports.get("", model.graph.opset_imports.get("", 13))
    found = [_Output(v, arrays.get(v.name or ""), opset) for v in model.graph.outputs]
    specs: list[dict[str, Any]] = []
    said: list[str] = []
    skipped: list[tuple[str, str]] = []
    consumed = _detections(found, specs, said)
    classes = [o for o in found if o.head is not None and o.head.op_type in _SOFTMAX | _SIGMOID]
    sequences: list[_Output] = []
    for out in found:
        if out.name in consumed:
            continue
        why_not = _not_judged(out, model)
        if why_not:
            skipped.append((out.name, why_not))
            continue
        spec, words = _judge_one(out, bool(classes) and out not in classes, len(found))
        if spec["kind"] == "argmax_seq" and spec.get("axis") is None:
            sequences.append(out)
        specs.append(spec)
        said.append(words)
    _drop_riders(found, specs, said, skipped, sequences)
    if not specs:
        reason = "cosine on every output (the outputs do not say what the task is)"
        return [{"kind": "cosine", "min": THRESHOLDS["cosine"][1]}], reason
    reason = "; ".join(said)
    if skipped:
        reason += "; not judged: " + _grouped(skipped)
    return specs, reason


def _grouped(skipped: list[tuple[str, str]]) -> str:
    """``'a' (why), 'b' (why)``; four or more for one reason as ``6 outputs (why)``."""
    reasons: dict[str, list[str]] = {}
    for name, why in skipped:
        reasons.setdefault(why, []).append(name)
    parts = []
    for why, names in reasons.items():
        listed = ", ".join(f"'{n}'" for n in names) if len(names) < 4 else f"{len(names)} outputs"
        parts.append(f"{listed} ({why})")
    return ", ".join(parts)


#: The setting that holds each kind's threshold (the others' is ``min_agreement``).
_THRESHOLD_KEY = {"cosine": "min", "custom": "min"}


def task_judge_at(
    model: ir.Model,
    outputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None,
    least: float,
) -> tuple[list[dict[str, Any]], str]:
    """:func:`infer_judge`'s specs with every threshold set to ``least`` (a lossy step's budget:
    quantize's 1% loss is 0.99 of top-1, per-position or per-pixel agreement, or of cosine)."""
    specs, reason = infer_judge(model, outputs)
    return [at_least(spec, least) for spec in specs], reason


def at_least(spec: Mapping[str, Any], least: float) -> dict[str, Any]:
    """``spec`` with its kind's threshold set to ``least``."""
    return {**spec, _THRESHOLD_KEY.get(str(spec["kind"]), "min_agreement"): least}


def default_budget(
    model: ir.Model, outputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """What an engine's run of ``model`` is judged by against ONNX Runtime's when no budget is
    given, and the judge in words (``judge: ...``).

    A float source: :data:`ferry.parity.DEFAULT_BUDGET` (engines computing the same float
    function should agree in the numbers). A source already reduced in precision (QDQ, dynamic
    or weight-only int8): its task's judge (:func:`infer_judge`), since two engines' int8
    kernels round differently (OpenVINO's int8 of a QDQ ResNet-50 is cosine 0.995 from ONNX
    Runtime's, with the same top-1, and 3.9x faster).
    """
    reduced = reduced_precision(model)
    if not reduced:
        return [dict(spec) for spec in DEFAULT_BUDGET], (
            "judge: cosine >= 0.999 and argmax agreement >= 99% on every output (a float "
            "source: engines computing it should agree in the numbers)"
        )
    specs, reason = infer_judge(model, outputs)
    return specs, (
        f"judge: {reason} (a {' and '.join(reduced.kinds)} source: engines round its integers "
        "differently, so it is judged at the task)"
    )


def _by_name(
    model: ir.Model, outputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None
) -> dict[str, np.ndarray]:
    names = [v.name or "" for v in model.graph.outputs]
    if outputs is None:
        return {}
    if isinstance(outputs, Mapping):
        if all(n in outputs for n in names):
            return {n: outputs[n] for n in names}
        outputs = list(outputs.values())  # other names, same order (a framework's)
    values = list(outputs)
    return dict(zip(names, values)) if len(values) == len(names) else {}


def _np_dtype(dtype: ir.DataType | None) -> np.dtype[Any] | None:
    try:
        return None if dtype is None else np.dtype(dtype.numpy())
    except (TypeError, ValueError):
        return None


def _head(value: ir.Value) -> tuple[ir.Node | None, bool, ir.Node | None, bool]:
    """The first op up from ``value`` that computes (None: a graph input or a constant), whether
    an op on the way may have moved axes, the QuantizeLinear nearest the output (if any), and
    whether a bias or scale changed the values' range on the way."""
    moved = rescaled = False
    quantize = None
    for _ in range(64):
        node = value.producer()
        if node is None:
            return None, moved, quantize, rescaled
        if node.op_type == "QuantizeLinear" and quantize is None:
            quantize = node
        nxt = _through(node, value)
        if nxt is None:
            return node, moved, quantize, rescaled
        moved = moved or node.op_type in _MOVING
        rescaled = rescaled or node.op_type in _AFFINE
        value = nxt
    return None, moved, quantize, rescaled


def _through(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The input a transparent ``node`` passes on, or None when ``node`` computes."""
    inputs = [i for i in node.inputs if i is not None]
    if not inputs:
        return None
    if node.op_type in _TRANSPARENT or (node.op_type == "Concat" and len(inputs) == 1):
        return inputs[0]
    if node.op_type in _AFFINE and len(inputs) == 2:
        a, b = inputs
        if constant(b) is not None:
            return a
        if constant(a) is not None:
            return b
        # A quantized product's rescale: Cast(MatMulInteger) * (scale_a * scale_b).
        for side in (a, b):
            cast = side.producer()
            if cast is not None and cast.op_type == "Cast" and cast.inputs[0] is not None:
                source = cast.inputs[0].producer()
                if source is not None and source.op_type in ("MatMulInteger", "ConvInteger"):
                    return side
    return None


def _ancestor_ops(value: ir.Value, limit: int = 20000) -> set[str]:
    seen: set[int] = set()
    ops: set[str] = set()
    stack = [value]
    while stack and len(seen) < limit:
        node = stack.pop().producer()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        ops.add(node.op_type)
        stack.extend(i for i in node.inputs if i is not None)
    return ops


def _detections(found: list[_Output], specs: list[dict[str, Any]], said: list[str]) -> set[str]:
    """Add a ``boxes`` spec per detector's boxes output; the outputs they read (consumed)."""
    consumed: set[str] = set()
    # Boxes of 4 first (they claim their scores and labels), then boxes with score columns.
    for boxes in sorted(found, key=lambda o: o.shape is None or o.shape[-1:] != (4,)):
        if boxes.name in consumed or not boxes.is_float or boxes.shape is None:
            continue
        if boxes.rank is None or boxes.rank < 2:
            continue
        width, k = boxes.shape[-1], boxes.shape[-2]
        selected = bool(_ancestor_ops(boxes.value) & _DETECTING)
        head = boxes.head.op_type if boxes.head is not None else None
        if width == 4 and (boxes.rank >= 3 or selected) and head not in ("Loop", "Scan", "If"):
            scores = _partner(found, boxes, k, float_scores=True, selected=selected)
            if scores is None and not selected:
                continue
            labels = _partner(found, boxes, k, float_scores=False, selected=selected)
        elif width is not None and 5 <= width <= 7 and selected and k != 1:
            scores = labels = None  # [.., K, 4 + score (+ label)]
        else:
            continue
        spec: dict[str, Any] = {"kind": "boxes", "output": boxes.name}
        how = "/".join(sorted(_ancestor_ops(boxes.value) & _DETECTING))
        words = f"boxes on '{boxes.name}' ({boxes.describe('detection')}"
        words += f" selected by {how} inside" if selected else ""
        for key, part in (("scores", scores), ("labels", labels)):
            if part is not None:
                spec[key] = part.name
                consumed.add(part.name)
                words += f"; {key} '{part.name}'"
        if scores is None and width != 4:
            words += "; scores in its 5th column"
        spec[THRESHOLDS["boxes"][0]] = THRESHOLDS["boxes"][1]
        specs.append(spec)
        said.append(words + "; matched by IoU >= 0.5 in any order)")
        consumed.add(boxes.name)
    return consumed


def _partner(
    found: list[_Output], boxes: _Output, k: int | None, *, float_scores: bool, selected: bool
) -> _Output | None:
    """The scores (float) or labels (integer) output lined up with ``boxes``' K boxes."""
    assert boxes.shape is not None
    lead = boxes.shape[:-1]
    for out in found:
        if out is boxes or out.shape is None or out.is_float != float_scores:
            continue
        if out.head is not None and out.head.op_type in _SOFTMAX and not selected:
            continue  # a decoded sequence's classes, not a detector's scores
        shape = out.shape
        if shape == lead or shape == (*lead, 1):
            return out
        if float_scores and len(shape) == len(boxes.shape) and shape[-2] == k and k is not None:
            return out  # per-class scores [.., K, C]
    return None


def _drop_riders(
    found: list[_Output],
    specs: list[dict[str, Any]],
    said: list[str],
    skipped: list[tuple[str, str]],
    sequences: list[_Output],
) -> None:
    """Per-step values beside a decoded sequence (a table recognizer's cell box per token) ride
    on the sequence: where its tokens differ they differ too, so the sequence judges both."""
    for out in found:
        index = next((i for i, s in enumerate(specs) if s.get("output") == out.name), None)
        if index is None or specs[index]["kind"] != "cosine" or out.shape is None:
            continue
        rides = next(
            (
                seq
                for seq in sequences
                if seq is not out
                and seq.shape is not None
                and out.rank == seq.rank
                and out.shape[:-1] == seq.shape[:-1]
            ),
            None,
        )
        if rides is not None:
            del specs[index], said[index]
            skipped.append((out.name, f"per-step values riding on the sequence '{rides.name}'"))


def _not_judged(out: _Output, model: ir.Model) -> str | None:
    if out.name.startswith(STATE_OUTPUT_PREFIX):
        return "recurrent state carried to the next call"
    if out.head is None:
        source = _source_input(out.value, model)
        return f"passes input '{source}' through" if source else "a constant"
    if not out.is_float and out.quantized_by is None and out.head.op_type != "ArgMax":
        if out.dtype is not None and out.dtype.kind == "b":
            return "booleans, compared exactly"
        return "integers, compared exactly"
    return None


def _source_input(value: ir.Value, model: ir.Model) -> str | None:
    inputs = {id(v): v.name for v in model.graph.inputs}
    for _ in range(64):
        if id(value) in inputs:
            return inputs[id(value)]
        node = value.producer()
        if node is None or not node.inputs or node.inputs[0] is None:
            return None
        value = node.inputs[0]
    return None


def _judge_one(out: _Output, beside_classes: bool, count: int) -> tuple[dict[str, Any], str]:
    """One output's spec and the words for it."""
    head = out.head
    assert head is not None
    op = head.op_type
    shape, rank = out.shape, out.rank
    if op == "ArgMax":
        words = f"labels on '{out.name}' ({out.describe('label map')} from ArgMax)"
        return _spec("labels", out), words
    if op in _SOFTMAX and rank:
        axis = _class_axis(out, head)
        classes = shape[axis] if shape is not None else None
        if classes != 1:
            return _classes(out, axis, f"{op} over {'?' if classes is None else classes} classes")
    if op in _SIGMOID and not out.rescaled:
        threshold = _half(out)
        spec = {**_spec("mask", out), "threshold": threshold}
        words = f"mask on '{out.name}' ({out.describe('Sigmoid map')}, set above {threshold:g})"
        return spec, words
    if op in _LINEAR and rank and not _EMBEDDING_NAME.search(out.name):
        if beside_classes:
            words = f"cosine on '{out.name}' ({out.describe('regression')} beside the classes)"
            return _spec("cosine", out), words
        conv = op in ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
        axis = 1 if conv and rank > 2 else -1
        classes = shape[axis] if shape is not None else None
        classes = classes if classes is not None else _width(head, conv)
        if classes not in (None, 1) and (rank < 4 or (count == 1 and classes not in _VALUES)):
            return _classes(out, axis, f"{op} logits over {classes} classes")
    if op == "Div" and head.inputs[0] is not None:
        numerator = head.inputs[0].producer()
        op = "ReduceSum" if numerator is not None and numerator.op_type == "ReduceSum" else op
    noun, what = {
        **dict.fromkeys(_NORMALIZE | {"Div"}, ("embedding", "normalized")),
        **dict.fromkeys(("ReduceMean", "ReduceSum", "GlobalAveragePool"), ("embedding", "pooled")),
        "LayerNormalization": ("embedding", "hidden states"),
    }.get(op, ("output", f"{op} values"))
    if _EMBEDDING_NAME.search(out.name):
        noun, what = "embedding", f"named so, {what}"
    return _spec("cosine", out), f"cosine on '{out.name}' ({out.describe(noun)}: {what})"


def _classes(out: _Output, axis: int, what: str) -> tuple[dict[str, Any], str]:
    """top1 when each sample has one set of classes; else argmax agreement per position."""
    shape = out.shape or ()
    rank = len(shape)
    axis = axis % rank if rank else 0
    others = [d for i, d in enumerate(shape) if i not in (0, axis)]
    # [N, C] or a conv classifier's [N, C, 1, 1]; a [T, 1, C] is a time-major sequence.
    if rank <= 2 or (rank == 4 and all(d == 1 for d in others)):
        return _spec("top1", out), f"top1 on '{out.name}' ({out.describe('classifier')}: {what})"
    spec = _spec("argmax_seq", out)
    if axis != rank - 1:
        spec["axis"] = axis
        words = f"({out.describe('map')}: {what} on axis {axis}, per position)"
        return spec, f"argmax_seq on '{out.name}' {words}"
    return spec, f"argmax_seq on '{out.name}' ({out.describe('sequence')}: {what})"


def _width(node: ir.Node, conv: bool) -> int | None:
    """How many values a linear op gives per position, from its weights (Conv: its filters;
    Gemm/MatMul: the weight's last dim; a Gemm may hold it transposed)."""
    index = 3 if node.op_type in ("QLinearConv", "QLinearMatMul") else 1
    weight = node.inputs[index] if len(node.inputs) > index else None
    shape = None if weight is None else weight.shape
    if weight is not None and weight.producer() is not None:
        producer = weight.producer()
        if producer is not None and producer.op_type == "DequantizeLinear" and producer.inputs:
            shape = producer.inputs[0].shape if producer.inputs[0] is not None else shape
    if shape is None or len(shape) < 2:
        return None
    if conv:
        width = shape[1] if node.op_type == "ConvTranspose" else shape[0]
    elif node.op_type == "Gemm" and node.attributes.get_int("transB", 0) == 1:
        width = shape[0]
    else:
        width = shape[-1]
    return width if isinstance(width, int) else None


def _spec(kind: str, out: _Output) -> dict[str, Any]:
    key, least = THRESHOLDS[kind]
    return {"kind": kind, "output": out.name, key: least}


def _class_axis(out: _Output, softmax: ir.Node) -> int:
    """The output's axis the softmax ran over (the last, unless it says otherwise)."""
    source = softmax.inputs[0]
    in_rank = len(source.shape) if source is not None and source.shape is not None else None
    # Before opset 13 the default axis was 1 (of the input flattened to 2-D there).
    axis = softmax.attributes.get_int("axis", -1 if out.opset >= 13 else 1)
    rank = out.rank or 1
    if in_rank is not None:
        axis %= in_rank
        if not out.moved and in_rank == rank:
            return axis
        classes = source.shape[axis] if source is not None and source.shape is not None else None
        if isinstance(classes, int) and out.shape is not None:
            for candidate in (rank - 1, 1):
                if candidate < rank and out.shape[candidate] == classes:
                    return candidate
    return rank - 1 if axis != 1 or rank < 4 else 1


def _half(out: _Output) -> float:
    """0.5 in the output's own numbers: through its QuantizeLinear's scale and zero point."""
    if out.is_float or out.quantized_by is None:
        return 0.5
    node = out.quantized_by
    scale = constant(node.inputs[1]) if len(node.inputs) > 1 else None
    zero = constant(node.inputs[2]) if len(node.inputs) > 2 else None
    if scale is None or scale.size != 1:
        info = np.iinfo(out.dtype) if out.dtype is not None else np.iinfo(np.uint8)
        return (int(info.max) + int(info.min)) / 2
    zp = float(zero.reshape(-1)[0]) if zero is not None and zero.size else 0.0
    return float(0.5 / float(scale.reshape(-1)[0]) + zp)
