"""Small hand-built ONNX models covering the shapes of trouble real models bring.

Each builder returns an ``onnx.ModelProto``; tests save them where they need files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(graph: onnx.GraphProto, opset: int = OPSET, **kw: object) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)
    model.ir_version = 8
    return model


def mlp(batch: str | int = "batch", seed: int = 0) -> onnx.ModelProto:
    """x[batch, 16] -> Gemm -> Relu -> MatMul -> Softmax -> y[batch, 4]."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [w1, b1, w2],
    )
    return _model(graph)


def conv(seed: int = 0) -> onnx.ModelProto:
    """x[N,3,16,16] -> Conv(8, 3x3, pad 1) -> ConvTranspose(4, 2x2, stride 2) -> y[N,4,32,32]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    wt = numpy_helper.from_array(rng.standard_normal((8, 4, 2, 2)).astype(np.float32), "wt")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["c", "wt"], ["y"], name="deconv", strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 32, 32])],
        [w, wt],
    )
    return _model(graph)


def two_inputs() -> onnx.ModelProto:
    """a[batch, 4] float, b[batch, 4] float, k[] int64 -> sum = (a + b) * k, mask = a > b."""
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Cast", ["k"], ["kf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["s", "kf"], ["sum"], name="mul"),
        helper.make_node("Greater", ["a", "b"], ["mask"], name="greater"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("k", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 4]),
        ],
    )
    return _model(graph)


def with_if() -> onnx.ModelProto:
    """x[N, 4] -> If(sum(x) > 0) then x * 2 else Neg(x) -> y. Exercises subgraphs."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["then_out"], name="then_mul")],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, ["N", 4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["else_out"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, ["N", 4])],
    )
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node(
            "If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [two, zero],
    )
    return _model(graph)


def reshape_to(shape: list[int]) -> onnx.ModelProto:
    """x[N, M] -> Reshape(shape) -> y: fails at run time when the sizes do not fit."""
    target = numpy_helper.from_array(np.array(shape, dtype=np.int64), "target")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")],
        "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [target],
    )
    return _model(graph)


def custom_ops() -> onnx.ModelProto:
    """Two nodes of an unregistered domain and one misspelled ONNX op."""
    nodes = [
        helper.make_node("FancyAct", ["x"], ["a"], name="fancy1", domain="acme"),
        helper.make_node("FancyAct", ["a"], ["b"], name="fancy2", domain="acme"),
        helper.make_node("Rellu", ["b"], ["y"], name="typo"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("acme", 1)]
    )
    model.ir_version = 8
    return model


def strings() -> onnx.ModelProto:
    """text[N] string -> Identity -> same."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["out"], name="id")],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("out", TensorProto.STRING, ["N"])],
    )
    return _model(graph)


def initializer_as_input(ir_version: int = 8) -> onnx.ModelProto:
    """bias is both an initializer and a graph input: a default callers may override (IR >= 4)."""
    bias = numpy_helper.from_array(np.full(4, 10.0, dtype=np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"], name="add")],
        "init_input",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = ir_version
    return model


def save_external(model: onnx.ModelProto, path: Path) -> Path:
    """Save with every weight in ``<name>.data`` beside the model."""
    onnx.save(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=0,
    )
    return path
