"""Preparing a model for plans, placement and sessions: every value named and typed.

``prepare`` gives the named, typed copy; ``infer_value_types`` and ``inference_proto`` run ONNX
shape inference without copying large weights; ``symbolic_shape_inference`` runs ONNX Runtime's.
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir

from ferry.graph._dims import Dim, dtype_name, proto_dim

__all__ = [
    "InferTypesPass",
    "infer_value_types",
    "inference_proto",
    "prepare",
    "proto_shapes",
    "symbolic_shape_inference",
]

logger = logging.getLogger(__name__)


class InferTypesPass(ir.passes.InPlacePass):
    """Give values the dtypes and shapes ONNX shape inference finds, where the model declares none.

    Before -> After::

        node output: dtype None, shape None  ->  dtype FLOAT, shape [batch, 8]   (as inferred)
        node output: dtype FLOAT, shape [batch, 8]  ->  unchanged (declared types are kept)

    Best effort: a model inference cannot handle (custom ops) keeps its declared types. Weights
    above 1 KiB are left out of the proto given to inference (their types stay), so nothing large
    is copied; onnx_ir's ``ShapeInferencePass`` would also deserialize the whole inferred model to
    merge it back, which dominates on large graphs; this reads only the value infos.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        inferred = _inferred_value_infos(model)
        if inferred is None:
            return ir.passes.PassResult(model, modified=False)
        untyped = {
            value.name or "": value
            for node in model.graph
            for value in node.outputs
            if value.dtype is None or value.shape is None
        }
        modified = False
        for info in inferred.graph.value_info:
            target = untyped.get(info.name)
            if target is None or not info.type.HasField("tensor_type"):
                continue
            tensor_type = info.type.tensor_type
            if target.dtype is None and tensor_type.elem_type:
                target.dtype = ir.DataType(tensor_type.elem_type)
                modified = True
            if target.shape is None and tensor_type.HasField("shape"):
                target.shape = ir.Shape([proto_dim(d) for d in tensor_type.shape.dim])
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def prepare(model: ir.Model) -> ir.Model:
    """The copy of ``model`` that plans, placement and sessions work on.

    Before -> After::

        model (nodes or values unnamed or named twice, intermediate types unknown)
            -> copy: every node and value named uniquely (onnx_ir's ``NameFixPass``), value types
               inferred where undeclared (:class:`InferTypesPass`)

    Weights are shared, not copied, and ``model`` is not changed. Naming is deterministic, so a
    plan made on one prepared copy fits every other copy of the same model.
    """
    from onnx_ir.passes.common import NameFixPass

    try:
        work = model.clone()
    except RuntimeError:
        # onnx_ir clones only topologically sorted graphs; a round trip through the proto takes
        # any order (and copies the weights, which only such rare models pay for).
        work = ir.from_proto(ir.to_proto(model))
    ir.passes.PassManager([NameFixPass(), InferTypesPass()])(work)
    return work


def infer_value_types(model: ir.Model) -> dict[str, tuple[str | None, tuple[Dim, ...] | None]]:
    """Run ONNX shape inference on ``model``; map each value name to ``(dtype, shape)``.

    The model is not changed. Shape inference failing (custom ops, malformed graphs) gives an empty
    mapping, not an error: it only refines what is declared.
    """
    inferred = _inferred_value_infos(model)
    if inferred is None:
        return {}
    found: dict[str, tuple[str | None, tuple[Dim, ...] | None]] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dtype = dtype_name(ir.DataType(tt.elem_type)) if tt.elem_type else None
        shape: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(proto_dim(d) for d in tt.shape.dim)
        found[vi.name] = (dtype, shape)
    return found


#: Weights larger than this are left out of the proto given to shape inference (their type stays).
_INFERENCE_WEIGHT_LIMIT = 1024


def inference_proto(model: ir.Model) -> onnx.ModelProto:
    """``model`` as a proto for shape inference: weights above the limit are typed inputs instead
    of initializers (shapes never depend on their values, and no large tensor is copied). The
    model itself is not changed, beyond giving weights the type their tensor has."""
    graph = model.graph
    small: list[ir.Value] = []
    large: list[ir.Value] = []
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is not None and tensor.nbytes <= _INFERENCE_WEIGHT_LIMIT:
            small.append(value)
            continue
        if tensor is not None:  # a weight's type is its tensor's, declared or not
            value.shape = value.shape if value.shape is not None else ir.Shape(tensor.shape.numpy())
            value.dtype = value.dtype if value.dtype is not None else tensor.dtype
        if not value.is_graph_input():
            large.append(value)
    view = ir.GraphView(
        [*graph.inputs, *large],
        graph.outputs,
        nodes=graph,
        initializers=small,
        opset_imports=dict(graph.opset_imports),
        name=graph.name,
    )
    shell = ir.Model(
        view,  # type: ignore[arg-type]  # onnx_ir serializes a GraphView like a Graph
        ir_version=max(model.ir_version, 4),
        functions=list(model.functions.values()),
    )
    return ir.to_proto(shell)


def _inferred_value_infos(model: ir.Model) -> onnx.ModelProto | None:
    """ONNX shape inference's result on ``model`` (see :func:`inference_proto`), or None."""
    try:
        proto = inference_proto(model)
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises a zoo of types; inference is best effort here
        logger.info("shape inference failed, shapes stay as declared: %s", e)
        return None


def symbolic_shape_inference(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference on ``proto``, what it found even where it did not
    finish; None where it is not available (it needs sympy) or fails.

    Its public ``infer_shapes`` raises on the first op it cannot infer, losing the rest, and then
    saves the model in the working directory; this runs the same loop without either.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception as e:  # ImportError without sympy
        logger.debug("ONNX Runtime's symbolic shape inference is unavailable: %s", e)
        return None
    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
    # It logs each dim it merges by guess ("Unable to determine if ... treat as equal") as a
    # warning on the user's terminal: an answer it gives, not news.
    tool_logger = logging.getLogger(SymbolicShapeInference.__module__)
    level = tool_logger.level
    tool_logger.setLevel(logging.ERROR)
    try:
        inference._preprocess(proto)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        out = inference.out_mp_
    except Exception as e:  # best effort, like ONNX's
        logger.info("ONNX Runtime's symbolic shape inference stopped early: %s", e)
        found = getattr(inference, "known_vi_", None)
        if not found:
            return None
        out = onnx.ModelProto()
        out.graph.value_info.extend(
            vi for name, vi in found.items() if vi.type.HasField("tensor_type") and name
        )
    finally:
        tool_logger.setLevel(level)
    return out if isinstance(out, onnx.ModelProto) else None


def proto_shapes(proto: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Each tensor value's shape in ``proto`` (value infos and outputs), where it has one."""
    shapes: dict[str, tuple[Dim, ...]] = {}
    for info in (*proto.graph.value_info, *proto.graph.output):
        if not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = tuple(proto_dim(d) for d in tensor_type.shape.dim)
    return shapes
