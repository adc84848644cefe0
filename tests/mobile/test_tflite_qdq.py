"""A model someone else quantized (static QDQ, by ONNX Runtime's quantizer) exports as int8
without being asked: TFLite's integer kernels run its Conv and MatMul, verified in LiteRT against
ONNX Runtime on the QDQ model within the int8 budget. Asking for float is refused in one line
naming what to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tflite_graphs import weights

import ferry
from ferry.mobile import export_tflite
from ferry.tflite import read_tflite

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")
quantization = pytest.importorskip("onnxruntime.quantization")


def _float_model(path: Path) -> Path:
    """Conv -> Relu -> Flatten -> MatMul + bias: the common static-QDQ pattern."""
    inits = {
        "w1": weights(8, 3, 3, 3),
        "b1": weights(8),
        "w2": weights(8 * 8 * 8, 10, scale=0.1),
        "b2": weights(10),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("MatMul", ["f", "w2"], ["mm"]),
        helper.make_node("Add", ["mm", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_source",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, path)
    return path


class _Calibration(quantization.CalibrationDataReader):  # type: ignore[misc]
    def __init__(self) -> None:
        rng = np.random.default_rng(5)
        self._feeds = iter(
            [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


@pytest.mark.parametrize(("activations", "per_channel"), [("QInt8", True), ("QUInt8", False)])
def test_a_qdq_source_exports_as_int8(tmp_path: Path, activations: str, per_channel: bool) -> None:
    source = _float_model(tmp_path / "float.onnx")
    qdq = tmp_path / "qdq.onnx"
    quantization.quantize_static(
        str(source),
        str(qdq),
        _Calibration(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=getattr(quantization.QuantType, activations),
        weight_type=quantization.QuantType.QInt8,
    )
    result = export_tflite(qdq, tmp_path / "model.tflite")  # no precision given
    report = result.report
    assert report.precision == "int8" and report.passed
    sg = read_tflite(result.path.read_bytes(), "int8").subgraphs[0]
    heavy = [op for op in sg.operators if op.opcode in ("CONV_2D", "FULLY_CONNECTED")]
    assert {op.opcode for op in heavy} == {"CONV_2D", "FULLY_CONNECTED"}
    for op in heavy:
        assert sg.tensors[op.inputs[1]].type_name == "int8", op.opcode
    assert report.size_bytes < 0.5 * export_tflite(source, tmp_path / "f.tflite").report.size_bytes


def test_a_qdq_source_at_fp32_is_refused_in_one_line(tmp_path: Path) -> None:
    source = _float_model(tmp_path / "float.onnx")
    qdq = tmp_path / "qdq.onnx"
    quantization.quantize_static(
        str(source), str(qdq), _Calibration(), quant_format=quantization.QuantFormat.QDQ
    )
    with pytest.raises(ferry.errors.InvalidInputError, match="precision int8") as caught:
        export_tflite(qdq, tmp_path / "m.tflite", precision="fp32")
    assert "\n" not in str(caught.value)
