"""What each engine wants from an int8 QDQ model and how to ask ONNX Runtime's quantizer for it; the
validator that names every node of a QDQ model breaking a target's rules is ``_check``.

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
from dataclasses import dataclass
from typing import Any, Literal

import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.optimizer._host import host_cpu_flags

__all__ = [
    "PLACEMENTS",
    "RULES",
    "TARGETS",
    "Scheme",
    "drop_graph_output_qdq",
    "ort_arguments",
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
