"""Load, save, prepare and inspect models in the unified graph (ONNX held as ``onnx_ir.Model``).

``load_model`` accepts a file, an artifact folder, an ``onnx_ir.Model`` or an ``onnx.ModelProto`` and
always gives an ``ir.Model``; ``save_model`` writes one atomically (a reader never sees a half-written
file, and a failed save leaves an existing file untouched); ``prepare`` gives the named, typed copy
that plans, placement and sessions work on; ``summarize`` describes a model: its inputs and
outputs, opsets, op histogram, parameters and a FLOPs estimate. ``subgraphs`` and ``node_reads``
answer what an If/Loop/Scan node holds and reads, for everyone who walks a graph.

One helper per job, for every room to call rather than write again:

- ``constant(value)`` / ``constant_tensor(value)``: what an initializer or a Constant node holds;
- ``tensors(model)``: every tensor, subgraphs and functions included;
- ``external_files(model)``: the external data files those tensors live in;
- ``with_input_shapes(model, shapes)``: the model with its inputs fixed to concrete shapes;
- ``flops(model)``: FLOPs (and MACs) of one inference;
- ``reduced_precision(model)``: the quantization a model already holds (QDQ, dynamic int8,
  QOperator, weight-only int8);
- ``without_randomness(model)``: a copy whose random ops give their expected value, so that two
  runs (two engines, a transformed copy) can be compared.
"""

from __future__ import annotations

from ferry.graph._dims import Dim, dim, dtype_name, graph_inputs, shape_of
from ferry.graph._flops import FlopCount, flops
from ferry.graph._load import load_model, model_source_path, resolve_model_file
from ferry.graph._precision import INTEGER_WEIGHTS, ReducedPrecision, reduced_precision
from ferry.graph._prepare import (
    InferTypesPass,
    infer_value_types,
    inference_proto,
    prepare,
    proto_shapes,
    symbolic_shape_inference,
)
from ferry.graph._random import RANDOM_OPS, random_nodes, without_randomness
from ferry.graph._save import atomic_path, save_model
from ferry.graph._shapes import with_input_shapes
from ferry.graph._summary import ModelSummary, TensorInfo, summarize, tensor_info
from ferry.graph._tensors import constant, constant_tensor, external_files, tensors
from ferry.graph._walk import named_subgraphs, node_reads, subgraphs

__all__ = [
    "INTEGER_WEIGHTS",
    "RANDOM_OPS",
    "Dim",
    "FlopCount",
    "InferTypesPass",
    "ModelSummary",
    "ReducedPrecision",
    "TensorInfo",
    "atomic_path",
    "constant",
    "constant_tensor",
    "dim",
    "dtype_name",
    "external_files",
    "flops",
    "graph_inputs",
    "infer_value_types",
    "inference_proto",
    "load_model",
    "model_source_path",
    "named_subgraphs",
    "node_reads",
    "prepare",
    "proto_shapes",
    "random_nodes",
    "reduced_precision",
    "resolve_model_file",
    "save_model",
    "shape_of",
    "subgraphs",
    "summarize",
    "symbolic_shape_inference",
    "tensor_info",
    "tensors",
    "with_input_shapes",
    "without_randomness",
]
