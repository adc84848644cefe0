"""What each engine wants from an int8 QDQ model, how to ask ONNX Runtime's quantizer for it, and a
validator that reads a QDQ model and names every node that breaks a target's rules.

Targets and where their rules come from:

- ``onnxruntime`` (CPU EP): ``onnxruntime.quantization.quantize_static``'s docstring, "Choosing
  parameters for CPU inference" (ORT 1.32): U8S8 on x86-64 (``reduce_range`` when the CPU has no VNNI,
  because ``VPMADDUBSW`` saturates its int16 pair sums), S8S8 on ARM; per-channel weights for
  accuracy on convolutions. The QDQ -> ``QLinearConv``/``QGemm`` fusion takes an int32 bias as is, its
  scale implied to be ``input_scale * weight_scale``.
- ``openvino`` (CPU plugin): the ONNX frontend turns each Q/DQ pair into a ``FakeQuantize`` and the
  plugin's low-precision transformations (``intel_cpu/src/transformations/transformation_pipeline.cpp``)
  run Convolution with u8 activations (i8 only on AMX / AVX2-VNNI-2), i8 weights, per-tensor
  activation scales, and skip ConvolutionBackpropData with asymmetric weights. NNCF's CPU defaults
  match: symmetric 8-bit weights per channel in 255 levels, 8-bit activations ("mixed" preset:
  asymmetric).
- ``tensorrt``: explicit quantization takes only signed int8 Q/DQ with zero point 0 (symmetric),
  per-tensor activations, weights per-tensor or per output channel, and no int32 DQ (a bias stays
  float and TensorRT folds it in). NVIDIA ModelOpt's ORT settings for TensorRT (``QuantizeBias:
  False``, ``ActivationSymmetric: True``, no output quantization, dedicated Q/DQ pairs, per-channel
  axes Conv 0 / ConvTranspose 1) are what :func:`ort_arguments` asks for.
- ``tflite``: the TFLite 8-bit quantization spec: activations int8 asymmetric per tensor, weights
  int8 symmetric in [-127, 127] per axis (output channel), bias int32 with zero point 0 and scale
  ``input_scale * weight_scale``.
- ``portable``: the intersection, so one file runs quantized on every target above.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import numpy as np
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.optimizer._host import host_cpu_flags

__all__ = [
    "PLACEMENTS",
    "RULES",
    "TARGETS",
    "Breach",
    "Scheme",
    "check",
    "check_summary",
    "drop_graph_output_qdq",
    "ort_arguments",
    "quantize_residual_inputs",
    "scheme",
]

TARGETS = ("onnxruntime", "openvino", "tensorrt", "tflite", "portable")

#: Every rule :func:`check` knows, with the engine behaviour it comes from.
RULES: dict[str, str] = {
    "activation-dtype": "activation Q/DQ in an integer type the target's int8 kernels do not take "
    "(TensorRT and TFLite run signed int8 only; a uint8 Q/DQ does not parse or falls back to float)",
    "activation-symmetric": "activation zero point not 0 where the target needs symmetric "
    "quantization (TensorRT fuses only zero-point-0 Q/DQ; anything else does not build)",
    "weight-dtype": "weight DQ not in the int8 type the target's int8 kernels take",
    "weight-symmetric": "weight zero point not 0 (every target's int8 GEMM/conv kernels take "
    "symmetric weights; ORT's per-channel QLinearConv needs one zero point, OpenVINO falls back to "
    "float for asymmetric weights, TensorRT and TFLite reject them)",
    "weight-range": "weight values outside the target's range ([-127, 127] for TFLite's spec and "
    "portable; [-64, 64] for ORT on x86 without VNNI, whose VPMADDUBSW saturates)",
    "per-channel": "one scale for a whole weight where per-channel scales are wanted",
    "channel-axis": "per-channel weight scales on an axis other than the output channel (Conv 0, "
    "ConvTranspose 1, Gemm 0 with transB=1 else 1, MatMul last); kernels scale output channels",
    "output-qdq": "a graph output produced by QuantizeLinear/DequantizeLinear where the target "
    "wants it float (TensorRT placement: do not quantize outputs; it only rounds the result)",
    "bias-quantized": "a quantized bias where the target needs it float (TensorRT takes no int32 "
    "DQ and folds a float bias into its int8 kernel itself)",
    "bias-dtype": "a quantized bias not in int32 (ORT's and TFLite's int8 kernels add an int32 "
    "bias to the int32 accumulator)",
    "bias-scale": "an int32 bias whose scale is not input_scale * weight_scale or whose zero point "
    "is not 0 (the kernels add it to the accumulator unscaled: the result would be wrong)",
    "scale": "a Q/DQ scale that is not positive and finite (the quantized values are undefined)",
    "residual-qdq": "a residual Add of a Conv's float output and an activation quantized elsewhere, "
    "read float here (TensorRT fuses Conv + Add into one int8 kernel only when the Add's other "
    "input comes through Q/DQ; otherwise the Add runs alone in float after the Conv)",
}

Int8Type = Literal["int8", "uint8"]
BiasRule = Literal["float", "int32", "any"]
Placement = Literal["inputs", "inputs+outputs"]

#: Where activations get Q/DQ. ``inputs``: where they enter a weighted op (NVIDIA's placement for
#: TensorRT, NNCF's for OpenVINO: the engine runs the op int8 and keeps its float output for the
#: activations and bias that follow, fused as post-ops). ``inputs+outputs``: each quantized op's
#: output too (ONNX Runtime's QDQ placement: its CPU kernels fuse only ``DQ -> Conv -> Q`` into
#: QLinearConv; without the output Q it runs the op in float, measured 0.31x fp32 on a MobileNet).
PLACEMENTS: tuple[Placement, ...] = ("inputs", "inputs+outputs")

_X86_FLAGS = frozenset({"sse2", "avx", "avx2", "avx512f"})
_ARM_FLAGS = frozenset({"asimd", "neon", "fp"})
# VNNI (VPDPBUSD) and AMX accumulate u8*s8 products in int32 without the int16 saturation of
# AVX2/AVX-512 VPMADDUBSW, so the full 8-bit weight range is safe there.
_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"})

_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass(frozen=True)
class Scheme:
    """What one target wants from an int8 QDQ model: what ferry produces and what the target takes.

    Attributes:
        target: The target's name (one of :data:`TARGETS`).
        activations: Integer type ferry quantizes activations to.
        activations_symmetric: Activation zero points must be 0.
        weights: Integer type of quantized weights.
        weights_symmetric: Weight zero points must be 0.
        weight_range: Inclusive range of quantized weight values.
        per_channel: Weights get one scale per output channel.
        quantize_bias_as_int32: ferry quantizes biases to int32 (scale ``input * weight``).
        qdq_on_graph_outputs: The target accepts a Q/DQ pair in front of a graph output.
        activations_accepted: Activation types the target runs in int8 (a superset of
            ``activations``).
        bias: What the target takes as a Conv/Gemm bias: ``"float"`` only, ``"int32"`` (float, or
            int32 with the exact scale) or ``"any"`` (any DQ, folded to float).
        reduce_range: Weights are quantized to 7 bits (ORT's ``reduce_range``).
        residual_qdq: The other input of an Add fed by a Conv gets Q/DQ (TensorRT's Conv + Add
            fusion).
        placements: Where activations are quantized, in the order tried (:data:`PLACEMENTS`);
            where there are two, the target engine's timings choose.
    """

    target: str
    activations: Int8Type
    activations_symmetric: bool
    weights: Literal["int8"]
    weights_symmetric: bool
    weight_range: tuple[int, int]
    per_channel: bool
    quantize_bias_as_int32: bool
    qdq_on_graph_outputs: bool
    activations_accepted: tuple[Int8Type, ...]
    bias: BiasRule
    reduce_range: bool = False
    residual_qdq: bool = False
    placements: tuple[Placement, ...] = ("inputs+outputs",)

    def describe(self) -> str:
        """One line for a report or the CLI, e.g. ``tensorrt: int8 symmetric activations, ...``."""
        acts = f"{self.activations} {'symmetric' if self.activations_symmetric else 'asymmetric'}"
        lo, hi = self.weight_range
        granularity = "per-channel" if self.per_channel else "per-tensor"
        bias = "int32 bias" if self.quantize_bias_as_int32 else "float bias"
        outputs = "Q/DQ on graph outputs" if self.qdq_on_graph_outputs else "float graph outputs"
        return (
            f"{self.target}: {acts} activations, {self.weights} symmetric {granularity} weights "
            f"in [{lo}, {hi}], {bias}, {outputs}, Q/DQ at {' or '.join(self.placements)}"
        )

    def with_placement(self, placement: Placement) -> Scheme:
        """This scheme with activations quantized at ``placement`` only."""
        if placement not in PLACEMENTS:
            raise InvalidInputError(
                f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}"
            )
        return dataclasses.replace(self, placements=(placement,))


def _known_target(target: str) -> str:
    if target not in TARGETS:
        raise InvalidInputError(
            f"Unknown quantization target {target!r}; use one of: {', '.join(TARGETS)}."
        )
    return target


def _cpu_kind(flags: frozenset[str]) -> Literal["x86", "arm"]:
    if flags & _X86_FLAGS:
        return "x86"
    if flags & _ARM_FLAGS:
        return "arm"
    machine = platform.machine().lower()
    return "arm" if machine.startswith(("arm", "aarch64")) else "x86"


def scheme(
    target: str, *, per_channel: bool | None = None, cpu_flags: set[str] | None = None
) -> Scheme:
    """The quantization scheme for ``target``.

    Args:
        target: One of :data:`TARGETS`.
        per_channel: Override per-channel weights (default: on for every target: TFLite's spec and
            TensorRT's explicit quantization want it, and ORT's docs recommend it for the accuracy
            of convolutions).
        cpu_flags: CPU feature flags for ``onnxruntime`` (``avx512_vnni``, ``amx_int8``,
            ``asimd``...); read from ``/proc/cpuinfo`` when None.

    Returns:
        The target's :class:`Scheme`.

    Raises:
        InvalidInputError: ``target`` is not one of :data:`TARGETS`.
    """
    _known_target(target)
    if target == "onnxruntime":
        flags = frozenset(cpu_flags) if cpu_flags is not None else host_cpu_flags()
        if _cpu_kind(flags) == "arm":
            # ORT's docstring: ARM kernels (SDOT) run S8S8 natively.
            base = Scheme(
                target, "int8", False, "int8", True, (-128, 127), True, True, True,
                ("int8", "uint8"), "int32",
            )  # fmt: skip
        elif flags & _VNNI_FLAGS:
            # ORT's docstring: U8S8 with the full range; VNNI accumulates without saturation.
            base = Scheme(
                target, "uint8", False, "int8", True, (-128, 127), True, True, True,
                ("int8", "uint8"), "int32",
            )  # fmt: skip
        else:
            # ORT's docstring: U8S8 with 7-bit weights on x86 without VNNI, so VPMADDUBSW's
            # int16 sum of two u8*s8 products cannot saturate (2 * 255 * 64 < 32767).
            base = Scheme(
                target, "uint8", False, "int8", True, (-64, 64), True, True, True,
                ("int8", "uint8"), "int32", reduce_range=True,
            )  # fmt: skip
    elif target == "openvino":
        # u8 activations are what the CPU plugin's Convolution takes on every x86 CPU (i8 only
        # with AMX); asymmetric is NNCF's "mixed" preset and costs nothing there (input zero
        # points). The bias DQ is constant-folded to float, so any bias is fine. Placement:
        # inputs only (NNCF's) was 1.1-1.7x faster than with outputs on 8 of 9 kit models, but
        # 0.85x on mtcnn (Conv -> PRelu), so both are timed on the engine.
        base = Scheme(
            target, "uint8", False, "int8", True, (-127, 127), True, True, True,
            ("int8", "uint8"), "any", placements=("inputs", "inputs+outputs"),
        )  # fmt: skip
    elif target == "tensorrt":
        base = Scheme(
            target, "int8", True, "int8", True, (-128, 127), True, False, False, ("int8",), "float",
            placements=("inputs",), residual_qdq=True,
        )  # fmt: skip
    elif target == "tflite":
        base = Scheme(
            target, "int8", False, "int8", True, (-127, 127), True, True, True, ("int8",), "int32"
        )
    else:
        # Symmetric int8 activations (TensorRT), weights in [-127, 127] (TFLite), float bias
        # (TensorRT; TFLite's converter, ORT's WeightBiasQuantization and OpenVINO quantize or
        # fold a float bias themselves), float graph outputs (TensorRT placement).
        base = Scheme(
            target, "int8", True, "int8", True, (-127, 127), True, False, False, ("int8",), "float",
            residual_qdq=True,
        )  # fmt: skip
    if per_channel is not None:
        base = dataclasses.replace(base, per_channel=per_channel)
    return base


def ort_arguments(s: Scheme) -> dict[str, Any]:
    """Keyword arguments for ``onnxruntime.quantization.quantize_static`` that follow ``s``.

    Add ``model_input``, ``model_output`` and ``calibration_data_reader``. ORT's symmetric int8
    weights land in [-127, 127] (its symmetric range), or [-64, 64] with ``reduce_range``.

    ORT cannot express "no Q/DQ on graph outputs" alone: with the ``inputs`` placement no op's
    output is quantized, which covers it; for ``portable`` intermediate outputs stay quantized
    (ORT and OpenVINO fuse ``DQ -> Conv -> Q``), so run :func:`drop_graph_output_qdq` on the
    result.

    Args:
        s: The scheme, from :func:`scheme`; its first placement is used.

    Returns:
        The keyword arguments.
    """
    from onnxruntime.quantization import QuantFormat, QuantType
    from onnxruntime.quantization.registry import QDQRegistry

    extra: dict[str, Any] = {
        "ActivationSymmetric": s.activations_symmetric,
        "WeightSymmetric": s.weights_symmetric,
        "QuantizeBias": s.quantize_bias_as_int32,
        # Removing a Relu/Clip folds it into the previous Q's range; keep it where the engine
        # (TensorRT) removes Q/DQ itself and would lose the clamp.
        "QDQKeepRemovableActivations": not s.qdq_on_graph_outputs,
    }
    if s.placements[0] == "inputs":
        extra["OpTypesToExcludeOutputQuantization"] = sorted(QDQRegistry)
    if s.target == "tensorrt":
        extra["DedicatedQDQPair"] = True
    return {
        "quant_format": QuantFormat.QDQ,
        "activation_type": QuantType.QInt8 if s.activations == "int8" else QuantType.QUInt8,
        "weight_type": QuantType.QInt8,
        "per_channel": s.per_channel,
        "reduce_range": s.reduce_range,
        "extra_options": extra,
    }


def drop_graph_output_qdq(model: ir.Model) -> list[str]:
    """Remove each ``Q -> DQ`` pair that produces a graph output, in place.

    Before -> After::

        x -> QuantizeLinear -> DequantizeLinear -> output
        x -> output                          (renamed to the output's name)

    Args:
        model: A QDQ model; changed in place.

    Returns:
        The names of the graph outputs that were freed of their Q/DQ.
    """
    graph = model.graph
    freed: list[str] = []
    for index, out in enumerate(list(graph.outputs)):
        dq = out.producer()
        if dq is None or dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx"):
            continue
        q = dq.inputs[0].producer() if dq.inputs[0] is not None else None
        if q is None or q.op_type != "QuantizeLinear" or len(q.outputs[0].uses()) != 1:
            continue
        source = q.inputs[0]
        if source is None or source.is_graph_input() or source.is_graph_output():
            continue
        name = out.name
        params = [v for v in (*q.inputs[1:], *dq.inputs[1:]) if v is not None]
        out.name = None
        graph.outputs[index] = source
        graph.remove([dq, q], safe=True)
        source.name = name
        for value in params:
            # The pair's scale and zero point are dead now; ORT warns about unused initializers.
            if value.is_initializer() and not value.uses() and value.name is not None:
                graph.initializers.pop(value.name, None)
        freed.append(name or "")
    return freed


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


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The value's array when it is an initializer or a Constant node's output, else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return np.asarray(value.const_value.numpy())
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    for key, attr in node.attributes.items():
        if key == "value":
            return np.asarray(attr.as_tensor().numpy())
        if key in ("value_float", "value_floats"):
            return np.asarray(attr.value, dtype=np.float32)
        if key in ("value_int", "value_ints"):
            return np.asarray(attr.value, dtype=np.int64)
    return None


def _dtype_of(value: ir.Value | None) -> str | None:
    """numpy-style name of the value's element type (``int8``, ``uint8``, ``int32``...)."""
    if value is None:
        return None
    array = _constant(value)
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
    zero_point = _constant(zp_value)
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
    return _QParams(node, _constant(inputs[1]), zero_point, dtype, axis)


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
    values = _constant(source)
    if values is not None:
        return _Weight(op, dq, values)
    q_node = source.producer() if source is not None else None
    if not _is_op(q_node, "QuantizeLinear"):
        return None
    floats = _constant(q_node.inputs[0])
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
    return node.op_type == "QuantizeLinear" and _constant(node.inputs[0]) is not None


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
