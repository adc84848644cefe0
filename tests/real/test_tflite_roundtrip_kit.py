"""Round trip on the kit: every kit ``.tflite`` -> ONNX (``ferry.convert``) -> ``.tflite``
(``ferry.mobile.export_tflite``), both files run in LiteRT on the kit's realistic inputs and
judged against each other at the task, and numerically.

The precision of the way back is read off the original file, not listed per model:

- float models come back fp32, within :mod:`ferry.parity`'s float tolerance;
- dynamic-range ("hybrid") models, whose int8 weights TFLite's hybrid kernels read with float
  activations, convert to DequantizeLinear of int8 constants: they come back fp32 with those
  weights dequantized. The original's hybrid kernels quantize activations on the fly and this
  export does not, so the figures are the kit's judge and a bound measured on the kit model;
- full-integer int8 models convert to a QDQ model and come back full-integer int8: every tensor
  the original computes in int8 (or uint8) is int8 (or uint8) again, its convolutions and fully
  connected layers run int8 kernels (int8 weights, int32 bias), and the outputs are within
  :data:`INT8_STEPS` quantization steps of the original's.

A streaming model's resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE, set up by
CALL_ONCE) become explicit inputs ``state:<variable>`` and outputs ``state_out:<variable>`` in
ONNX, which has no state; the written ``.tflite`` keeps that interface. The original keeps its
state inside one interpreter across calls; the round trip is run over the same sequence of calls
with each call's ``state_out`` fed back as the next call's ``state``, starting from the defaults
the conversion recorded, and must give the same answer at every call.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ferry
import kit_models
from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from ferry.mobile import TFLiteExport, export_tflite
from ferry.mobile._litert import KERNELS, LiteRT
from ferry.mobile._tflite_lower import optional_inputs
from ferry.parity import compare_outputs
from ferry.tflite import TFLiteModel, read_tflite

pytest.importorskip("ai_edge_litert", reason="LiteRT runs both .tflite files")

#: Calls per model: two realistic inputs (kit indices 2 and 3, other than the export's own
#: samples 0 and 1); a streaming model runs a sequence of this many consecutive calls.
CALLS = {"stream": 12, "other": 2}

#: int8 outputs may differ by this many quantization steps (integer kernels round differently
#: from one kernel set to the next: the issue's contract, 1 to 2 steps).
INT8_STEPS = 2

#: The hybrid original against its fp32 round trip: the largest absolute difference of the
#: softmax probabilities allowed. Measured 0.0021 on ``emotion_tflite_hybrid`` (its hybrid
#: kernels quantize activations per call, the fp32 export computes them in float).
HYBRID_ATOL = 0.03

#: Ops that read weights: in a full-integer model, int8 input and weights and int32 bias.
HEAVY = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")

#: Resource-variable ops of the original, which the round trip expresses as inputs/outputs.
STATE_OPS = {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"}


# ------------------------------------------------------------------------------- the original


def _kind(model: TFLiteModel) -> str:
    """``float``, ``hybrid`` (int8 weights read by float-activation kernels) or ``int8``
    (integer activations), read off the ops that carry weights."""
    sg = model.subgraphs[0]
    kinds = set()
    for op in sg.operators:
        if op.opcode not in HEAVY:
            continue
        x, w = (sg.tensors[i] for i in op.inputs[:2])
        if x.type_name in ("int8", "uint8"):
            kinds.add("int8")
        elif w.type_name == "int8":
            kinds.add("hybrid")
    assert len(kinds) <= 1, f"mixed quantization {kinds}"
    return kinds.pop() if kinds else "float"


def _activation_types(model: TFLiteModel) -> set[str]:
    """The element types of the tensors ops compute (not constants, not resource handles)."""
    sg = model.subgraphs[0]
    found = set()
    for op in sg.operators:
        if op.opcode in STATE_OPS:
            continue
        for i in (*op.inputs, *op.outputs):
            t = sg.tensors[i] if i >= 0 else None
            if t is not None and t.data is None and t.type_name != "resource":
                found.add(t.type_name)
    return found


class _Original:
    """The kit's ``.tflite`` in LiteRT's interpreter, inputs and outputs by signature name (one
    interpreter: a streaming model keeps its variables between calls, as on a device).

    A streaming model's answer alone may say little (the wake-word model answers 0 on speech
    without the wake word), so ``run`` also returns the value each call assigns to each
    variable, as ``state_out:<variable>``: the tensor its ASSIGN_VARIABLE reads, kept by the
    interpreter's ``experimental_preserve_all_tensors``.
    """

    def __init__(
        self, model: TFLiteModel, path: Path, feeds: Mapping[str, np.ndarray], kernels: str
    ) -> None:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        sg = model.subgraphs[0]
        handles = {
            op.outputs[0]: str(op.options.get("shared_name"))
            for op in sg.operators
            if op.opcode == "VAR_HANDLE" and not op.options.get("container")
        }
        #: state_out:<variable> -> the tensor the call's last ASSIGN_VARIABLE writes to it.
        self.assigned = {
            STATE_OUTPUT_PREFIX + handles[op.inputs[0]]: op.inputs[1]
            for op in sg.operators
            if op.opcode == "ASSIGN_VARIABLE"
        }
        options: dict[str, Any] = {}
        if kernels == "reference":
            options["experimental_op_resolver_type"] = OpResolverType.BUILTIN_REF
        with warnings.catch_warnings():  # "for debugging": reading the variables is that
            warnings.filterwarnings("ignore", message=".*preserve_all_tensors")
            self.interpreter = Interpreter(
                model_path=str(path),
                experimental_preserve_all_tensors=bool(self.assigned),
                **options,
            )
        it = self.interpreter
        self.inputs = {d["name"]: d for d in it.get_input_details()}
        for name, array in feeds.items():
            # The batch is -1 in some signatures: resized to the kit's sizes.
            if tuple(self.inputs[name]["shape"]) != array.shape:
                it.resize_tensor_input(self.inputs[name]["index"], array.shape)
        it.allocate_tensors()
        self.outputs = {d["name"]: d for d in it.get_output_details()}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        it = self.interpreter
        for name, array in feeds.items():
            it.set_tensor(self.inputs[name]["index"], np.asarray(array, order="C"))
        it.invoke()
        found = {n: np.array(it.get_tensor(d["index"])) for n, d in self.outputs.items()}
        found.update({n: np.array(it.get_tensor(i)) for n, i in self.assigned.items()})
        return found

    def quantization(self, name: str) -> tuple[float, int] | None:
        scale, zero = self.outputs[name]["quantization"]
        return (float(scale), int(zero)) if scale else None


# ------------------------------------------------------------------------------ the round trip


def _round_trip(mid: str, folder: Path, precision: str) -> tuple[TFLiteExport, Path]:
    """``ferry.convert`` the kit file, then ``export_tflite`` the ONNX model at ``precision``
    (verified inside against ONNX Runtime on the converted model, on kit samples 0 and 1)."""
    onnx_path = kit_models.convert(mid, folder / f"{mid}.onnx")
    samples = [kit_models.feeds(mid, i) for i in (0, 1)]
    result = export_tflite(
        onnx_path, folder / f"{mid}.tflite", precision=precision, samples=samples
    )
    return result, onnx_path


def _calls(mid: str, streaming: bool) -> list[dict[str, np.ndarray]]:
    if streaming:
        return [kit_models.feeds(mid, i) for i in range(CALLS["stream"])]
    return [kit_models.feeds(mid, i) for i in range(2, 2 + CALLS["other"])]


def _digest(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), stat.st_size, stat.st_mtime_ns


@pytest.mark.parametrize("mid", kit_models.ids("tflite"))
def test_round_trip_runs_in_litert_and_matches_the_original(mid: str, tmp_path: Path) -> None:
    source = kit_models.path(mid)
    before = _digest(source)
    original_model = read_tflite(source.read_bytes(), source.name)
    kind = _kind(original_model)
    precision = "int8" if kind == "int8" else "fp32"

    result, onnx_path = _round_trip(mid, tmp_path, precision)
    report = result.report
    assert report.passed and [v.placement.kernels for v in report.verification] == list(KERNELS)
    written = read_tflite(result.path.read_bytes(), result.path.name)
    _check_types(kind, original_model, written, onnx_path)

    state_in = [io.name for io in report.inputs if io.name.startswith(STATE_INPUT_PREFIX)]
    streaming = any(op.opcode in STATE_OPS for op in original_model.subgraphs[0].operators)
    assert bool(state_in) == streaming, "the state is an input exactly when the original has one"
    state = optional_inputs(ferry.graph.load_model(onnx_path))
    assert sorted(state) == sorted(state_in)

    calls = _calls(mid, streaming)
    data = result.path.read_bytes()
    inputs = [(io.name, io.perm) for io in report.inputs]
    outputs = [(io.name, io.perm) for io in report.outputs]
    answers = [o for o, _ in outputs if not o.startswith(STATE_OUTPUT_PREFIX)]
    for kernels in KERNELS:
        # Each kernel set against the original on the same kernels: integer kernels round
        # differently from one set to the next, and a stream feeds each call's rounding into
        # the next (3 steps apart after 12 calls between XNNPACK and the reference kernels).
        original = _Original(original_model, source, calls[0], kernels)
        wants = [original.run(feeds) for feeds in calls]
        assert sorted(answers) == sorted(original.outputs)  # the original's names, both ways
        # Every variable the original assigns is a state output of the round trip.
        assert sorted(o for o, _ in outputs if o not in answers) == sorted(original.assigned)
        compared = [*answers, *original.assigned]
        runtime = LiteRT(data, kernels, inputs, outputs)
        carried = dict(state)
        got_all: dict[str, list[np.ndarray]] = {n: [] for n in compared}
        for feeds, want in zip(calls, wants):
            got = runtime.run({**feeds, **carried})
            # The next call starts from the state this one left, as the original's variables.
            carried = {n: got[STATE_OUTPUT_PREFIX + n[len(STATE_INPUT_PREFIX) :]] for n in state}
            for n in compared:
                assert got[n].dtype == want[n].dtype and got[n].shape == want[n].shape, n
                got_all[n].append(got[n])
            dequantize = {n: q for n in answers if (q := original.quantization(n)) is not None}
            kit_models.judged(
                mid,
                f"tflite round trip {precision} ({kernels})",
                {n: got[n] for n in answers},
                {n: want[n] for n in answers},
                dequantize=dequantize or None,
            )
        _check_numbers(kind, {n: np.stack(v) for n, v in got_all.items()}, wants, original)
    assert _digest(source) == before, "the round trip changed the kit's own file"
    assert result.path.parent == tmp_path and onnx_path.parent == tmp_path


def _check_types(kind: str, original: TFLiteModel, written: TFLiteModel, onnx_path: Path) -> None:
    """The precision came back as the original had it."""
    osg, wsg = original.subgraphs[0], written.subgraphs[0]
    # The model's own inputs and outputs keep their element types (int8 features in, uint8
    # probability out); the state ones are the round trip's own.
    edge = [wsg.tensors[i] for i in (*wsg.inputs, *wsg.outputs)]
    assert sorted(
        t.type_name
        for t in edge
        if not t.name.startswith((STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX))
    ) == sorted(osg.tensors[i].type_name for i in (*osg.inputs, *osg.outputs))
    if kind == "float":
        assert _activation_types(written) <= {"float32", "int32", "bool", "int64"}
        return
    if kind == "hybrid":
        # Weight-only quantization: int8 weights behind DequantizeLinear in ONNX, folded to float
        # weights by the fp32 export (no DEQUANTIZE op runs, every heavy op reads float).
        onnx_model = ferry.graph.load_model(onnx_path)
        assert any(n.op_type == "DequantizeLinear" for n in onnx_model.graph)
        assert not any(op.opcode == "DEQUANTIZE" for op in wsg.operators)
        for op in wsg.operators:
            if op.opcode in HEAVY:
                assert {wsg.tensors[i].type_name for i in op.inputs if i >= 0} == {"float32"}
        return
    # Full integer: what the original computes in int8/uint8, the round trip does too.
    assert _activation_types(written) == _activation_types(original), (
        _activation_types(written),
        _activation_types(original),
    )
    assert not any(op.opcode == "DEQUANTIZE" for op in wsg.operators)
    heavy = [op for op in wsg.operators if op.opcode in HEAVY]
    assert sorted(op.opcode for op in heavy) == sorted(
        op.opcode for op in osg.operators if op.opcode in HEAVY
    )
    for op in heavy:
        x, w, b = (wsg.tensors[i] for i in op.inputs[:3])
        assert (x.type_name, w.type_name, b.type_name) == ("int8", "int8", "int32"), op.opcode
        assert w.quant is not None and not w.quant.zero_point.any()


def _check_numbers(
    kind: str,
    got: Mapping[str, np.ndarray],
    wants: Sequence[Mapping[str, np.ndarray]],
    original: _Original,
) -> None:
    want = {n: np.stack([w[n] for w in wants]) for n in got}
    if kind == "float":
        report = compare_outputs(got, want)
        assert report.passed, report.summary()
    elif kind == "hybrid":
        for n in got:
            worst = float(np.max(np.abs(got[n].astype(np.float64) - want[n])))
            assert worst <= HYBRID_ATOL, f"{n}: max abs {worst:.3g} > {HYBRID_ATOL}"
    else:
        for n in got:
            assert got[n].dtype.kind in "iu", f"{n} is {got[n].dtype}, not integers"
            steps = np.abs(got[n].astype(np.int64) - want[n].astype(np.int64))
            assert steps.max() <= INT8_STEPS, f"{n}: {steps.max()} quantization steps off"
    # The figures, for the report (``pytest -s``).
    worst = {n: float(np.max(np.abs(got[n].astype(np.float64) - want[n]))) for n in got}
    print(f"round trip ({kind}): max abs difference per output {worst}")
