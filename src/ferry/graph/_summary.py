"""Describing a model: its inputs and outputs, opsets, op histogram, parameters and FLOPs."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from ferry.errors import InvalidInputError, ModelLoadError
from ferry.graph._dims import Dim, dtype_name, graph_inputs, shape_of
from ferry.graph._flops import flops as count_flops
from ferry.graph._prepare import infer_value_types
from ferry.graph._tensors import tensors

__all__ = ["ModelSummary", "TensorInfo", "summarize", "tensor_info"]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, element type and shape (None when unknown)."""

    name: str
    dtype: str | None
    shape: tuple[Dim, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What ``ferry info`` shows about a model."""

    producer: str
    ir_version: int
    opsets: dict[str, int]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_counts: dict[str, int]
    node_count: int
    param_count: int
    param_bytes: int
    #: FLOPs of one inference (Conv, ConvTranspose, MatMul, Gemm) at ``flops_shapes``, or with
    #: every symbolic dim taken as 1 when no shapes were given.
    flops: int
    #: Nodes of those four op types whose FLOPs could not be estimated (shapes unknown).
    flops_unknown_nodes: int
    has_subgraphs: bool
    external_data: bool
    #: Inputs with a default the caller may override (initializers the model also lists as
    #: inputs, IR >= 4): a streaming model's state, say.
    optional_inputs: tuple[TensorInfo, ...] = ()
    #: The input shapes ``flops`` was counted at (None: symbolic dims as 1).
    flops_shapes: dict[str, list[int]] | None = None
    #: Symbolic input dims past the first (``x[2]``) that ``flops`` depends on and took as 1: an
    #: image model's height and width. Give shapes for the real figure.
    flops_assumed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = [t.to_dict() for t in self.inputs]
        d["outputs"] = [t.to_dict() for t in self.outputs]
        d["optional_inputs"] = [t.to_dict() for t in self.optional_inputs]
        return d


def tensor_info(value: ir.Value) -> TensorInfo:
    """The name, dtype and shape of a graph value."""
    dtype = dtype_name(value.dtype) if value.dtype is not None else None
    return TensorInfo(name=value.name or "", dtype=dtype, shape=shape_of(value))


def summarize(
    model: ir.Model, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> ModelSummary:
    """Describe ``model``: I/O specs, opsets, op histogram, parameters, FLOPs estimate.

    Args:
        model: the model (not changed).
        input_shapes: concrete shapes of (some of) the inputs to count FLOPs at; without them,
            FLOPs are per sample with every symbolic dim taken as 1.

    Raises:
        ModelLoadError: ``input_shapes`` names an input the model does not have, or gives it
            another rank or a fixed dim another size.
    """
    types = infer_value_types(model)
    try:
        counted = count_flops(model, input_shapes, value_types=types)
    except InvalidInputError as e:
        raise ModelLoadError(str(e)) from e
    op_counts: Counter[str] = Counter()
    node_count = 0
    for node in model.graph.all_nodes():
        node_count += 1
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        op_counts[key] += 1
    params = list(tensors(model, weights_only=True))

    def io(value: ir.Value) -> TensorInfo:
        info = tensor_info(value)
        dtype, shape = types.get(info.name, (None, None))
        return TensorInfo(info.name, info.dtype or dtype, info.shape or shape)

    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ModelSummary(
        producer=producer or "unknown",
        ir_version=model.ir_version,
        opsets={(k or "ai.onnx"): v for k, v in model.opset_imports.items()},
        inputs=tuple(io(v) for v in graph_inputs(model)),
        outputs=tuple(io(v) for v in model.graph.outputs),
        op_counts=dict(op_counts.most_common()),
        node_count=node_count,
        param_count=sum(t.size for t in params),
        param_bytes=sum(t.nbytes for t in params),
        flops=counted.flops,
        flops_unknown_nodes=counted.unknown_nodes,
        has_subgraphs=any(True for _ in model.graph.subgraphs()),
        external_data=_has_external_data(model),
        optional_inputs=tuple(
            io(v)
            for v in model.graph.inputs
            if v.name in model.graph.initializers and model.ir_version >= 4
        ),
        flops_shapes={k: list(v) for k, v in input_shapes.items()} if input_shapes else None,
        flops_assumed=()
        if input_shapes
        else tuple(
            f"{v.name}[{axis}]"
            for v in graph_inputs(model)
            for axis, d in enumerate(shape_of(v) or ())
            if axis > 0 and not isinstance(d, int)
        ),
    )


def _has_external_data(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )
