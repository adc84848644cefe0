"""TFLite -> ONNX: read a ``.tflite`` flatbuffer without TensorFlow, verify against LiteRT.

Before -> After::

    model.tflite (NHWC, float / int8 / uint8 / float16 weights)
        -> ir.Model (same NHWC inputs and outputs; quantized tensors as QuantizeLinear/
           DequantizeLinear pairs around float ops; NCHW-only ONNX ops (Conv, pooling...) and
           the ops between them computed in NCHW, so Transposes sit at the graph's edges;
           resource variables, a streaming model's state, as inputs ``state:<name>`` with their
           initial values as defaults and outputs ``state_out:<name>``, see
           :func:`ferry.tflite.find_state`)

Reading needs the pure-Python ``tflite`` schema package; the reference (the source model run on the
same inputs) uses the LiteRT interpreter (``ai-edge-litert``) when it is installed, else
TensorFlow's ``tf.lite.Interpreter``, else there is none and ``Converted.notes`` says so. For
dynamic-range quantized models the reference runs with the int8 weights dequantized, as the
converted model computes (see ``reference``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ferry.converters._base import Converted, ConvertOptions, as_array, name_examples
from ferry.errors import ConversionError, InvalidInputError, ModelLoadError
from ferry.tflite import (
    STATE_INPUT_PREFIX,
    STATE_OUTPUT_PREFIX,
    TFLITE_DTYPES,
    State,
    TFLiteSubgraph,
    TFLiteTensor,
    find_state,
    is_tflite,
    read_tflite,
    translate,
)

__all__ = ["TFLiteConverter"]

logger = logging.getLogger(__name__)

# Integer kernels and a float simulation of them (QDQ) round differently now and then; each
# differing rounding moves an output by one step, and steps add up over a few layers. Measured on
# the fixtures: at most 2 steps; 3 leaves room for deeper models.
_QUANTIZED_STEPS = 3.0
_FLOAT_TYPES = {0, 1, 10}
_INT_QUANTIZED = {3, 7, 9}


class TFLiteConverter:
    """Converts ``.tflite`` files (or their bytes) to ONNX."""

    name = "tflite"
    extra = "tflite"
    suffixes: tuple[str, ...] = (".tflite",)

    def sniff(self, path: Path) -> bool:
        """A file whose bytes 4..8 are the TFLite flatbuffer identifier ``TFL3``."""
        try:
            if not path.is_file():
                return False
            with path.open("rb") as f:
                return is_tflite(f.read(8))
        except OSError:
            return False

    def accepts(self, obj: object) -> bool:
        """``bytes`` (or bytearray/memoryview) holding a TFLite flatbuffer."""
        return isinstance(obj, bytes | bytearray | memoryview) and is_tflite(obj)

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert a ``.tflite`` file (path) or flatbuffer bytes.

        Raises:
            ModelLoadError: the file is missing, unreadable, not TFLite, or corrupt.
            UnsupportedOpError: listing every op that has no translation.
            BackendUnavailableError: the ``tflite`` schema package is missing.
        """
        from ferry.converters._tflite.reference import make_reference

        data, label = _load(source)
        model = read_tflite(data, label)
        state = find_state(model)
        notes: list[str] = []
        others = len(model.subgraphs) - 1 - len(state.init_subgraphs)
        if others > 0:
            notes.append(
                f"the model has {len(model.subgraphs)} subgraphs; subgraph 0 (the main one) "
                "was converted"
            )
        if any(t.is_variable for t in model.subgraphs[0].tensors):
            notes.append(
                "variable tensors (the states of LSTM-style ops) start from their initial "
                "values on every run; LiteRT would carry them over between invocations"
            )
        ir_model = translate(
            model,
            label,
            input_shapes=options.input_shapes,
            dynamic_axes=options.dynamic_axes,
            state=state,
        )
        sg = model.subgraphs[0]
        if state.variables:
            notes.append(_state_note(state))
        outputs = [sg.tensors[i] for i in sg.outputs]
        in_names = [v.name or "" for v in ir_model.graph.inputs]
        out_names = [v.name or "" for v in ir_model.graph.outputs]
        # The state inputs have defaults (a fresh interpreter's values): the parity check leaves
        # them out, so it compares a first call with LiteRT's, state outputs included.
        samples = _sample_inputs(sg, in_names, options)
        reference, reference_notes = make_reference(data, sg, in_names, out_names, state=state)
        notes += reference_notes
        tolerance, note = _tolerance(sg, outputs)
        if note:
            notes.append(note)
        return Converted(
            model=ir_model,
            reference=reference,
            sample_inputs=samples,
            tolerance=tolerance,
            notes=notes,
        )


def _state_note(state: State) -> str:
    names = ", ".join(v.name for v in state.variables)
    starts = (
        "their initial values (from the model's CALL_ONCE init subgraph)"
        if all(v.initial is not None for v in state.inputs)
        else "their initial values (the init subgraph's, else zeros)"
    )
    return (
        f"stateful (streaming) model: its {len(state.variables)} resource variable(s) ({names}) "
        f"are explicit: input '{STATE_INPUT_PREFIX}<name>' (default: {starts}, as in a fresh "
        f"LiteRT interpreter) and output '{STATE_OUTPUT_PREFIX}<name>' (the value after the "
        "call). Feed each output back as the input of the next call to stream, as LiteRT "
        "carries them between invocations"
    )


def _load(source: Path | object) -> tuple[bytes, str]:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), "<TFLite flatbuffer in memory>"
    if not isinstance(source, str | os.PathLike):
        raise ModelLoadError(
            f"cannot read a TFLite model from a {type(source).__name__}; pass a .tflite path "
            "or the file's bytes"
        )
    path = Path(source)
    if not path.is_file():
        raise ModelLoadError(f"TFLite model not found: {path}")
    try:
        return path.read_bytes(), str(path)
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from e


# ----------------------------------------------------------------------------------- inputs


def _sample_inputs(
    sg: TFLiteSubgraph, names: list[str], options: ConvertOptions
) -> dict[str, np.ndarray]:
    """Inputs for the parity check: the user's example inputs, or ones that span what the model
    expects (the full integer range of a quantized input; for a float input that is quantized
    right away, the range its quantization covers; else uniform in [-1, 1]).

    ``names`` are the converted model's inputs: the subgraph's, then the state inputs, which
    examples may leave out (they have defaults).
    """
    if options.example_inputs is not None:
        named = name_examples(options.example_inputs, names, leading=True)
        missing = [n for n in names[: len(sg.inputs)] if n not in named]
        if missing:
            raise InvalidInputError(
                f"example_inputs lacks {', '.join(map(repr, missing))}, which the model needs; "
                f"its inputs are: {', '.join(names)}"
            )
        return {name: as_array(value, name) for name, value in named.items()}
    rng = np.random.default_rng(0)
    samples = {}
    for index, name in zip(sg.inputs, names):
        t = sg.tensors[index]
        shape = _sample_shape(t, (options.input_shapes or {}).get(t.name))
        samples[name] = _sample(rng, t, shape, _consumer_range(sg, index))
    return samples


def _sample_shape(t: TFLiteTensor, override: Sequence[int | str] | None) -> tuple[int, ...]:
    if override is not None and all(isinstance(d, int) for d in override):
        return tuple(int(d) for d in override)
    # An open dim samples at TFLite's placeholder size for the batch, else at a modest size
    # that any sane kernel fits in.
    return tuple(
        d if d is not None else (max(t.shape[i], 1) if i == 0 else 16) for i, d in enumerate(t.dims)
    )


def _consumer_range(sg: TFLiteSubgraph, index: int) -> tuple[float, float] | None:
    """The real range a float input is quantized to by the op that reads it, if one does."""
    for op in sg.operators:
        if op.opcode == "QUANTIZE" and op.inputs and op.inputs[0] == index:
            q = sg.tensors[op.outputs[0]]
            if q.quant is not None and q.type in _INT_QUANTIZED:
                info = np.iinfo(TFLITE_DTYPES[q.type])
                scale, zero = float(q.quant.scale[0]), int(q.quant.zero_point[0])
                return (info.min - zero) * scale, (info.max - zero) * scale
    return None


def _sample(
    rng: np.random.Generator,
    t: TFLiteTensor,
    shape: tuple[int, ...],
    span: tuple[float, float] | None,
) -> np.ndarray:
    if t.type in _INT_QUANTIZED:
        dtype = TFLITE_DTYPES[t.type]
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    if t.type in _FLOAT_TYPES:
        # Mobile models take normalized inputs (images in [0, 1] or [-1, 1], waveforms in
        # [-1, 1]); values far outside drive deep nets into ranges where float32 rounding
        # alone exceeds the parity tolerance.
        low, high = span if span is not None else (-1.0, 1.0)
        return rng.uniform(low, high, size=shape).astype(TFLITE_DTYPES[t.type])
    if t.type == 6:
        return rng.integers(0, 2, size=shape).astype(bool)
    if t.type in (2, 4):
        # Integer inputs are usually indices or ids; small values stay in range for most.
        return rng.integers(0, 3, size=shape).astype(np.int32 if t.type == 2 else np.int64)
    raise ConversionError(
        f"cannot make sample values for input {t.name!r} of type {t.type_name}; pass example_inputs"
    )


# -------------------------------------------------------------------------------- tolerance


def _tolerance(
    sg: TFLiteSubgraph, outputs: list[TFLiteTensor]
) -> tuple[tuple[float, float] | None, str | None]:
    """The parity tolerance: by dtype for float models (hybrid ones included, see
    ``reference``); in output quantization steps for quantized ones."""
    quantized_activations = any(
        t.quant is not None and t.type in _INT_QUANTIZED and t.data is None for t in sg.tensors
    )
    if not quantized_activations:
        return None, None
    atol = 0.0
    for t in outputs:
        if t.type in _INT_QUANTIZED:
            atol = max(atol, _QUANTIZED_STEPS)  # integer outputs: steps are units
        else:
            scale = _feeding_scale(sg, t.index)
            atol = max(atol, _QUANTIZED_STEPS * scale if scale else 1e-4)
    return (atol, 0.0), (
        f"quantized model: outputs are compared within {_QUANTIZED_STEPS:g} quantization "
        "steps (integer kernels and QDQ in float round differently)"
    )


def _feeding_scale(sg: TFLiteSubgraph, index: int) -> float | None:
    """The output scale of the quantized tensor a float output is dequantized from."""
    for op in sg.operators:
        if index in op.outputs and op.opcode == "DEQUANTIZE":
            q = sg.tensors[op.inputs[0]].quant
            if q is not None:
                return float(np.max(q.scale))
    return None
