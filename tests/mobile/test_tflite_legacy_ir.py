"""Legacy IR: a model that lists its weights among its graph inputs (IR 3 required it; old
exporters and PyTorch's ``keep_initializers_as_inputs`` still do it at IR 4). Those inputs are
weights, constants of the ``.tflite`` file: the Conv, ConvTranspose and BatchNormalization of a
face detector so exported lower as they would with plain initializers, verified in LiteRT
against ONNX Runtime. A streaming model's state (one initializer listed as an input, the
weights not) stays an input of the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tflite_graphs import weights

from ferry.mobile import export_tflite, lower_model

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")


def _face_detector(ir_version: int) -> onnx.ModelProto:
    inits = {
        "w1": weights(8, 3, 3, 3),
        "b1": weights(8),
        "scale": np.abs(weights(8)) + 0.5,
        "shift": weights(8),
        "mean": weights(8),
        "var": np.abs(weights(8)) + 0.5,
        "wt": weights(8, 4, 2, 2),
        "bt": weights(4),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["y"], strides=[2, 2]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])]
    inputs += [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inits.items()
    ]
    graph = helper.make_graph(
        nodes,
        "face",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 32, 32])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    proto.ir_version = ir_version
    onnx.checker.check_model(proto)
    return proto


@pytest.mark.parametrize("ir_version", [3, 4])
def test_weights_listed_as_inputs_are_constants(tmp_path: Path, ir_version: int) -> None:
    out = tmp_path / "face.tflite"
    result = export_tflite(_face_detector(ir_version), out)
    report = result.report
    assert report.passed and out.is_file()
    assert [io.name for io in report.inputs] == ["x"]
    assert {"CONV_2D", "TRANSPOSE_CONV"} <= set(report.ops)
    assert not any("default" in note for note in report.notes)


def test_a_state_listed_as_an_input_stays_an_input() -> None:
    """One initializer listed (the state), the weights not: the state is an input of the file."""
    state = np.zeros((1, 4), dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "state"], ["y"]),
        ],
        "stream",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(weights(3, 4), "w"), numpy_helper.from_array(state, "state")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    lowered = lower_model(proto)
    assert sorted(io.name for io in lowered.inputs) == ["state", "x"]
