"""Full-integer int8 export of a QDQ model made by ``ferry quantize --target tflite``: integer
kernels with the model's own parameters, QUANTIZE at the float input, DEQUANTIZE at the output,
verified in LiteRT against ONNX Runtime on the quantized model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from tflite_graphs import model, weights

import ferry
from ferry.formats import read_tflite
from ferry.mobile import export_tflite, lower_model

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")

N = helper.make_node


def _cnn() -> onnx.ModelProto:
    inits = {
        "w0": weights(8, 3, 3, 3), "b0": weights(8), "wd": weights(8, 1, 3, 3), "bd": weights(8),
        "w1": weights(8, 8, 1, 1), "b1": weights(8),
        "wg": weights(8, 4, 1, 1), "bg": weights(8), "fc": weights(5, 16), "fb": weights(5),
    }  # fmt: skip
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        N("Relu", ["c0"], ["r0"]),
        N("Conv", ["r0", "wd", "bd"], ["c1"], group=8, pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["r1"]),
        N("Conv", ["r1", "wg", "bg"], ["g1"], group=2),  # grouped
        N("Conv", ["g1", "w1", "b1"], ["c2"]),
        N("Add", ["c2", "r0"], ["a"]),
        N("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Sigmoid", ["p"], ["s"]),
        N("Concat", ["p", "s"], ["cat"], axis=1),
        N("GlobalAveragePool", ["cat"], ["g"]),
        N("Flatten", ["g"], ["f"]),
        N("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
    ]
    return model(nodes, {"x": [1, 3, 16, 16]}, ["y"], inits, opset=13)


@pytest.fixture(scope="module")
def qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(5)
    data = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(16)]
    result = ferry.quantize(_cnn(), data=data, target="tflite", method="minmax", force=True)
    path = tmp_path_factory.mktemp("int8") / "qdq.onnx"
    result.save(path)
    return path


@pytest.fixture(scope="module")
def full_qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every op between Q/DQ pairs (ONNX Runtime's quantizer, all op types, int8 everywhere): the
    ops whose int8 kernels need shared or fixed parameters (pooling, concatenation, sigmoid)
    come out quantized, with parameters of their own."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    folder = tmp_path_factory.mktemp("full_qdq")
    source = folder / "float.onnx"
    onnx.save(_cnn(), source)
    rng = np.random.default_rng(6)
    samples = iter([{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(16)])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(samples, None)

    out = folder / "qdq.onnx"
    quantize_static(
        str(source), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
    )  # fmt: skip
    return out


def test_every_op_quantized_runs_integer_kernels(full_qdq: Path, tmp_path: Path) -> None:
    samples = [
        {"x": np.random.default_rng(i).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)}
        for i in (30, 31)
    ]
    result = export_tflite(full_qdq, tmp_path / "m.tflite", precision="int8", samples=samples)
    sg = read_tflite(result.path.read_bytes(), "int8").subgraphs[0]
    computing = [op for op in sg.operators if op.opcode not in ("QUANTIZE", "DEQUANTIZE")]
    floats = [op.opcode for op in computing if sg.tensors[op.outputs[0]].type_name != "int8"]
    assert floats == [], floats
    for op in sg.operators:
        if op.opcode in ("MAX_POOL_2D", "CONCATENATION", "RESHAPE"):
            out = sg.tensors[op.outputs[0]].quant
            for i in op.inputs:
                t = sg.tensors[i]
                if t.type_name == "int8" and t.data is None:
                    # the kernel copies integers: the parameters are the output's
                    assert t.quant is not None and out is not None
                    assert np.allclose(t.quant.scale, out.scale), op.opcode
                    assert np.array_equal(t.quant.zero_point, out.zero_point), op.opcode
    logistic = next(op for op in sg.operators if op.opcode == "LOGISTIC")
    q = sg.tensors[logistic.outputs[0]].quant
    assert q is not None and np.isclose(q.scale[0], 1 / 256) and q.zero_point[0] == -128
    assert all(v.passed for v in result.report.verification), result.lines()


def test_qdq_model_runs_integer_kernels(qdq: Path, tmp_path: Path) -> None:
    samples = [
        {"x": np.random.default_rng(i).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)}
        for i in (20, 21)
    ]
    result = export_tflite(qdq, tmp_path / "m.tflite", precision="int8", samples=samples)
    sg = read_tflite(result.path.read_bytes(), "int8").subgraphs[0]
    ops = {op.opcode: op for op in sg.operators}
    for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        op = ops[opcode]
        x, w, b = (sg.tensors[i] for i in op.inputs[:3])
        assert (x.type_name, w.type_name, b.type_name) == ("int8", "int8", "int32"), opcode
        axis = 3 if opcode == "DEPTHWISE_CONV_2D" else 0
        assert w.quant is not None and w.quant.axis == axis and w.quant.scale.size == w.shape[axis]
        assert not w.quant.zero_point.any() and np.abs(w.data).max() <= 127
        assert b.quant is not None and x.quant is not None
        # the bias's scale is the input's times each channel's weight scale
        assert np.allclose(b.quant.scale, x.quant.scale[0] * w.quant.scale, rtol=1e-6)
    # ferry's quantizer leaves ops without weights float: they run float between a DEQUANTIZE
    # and the next QUANTIZE, as in the model.
    for opcode in ("ADD", "MAX_POOL_2D", "LOGISTIC", "CONCATENATION", "MEAN"):
        assert sg.tensors[ops[opcode].outputs[0]].type_name == "float32", opcode
    (first,) = [op for op in sg.operators if sg.inputs[0] in op.inputs]
    assert first.opcode == "QUANTIZE"
    assert sg.tensors[sg.inputs[0]].type_name == sg.tensors[sg.outputs[0]].type_name == "float32"
    (last,) = [op for op in sg.operators if sg.outputs[0] in op.outputs]
    assert last.opcode == "DEQUANTIZE"
    assert all(v.passed and v.budget is not None for v in result.report.verification)
    weights = [t for t in sg.tensors if t.data is not None and t.type_name == "int8"]
    assert sum(t.data.size for t in weights) >= 8 * 3 * 9 + 8 * 9 + 64 + 80  # every weight, 1 B


def test_a_qdq_model_exports_as_int8_only(qdq: Path) -> None:
    with pytest.raises(ferry.errors.InvalidInputError, match="precision int8"):
        lower_model(qdq)
