"""The parity reference: the source ``.tflite`` run by the LiteRT interpreter.

A stateful model (resource variables, see :func:`ferry.tflite.find_state`) is run two ways. Called without state
inputs, or with their initial values, the reference is the file itself in a fresh interpreter
(its CALL_ONCE initialises the variables as on a device's first call), with the variables' new
values read from the tensors assigned to them. Called with other state, it is a copy of the file
in which the variables are plain subgraph inputs and outputs (the ops handling them removed),
since LiteRT offers no way to set a variable from outside.

For dynamic-range (hybrid) models, LiteRT's kernels quantize activations to int8 on the fly while
the converted model computes in float with the weights dequantized, which is more exact; over a
deep network the two drift apart by a good share of the output range, which no fixed tolerance
separates from a conversion bug. So for those models the reference runs a copy of the file with
the hybrid weights dequantized to float32 (LiteRT then runs its float kernels), and the check stays
as strict as for float models. :func:`hybrid_weights` says whether a model is hybrid.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.converters._base import ReferenceFn, first_line, native_stderr_to_log, require_inputs
from ferry.tflite import STATE_OPS, TFLITE_IDENTIFIER, TFLITE_INT4, State, TFLiteSubgraph

__all__ = [
    "HYBRID_OPS",
    "dequantize_hybrid_weights",
    "hybrid_weights",
    "make_reference",
    "stateless",
    "with_outputs",
]

logger = logging.getLogger(__name__)

#: Ops that have hybrid kernels: float activations, int8 (or int4) constant weights.
HYBRID_OPS = {
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "FULLY_CONNECTED",
    "BATCH_MATMUL",
    "TRANSPOSE_CONV",
    "UNIDIRECTIONAL_SEQUENCE_LSTM",
    "BIDIRECTIONAL_SEQUENCE_LSTM",
    "UNIDIRECTIONAL_SEQUENCE_RNN",
    "SVDF",
    "EMBEDDING_LOOKUP",
}
_FLOAT32, _INT8 = 0, 9


def hybrid_weights(sg: TFLiteSubgraph) -> set[int]:
    """Indices of the int8/int4 constant tensors that hybrid ops read with float activations."""
    found: set[int] = set()
    for op in sg.operators:
        if op.opcode not in HYBRID_OPS:
            continue
        floats = [i for i in op.inputs if i >= 0 and sg.tensors[i].type == _FLOAT32]
        if not floats:
            continue
        for i in op.inputs:
            t = sg.tensors[i] if i >= 0 else None
            if t is not None and t.type in (_INT8, TFLITE_INT4) and t.data is not None and t.quant:
                found.add(i)
    return found


def _interpreter() -> tuple[Any, Any, str]:
    """(Interpreter class, flatbuffer schema module, why not) from LiteRT, else TensorFlow."""
    try:
        from ai_edge_litert import schema_py_generated as schema
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter, schema, ""
    except ImportError:
        pass
    try:  # TensorFlow still ships the interpreter (deprecated in favour of LiteRT)
        import tensorflow as tf
        from tensorflow.lite.python import schema_py_generated as schema

        return tf.lite.Interpreter, schema, ""
    except ImportError:
        return (
            None,
            None,
            "neither ai-edge-litert nor tensorflow is installed (pip install 'ferry[tflite]')",
        )


def dequantize_hybrid_weights(
    data: bytes, schema: Any, sg: TFLiteSubgraph, tensors: set[int]
) -> bytes:
    """A copy of the flatbuffer with subgraph 0's ``tensors`` (int8/int4 weights, as read into
    ``sg``) turned into float32 constants, through the schema's object API (the TFLite writer's own
    code)."""
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    written = model.subgraphs[0]
    for index in sorted(tensors):
        read = sg.tensors[index]
        if read.data is None or read.quant is None:
            continue  # not a quantized constant: hybrid_weights picks none such
        real = read.quant.dequantize(read.data).astype("<f4")
        t = written.tensors[index]
        fresh = schema.BufferT()
        fresh.data = np.frombuffer(real.tobytes(), dtype=np.uint8)
        model.buffers.append(fresh)  # buffers may be shared: leave the original alone
        t.buffer = len(model.buffers) - 1
        t.type = _FLOAT32
        t.quantization = None
    return _pack(model, len(data))


def _pack(model: Any, size: int) -> bytes:
    import flatbuffers

    builder = flatbuffers.Builder(size * 2 + 1024)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    return bytes(builder.Output())


def with_outputs(data: bytes, schema: Any, tensors: Sequence[int]) -> bytes:
    """A copy of the flatbuffer whose subgraph 0 also outputs ``tensors`` (after its own)."""
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    main = model.subgraphs[0]
    main.outputs = [*_ints(main.outputs), *tensors]
    return _pack(model, len(data))


def stateless(data: bytes, schema: Any, sg: TFLiteSubgraph, state: State) -> bytes:
    """A copy of the flatbuffer in which subgraph 0's resource variables are plain inputs and
    outputs, in the converted model's order (after the model's own): each variable's first read
    tensor is an input, the tensor last assigned to it an output, later reads are wired to the
    tensor they read, and the ops handling variables (CALL_ONCE included) are gone."""
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    main = model.subgraphs[0]
    kept = []
    for read, op in zip(sg.operators, main.operators):
        if read.opcode in STATE_OPS:
            continue
        op.inputs = [state.aliases.get(i, i) for i in _ints(op.inputs)]
        kept.append(op)
    main.operators = kept
    main.inputs = [*_ints(main.inputs), *(v.read for v in state.inputs)]
    outputs = [state.aliases.get(i, i) for i in _ints(main.outputs)]
    main.outputs = [*outputs, *(v.assigned for v in state.outputs)]
    return _pack(model, len(data))


def _ints(values: Any) -> list[int]:
    return [] if values is None else [int(v) for v in values]


def make_reference(
    data: bytes,
    sg: TFLiteSubgraph,
    in_names: Sequence[str],
    out_names: Sequence[str],
    *,
    state: State | None = None,
    dequantize_hybrid: bool = True,
) -> tuple[ReferenceFn | None, list[str]]:
    """A function running the model with LiteRT, and notes on how it runs it.

    Inputs and outputs are named as the converted model's: ``in_names``/``out_names`` follow
    subgraph 0's input and output order, then ``state``'s inputs and outputs.
    """
    cls, schema, why = _interpreter()
    if cls is None:
        return None, [f"no reference run: {why}"]
    notes = []
    state = state if state is not None else State()
    hybrid = hybrid_weights(sg) if dequantize_hybrid else set()
    content = data
    if hybrid:
        try:
            content = dequantize_hybrid_weights(data, schema, sg, hybrid)
        except Exception as e:  # an unusual file the object API cannot round-trip
            logger.debug("cannot dequantize the hybrid weights", exc_info=True)
            return None, [f"no reference run: cannot rewrite the hybrid weights ({e})"]
        notes.append(
            f"dynamic-range quantized model: {len(hybrid)} int8 weight tensors are dequantized "
            "in the converted model, which computes in float; the reference ran LiteRT on the "
            "same dequantized weights (LiteRT's hybrid kernels also round activations to int8)"
        )
    n_in, n_out = len(sg.inputs), len(sg.outputs)
    inputs = list(zip(sg.inputs, in_names[:n_in]))
    outputs = list(zip(sg.outputs, out_names[:n_out]))
    # (tensor, name) of the variables' first reads and last assignments.
    state_in = [(v.read, n) for v, n in zip(state.inputs, in_names[n_in:]) if v.read is not None]
    state_out = [
        (v.assigned, n) for v, n in zip(state.outputs, out_names[n_out:]) if v.assigned is not None
    ]
    fresh = content
    explicit = None
    if state.variables:
        try:
            fresh = with_outputs(content, schema, [index for index, _ in state_out])
            explicit = stateless(content, schema, sg, state)
        except Exception as e:  # an unusual file the object API cannot round-trip
            logger.debug("cannot rewrite the stateful model", exc_info=True)
            return None, [*notes, f"no reference run: cannot rewrite the state ops ({e})"]
    try:
        with native_stderr_to_log(logger):
            interpreter = cls(model_content=explicit or content)
            if explicit is not None:
                cls(model_content=fresh)  # what a first call runs loads too
    except Exception as e:  # custom/Flex ops it lacks, names it cannot decode...: no reference
        return None, [*notes, f"no reference run: LiteRT cannot load the model: {first_line(e)}"]
    defaults = {name: v.default(sg) for v, name in zip(state.inputs, in_names[n_in:])}
    shapes: dict[str, Any] = {"shapes": None}

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, [name for _, name in inputs], "the TFLite reference")
        first_call = all(
            name not in feeds or np.array_equal(np.asarray(feeds[name]), value)
            for name, value in defaults.items()
        )
        wanted = [*outputs, *state_out]
        if state.variables and first_call:
            # A fresh interpreter: CALL_ONCE initialises the variables, as on a first call.
            with native_stderr_to_log(logger):
                first = cls(model_content=fresh)
            return _invoke(first, inputs, feeds, wanted, None)
        given = [*inputs, *state_in]
        feeds = {**defaults, **feeds}
        return _invoke(interpreter, given, feeds, wanted, shapes)

    return run, notes


def _invoke(
    interpreter: Any,
    inputs: Sequence[tuple[int, str]],
    feeds: dict[str, np.ndarray],
    outputs: Sequence[tuple[int, str]],
    shapes: dict[str, Any] | None,
) -> dict[str, np.ndarray]:
    """Set ``inputs`` (tensor index, feed name), invoke, and read ``outputs`` by name."""
    details = {d["index"]: d for d in interpreter.get_input_details()}
    arrays = [(details[index], np.asarray(feeds[name], order="C")) for index, name in inputs]
    current = [a.shape for _, a in arrays]
    if shapes is None or current != shapes["shapes"]:
        for detail, array in arrays:
            interpreter.resize_tensor_input(detail["index"], array.shape, strict=False)
        with native_stderr_to_log(logger):
            interpreter.allocate_tensors()
        if shapes is not None:
            shapes["shapes"] = current
    for detail, array in arrays:
        interpreter.set_tensor(detail["index"], array.astype(detail["dtype"], copy=False))
    # LiteRT keeps variable tensors (LSTM states) from one invoke to the next; the ONNX
    # model starts every run from their initial values, so the reference must too.
    interpreter.reset_all_variables()
    interpreter.invoke()
    found = {d["index"]: d for d in interpreter.get_output_details()}
    return {
        name: np.array(interpreter.get_tensor(found[index]["index"])) for index, name in outputs
    }
