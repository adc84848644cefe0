"""``backends="auto"``'s candidates: the configurations it tries, and what each one computes.

Before -> After::

    model, engines -> [onnxruntime fp32, openvino fp32, openvino bf16, ..., all engines fp32]
    a QDQ source, once compiled -> [onnxruntime int8 (QDQ), openvino int8 (QDQ),
                                    openvino int8 (QDQ) + bf16, ...]

A source already reduced in precision (static QDQ, dynamic int8, QOperator int8) is computed in
int8 only where an engine recognizes its quantized layers; elsewhere the engine widens them to
float. Which it did is asked of the compiled engine, never assumed: OpenVINO's runtime graph says
each layer's precision (its low-precision transformations run a QDQ convolution in u8, a
dynamic-int8 ``ConvInteger`` in f32), ONNX Runtime's optimized graph says which layers it fused to
integer kernels (``QLinearConv``, ``QGemm``, ``MatMulInteger``...) and which it left as float
``Conv`` between ``DequantizeLinear`` and ``QuantizeLinear``. The label then says it: ``openvino
int8 (QDQ)`` where the engine computes the source's int8 in its weighted layers (``precision``
``int8``; ``int8+bf16`` when its float layers also run lower), ``openvino fp32 (widens dynamic
int8)`` where it computes none of them in int8. An engine that does not say (an adapter without
this introspection) keeps its plain label, and the table says so. A weight-only int8 source is
computed in float by every engine, as typed: its labels are the float ones.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK, get_backend, place
from ferry.graph import ReducedPrecision
from ferry.parity import BudgetVerdict
from ferry.plan import Plan

__all__ = ["Candidate", "Computed", "candidates", "computes_int8", "name_computed"]

logger = logging.getLogger(__name__)

BASELINE = f"{FALLBACK} fp32"

#: The source's quantization, as a label names it.
_TAGS = {"static QDQ": "QDQ", "dynamic int8": "dynamic int8", "QOperator int8": "QOperator"}
#: OpenVINO's runtime layer types that carry weights (where int8 pays).
_OV_WEIGHTED = frozenset(
    {"Convolution", "GroupConvolution", "Deconvolution", "FullyConnected", "MatMul", "RNNSeq"}
)
_OV_INT8 = frozenset({"i8", "u8"})
#: ONNX Runtime's weighted ops after its graph optimizations: integer kernels, float kernels.
_ORT_INT8 = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QAttention",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
    }
)
_ORT_FLOAT = frozenset(
    {
        "Conv",
        "FusedConv",
        "ConvTranspose",
        "MatMul",
        "FusedMatMul",
        "Gemm",
        "FusedGemm",
        "LSTM",
        "GRU",
        "RNN",
        "Attention",
    }
)
#: TFLite's weighted ops, and its int8 / uint8 tensor type codes.
_TFLITE_WEIGHTED = frozenset(
    {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "TRANSPOSE_CONV",
        "FULLY_CONNECTED",
        "BATCH_MATMUL",
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
    }
)
_TFLITE_INT8 = frozenset({9, 3})
#: OpenVINO's names of what it ran in -> ferry's precision names.
_PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "float32": "fp32"}
#: A model past this size is not serialized again to ask ONNX Runtime what it fused.
_MAX_ASK_BYTES = 1 << 30


@dataclasses.dataclass
class Computed:
    """What a candidate's engines computed in a reduced-precision source's weighted layers.

    Attributes:
        int8: weighted layers computed in int8, per engine.
        layers: weighted layers, per engine (int8 or float).
        ran: the float precision each engine ran in, where it says (OpenVINO's hint is a wish:
            ``fp16`` runs ``bf16`` on a CPU without fp16 units).
        silent: engines that do not say what they computed.
    """

    int8: dict[str, int] = dataclasses.field(default_factory=dict)
    layers: dict[str, int] = dataclasses.field(default_factory=dict)
    ran: dict[str, str] = dataclasses.field(default_factory=dict)
    silent: list[str] = dataclasses.field(default_factory=list)

    def words(self) -> str:
        """``openvino: int8 in 5 of 15 weighted layers, the rest fp32; onnxruntime: ...``."""
        parts = []
        for engine, layers in self.layers.items():
            int8, ran = self.int8.get(engine, 0), self.ran.get(engine, "fp32")
            if not layers:
                continue  # only what it takes between the others' layers
            every = f"all {layers} weighted layers" if layers > 1 else "its one weighted layer"
            if int8 == layers:
                parts.append(f"{engine}: int8 in {every}")
            elif int8:
                parts.append(
                    f"{engine}: int8 in {int8} of {layers} weighted layers, the rest {ran}"
                )
            else:
                parts.append(f"{engine}: {ran} in {every} (int8 widened)")
        parts += [f"{engine}: does not say" for engine in self.silent]
        return "; ".join(parts)


@dataclasses.dataclass
class Candidate:
    """One configuration tried, and how it did.

    Attributes:
        label: engine(s) and precision, e.g. ``"openvino bf16"``, ``"openvino int8 (QDQ)"``.
        plan: the plan measured.
        precision: the precision its engines computed in: the option asked (``fp32``, ``bf16``),
            or on a reduced-precision source ``int8`` where its engine computed the source's int8
            (``int8+bf16``: its float layers asked lower too).
        option: the precision option asked of its engines (None: ``precision``); a tie goes to
            the candidate that asks for no precision below the source's.
        load_s: compile time.
        latency_ms: median per call over the timed blocks (inf when it failed).
        accuracy: its outputs against ONNX Runtime's (None when it failed).
        noise: the relative spread of ``latency_ms`` within the run
            (:class:`ferry.runtime._measure.BlockStats`).
        error: why it could not be measured.
        computes: on a reduced-precision source, what its engines computed in words
            (:meth:`Computed.words`); empty otherwise.
    """

    label: str
    plan: Plan
    precision: str = "fp32"
    load_s: float = 0.0
    latency_ms: float = float("inf")
    accuracy: BudgetVerdict | None = None
    error: str | None = None
    noise: float = 0.0
    option: str | None = None
    computes: str = ""

    @property
    def passed(self) -> bool:
        """Measured and within the accuracy budget."""
        return self.error is None and self.accuracy is not None and self.accuracy.passed

    @property
    def lowered(self) -> bool:
        """It asked its engines for a precision below fp32 (beyond what the source holds)."""
        return (self.option or self.precision) != "fp32"

    def to_dict(self, baseline_ms: float | None = None) -> dict[str, Any]:
        measured = self.error is None and np.isfinite(self.latency_ms)
        row = {
            "label": self.label,
            "precision": self.precision,
            "partitions": len(self.plan.partitions),
            "backends": self.plan.backends,
            "load_s": round(self.load_s, 4),
            "latency_ms": self.latency_ms if measured else None,
            "noise": round(self.noise, 4) if measured else None,
            "speedup": baseline_ms / self.latency_ms if measured and baseline_ms else None,
            "accuracy": None if self.accuracy is None else self.accuracy.to_dict(),
            "passed": self.passed,
            "error": self.error,
        }
        if self.computes:
            row["computes"] = self.computes
        return row


def candidates(
    model: ir.Model,
    names: list[str],
    *,
    exact: bool,
    precision: str | None,
    held: ReducedPrecision | None = None,
) -> list[Candidate]:
    """ONNX Runtime fp32 (the baseline, first), each engine in ``names`` at each precision it
    offers (``exact``: fp32 only; ``precision``: that one), and all engines placed together;
    a plan already listed is not listed again, nor a precision the engine runs as another it
    offers (``backend.runs_in``: OpenVINO's fp16 on a CPU without fp16 units is its bf16).

    ``precision="int8"`` on a source that ``held`` says is in int8 also asks each engine that
    offers no int8 option for fp32: its int8 is the source's (OpenVINO's int8 of a QDQ model), and
    :func:`computes_int8` then keeps only those that computed it.
    """
    out = [Candidate(BASELINE, Plan.whole_graph(model, FALLBACK))]
    seen = {_plan_signature(out[0].plan)}
    engines = [n for n in names if n != FALLBACK]
    in_int8 = held is not None and any(k in _TAGS for k in held.kinds)
    for name in engines:
        backend = get_backend(name)
        wanted = precision
        if precision == "int8" and in_int8 and "int8" not in backend.precisions:
            wanted = "fp32"
        placed = None
        for offered in backend.precisions:
            if (exact and offered != "fp32") or (wanted is not None and offered != wanted):
                continue
            ran = backend.runs_in(offered)
            if wanted is None and ran != offered and ran in backend.precisions:
                continue  # the same computation as its ``ran`` candidate (fp16 run as bf16)
            if placed is None:  # placed once: precision is an option of the plan
                placed = place(model, [backend, get_backend(FALLBACK)])
            plan = placed.with_options({name: {"precision": offered}})
            _add(out, seen, Candidate(f"{name} {offered}", plan, offered))
    if len(engines) > 1 and precision in (None, "fp32"):
        plan = place(model, [get_backend(n) for n in names])
        # fp32 spelled out, so that a combined plan one engine took whole is seen as that one's
        fp32 = {n: {"precision": "fp32"} for n in plan.backends if n != FALLBACK}
        _add(out, seen, Candidate("+".join(names) + " fp32", plan.with_options(fp32)))
    return out


def name_computed(candidate: Candidate, compiled: Sequence[Any], held: ReducedPrecision) -> None:
    """Label ``candidate`` by what its compiled partitions computed of a source holding
    ``held`` (no change for a float or weight-only int8 source, or when its engines do not say).

    Args:
        candidate: the candidate, labelled ``"<engines> <option>"``; relabelled in place.
        compiled: its compiled partitions (each with ``spec``: the partition and its model).
        held: the source's quantization (:func:`ferry.graph.reduced_precision`).
    """
    kinds = [k for k in held.kinds if k in _TAGS]
    if not kinds:
        return
    computed = computed_by(compiled)
    candidate.computes = computed.words()
    option = candidate.option = candidate.option or candidate.precision
    engines, _, _ = candidate.label.rpartition(" ")
    # The label names what the candidate's own engines did (ONNX Runtime, when it only takes
    # what they refuse, is in the partitions column).
    own = [e for e in computed.layers if e != FALLBACK] or [e for e in computed.layers]
    if not own or any(e in computed.silent for e in engines.split("+")):
        return  # an engine that does not say keeps its plain label
    tag = " + ".join(_TAGS[k] for k in kinds)
    int8 = sum(computed.int8.get(e, 0) for e in own)
    layers = sum(computed.layers[e] for e in own)
    ran = {computed.ran[e] for e in own if e in computed.ran} - {option}
    runs = f"runs {'/'.join(sorted(ran))}" if ran else ""
    if layers and int8:
        candidate.precision = "int8" if option == "fp32" else f"int8+{option}"
        more = "" if option == "fp32" else f" + {option}" + (f" ({runs})" if runs else "")
        candidate.label = f"{engines} int8 ({tag}){more}"
    elif layers:
        candidate.label = f"{engines} {option} (widens {tag}" + (f"; {runs})" if runs else ")")


def computes_int8(candidate: Candidate) -> str | None:
    """None when ``candidate`` (named by :func:`name_computed`) computed the source's int8, else
    why it is not an int8 candidate (for ``precision="int8"``)."""
    if candidate.precision.startswith("int8"):
        return None
    if "does not say" in candidate.computes or not candidate.computes:
        return "its engine does not say whether it computes the source's int8"
    return f"it computes none of the source's layers in int8 ({candidate.computes})"


def computed_by(compiled: Sequence[Any]) -> Computed:
    """Ask each compiled partition's engine which of its weighted layers it computes in int8."""
    out = Computed()
    for partition in compiled:
        spec = getattr(partition, "spec", None)
        engine = getattr(getattr(spec, "partition", None), "backend", None)
        if spec is None or engine is None:
            continue
        found = _ask(engine, partition, spec)
        if found is None:
            if engine not in out.silent:
                out.silent.append(engine)
            continue
        int8, layers, ran = found
        out.int8[engine] = out.int8.get(engine, 0) + int8
        out.layers[engine] = out.layers.get(engine, 0) + layers
        if ran is not None:
            out.ran[engine] = ran
    out.silent = [e for e in out.silent if e not in out.layers]
    return out


def _ask(engine: str, partition: Any, spec: Any) -> tuple[int, int, str | None] | None:
    """(int8 layers, weighted layers, the float precision run) of one compiled partition, or
    None when its engine does not say."""
    try:
        if engine == "openvino" and hasattr(
            getattr(partition, "compiled", None), "get_runtime_model"
        ):
            return _ask_openvino(partition)
        if engine == FALLBACK:
            return _ask_onnxruntime(spec.model)
        if engine == "litert":
            return _ask_litert(partition)
    except Exception as e:  # a question about the engine must never fail the candidate
        logger.info("auto: could not ask %s what it computed: %s", engine, e)
    return None


def _ask_openvino(partition: Any) -> tuple[int, int, str | None]:
    """OpenVINO's runtime graph: each executed layer's ``layerType`` and ``runtimePrecision``."""
    int8 = layers = 0
    for op in partition.compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" not in info or info["layerType"].astype(str) not in _OV_WEIGHTED:
            continue
        layers += 1
        precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
        int8 += precision in _OV_INT8
    ran = getattr(partition, "inference_precision", None)
    return int8, layers, _PRECISION_NAMES.get(str(ran), str(ran)) if ran else None


def _ask_onnxruntime(model: ir.Model) -> tuple[int, int, str | None] | None:
    """ONNX Runtime's optimized graph (a second session that writes it out): its integer
    kernels and its float ones. ONNX Runtime computes in fp32 only."""
    import onnx
    import onnxruntime as ort

    proto = ir.to_proto(model)
    if proto.ByteSize() > _MAX_ASK_BYTES:
        return None
    with tempfile.TemporaryDirectory(prefix="ferry-auto-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath, load_external_data=False)
    ops = [node.op_type for node in optimized.graph.node]
    int8 = sum(op in _ORT_INT8 for op in ops)
    return int8, int8 + sum(op in _ORT_FLOAT for op in ops), "fp32"


def _ask_litert(partition: Any) -> tuple[int, int, str | None] | None:
    """The ``.tflite`` file LiteRT runs (lowered at the sizes of the first call, which auto has
    made): its weighted ops, int8 where their input is int8 or uint8."""
    from ferry.tflite import read_tflite

    engines = list(getattr(partition, "_engines", {}).values())
    data = getattr(engines[0], "data", None) if engines else None
    if not isinstance(data, bytes):
        return None
    graph = read_tflite(data, "litert partition").subgraphs[0]
    int8 = layers = 0
    for op in graph.operators:
        if op.opcode not in _TFLITE_WEIGHTED or not op.inputs or op.inputs[0] < 0:
            continue
        layers += 1
        int8 += graph.tensors[op.inputs[0]].type in _TFLITE_INT8
    return int8, layers, "fp32"


def _add(out: list[Candidate], seen: set[str], candidate: Candidate) -> None:
    signature = _plan_signature(candidate.plan)
    if signature not in seen:
        seen.add(signature)
        out.append(candidate)


def _plan_signature(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True)
