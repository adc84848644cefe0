"""ONNX -> TFLite lowering of a prepared model: it becomes a :class:`~ferry.tflite.TFLiteModel`.

Before -> After::

    prepared model (names, types; input sizes fixed; every value's shape static; NCHW)
        -> one TFLite subgraph of builtin ops, NHWC inside, ONNX's layout at the edges

:func:`static_inputs` decides the sizes (a symbolic batch becomes 1), :func:`prepare_static`
makes the prepared copy (``ferry.mobile`` adds the optimizer's basic pipeline first), and
:func:`lower_prepared` walks it in order: each node is folded when its inputs are constants,
else handed to its op's translator (``_ops_*``), which writes TFLite operators in the layouts
its op needs (:mod:`._layout`). Every node that cannot be lowered is collected, with the
reason, and reported at once (:func:`node_problems` gives them node by node). Peephole passes
(:mod:`._fuse`) fuse activations and biases, and the int8 and fp16 precisions rewrite the
weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ferry._version import __version__
from ferry.errors import InvalidInputError, UnsupportedOpError
from ferry.graph import graph_inputs, infer_value_types, prepare, shape_of, with_input_shapes
from ferry.tflite._onnx_to_tflite._context import Held, Lowering, Options
from ferry.tflite._onnx_to_tflite._fold import evaluate
from ferry.tflite._onnx_to_tflite._fuse import (
    cleanup,
    fuse_activations,
    fuse_bias,
    fuse_hard_swish,
    weights_to_fp16,
)
from ferry.tflite._onnx_to_tflite._int8 import (
    QDQ_OPS,
    Int8Weights,
    finish_int8,
    fold_qdq,
    run_node,
)
from ferry.tflite._onnx_to_tflite._layout import Perm, channels_last, identity, permute
from ferry.tflite._onnx_to_tflite._ops_conv import OPS as CONV_OPS
from ferry.tflite._onnx_to_tflite._ops_elementwise import OPS as ELEMENTWISE_OPS
from ferry.tflite._onnx_to_tflite._ops_index import OPS as INDEX_OPS
from ferry.tflite._onnx_to_tflite._ops_math import OPS as MATH_OPS
from ferry.tflite._onnx_to_tflite._ops_rnn import OPS as RNN_OPS
from ferry.tflite._onnx_to_tflite._ops_shape import OPS as SHAPE_OPS
from ferry.tflite._onnx_to_tflite._ops_values import OPS as VALUE_OPS
from ferry.tflite._onnx_to_tflite._static import fold_constants
from ferry.tflite._schema import TFLITE_TYPE_NAMES, TFLiteModel, TFLiteTensor
from ferry.tflite._unsupported import Unsupported

__all__ = [
    "PRECISIONS",
    "TRANSLATORS",
    "IOInfo",
    "Lowered",
    "check_precision",
    "infer_shapes",
    "is_qdq",
    "lower_prepared",
    "node_problems",
    "prepare_static",
    "static_inputs",
]

logger = logging.getLogger(__name__)

#: The precisions the export writes.
PRECISIONS = ("fp32", "fp16", "int8")

#: ONNX op type -> its translator.
TRANSLATORS: dict[str, Callable[[Lowering, ir.Node], None]] = {
    **ELEMENTWISE_OPS,
    **SHAPE_OPS,
    **CONV_OPS,
    **MATH_OPS,
    **RNN_OPS,
    **VALUE_OPS,
    **INDEX_OPS,  # last: its Div takes integer division and hands the rest to ELEMENTWISE_OPS'
}

#: At most this many rounds of folding and inference in :func:`prepare_static`.
_FOLD_ROUNDS = 8

#: Ops lowered as ops even when their inputs are constant, at int8 only (the QDQ translators
#: keep the integers behind them). At fp32 and fp16 there is no such translator and a
#: DequantizeLinear of stored integers (a weight-only quantized model's) folds to float weights.
_NOT_FOLDED = {"QuantizeLinear", "DequantizeLinear"}

_CONTROL_FLOW = "control flow (ferry writes no WHILE/IF subgraphs)"
_DYNAMIC_INT8 = (
    "dynamic int8 quantization: export the float model (fp32/fp16), or quantize it statically "
    "with ferry quantize --target tflite and export with precision int8"
)
_DATA_SIZED = "its output's size depends on the data; TFLite needs static shapes"

#: Why ops without a translator cannot be lowered, where there is more to say than "no op".
_NO_TFLITE_OP = {
    "Loop": _CONTROL_FLOW,
    "If": _CONTROL_FLOW,
    "Scan": _CONTROL_FLOW,
    "DynamicQuantizeLinear": _DYNAMIC_INT8,
    "ConvInteger": _DYNAMIC_INT8,
    "MatMulInteger": _DYNAMIC_INT8,
    "NonZero": _DATA_SIZED,
    "NonMaxSuppression": _DATA_SIZED,
    "Unique": _DATA_SIZED,
}


@dataclasses.dataclass(frozen=True)
class IOInfo:
    """A model input or output as the ``.tflite`` file has it.

    Attributes:
        name: the ONNX name, kept in the ``.tflite`` file.
        shape: the TFLite tensor's shape.
        dtype: numpy's name of its element type.
        layout: for 4-D tensors, ``as ONNX`` (the model's own order, NCHW for most) or ``NHWC``
            (made channels-last by ``nhwc_io``); ``-`` for the others.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    perm: Perm

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
        }


@dataclasses.dataclass
class Lowered:
    """A lowering's result: the TFLite model and what the report says about it."""

    model: TFLiteModel
    inputs: list[IOInfo]
    outputs: list[IOInfo]
    #: Input sizes the export fixed: given ones and symbolic batches set to 1.
    fixed_shapes: dict[str, tuple[int, ...]]
    #: Inputs whose symbolic first dim (the batch) was set to 1.
    batch_fixed: list[str]
    #: ONNX ops of the prepared model (after the optimizer), by type.
    onnx_ops: dict[str, int]
    fused_activations: int
    fp16_weights: int
    notes: list[str] = dataclasses.field(default_factory=list)


def check_precision(model: ir.Model, precision: str) -> None:
    """Refuse a precision the model cannot be lowered in.

    Raises:
        InvalidInputError: an unknown precision, ``int8`` for a float model, or a quantized
            (QDQ) model at another precision.
    """
    if precision not in PRECISIONS:
        raise InvalidInputError(
            f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    # Activations quantized (a QuantizeLinear): integer kernels. DequantizeLinear alone (weights
    # stored as integers) folds to float weights at any precision.
    qdq = is_qdq(model)
    if precision == "int8" and not qdq:
        raise InvalidInputError(
            "precision int8 takes a quantized (QDQ) model and this one is float; quantize it "
            "first: ferry quantize MODEL --target tflite -o model.int8.onnx --data ..."
        )
    if qdq and precision != "int8":
        raise InvalidInputError(
            "this model's activations are quantized (QuantizeLinear nodes): export it with "
            "precision int8, or export the float model it was made from"
        )


def is_qdq(model: ir.Model) -> bool:
    """Whether the model's activations are quantized (it has QuantizeLinear nodes)."""
    return any(n.op_type == "QuantizeLinear" for n in model.graph)


def lower_prepared(
    work: ir.Model,
    *,
    precision: str = "fp32",
    nhwc_io: bool = False,
    fixed: Mapping[str, tuple[int, ...]] | None = None,
    batch: Sequence[str] = (),
) -> Lowered:
    """Lower a prepared model (static shapes on every value, see :func:`prepare_static`).

    Before -> After::

        prepared ONNX model (NCHW, static shapes) -> Lowered (one TFLite subgraph, NHWC inside)

    Args:
        work: the prepared model; read, not changed.
        precision: ``fp32``, ``fp16`` (weights stored as float16) or ``int8`` (a QDQ model).
        nhwc_io: 4-D inputs and outputs in NHWC instead of ONNX's layout.
        fixed: the input sizes the preparation fixed (recorded in the result).
        batch: the inputs whose symbolic batch was set to 1 (recorded in the result).

    Raises:
        InvalidInputError: a quantized model that TFLite's int8 kernels cannot run.
        UnsupportedOpError: nodes TFLite cannot run, every one named with the reason.
    """
    channels_last: frozenset[str] = frozenset()
    done = None
    if nhwc_io:
        # Which 4-D inputs and outputs the model treats as NCHW: those the lowering transposes
        # to or from NHWC at the edge. The other 4-D ones go channels-last too if that leaves
        # fewer TRANSPOSEs (an input sliced before its first conv); one already NHWC (a
        # TensorFlow model's) stays as it is.
        probe = _Pass(work, Options(precision=precision))
        channels_last = frozenset(probe.nchw_edges())
        done = _Pass(work, Options(precision=precision, channels_last=channels_last))
        others = frozenset(probe.four_d()) - channels_last
        if others:
            trial = _Pass(work, Options(precision=precision, channels_last=channels_last | others))
            if trial.transposes() < done.transposes():
                done = trial
    if done is None:
        done = _Pass(work, Options(precision=precision))
    cx = done.cx
    sg = done.model.subgraphs[0]
    return Lowered(
        model=done.model,
        inputs=[_io(sg.tensors[i], info) for i, info in zip(sg.inputs, done.inputs)],
        outputs=[_io(sg.tensors[o], info) for o, info in zip(sg.outputs, done.outputs)],
        fixed_shapes=dict(fixed or {}),
        batch_fixed=list(batch),
        onnx_ops=dict(Counter(n.op_type for n in work.graph)),
        fused_activations=done.fused,
        fp16_weights=done.halves,
        notes=cx.notes + done.notes,
    )


def node_problems(work: ir.Model, precision: str = "fp32") -> dict[str, str]:
    """Why each node of a prepared model that cannot be lowered cannot be: the lowering's
    coverage, node by node, without stopping at the first problem.

    Before -> After::

        prepared model (static shapes) -> {"nms": "NonMaxSuppression: its output's size ...",
                                           "after_nms": "reads 'nms_out', ...: ..."}

    Nodes that fail only because they read the result of a node that cannot be lowered (whose
    size is then unknown) are named too, with that reason: they could not be lowered in a
    partition of their own either. Nodes not named can be.
    """
    cx = Lowering(work, Options(precision=precision))
    if precision == "int8":
        try:
            fold_qdq(cx)
        except Unsupported as e:
            why = f"the quantized model cannot run TFLite's int8 kernels: {e}"
            return {node.name or node.op_type: why for node in work.graph}
        cx.weights = Int8Weights()
    _declare_inputs(cx)
    return {
        name: why if why.startswith(op) else f"{op}: {why}"
        for name, op, why in _lower_nodes(cx, knock_on=True)
    }


def prepare_static(model: ir.Model, fixed: Mapping[str, tuple[int, ...]]) -> ir.Model:
    """The named, typed copy at the given input sizes, every value's shape inferred: what
    :func:`lower_prepared` takes, without the optimizer (which ``ferry.mobile`` adds); what is
    computed from constants and static sizes alone is folded (``_static.fold_constants``).

    Before -> After::

        model (input x: [N, 3, 224, 224]) -> copy (x: [1, 3, 224, 224], every value static)
    """
    work = prepare(model)
    if fixed:
        with_input_shapes(work, fixed, in_place=True, keep_output_shapes=True)
    infer_shapes(work)
    # Shape arithmetic (Shape -> Gather -> Div -> Concat -> Pad) hides sizes from inference:
    # folded, inference sees through it; repeated while a pass folds something.
    for _ in range(_FOLD_ROUNDS):
        if not fold_constants(work):
            break
        infer_shapes(work)
    work.graph.sort()
    return work


class _Pass:
    """One lowering of the prepared model with the given options (the whole subgraph)."""

    def __init__(self, work: ir.Model, options: Options) -> None:
        precision = options.precision
        cx = Lowering(work, options)
        self.cx = cx
        self.notes: list[str] = []
        if precision == "int8":
            try:
                self.notes += fold_qdq(cx)
            except Unsupported as e:
                raise InvalidInputError(
                    f"the quantized model cannot run TFLite's int8 kernels: {e}"
                ) from e
            cx.weights = Int8Weights()
        self.inputs = _declare_inputs(cx)
        problems = _lower_nodes(cx)
        if problems:
            raise UnsupportedOpError(
                _unsupported_message(problems), [(op, name) for name, op, _ in problems]
            )
        self.held_outputs = {v: cx.held.get(v) for v in work.graph.outputs}
        self.outputs = _declare_outputs(cx)
        out_indices = {o.index for o in self.outputs}
        self.fused = fuse_activations(cx.b, out_indices)
        self.fused -= fuse_hard_swish(cx.b, out_indices)  # each took a fused ADD+RELU6 along
        fuse_bias(cx.b, out_indices)
        cleanup(cx.b, out_indices)
        self.halves = weights_to_fp16(cx.b) if precision == "fp16" else 0
        if precision == "int8":
            self.notes += finish_int8(cx, out_indices)
        self.model = cx.b.model(
            [i.index for i in self.inputs],
            [o.index for o in self.outputs],
            f"ferry {__version__}: {precision} export of {work.graph.name or 'an ONNX model'}",
        )

    def transposes(self) -> int:
        return sum(op.opcode == "TRANSPOSE" for op in self.model.subgraphs[0].operators)

    def four_d(self) -> list[str]:
        """Names of the 4-D inputs and outputs."""
        values = [*graph_inputs(self.cx.model), *self.cx.model.graph.outputs]
        return [v.name or "" for v in values if v.shape is not None and len(v.shape) == 4]

    def nchw_edges(self) -> list[str]:
        """Names of the 4-D inputs read in NHWC and 4-D outputs made in NHWC."""
        nhwc = channels_last(4)
        found = []
        quantized: dict[int, list[int]] = {}  # int8 export: the input's QUANTIZE comes first
        for op in self.cx.b.operators:
            if op.opcode == "QUANTIZE":
                quantized.setdefault(op.inputs[0], []).extend(op.outputs)
        for value, held in zip(graph_inputs(self.cx.model), self.inputs):
            tensors = [held.index, *quantized.get(held.index, [])]
            if len(held.perm) == 4 and any((t, nhwc) in self.cx.views for t in tensors):
                found.append(value.name or "")
        for value, before in self.held_outputs.items():
            if before is not None and before.perm == nhwc:
                found.append(value.name or "")
        return found


# ------------------------------------------------------------------------------- preparation


def static_inputs(
    model: ir.Model, shapes: Mapping[str, Sequence[int]]
) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Every input's size at export: given, declared, or a symbolic batch set to 1.

    Raises:
        InvalidInputError: an unknown name, a size contradicting the model, an open dim left.
    """
    inputs = {v.name or "": v for v in graph_inputs(model)}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise InvalidInputError(
            f"--shape names {', '.join(map(repr, unknown))}, not an input of the model; its "
            f"inputs are {', '.join(map(repr, inputs))}"
        )
    fixed: dict[str, tuple[int, ...]] = {}
    batch: list[str] = []
    problems: list[str] = []
    for name, value in inputs.items():
        declared = shape_of(value)
        if name in shapes:
            dims = tuple(int(d) for d in shapes[name])
            if any(d < 1 for d in dims):
                raise InvalidInputError(f"--shape {name}: sizes must be positive, got {list(dims)}")
            if declared is not None:
                if len(declared) != len(dims):
                    raise InvalidInputError(
                        f"--shape {name}={','.join(map(str, dims))} has rank {len(dims)}, but the "
                        f"input has rank {len(declared)} ({list(declared)})"
                    )
                for axis, (have, want) in enumerate(zip(declared, dims)):
                    if isinstance(have, int) and have != want:
                        raise InvalidInputError(
                            f"--shape {name}: dim {axis} is fixed at {have} in the model, not {want}"
                        )
            fixed[name] = dims
            continue
        if declared is None:
            problems.append(f"input {name!r} has no declared shape")
            continue
        dims_list = []
        for axis, d in enumerate(declared):
            if isinstance(d, int):
                dims_list.append(d)
            elif axis == 0:
                dims_list.append(1)
                if name not in batch:
                    batch.append(name)
            else:
                problems.append(f"input {name!r} dim {axis} ({d or '?'}) is dynamic")
                dims_list.append(1)
        if any(not isinstance(d, int) for d in declared):
            fixed[name] = tuple(dims_list)
    if problems:
        wanted = []
        for n, value in inputs.items():
            declared = shape_of(value)
            if n in shapes or declared is None or all(isinstance(d, int) for d in declared[1:]):
                continue
            words = [_size_word(d, axis) for axis, d in enumerate(declared)]
            wanted.append(f"--shape {n}={','.join(['1', *words[1:]])}")
        raise InvalidInputError(
            "TFLite fixes every size but the batch at export: "
            + "; ".join(problems)
            + ". Give the sizes to export at: "
            + " ".join(wanted or ["--shape NAME=DIMS"])
            + " with the capitals replaced by sizes (shapes= in Python)"
        )
    return fixed, batch


def _size_word(dim: object, axis: int) -> str:
    """A dim as the sizes hint writes it: its size, or a capitalized name to replace (a dim
    without a usable name, ``?`` or none, is called after its axis)."""
    if isinstance(dim, int):
        return str(dim)
    name = str(dim or "")
    return name.upper() if name.isidentifier() else f"DIM{axis}"


def infer_shapes(work: ir.Model) -> None:
    """Give every value the static shape ONNX's inference finds where its own is not static
    (declared output shapes may be symbolic, or wrong: the inferred ones win when static)."""
    for value in work.graph.outputs:
        if value.producer() is not None:
            value.shape = None  # exporters declare outputs wrong (even their rank)
    inferred = infer_value_types(work)
    for node in work.graph:
        for value in node.outputs:
            dtype, shape = inferred.get(value.name or "", (None, None))
            if shape is not None and all(isinstance(d, int) for d in shape):
                value.shape = ir.Shape(list(shape))
            if value.dtype is None and dtype is not None:
                value.dtype = ir.DataType.from_numpy(np.dtype(dtype))


# ---------------------------------------------------------------------------------- lowering


def _io_perm(cx: Lowering, value: ir.Value) -> Perm:
    rank = cx.rank(value)
    wanted = rank == 4 and (value.name or "") in cx.options.channels_last
    return channels_last(4) if wanted else identity(rank)


def _declare_inputs(cx: Lowering) -> list[Held]:
    held = []
    for value in graph_inputs(cx.model):
        perm = _io_perm(cx, value)
        index = cx.b.tensor(value.name or "input", cx.ttype(value), permute(cx.shape(value), perm))
        if value in cx.quant:
            cx.b.tensors[index].quant = cx.quant[value][1]
        cx.held[value] = Held(index, perm)
        held.append(cx.held[value])
    return held


def _lower_nodes(cx: Lowering, *, knock_on: bool = False) -> list[tuple[str, str, str]]:
    """Lower every node; ``(node name, op, reason)`` of those that cannot be.

    A node that fails only because it reads what a node that cannot be lowered makes is left
    out (the export reports causes), unless ``knock_on`` (a per-node check wants every node).
    """
    opset = cx.model.opset_imports.get("", cx.model.opset_imports.get("ai.onnx", 13))
    problems: list[tuple[str, str, str]] = []
    poisoned: set[ir.Value] = set()
    for node in cx.model.graph:
        cx.node = node
        if node in cx.done:
            continue
        name = node.name or node.op_type
        if node.domain not in ("", "ai.onnx"):
            problems.append((name, f"{node.domain}.{node.op_type}", "a custom-domain op"))
            _placeholders(cx, node, poisoned)
            continue
        if node.outputs and all(o in cx.folded for o in node.outputs):
            continue  # computed at export already (a quantized model's constants)
        consts = [cx.const(v) for v in node.inputs]
        keep = cx.options.precision == "int8" and node.op_type in _NOT_FOLDED
        if not keep and all(
            c is not None or v is None for v, c in zip(node.inputs, consts)
        ):  # a Constant node too: no inputs
            results = evaluate(node, consts, opset)
            if results is not None:
                for value, array in zip(node.outputs, results):
                    cx.folded[value] = array
                continue
        translator = TRANSLATORS.get(node.op_type)
        if cx.options.precision == "int8" and node.op_type in QDQ_OPS:
            translator = QDQ_OPS[node.op_type]
        if translator is None:
            why = _NO_TFLITE_OP.get(node.op_type, "TFLite has no builtin op for it")
            problems.append((name, node.op_type, why))
            _placeholders(cx, node, poisoned)
            continue
        try:
            if cx.options.precision == "int8":
                run_node(cx, node, translator)
            else:
                translator(cx, node)
        except Unsupported as e:
            # A node reading a value no stand-in could be made for fails for that reason alone.
            cause = next(
                (v for v in node.inputs if v is not None and v in poisoned and not cx.is_held(v)),
                None,
            )
            if cause is None:
                problems.append((name, node.op_type, str(e)))
            elif knock_on:
                why = f"reads {cause.name!r}, made by a node TFLite cannot run ({e})"
                problems.append((name, node.op_type, why))
            _placeholders(cx, node, poisoned)
    return problems


def _placeholders(cx: Lowering, node: ir.Node, poisoned: set[ir.Value]) -> None:
    """Stand-in tensors for a node that was not lowered, so the nodes after it are still
    checked (their own problems are reported too)."""
    for value in node.outputs:
        poisoned.add(value)
        with contextlib.suppress(Unsupported):
            cx.output(value)


def _unsupported_message(problems: list[tuple[str, str, str]]) -> str:
    groups: dict[tuple[str, str], list[str]] = {}
    for name, op, why in problems:
        groups.setdefault((op, why), []).append(name)
    lines = [
        f"  {names[0]} ({op}): {why}"
        if len(names) == 1
        else f"  {op} x{len(names)} ({why}): {', '.join(names)}"
        for (op, why), names in groups.items()
    ]
    ops = sorted({op for _, op, _ in problems})
    return (
        f"{len(problems)} node(s) cannot be lowered to TFLite builtin ops ({', '.join(ops)}):\n"
        + "\n".join(lines)
    )


def _declare_outputs(cx: Lowering) -> list[Held]:
    """The graph outputs, each a tensor named as the ONNX output, in ONNX's layout (NHWC for
    4-D outputs with ``nhwc_io``)."""
    outputs: list[Held] = []
    taken: set[int] = {h.index for v, h in cx.held.items() if v.is_graph_input()}
    for value in cx.model.graph.outputs:
        perm = _io_perm(cx, value)
        if value not in cx.held:
            array = cx.const(value)
            if array is None:
                raise UnsupportedOpError(f"output {value.name!r} is not computed by any op")
            index = cx.constant(
                array.transpose(perm) if array.ndim else array, f"{value.name}/const"
            )
        else:
            index = cx.get(value, perm)
        tensor = cx.b.tensors[index]
        if tensor.quant is not None and value.dtype is not None and not value.dtype.is_integer():
            # Integers standing for a float output: the app reads floats.
            floats = cx.temp(value.name or "output", 0, tensor.shape)
            cx.emit("DEQUANTIZE", [index], [floats])
            index = floats
        if index in taken or cx.b.is_const(index):
            # An output that is an input, a constant or another output: a copy of its own.
            copy = cx.temp(
                value.name or "output", cx.ttype_of(index), cx.b.tensors[index].shape, index
            )
            cx.emit("RESHAPE", [index, cx.ints(cx.b.tensors[index].shape)], [copy])
            index = copy
        cx.b.rename(index, value.name or "output")
        taken.add(index)
        outputs.append(Held(index, perm))
    return outputs


def _io(tensor: TFLiteTensor, held: Held) -> IOInfo:
    rank = len(held.perm)
    layout = "-" if rank != 4 else ("NHWC" if held.perm == channels_last(4) else "as ONNX")
    return IOInfo(
        tensor.name, tensor.shape, TFLITE_TYPE_NAMES.get(tensor.type, "?"), layout, held.perm
    )
