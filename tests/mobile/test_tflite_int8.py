"""Full-integer int8 export of a QDQ model made by ``ferry quantize --target tflite``: integer
kernels with the model's own parameters, QUANTIZE at the float input, DEQUANTIZE at the output,
verified in LiteRT against ONNX Runtime on the quantized model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tflite_graphs import model, weights

import ferry
from ferry.mobile import TFLiteExport, export_tflite, lower_model
from ferry.tflite import TFLiteOperator, TFLiteSubgraph, read_tflite

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
    """Without a precision a QDQ model is lowered as what it is (int8); float is refused."""
    assert "QUANTIZE" in [op.opcode for op in lower_model(qdq).model.subgraphs[0].operators]
    with pytest.raises(ferry.errors.InvalidInputError, match="precision int8"):
        lower_model(qdq, precision="fp32")


# ---------------------------------------------------------- QDQ graphs built by hand (onnx.helper)


def _params(prefix: str, scale: float, zero: int, dtype: type = np.int8) -> dict[str, np.ndarray]:
    """A Q/DQ pair's per-tensor parameters, named ``<prefix>_s`` and ``<prefix>_z``."""
    return {f"{prefix}_s": np.float32(scale), f"{prefix}_z": np.array(zero, dtype=dtype)}


def _q(x: str, prefix: str, y: str) -> onnx.NodeProto:
    return N("QuantizeLinear", [x, f"{prefix}_s", f"{prefix}_z"], [y])


def _dq(x: str, prefix: str, y: str, **attrs: int) -> onnx.NodeProto:
    return N("DequantizeLinear", [x, f"{prefix}_s", f"{prefix}_z"], [y], **attrs)


def _int8_weights(
    name: str, w: np.ndarray, axis: int = 0, bias: np.ndarray | None = None, x_scale: float = 0
) -> tuple[dict[str, np.ndarray], list[onnx.NodeProto]]:
    """Per-channel symmetric int8 weights behind a DequantizeLinear (``<name>`` its float
    output), and an int32 bias at the input's scale times each channel's (``<name>_b``)."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=other) / 127).astype(np.float32)
    shaped = scale.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    inits = {
        f"{name}_q": np.clip(np.round(w / shaped), -127, 127).astype(np.int8),
        f"{name}_s": scale,
        f"{name}_z": np.zeros(scale.size, np.int8),
    }
    nodes = [_dq(f"{name}_q", name, name, axis=axis)]
    if bias is not None:
        b_scale = (x_scale * scale).astype(np.float32)
        inits[f"{name}_bq"] = np.round(bias / b_scale).astype(np.int32)
        inits[f"{name}_b_s"] = b_scale
        inits[f"{name}_b_z"] = np.zeros(scale.size, np.int32)
        nodes.append(_dq(f"{name}_bq", f"{name}_b", f"{name}_b", axis=0))
    return inits, nodes


def _tflite(result: TFLiteExport) -> TFLiteSubgraph:
    return read_tflite(result.path.read_bytes(), str(result.path)).subgraphs[0]


def _op(sg: TFLiteSubgraph, opcode: str) -> TFLiteOperator:
    (op,) = [op for op in sg.operators if op.opcode == opcode]
    return op


def _types(sg: TFLiteSubgraph, op: TFLiteOperator) -> tuple[str, ...]:
    return tuple(sg.tensors[i].type_name for i in (*op.inputs[:3], op.outputs[0]))


def _verified(result: TFLiteExport) -> None:
    assert result.report.verification, result.lines()
    assert all(v.passed for v in result.report.verification), result.lines()


def _image(seed: int, shape: tuple[int, ...] = (1, 3, 8, 8)) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).uniform(0, 1, shape).astype(np.float32)}


def test_weight_only_quantized_model_exports_at_fp32(tmp_path: Path) -> None:
    """int8 weights -> DequantizeLinear (opset 13, which ONNX's reference evaluator lacks) ->
    Conv with float activations: the DQ folds to float weights at fp32, instead of leaving the
    convolution's weights "computed at run time"."""
    inits, deq = _int8_weights("w", weights(4, 3, 3, 3))
    nodes = [*deq, N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    proto = model(nodes, {"x": [1, 3, 8, 8]}, ["y"], inits, opset=13)
    result = export_tflite(proto, tmp_path / "m.tflite", samples=[_image(40), _image(41)])
    sg = _tflite(result)
    conv = _op(sg, "CONV_2D")
    assert _types(sg, conv)[:2] == ("float32", "float32")
    w = sg.tensors[conv.inputs[1]]
    assert w.data is not None and w.data.dtype == np.float32
    # the weights are the stored integers times their scales, (O, H, W, I) in TFLite
    q = np.transpose(inits["w_q"], (0, 2, 3, 1)) * inits["w_s"].reshape(-1, 1, 1, 1)
    np.testing.assert_allclose(w.data, q, rtol=1e-6)
    assert "DEQUANTIZE" not in [op.opcode for op in sg.operators]
    _verified(result)


def _qdq_conv(
    *, x_type: int = TensorProto.FLOAT, y_dtype: type = np.int8, relu: bool = False
) -> onnx.ModelProto:
    """x -> [Q] -> DQ -> Conv -> [Relu] -> Q -> [DQ] -> y: a float ``x`` is quantized in the
    model, an integer one only dequantized; ``y_dtype`` uint8 leaves y the Q's uint8."""
    x_scale = 1 / 255
    inits, deq = _int8_weights("w", weights(4, 3, 3, 3), bias=weights(4), x_scale=x_scale)
    x_zero = {TensorProto.UINT8: (128, np.uint8), TensorProto.INT8: (0, np.int8)}
    zero, x_dtype = x_zero.get(x_type, (-128, np.int8))
    inits |= _params("x", x_scale, zero, x_dtype)
    inits |= _params("y", 0.05, 128 if y_dtype == np.uint8 else 3, y_dtype)
    nodes = [] if x_type != TensorProto.FLOAT else [_q("x", "x", "xq")]
    nodes += [
        *deq,
        _dq("x" if x_type != TensorProto.FLOAT else "xq", "x", "xd"),
        N("Conv", ["xd", "w", "w_b"], ["c"], pads=[1, 1, 1, 1]),
    ]
    if relu:
        nodes.append(N("Relu", ["c"], ["r"]))
    nodes.append(_q("r" if relu else "c", "y", "yq" if y_dtype == np.int8 else "y"))
    if y_dtype == np.int8:
        nodes.append(_dq("yq", "y", "y"))
    return model(nodes, {"x": [1, 3, 8, 8]}, ["y"], inits, opset=13, input_types={"x": x_type})


def test_uint8_model_output_stays_uint8(tmp_path: Path) -> None:
    """A QDQ model whose output is a uint8 QuantizeLinear: the conv runs int8 (uint8 runs as
    int8, zero point 128 lower), and a QUANTIZE gives the file a uint8 output again."""
    proto = _qdq_conv(y_dtype=np.uint8)
    result = export_tflite(
        proto, tmp_path / "m.tflite", precision="int8", samples=[_image(42), _image(43)]
    )
    sg = _tflite(result)
    assert sg.tensors[sg.inputs[0]].type_name == "float32"
    out = sg.tensors[sg.outputs[0]]
    assert out.type_name == "uint8"
    assert out.quant is not None and out.quant.zero_point[0] == 128
    conv = _op(sg, "CONV_2D")
    assert _types(sg, conv) == ("int8", "int8", "int32", "int8")
    c = sg.tensors[conv.outputs[0]].quant
    assert c is not None and np.isclose(c.scale[0], 0.05) and c.zero_point[0] == 0
    # one QUANTIZE makes the uint8 numbers, from the conv's int8 (a TRANSPOSE back to NCHW
    # may follow it)
    to_uint8 = next(op for op in sg.operators if _types(sg, op)[-1] == "uint8")
    assert to_uint8.opcode == "QUANTIZE"
    assert sg.tensors[to_uint8.inputs[0]].type_name == "int8"
    _verified(result)


@pytest.mark.parametrize(
    ("x_type", "dtype", "zero"),
    [(TensorProto.UINT8, np.uint8, 128), (TensorProto.INT8, np.int8, 0)],
    ids=["uint8", "int8"],
)
def test_integer_model_input_takes_its_dequantize_parameters(
    tmp_path: Path, x_type: int, dtype: type, zero: int
) -> None:
    """An integer model input no QuantizeLinear made, only a DequantizeLinear reading it: the
    input keeps its type and the DQ's parameters; the conv after it runs int8."""
    proto = _qdq_conv(x_type=x_type)
    rng = np.random.default_rng(44)
    info = np.iinfo(dtype)
    samples = [
        {"x": rng.integers(info.min, info.max, (1, 3, 8, 8), endpoint=True).astype(dtype)}
        for _ in range(2)
    ]
    result = export_tflite(proto, tmp_path / "m.tflite", precision="int8", samples=samples)
    sg = _tflite(result)
    x = sg.tensors[sg.inputs[0]]
    assert x.type_name == np.dtype(dtype).name
    assert x.quant is not None and np.isclose(x.quant.scale[0], 1 / 255)
    assert x.quant.zero_point[0] == zero
    assert sg.tensors[sg.outputs[0]].type_name == "float32"
    conv = _op(sg, "CONV_2D")
    assert _types(sg, conv) == ("int8", "int8", "int32", "int8")
    xq = sg.tensors[conv.inputs[0]].quant
    assert xq is not None and xq.zero_point[0] == zero - (128 if dtype == np.uint8 else 0)
    opcodes = [op.opcode for op in sg.operators]
    # a uint8 input is requantized to int8 (one QUANTIZE); an int8 one goes straight in
    assert opcodes.count("QUANTIZE") == (1 if dtype == np.uint8 else 0), opcodes
    assert opcodes.count("DEQUANTIZE") == 1, opcodes  # the float output only
    _verified(result)


def test_conv_relu_quantize_writes_at_the_q_parameters(tmp_path: Path) -> None:
    """``Conv -> Relu -> QuantizeLinear`` with no Q between the conv and the relu: the conv
    writes int8 at the Q's parameters itself, no DEQUANTIZE/QUANTIZE pair around it."""
    proto = _qdq_conv(relu=True)
    result = export_tflite(
        proto, tmp_path / "m.tflite", precision="int8", samples=[_image(45), _image(46)]
    )
    sg = _tflite(result)
    conv = _op(sg, "CONV_2D")
    assert _types(sg, conv) == ("int8", "int8", "int32", "int8")
    c = sg.tensors[conv.outputs[0]]
    assert c.quant is not None and np.isclose(c.quant.scale[0], 0.05)
    assert c.quant.zero_point[0] == 3
    assert conv.options["fused_activation_function"] == 1  # RELU, on the integers
    readers = [op.opcode for op in sg.operators if conv.outputs[0] in op.inputs]
    assert "QUANTIZE" not in readers, readers
    opcodes = [op.opcode for op in sg.operators]
    # QUANTIZE at the float input, DEQUANTIZE at the float output: nothing around the conv
    assert opcodes.count("QUANTIZE") == opcodes.count("DEQUANTIZE") == 1, opcodes
    _verified(result)


@pytest.mark.parametrize("move", ["Reshape", "Transpose"])
def test_dequantize_then_data_movement_then_gemm_runs_int8(tmp_path: Path, move: str) -> None:
    """``DQ -> Reshape/Transpose -> Gemm``: the op that moves integers passes the DQ's
    parameters on, so the FULLY_CONNECTED takes int8 input."""
    x_scale = 0.02
    w = weights(5, 12)
    inits, deq = _int8_weights("w", w, bias=weights(5), x_scale=x_scale)
    inits |= _params("x", x_scale, 2) | _params("y", 0.05, -4)
    if move == "Reshape":
        shape, inits["shape"] = [1, 3, 4], np.array([1, 12], np.int64)
        moving = N("Reshape", ["xd", "shape"], ["f"])
    else:
        shape, moving = [12, 1], N("Transpose", ["xd"], ["f"], perm=[1, 0])
    nodes = [
        *deq,
        _q("x", "x", "xq"),
        _dq("xq", "x", "xd"),
        moving,
        N("Gemm", ["f", "w", "w_b"], ["g"], transB=1),
        _q("g", "y", "yq"),
        _dq("yq", "y", "y"),
    ]
    proto = model(nodes, {"x": shape}, ["y"], inits, opset=13)
    rng = np.random.default_rng(47)
    samples = [{"x": rng.uniform(-1, 1, shape).astype(np.float32)} for _ in range(2)]
    result = export_tflite(proto, tmp_path / "m.tflite", precision="int8", samples=samples)
    sg = _tflite(result)
    fc = _op(sg, "FULLY_CONNECTED")
    assert _types(sg, fc) == ("int8", "int8", "int32", "int8")
    x = sg.tensors[fc.inputs[0]].quant
    assert x is not None and np.isclose(x.scale[0], x_scale) and x.zero_point[0] == 2
    _verified(result)


def _with_default() -> tuple[onnx.ModelProto, np.ndarray]:
    """y = x * 2 + s, with ``s`` an initializer the model also lists as an input (IR >= 4:
    an input with a default)."""
    s = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6)
    proto = model(
        [N("Mul", ["x", "two"], ["m"]), N("Add", ["m", "s"], ["y"])],
        {"x": [1, 6]},
        ["y"],
        {"two": np.float32(2), "s": s},
    )
    proto.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 6]))
    onnx.checker.check_model(proto)
    return proto, s


def test_input_with_a_default_is_a_tflite_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file declares an input with a default as an input (TFLite has no optional inputs);
    a sample that leaves it out, or no sample at all, is verified from the default."""
    from ai_edge_litert.interpreter import Interpreter

    import ferry.mobile._tflite_export as tflite_export

    verified: list[dict[str, np.ndarray]] = []
    verify = tflite_export._verify

    def spy(source: Any, data: bytes, lowered: Any, feeds_list: Any, precision: str) -> Any:
        verified.extend(feeds_list)
        return verify(source, data, lowered, feeds_list, precision)

    monkeypatch.setattr(tflite_export, "_verify", spy)
    proto, s = _with_default()
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    result = export_tflite(proto, tmp_path / "m.tflite", samples={"x": x})
    _verified(result)
    assert [io.name for io in result.report.inputs] == ["x", "s"]
    assert any("default" in note and "s" in note for note in result.report.notes)
    assert len(verified) == 1 and np.array_equal(verified[0]["s"], s)
    sg = _tflite(result)
    assert sorted(sg.tensors[i].name for i in sg.inputs) == ["s", "x"]
    assert not any(t.data is not None and t.data.size == 6 for t in sg.tensors)  # not frozen
    # the file computes from the input it is given, the default or another value
    runner = Interpreter(model_path=str(result.path)).get_signature_runner()
    (got,) = runner(x=x, s=s).values()
    np.testing.assert_allclose(got, x * 2 + s, rtol=1e-6)
    (got,) = runner(x=x, s=np.zeros_like(s)).values()
    np.testing.assert_allclose(got, x * 2, rtol=1e-6)
    # no samples: random x, and s its default
    verified.clear()
    again = export_tflite(proto, tmp_path / "n.tflite")
    _verified(again)
    assert verified and all(np.array_equal(feeds["s"], s) for feeds in verified)
