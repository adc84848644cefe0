"""Mending what paddle2onnx writes, for the Paddle converter: one-element vectors where ONNX demands
them (:class:`VectorOperandsPass`), outputs named in the program's fetch order, the inputs' dims
named and fixed as asked, and sample inputs that fit the converted model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.converters._base import (
    DEFAULT_BATCH,
    ConvertOptions,
    as_array,
    check_input_options,
    name_examples,
)
from ferry.errors import ConversionError, InvalidInputError
from ferry.graph import infer_value_types

__all__ = ["VectorOperandsPass"]

logger = logging.getLogger(__name__)

# How paddle2onnx names the dims it knows nothing about.
_P2O_DIM = re.compile(r"DynamicDimension\.\d+")
# Operands ONNX requires to be 1-D (by input index): shapes, repeats, slice bounds, pads, sizes.
_VECTOR_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1,),
    "Resize": (1, 2, 3),
    "TopK": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
}


class VectorOperandsPass(ir.passes.InPlacePass):
    """Give ONNX the one-element vectors a legacy Paddle program had, where paddle2onnx made
    0-D scalars of them.

    Programs saved by Paddle before 2.5 have no 0-D tensors: an index or a slice that drops the
    only axis of a shape tensor (``x.shape[0]``) is a tensor of shape [1] there, and so is every
    ``fill_constant`` of a shape list. paddle2onnx 2.x, written for 0-D Paddle, squeezes the
    first to 0-D but keeps the second 1-D, so the ``Concat`` that assembles a new shape (every
    ``reshape`` with a computed dim) mixes ranks, and ONNX's checker and every runtime refuse the
    model ("All inputs to Concat must have same rank", "axis must be in [-rank, rank-1]"). A 0-D
    value where ONNX demands a 1-D one has a single reading, the one-element vector it was in
    Paddle, so the repair is exact.

    Before -> After::

        Concat(axis=0)(a: [1], s: [], b: [1])  ->  Concat(axis=0)(a, Reshape(s, [1]), b)
        Reshape(x, s: [])                       ->  Reshape(x, Reshape(s, [1]))
        (likewise the 1-D operands of Expand, Tile, ConstantOfShape, Slice, Pad, Resize, TopK,
        Squeeze and Unsqueeze)

    Ranks come from ONNX shape inference, which reads weights whether they are initializers or
    Constant nodes (paddle2onnx writes the latter). A value of unknown rank is left as it is; a
    Concat that also takes inputs of rank 2 or more is not this bug and is left to the checker.
    """

    _ROUNDS = 8  # each round can reveal ranks downstream of the Concats it mended

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for _ in range(self._ROUNDS):
            ranks = {
                name: len(shape)
                for name, (_, shape) in infer_value_types(model).items()
                if shape is not None
            }
            if not self._mend(model, ranks):
                break
            modified = True
        return ir.passes.PassResult(model, modified=modified)

    def _mend(self, model: ir.Model, ranks: dict[str, int]) -> bool:
        vectors: dict[tuple[int, ir.Value], ir.Value] = {}
        mended = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            known = [None if v is None else ranks.get(v.name or "") for v in node.inputs]
            if node.op_type == "Concat":
                if any(r is not None and r > 1 for r in known):
                    continue
                positions = [i for i, r in enumerate(known) if r == 0]
            else:
                operands = _VECTOR_OPERANDS.get(node.op_type, ())
                positions = [i for i in operands if i < len(known) and known[i] == 0]
            for i in positions:
                value = node.inputs[i]
                if value is None:
                    continue
                # One vector per value and graph: a subgraph may not see its parent's later nodes.
                key = (id(node.graph), value)
                if key not in vectors:
                    vectors[key] = _as_vector(node, node.graph, value, len(vectors))
                node.replace_input_with(i, vectors[key])
                mended = True
        return mended


def _as_vector(consumer: ir.Node, graph: ir.Graph, value: ir.Value, serial: int) -> ir.Value:
    """A ``Reshape(value, [1])`` placed before ``consumer`` in ``graph``."""
    base = f"{value.name or 'scalar'}__vector{serial}"
    shape = ir.Node(
        "",
        "Constant",
        [],
        attributes=[ir.AttrTensor("value", ir.tensor(np.array([1], dtype=np.int64)))],
        name=f"{base}_shape",
    )
    shape.outputs[0].name = f"{base}_shape"
    shape.outputs[0].dtype = ir.DataType.INT64
    shape.outputs[0].shape = ir.Shape([1])
    reshape = ir.Node("", "Reshape", [value, shape.outputs[0]], name=base)
    out = reshape.outputs[0]
    out.name = base
    if value.dtype is not None:  # a value_info needs both; inference fills them in otherwise
        out.dtype = value.dtype
        out.shape = ir.Shape([1])
    graph.insert_before(consumer, [shape, reshape])
    return out


def _fix_interface(model: Any, options: ConvertOptions) -> None:
    """Name open dims (``batch``, ``<input>_<axis>``), then apply input_shapes/dynamic_axes."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    check_input_options(options, list(inputs))

    for value in graph.inputs:
        if value.shape is None:
            continue
        value.shape = ir.Shape(
            [
                d if isinstance(d, int) else DEFAULT_BATCH if axis == 0 else f"{value.name}_{axis}"
                for axis, d in enumerate(value.shape.dims)
            ]
        )

    for name, shape in (options.input_shapes or {}).items():
        value = inputs[name]
        have = None if value.shape is None else list(value.shape.dims)
        want = list(shape)
        if have is not None and len(want) != len(have):
            raise InvalidInputError(
                f"input_shapes[{name!r}] = {tuple(want)} has rank {len(want)}, but input "
                f"{name!r} has shape {_shape_text(have)}"
            )
        new_dims: list[int | str | None] = []
        for axis, d in enumerate(want):
            cur = None if have is None else have[axis]
            if isinstance(cur, int) and not (isinstance(d, int) and d == cur):
                if d is None or (isinstance(d, int) and d < 0):
                    new_dims.append(cur)
                    continue
                raise InvalidInputError(
                    f"input_shapes[{name!r}] sets dim {axis} to {d!r}, but the Paddle program "
                    f"fixes it at {cur} ({_shape_text(have)}); re-save it with paddle.jit.save "
                    "and an InputSpec with None there to change it"
                )
            if isinstance(d, str):
                new_dims.append(d)
            elif d is None or int(d) < 0:
                new_dims.append(_dim_name(cur))
            else:
                new_dims.append(int(d))
        value.shape = ir.Shape(new_dims)

    for name, axes in (options.dynamic_axes or {}).items():
        value = inputs[name]
        if value.shape is None:
            continue
        dims2: list[int | str | None] = [_dim_name(d) for d in value.shape.dims]
        for axis, symbol in axes.items():
            axis = int(axis)
            if not 0 <= axis < len(dims2):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has shape "
                    f"{_shape_text(dims2)}"
                )
            if isinstance(dims2[axis], int):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] opens dim {axis}, but the Paddle program fixes it "
                    f"at {dims2[axis]}; re-save it with paddle.jit.save and an InputSpec with "
                    "None there"
                )
            dims2[axis] = str(symbol)
        value.shape = ir.Shape(dims2)

    # paddle2onnx numbers every open dim afresh (DynamicDimension.N), so a name says nothing;
    # shape inference (run by ferry.convert) names output dims from the inputs.
    for value in graph.outputs:
        if value.shape is not None:
            value.shape = ir.Shape(
                [
                    None
                    if isinstance(d, ir.SymbolicDim) and _P2O_DIM.fullmatch(str(d.value or ""))
                    else d
                    for d in value.shape.dims
                ]
            )


def _name_outputs(model: ir.Model, names: Sequence[str] | None, label: str) -> None:
    """Name the outputs as ``paddle.inference`` names them.

    Translating a legacy program to PIR renames its fetch variables (``sigmoid_0.tmp_0``) to
    ``fetch_name_N``, which paddle2onnx keeps; the names a Paddle user knows are the first.
    """
    outputs = list(model.graph.outputs)
    if not names or len(names) != len(outputs) or len(set(names)) != len(names):
        return
    taken = {
        v.name
        for v in (*model.graph.inputs, *(o for n in model.graph for o in n.outputs))
        if v not in outputs
    }
    if taken & set(names):
        logger.debug("%s: outputs keep paddle2onnx's names; Paddle's are taken", label)
        return
    for value, name in zip(outputs, names):
        value.name = name


def _dim_name(d: Any) -> int | str | None:
    if isinstance(d, int):
        return d
    value = getattr(d, "value", d)
    return value if isinstance(value, str) else None


def _shape_text(dims: Sequence[Any] | None) -> str:
    if dims is None:
        return "(unknown rank)"
    return "(" + ", ".join("?" if d is None else str(_dim_name(d) or "?") for d in dims) + ")"


def _input_specs(model: Any) -> list[tuple[str, np.dtype[Any] | None, list[int | str | None]]]:
    specs = []
    for value in model.graph.inputs:
        dtype = value.dtype.numpy() if value.dtype is not None else None
        dims = [_dim_name(d) for d in value.shape.dims] if value.shape is not None else []
        specs.append((value.name, dtype, dims))
    return specs


def _sample_inputs(model: Any, examples: Any, notes: list[str]) -> dict[str, np.ndarray] | None:
    """The example inputs named for the model, in its dtypes, checked against its shapes."""
    if examples is None:
        return None
    specs = _input_specs(model)
    named = name_examples(examples, [name for name, _, _ in specs])
    sample: dict[str, np.ndarray] = {}
    for name, dtype, dims in specs:
        arr = as_array(named[name], name)
        if dtype is not None and arr.dtype != dtype:
            if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise InvalidInputError(
                    f"example input {name!r} has dtype {arr.dtype}; the model takes {dtype}"
                )
            notes.append(f"example input {name!r}: {arr.dtype} cast to {dtype}")
            arr = arr.astype(dtype)
        if dims and (
            arr.ndim != len(dims)
            or any(isinstance(d, int) and d != s for d, s in zip(dims, arr.shape))
        ):
            raise InvalidInputError(
                f"example input {name!r} has shape {arr.shape}; the model takes {_shape_text(dims)}"
            )
        sample[name] = arr
    return sample


def _by_output_name(
    outputs: Sequence[np.ndarray], names: Sequence[str], label: str
) -> dict[str, np.ndarray]:
    # paddle2onnx keeps the program's fetch order, which is the order Paddle returns them in.
    if len(outputs) != len(names):
        raise ConversionError(
            f"Paddle returned {len(outputs)} output(s) for {label}, the converted model has "
            f"{len(names)} ({', '.join(names)}); this is a bug in ferry or paddle2onnx"
        )
    return dict(zip(names, outputs))
