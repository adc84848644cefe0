"""The QDQ validator: reads a QDQ model and names every node that breaks a target's rules
(:data:`~ferry.optimizer.quantize._targets.RULES`), and the residual Q/DQ that TensorRT's Conv + Add
fusion needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import onnx_ir as ir

from ferry.graph import constant
from ferry.optimizer.quantize._targets import _QDQ, _WEIGHTED, Scheme, scheme

__all__ = ["Breach", "check", "check_summary", "quantize_residual_inputs"]


@dataclass(frozen=True)
class Breach:
    """One place a QDQ model breaks a target's rules.

    Attributes:
        rule: The rule's key in :data:`RULES`.
        node: The node at fault (the weighted op for weight and bias rules, else the Q/DQ node).
        detail: What is wrong and what to do.
    """

    rule: str
    node: str
    detail: str


def _dtype_of(value: ir.Value | None) -> str | None:
    """numpy-style name of the value's element type (``int8``, ``uint8``, ``int32``...)."""
    if value is None:
        return None
    array = constant(value)
    if array is not None:
        return str(array.dtype)
    if value.dtype is not None:
        return str(value.dtype.numpy())
    return None


@dataclass
class _QParams:
    """One Q or DQ node's quantization parameters."""

    node: ir.Node
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    dtype: str | None
    axis: int


def _qparams(node: ir.Node) -> _QParams:
    inputs = list(node.inputs) + [None] * (3 - len(node.inputs))
    zp_value = inputs[2]
    zero_point = constant(zp_value)
    if zp_value is not None:
        dtype = _dtype_of(zp_value)
    elif node.op_type == "DequantizeLinear":
        dtype = _dtype_of(inputs[0])
    else:
        # QuantizeLinear without a zero point outputs uint8 unless output_dtype says otherwise.
        attr = node.attributes.get("output_dtype")
        dtype = str(ir.DataType(attr.value).numpy()) if attr is not None and attr.value else "uint8"
    axis_attr = node.attributes.get("axis")
    axis = int(axis_attr.value) if axis_attr is not None else 1
    return _QParams(node, constant(inputs[1]), zero_point, dtype, axis)


def _name(node: ir.Node) -> str:
    return node.name or f"<unnamed {node.op_type}>"


def _is_op(node: ir.Node | None, *ops: str) -> TypeGuard[ir.Node]:
    return node is not None and node.op_type in ops and node.domain in ("", "ai.onnx")


def _weight_axis(node: ir.Node, rank: int) -> int:
    """The output-channel axis of ``node``'s weight (input 1)."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        trans_b = node.attributes.get("transB")
        return 0 if trans_b is not None and int(trans_b.value) == 1 else 1
    return rank - 1


def _per_channel_scale(scale: np.ndarray) -> bool:
    return scale.size > 1


@dataclass
class _Weight:
    """A weighted op's constant weight behind a DQ (``int8 const -> DQ`` or ``const -> Q -> DQ``)."""

    op: ir.Node
    dq: _QParams
    values: np.ndarray  # the quantized integer values


def _find_weight(op: ir.Node) -> _Weight | None:
    if len(op.inputs) < 2 or op.inputs[1] is None:
        return None
    dq_node = op.inputs[1].producer()
    if not _is_op(dq_node, "DequantizeLinear"):
        return None
    dq = _qparams(dq_node)
    source = dq_node.inputs[0]
    values = constant(source)
    if values is not None:
        return _Weight(op, dq, values)
    q_node = source.producer() if source is not None else None
    if not _is_op(q_node, "QuantizeLinear"):
        return None
    floats = constant(q_node.inputs[0])
    q = _qparams(q_node)
    if floats is None or q.scale is None:
        return None
    # A float weight behind Q -> DQ (ORT's AddQDQPairToWeight): the engine sees round(w / s) + zp.
    shape = [1] * floats.ndim
    if q.scale.size > 1:
        shape[q.axis % floats.ndim] = -1
    zp = q.zero_point if q.zero_point is not None else np.zeros(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ints = np.rint(floats / q.scale.reshape(shape)) + zp.astype(np.float64).reshape(shape)
    return _Weight(op, dq, ints)


def _scale_breach(params: _QParams, at: str) -> Breach | None:
    scale = params.scale
    if scale is None:
        return None
    bad = ~np.isfinite(scale.astype(np.float64)) | (scale <= 0)
    if not bad.any():
        return None
    return Breach(
        "scale",
        at,
        f"{params.node.op_type} {_name(params.node)!r} has scale values {scale[bad][:4].tolist()}; "
        "a scale must be positive and finite: recalibrate (an all-zero or constant tensor gives a "
        "zero range) or exclude the node from quantization.",
    )


def check(
    model: ir.Model,
    target: str,
    *,
    per_channel: bool | None = None,
    cpu_flags: set[str] | None = None,
) -> list[Breach]:
    """Every place a QDQ model breaks ``target``'s rules (see :data:`RULES`), in graph order.

    Weights may be initializers or Constant nodes, stored as integers behind a DequantizeLinear
    or as floats behind a QuantizeLinear -> DequantizeLinear pair. Only the main graph is read.

    Args:
        model: The quantized model; not changed.
        target: One of :data:`TARGETS`.
        per_channel: As for :func:`scheme`: False accepts per-tensor weight scales.
        cpu_flags: As for :func:`scheme` (``onnxruntime`` only).

    Returns:
        The breaches, empty when the model follows the target's rules.

    Raises:
        InvalidInputError: ``target`` is not one of :data:`TARGETS`.
    """
    s = scheme(target, per_channel=per_channel, cpu_flags=cpu_flags)
    graph = model.graph
    breaches: list[Breach] = []
    weight_dqs: set[int] = set()
    bias_dqs: set[int] = set()

    for op in graph:
        if not _is_op(op, *_WEIGHTED):
            continue
        weight = _find_weight(op)
        if weight is not None:
            weight_dqs.add(id(weight.dq.node))
            breaches.extend(_check_weight(s, weight))
        if op.op_type != "MatMul" and len(op.inputs) > 2 and op.inputs[2] is not None:
            bias_node = op.inputs[2].producer()
            if _is_op(bias_node, "DequantizeLinear"):
                bias_dqs.add(id(bias_node))
                breaches.extend(_check_bias(s, op, _qparams(bias_node), weight))

    for node in graph:
        if not _is_op(node, *_QDQ):
            continue
        params = _qparams(node)
        if id(node) in weight_dqs or id(node) in bias_dqs or _is_weight_q(node):
            scale = _scale_breach(params, _name(node))
            if scale is not None:
                breaches.append(scale)
            continue
        # A Q and its DQ share their parameters: check each activation once, at the DQ (or at a Q
        # that no DQ reads).
        if node.op_type == "QuantizeLinear" and any(
            _is_op(use.node, "DequantizeLinear") for use in node.outputs[0].uses()
        ):
            continue
        breaches.extend(_check_activation(s, params))

    if not s.qdq_on_graph_outputs:
        for out in graph.outputs:
            producer = out.producer()
            if _is_op(producer, *_QDQ):
                breaches.append(
                    Breach(
                        "output-qdq",
                        _name(producer),
                        f"graph output {out.name!r} comes from {producer.op_type} "
                        f"{_name(producer)!r}; {target} wants float outputs: remove the Q/DQ "
                        "pair in front of it (ferry's drop_graph_output_qdq).",
                    )
                )
    if s.residual_qdq:
        for add, skip, _ in _residual_adds(graph):
            breaches.append(
                Breach(
                    "residual-qdq",
                    _name(add),
                    f"Add {_name(add)!r} reads Conv output and {skip.name!r} float, but "
                    f"{skip.name!r} is quantized elsewhere: {target} fuses Conv + Add only with "
                    "Q/DQ on that input (ferry's quantize_residual_inputs adds it).",
                )
            )
    return breaches


def _residual_adds(graph: ir.Graph) -> list[tuple[ir.Node, ir.Value, ir.Node]]:
    """``(Add, its float skip input, a Q that already quantizes that input)`` for every Add of a
    weighted op's float output and an activation read float here but quantized elsewhere."""
    found = []
    for add in graph:
        if not _is_op(add, "Add") or len(add.inputs) != 2:
            continue
        a, b = add.inputs
        if a is None or b is None:
            continue
        for conv_out, skip in ((a, b), (b, a)):
            if not _is_op(conv_out.producer(), *_WEIGHTED) or _is_op(
                skip.producer(), "DequantizeLinear", *_WEIGHTED
            ):
                continue
            q = next(
                (u.node for u in skip.uses() if _is_op(u.node, "QuantizeLinear") and u.idx == 0),
                None,
            )
            if q is not None:
                found.append((add, skip, q))
                break
    return found


def quantize_residual_inputs(model: ir.Model) -> list[str]:
    """Give each residual Add's skip input its own Q/DQ pair, in place, with the parameters of
    the Q that already quantizes it for a Conv (so no new range is needed).

    Before -> After::

        conv_out, skip -> Add            (skip -> Q -> DQ -> Conv elsewhere)
        conv_out, skip -> Q -> DQ -> Add

    Returns:
        The names of the Adds changed.
    """
    graph = model.graph
    changed = []
    for add, skip, q in _residual_adds(graph):
        params = list(q.inputs[1:])
        attributes = {k: a.value for k, a in q.attributes.items()}
        new_q = ir.node("QuantizeLinear", [skip, *params], attributes=attributes)
        dq_attributes = {k: v for k, v in attributes.items() if k in ("axis", "block_size")}
        new_dq = ir.node("DequantizeLinear", [new_q.outputs[0], *params], attributes=dq_attributes)
        new_q.outputs[0].name = f"{skip.name}_residual_q"
        new_dq.outputs[0].name = f"{skip.name}_residual_dq"
        new_dq.outputs[0].type, new_dq.outputs[0].shape = skip.type, skip.shape
        graph.insert_before(add, [new_q, new_dq])
        for index, value in enumerate(add.inputs):
            if value is skip:
                add.replace_input_with(index, new_dq.outputs[0])
        changed.append(_name(add))
    return changed


def _is_weight_q(node: ir.Node) -> bool:
    """A QuantizeLinear of a constant (the Q of a weight's Q -> DQ pair)."""
    return node.op_type == "QuantizeLinear" and constant(node.inputs[0]) is not None


def _check_activation(s: Scheme, params: _QParams) -> list[Breach]:
    at = _name(params.node)
    found: list[Breach] = []
    if params.dtype not in s.activations_accepted:
        found.append(
            Breach(
                "activation-dtype",
                at,
                f"{params.node.op_type} {at!r} quantizes an activation to {params.dtype}; "
                f"{s.target} runs {' or '.join(s.activations_accepted)} activations: "
                f"requantize with activations={s.activations!r}.",
            )
        )
    zp = params.zero_point
    if s.activations_symmetric and zp is not None and np.any(zp != 0):
        found.append(
            Breach(
                "activation-symmetric",
                at,
                f"{params.node.op_type} {at!r} has activation zero point {zp.ravel()[:4].tolist()}; "
                f"{s.target} needs symmetric activations (zero point 0): requantize for "
                f"{s.target}.",
            )
        )
    scale = _scale_breach(params, at)
    if scale is not None:
        found.append(scale)
    return found


def _check_weight(s: Scheme, weight: _Weight) -> list[Breach]:
    op, dq = weight.op, weight.dq
    at = _name(op)
    where = f"{op.op_type} {at!r}'s weight (DequantizeLinear {_name(dq.node)!r})"
    found: list[Breach] = []
    if dq.dtype != s.weights:
        found.append(
            Breach(
                "weight-dtype",
                at,
                f"{where} is {dq.dtype}; {s.target} takes {s.weights} weights: requantize for "
                f"{s.target}.",
            )
        )
    if s.weights_symmetric and dq.zero_point is not None and np.any(dq.zero_point != 0):
        found.append(
            Breach(
                "weight-symmetric",
                at,
                f"{where} has zero point {dq.zero_point.ravel()[:4].tolist()}; {s.target} takes "
                "symmetric weights (zero point 0): requantize with symmetric weights.",
            )
        )
    lo, hi = s.weight_range
    values = weight.values
    if values.size and (values.min() < lo or values.max() > hi):
        found.append(
            Breach(
                "weight-range",
                at,
                f"{where} holds values in [{int(values.min())}, {int(values.max())}]; {s.target} "
                f"takes weights in [{lo}, {hi}]: requantize for {s.target}.",
            )
        )
    scale = dq.scale
    if scale is not None and values.ndim > 0:
        expected = _weight_axis(op, values.ndim)
        channels = values.shape[expected]
        if _per_channel_scale(scale):
            axis = dq.axis % values.ndim
            if axis != expected:
                found.append(
                    Breach(
                        "channel-axis",
                        at,
                        f"{where} has per-channel scales on axis {axis}; the output channels of a "
                        f"{op.op_type} weight of shape {list(values.shape)} are on axis "
                        f"{expected}: requantize (ORT: QDQOpTypePerChannelSupportToAxis).",
                    )
                )
        elif s.per_channel and channels > 1:
            found.append(
                Breach(
                    "per-channel",
                    at,
                    f"{where} has one scale for {channels} output channels; {s.target} wants a "
                    "scale per output channel: requantize with per_channel=True (or check with "
                    "per_channel=False if per-tensor was meant).",
                )
            )
        breach = _scale_breach(dq, at)
        if breach is not None:
            found.append(breach)
    return found


def _producer_scale(value: ir.Value | None) -> np.ndarray | None:
    producer = value.producer() if value is not None else None
    if not _is_op(producer, "DequantizeLinear"):
        return None
    return _qparams(producer).scale


def _check_bias(s: Scheme, op: ir.Node, bias: _QParams, weight: _Weight | None) -> list[Breach]:
    at = _name(op)
    where = f"{op.op_type} {at!r}'s bias (DequantizeLinear {_name(bias.node)!r})"
    found: list[Breach] = []
    if s.bias == "float":
        found.append(
            Breach(
                "bias-quantized",
                at,
                f"{where} is quantized to {bias.dtype}; {s.target} needs a float bias: requantize "
                "without bias quantization (ORT: QuantizeBias=False).",
            )
        )
        return found
    scale_breach = _scale_breach(bias, at)
    if scale_breach is not None:
        found.append(scale_breach)
    if s.bias == "any":
        return found
    if bias.dtype != "int32":
        found.append(
            Breach(
                "bias-dtype",
                at,
                f"{where} is {bias.dtype}; {s.target}'s int8 kernels take an int32 bias: "
                "requantize (ORT quantizes a bias to int32 by default).",
            )
        )
        return found
    if bias.zero_point is not None and np.any(bias.zero_point != 0):
        found.append(
            Breach(
                "bias-scale",
                at,
                f"{where} has zero point {bias.zero_point.ravel()[:4].tolist()}; an int32 bias "
                "needs zero point 0: requantize.",
            )
        )
    input_scale = _producer_scale(op.inputs[0])
    if weight is None or weight.dq.scale is None or input_scale is None or bias.scale is None:
        return found
    want = (input_scale.astype(np.float64) * weight.dq.scale.astype(np.float64)).ravel()
    have = bias.scale.astype(np.float64).ravel()
    if have.size not in (1, want.size) and want.size != 1:
        ok = False
    else:
        ok = bool(np.allclose(have, want, rtol=1e-5, atol=0.0))
    if not ok:
        found.append(
            Breach(
                "bias-scale",
                at,
                f"{where} has scale {have[:4].tolist()} but input scale x weight scale is "
                f"{want[:4].tolist()}; the int32 bias is added to the accumulator as is, so its "
                "scale must be their product: requantize the bias.",
            )
        )
    return found


def check_summary(breaches: Iterable[Breach]) -> str:
    """One line for the CLI: ``ok`` or the count per rule and the first node of each.

    Args:
        breaches: What :func:`check` returned.

    Returns:
        ``"no breaches"`` or e.g. ``"3 breaches: weight-range x2 (Conv_0, ...), output-qdq (DQ_7)"``.
    """
    items = list(breaches)
    if not items:
        return "no breaches"
    by_rule: dict[str, list[str]] = {}
    for breach in items:
        by_rule.setdefault(breach.rule, []).append(breach.node)
    parts = []
    for rule, nodes in by_rule.items():
        count = f" x{len(nodes)}" if len(nodes) > 1 else ""
        more = ", ..." if len(nodes) > 1 else ""
        parts.append(f"{rule}{count} ({nodes[0]}{more})")
    noun = "breach" if len(items) == 1 else "breaches"
    return f"{len(items)} {noun}: {', '.join(parts)}"
