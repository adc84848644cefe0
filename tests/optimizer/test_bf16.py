"""bf16 conversion (``to_bf16``) and ``ferry.quantize(precision="bf16")``: which nodes compute in
bf16, where Casts go, weights shared with float readers, inputs a schema types alone, and the
result judged and timed on OpenVINO."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import ferry
from ferry.optimizer.quantize import quantize
from ferry.optimizer.quantize._bf16 import BF16_OPSET, to_bf16

KEEP = {"Softmax"}


def conv_model(opset: int = 17, channels: int = 4) -> onnx.ModelProto:
    """x -> Conv(w, b) -> Relu -> Resize(scales) -> Softmax -> y, and w also read by a float
    Mul (w_sum = w * 1) that is a second graph output."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Resize", ["r", "", "scales"], ["z"], mode="nearest", name="resize"),
        helper.make_node("Softmax", ["z"], ["y"], axis=1, name="softmax"),
        helper.make_node("Cast", ["w"], ["w_copy"], to=TensorProto.FLOAT, name="float_reader"),
    ]
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 16, 16]),
            helper.make_tensor_value_info("w_copy", TensorProto.FLOAT, [channels, 3, 3, 3]),
        ],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def by_name(model: ir.Model) -> dict[str, ir.Node]:
    return {n.name: n for n in model.graph if n.name}


def test_compute_in_bf16_with_sensitive_ops_and_io_float() -> None:
    converted, count = to_bf16(ir.from_proto(conv_model()), KEEP)
    nodes = by_name(converted)
    assert converted.opset_imports[""] == BF16_OPSET  # Conv takes bf16 from opset 22
    assert count == 3  # conv, relu, resize
    bf16 = ir.DataType.BFLOAT16
    assert nodes["conv"].outputs[0].dtype == bf16 and nodes["relu"].outputs[0].dtype == bf16
    assert nodes["resize"].outputs[0].dtype == bf16
    # Resize's scales are typed alone (float only): left float.
    assert nodes["resize"].inputs[2].dtype == ir.DataType.FLOAT
    # The kept Softmax reads float, the graph's input and outputs stay float with their names.
    assert nodes["softmax"].inputs[0].dtype == ir.DataType.FLOAT
    graph = converted.graph
    assert [v.dtype for v in graph.inputs] == [ir.DataType.FLOAT]
    assert [(v.name, v.dtype) for v in graph.outputs] == [
        ("y", ir.DataType.FLOAT),
        ("w_copy", ir.DataType.FLOAT),
    ]
    # The weight read by Conv and by a float node: a bf16 twin for Conv, the float one kept.
    conv_weight = nodes["conv"].inputs[1]
    assert conv_weight.dtype == bf16 and conv_weight.const_value is not None
    assert nodes["float_reader"].inputs[0].dtype == ir.DataType.FLOAT
    # The bias, read by Conv alone, converted in place.
    assert nodes["conv"].inputs[2].name == "b" and nodes["conv"].inputs[2].dtype == bf16
    onnx.checker.check_model(ir.to_proto(converted), full_check=True)


def test_bf16_runs_on_openvino_close_to_float() -> None:
    pytest.importorskip("openvino")
    model = conv_model()
    converted, _ = to_bf16(ir.from_proto(model), KEEP)
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    want = ferry.load(model).run({"x": x})
    got = ferry.load(converted, backends="openvino").run({"x": x})
    assert got["y"].dtype == np.float32
    np.testing.assert_allclose(got["y"], want["y"], rtol=0.05, atol=2e-3)
    np.testing.assert_array_equal(got["w_copy"], want["w_copy"])  # the float reader: untouched


def test_openvino_bf16_outputs_read_back_bit_for_bit() -> None:
    """OpenVINO shows bf16 output bits as float16; ferry reads them as bf16."""
    pytest.importorskip("openvino")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)],
        "out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", BF16_OPSET)])
    model.ir_version = 10
    x = np.array([[0.0, 1 / 3, 2 / 3], [1.0, -300.5, 1e30]], np.float32)
    got = ferry.load(model, backends="openvino").run({"x": x})["y"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16))


def test_quantize_bf16_for_openvino_halves_the_size_and_is_judged() -> None:
    pytest.importorskip("openvino")
    rng = np.random.default_rng(2)
    data = [{"x": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(8)]
    model = conv_model(channels=64)
    model.graph.output.pop()  # just the Softmax
    model.graph.node.pop()
    result = quantize(
        model, data=data, target="openvino", precision="bf16", budget="2%", force=True
    )
    report = result.report
    assert report.precision == "bf16" and report.engine == "openvino"
    assert report.score_after >= 0.98, report.lines()
    assert report.latency_before_ms and report.latency_after_ms
    # quantize keeps Resize (coordinates) and Softmax (a sum) float.
    assert set(report.quantized) == {"conv", "relu"}
    assert report.bytes_after < report.bytes_before
    assert "bf16 (2 nodes)" in report.scheme
