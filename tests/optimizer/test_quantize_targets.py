"""Target schemes and ORT's quantizer arguments (``quantize._targets``), the QDQ validator (``_check``).

The key property: what ``quantize_static(**ort_arguments(scheme(t)))`` produces passes ``check(., t)``.
Then each rule is broken on its own, by editing a valid model, and must be reported alone, naming
the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, quantize_static

from ferry.errors import InvalidInputError
from ferry.optimizer.quantize._check import Breach, check, check_summary
from ferry.optimizer.quantize._targets import (
    RULES,
    TARGETS,
    drop_graph_output_qdq,
    ort_arguments,
    scheme,
)

# Fixed flags keep the onnxruntime scheme the same on every machine (x86 with VNNI: U8S8).
VNNI = {"avx2", "avx512_vnni"}


def _float_model() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Reshape -> Gemm(transB=1), all with biases."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(size=(4, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b2"),
        numpy_helper.from_array(np.array([1, 4 * 6 * 6], dtype=np.int64), "shape"),
        numpy_helper.from_array(rng.normal(size=(10, 144)).astype(np.float32), "w3"),
        numpy_helper.from_array(rng.normal(size=(10,)).astype(np.float32), "b3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Reshape", ["c2", "shape"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self._it: Iterator[dict[str, np.ndarray]] = iter(
            [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def _quantize(target: str, path: Path, **extra: object) -> onnx.ModelProto:
    s = scheme(target, cpu_flags=VNNI)
    arguments = ort_arguments(s)
    arguments["extra_options"] = {**arguments["extra_options"], **extra}
    quantize_static(_float_model(), str(path), _Reader(), **arguments)
    model = ir.load(path)
    if not s.qdq_on_graph_outputs:
        # ORT cannot leave graph outputs float by itself (see ort_arguments).
        drop_graph_output_qdq(model)
    return ir.to_proto(model)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, onnx.ModelProto]:
    """One quantized proto per target, made with that target's scheme."""
    folder = tmp_path_factory.mktemp("quantized")
    return {t: _quantize(t, folder / f"{t}.onnx") for t in TARGETS}


def _check(proto: onnx.ModelProto, target: str) -> list[Breach]:
    return check(ir.from_proto(proto), target, cpu_flags=VNNI)


def _edit(proto: onnx.ModelProto, change: Callable[[onnx.GraphProto], None]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    change(copy.graph)
    return copy


def _init(graph: onnx.GraphProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(i for i in graph.initializer if i.name == name))


def _set(graph: onnx.GraphProto, name: str, array: np.ndarray) -> None:
    for index, init in enumerate(graph.initializer):
        if init.name == name:
            graph.initializer[index].CopyFrom(numpy_helper.from_array(array, name))
            return
    raise KeyError(name)


def _node(graph: onnx.GraphProto, name: str) -> onnx.NodeProto:
    return next(n for n in graph.node if n.name == name)


# -- the schemes --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_ort_output_follows_its_scheme(quantized: dict[str, onnx.ModelProto], target: str) -> None:
    assert _check(quantized[target], target) == []


def test_ort_weights_land_in_the_scheme_range(quantized: dict[str, onnx.ModelProto]) -> None:
    # ORT's symmetric int8 range is [-127, 127]: the weights never reach -128.
    for target in ("tflite", "portable"):
        weights = _init(quantized[target].graph, "w1_quantized")
        assert weights.dtype == np.int8
        assert weights.min() == -127 or weights.max() == 127
        assert weights.min() >= -127


def test_tflite_bias_is_int32_with_the_product_scale(quantized: dict[str, onnx.ModelProto]) -> None:
    graph = quantized["tflite"].graph
    bias_scale = _init(graph, "b1_quantized_scale")
    assert _init(graph, "b1_quantized").dtype == np.int32
    np.testing.assert_allclose(bias_scale, _init(graph, "x_scale") * _init(graph, "w1_scale"))


def test_portable_model_passes_every_target(quantized: dict[str, onnx.ModelProto]) -> None:
    for target in TARGETS:
        assert _check(quantized["portable"], target) == [], target


def test_portable_accepts_only_what_every_target_accepts(
    quantized: dict[str, onnx.ModelProto],
) -> None:
    for made_for, proto in quantized.items():
        if _check(proto, "portable") == []:
            assert all(_check(proto, t) == [] for t in TARGETS), made_for
    # U8 activations and an int32 bias run on ORT and OpenVINO, not on TensorRT: not portable.
    rules = {b.rule for b in _check(quantized["onnxruntime"], "portable")}
    assert rules == {"activation-dtype", "activation-symmetric", "bias-quantized", "output-qdq"}


def test_onnxruntime_scheme_follows_the_cpu() -> None:
    no_vnni = scheme("onnxruntime", cpu_flags={"sse2", "avx2"})
    assert (no_vnni.activations, no_vnni.weight_range, no_vnni.reduce_range) == (
        "uint8",
        (-64, 64),
        True,
    )
    assert ort_arguments(no_vnni)["reduce_range"] is True
    vnni = scheme("onnxruntime", cpu_flags=VNNI)
    assert (vnni.activations, vnni.weight_range, vnni.reduce_range) == ("uint8", (-128, 127), False)
    amx = scheme("onnxruntime", cpu_flags={"avx2", "amx_int8"})
    assert amx.weight_range == (-128, 127)
    arm = scheme("onnxruntime", cpu_flags={"fp", "asimd"})
    assert arm.activations == "int8"


def test_scheme_details() -> None:
    trt = scheme("tensorrt")
    assert (trt.activations, trt.activations_symmetric, trt.quantize_bias_as_int32) == (
        "int8",
        True,
        False,
    )
    assert not trt.qdq_on_graph_outputs
    tfl = scheme("tflite")
    assert (tfl.weight_range, tfl.quantize_bias_as_int32, tfl.activations_symmetric) == (
        (-127, 127),
        True,
        False,
    )
    assert not scheme("openvino", per_channel=False).per_channel
    assert "tensorrt: int8 symmetric activations" in trt.describe()
    options = ort_arguments(trt)["extra_options"]
    assert options["QuantizeBias"] is False
    assert options["ActivationSymmetric"] is True
    assert "Conv" in options["OpTypesToExcludeOutputQuantization"]


def test_unknown_target_is_refused(quantized: dict[str, onnx.ModelProto]) -> None:
    with pytest.raises(InvalidInputError, match="coreml.*onnxruntime, openvino, tensorrt"):
        _check(quantized["tflite"], "coreml")
    with pytest.raises(InvalidInputError, match="portable"):
        scheme("cuda")


# -- each rule, broken alone ---------------------------------------------------------------------


def _only(breaches: list[Breach], rule: str, node: str) -> None:
    assert breaches, f"{rule} was not reported"
    assert {b.rule for b in breaches} == {rule}, breaches
    assert [b.node for b in breaches] == [node], breaches
    assert node in breaches[0].detail


def test_activation_dtype(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["tensorrt"], lambda g: _set(g, "x_zero_point", np.uint8(0)))
    _only(_check(proto, "tensorrt"), "activation-dtype", "x_DequantizeLinear")
    # ORT and OpenVINO run uint8 activations.
    assert _check(proto, "openvino") == []


def test_activation_symmetric(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["tensorrt"], lambda g: _set(g, "r1_zero_point", np.int8(5)))
    _only(_check(proto, "tensorrt"), "activation-symmetric", "r1_DequantizeLinear")
    assert _check(proto, "tflite") == []  # TFLite's activations are asymmetric


def test_weight_dtype(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["tflite"], lambda g: _set(g, "w1_zero_point", np.zeros(8, np.uint8)))
    _only(_check(proto, "tflite"), "weight-dtype", "conv1")


def test_weight_symmetric(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["tflite"], lambda g: _set(g, "w1_zero_point", np.ones(8, np.int8)))
    _only(_check(proto, "tflite"), "weight-symmetric", "conv1")


def test_weight_range(quantized: dict[str, onnx.ModelProto]) -> None:
    def to_minus_128(graph: onnx.GraphProto) -> None:
        weights = _init(graph, "w2_quantized").copy()
        weights[0, 0, 0, 0] = -128
        _set(graph, "w2_quantized", weights)

    proto = _edit(quantized["tflite"], to_minus_128)
    _only(_check(proto, "tflite"), "weight-range", "conv2")
    # TensorRT takes the full int8 range; ORT without VNNI only 7 bits.
    assert "weight-range" not in {b.rule for b in _check(proto, "tensorrt")}
    no_vnni = check(ir.from_proto(quantized["onnxruntime"]), "onnxruntime", cpu_flags={"avx2"})
    assert {b.rule for b in no_vnni} == {"weight-range"}


def test_per_channel(quantized: dict[str, onnx.ModelProto]) -> None:
    def per_tensor(graph: onnx.GraphProto) -> None:
        _set(graph, "w2_scale", np.float32(_init(graph, "w2_scale").max()))
        _set(graph, "w2_zero_point", np.int8(0))

    proto = _edit(quantized["portable"], per_tensor)
    _only(_check(proto, "portable"), "per-channel", "conv2")
    assert check(ir.from_proto(proto), "portable", per_channel=False) == []


def test_channel_axis(quantized: dict[str, onnx.ModelProto]) -> None:
    def wrong_axis(graph: onnx.GraphProto) -> None:
        dq = _node(graph, "w3_DequantizeLinear")
        del dq.attribute[:]
        dq.attribute.append(helper.make_attribute("axis", 1))

    proto = _edit(quantized["portable"], wrong_axis)
    _only(_check(proto, "portable"), "channel-axis", "gemm")


def test_output_qdq(quantized: dict[str, onnx.ModelProto]) -> None:
    def quantize_output(graph: onnx.GraphProto) -> None:
        _node(graph, "gemm").output[0] = "y_float"
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.float32(0.1), "y_scale"),
                numpy_helper.from_array(np.int8(0), "y_zp"),
            ]
        )
        graph.node.extend(
            [
                helper.make_node("QuantizeLinear", ["y_float", "y_scale", "y_zp"], ["y_q"], "yq"),
                helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zp"], ["y"], "ydq"),
            ]
        )

    proto = _edit(quantized["portable"], quantize_output)
    _only(_check(proto, "portable"), "output-qdq", "ydq")
    assert _check(proto, "tflite") == []
    # drop_graph_output_qdq undoes it, keeping the output's name.
    model = ir.from_proto(proto)
    assert drop_graph_output_qdq(model) == ["y"]
    assert check(model, "portable") == []
    assert [o.name for o in model.graph.outputs] == ["y"]


def _quantize_bias(graph: onnx.GraphProto, dtype: type[np.integer]) -> None:
    """Replace conv1's float bias by ``int -> DQ`` with scale input_scale * weight_scale."""
    bias = _init(graph, "b1")
    scale = (_init(graph, "x_scale") * _init(graph, "w1_scale")).astype(np.float32)
    ints = np.clip(np.rint(bias / scale), np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype)
    graph.initializer.extend(
        [
            numpy_helper.from_array(ints, "b1_q"),
            numpy_helper.from_array(scale, "b1_q_scale"),
            numpy_helper.from_array(np.zeros(8, dtype), "b1_q_zp"),
        ]
    )
    graph.node.insert(
        0,
        helper.make_node(
            "DequantizeLinear", ["b1_q", "b1_q_scale", "b1_q_zp"], ["b1_dq"], "b1_dq", axis=0
        ),
    )
    conv = _node(graph, "conv1")
    conv.input[2] = "b1_dq"


def test_bias_quantized(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["portable"], lambda g: _quantize_bias(g, np.int32))
    _only(_check(proto, "portable"), "bias-quantized", "conv1")
    _only(_check(proto, "tensorrt"), "bias-quantized", "conv1")
    # An int32 bias with the product scale is what TFLite and ORT want.
    assert _check(proto, "tflite") == []


def test_bias_dtype(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(quantized["portable"], lambda g: _quantize_bias(g, np.int8))
    _only(_check(proto, "tflite"), "bias-dtype", "conv1")
    assert _check(proto, "openvino") == []  # OpenVINO folds any bias DQ to float


def test_bias_scale(quantized: dict[str, onnx.ModelProto]) -> None:
    proto = _edit(
        quantized["tflite"],
        lambda g: _set(g, "b1_quantized_scale", _init(g, "b1_quantized_scale") * 2),
    )
    _only(_check(proto, "tflite"), "bias-scale", "conv1")
    _only(_check(proto, "onnxruntime"), "bias-scale", "conv1")


def test_bias_zero_point(quantized: dict[str, onnx.ModelProto]) -> None:
    def bias_zp(graph: onnx.GraphProto) -> None:
        _quantize_bias(graph, np.int32)
        _set(graph, "b1_q_zp", np.ones(8, np.int32))

    proto = _edit(quantized["portable"], bias_zp)
    _only(_check(proto, "tflite"), "bias-scale", "conv1")


@pytest.mark.parametrize("bad", [0.0, -0.5, np.inf, np.nan])
def test_scale(quantized: dict[str, onnx.ModelProto], bad: float) -> None:
    proto = _edit(quantized["tflite"], lambda g: _set(g, "y_scale", np.float32(bad)))
    _only(_check(proto, "tflite"), "scale", "y_DequantizeLinear")


def test_every_rule_is_tested() -> None:
    tested = {
        "activation-dtype",
        "activation-symmetric",
        "weight-dtype",
        "weight-symmetric",
        "weight-range",
        "per-channel",
        "channel-axis",
        "output-qdq",
        "bias-quantized",
        "bias-dtype",
        "bias-scale",
        "scale",
        "residual-qdq",  # test_residual_add_gets_qdq_for_tensorrt
    }
    assert set(RULES) == tested


# -- weights stored other ways -------------------------------------------------------------------


def _to_constants(graph: onnx.GraphProto, names: tuple[str, ...]) -> None:
    """Move initializers into Constant nodes (how Paddle exports store weights)."""
    for name in names:
        array = _init(graph, name)
        kept = [i for i in graph.initializer if i.name != name]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.node.insert(
            0,
            helper.make_node(
                "Constant",
                [],
                [name],
                name=f"const_{name}",
                value=numpy_helper.from_array(array, name),
            ),
        )


def test_constant_node_weights_are_checked_the_same(quantized: dict[str, onnx.ModelProto]) -> None:
    names = ("w1_quantized", "w1_scale", "w1_zero_point", "b1_quantized", "b1_quantized_scale")
    proto = _edit(quantized["tflite"], lambda g: _to_constants(g, names))
    assert _check(proto, "tflite") == []

    def break_it(graph: onnx.GraphProto) -> None:
        _set(graph, "w1_zero_point", np.ones(8, np.int8))
        _to_constants(graph, names)

    _only(_check(_edit(quantized["tflite"], break_it), "tflite"), "weight-symmetric", "conv1")


def test_float_weights_behind_a_qdq_pair(tmp_path: Path) -> None:
    # ORT's AddQDQPairToWeight keeps float weights behind Q -> DQ (what NVIDIA's tools emit).
    proto = _quantize("tensorrt", tmp_path / "pair.onnx", AddQDQPairToWeight=True)
    assert any(i.name == "w1" for i in proto.graph.initializer)
    assert _check(proto, "tensorrt") == []

    def shrink_scale(graph: onnx.GraphProto) -> None:
        _set(graph, "w1_scale", _init(graph, "w1_scale") / 2)  # values now reach +-254

    _only(_check(_edit(proto, shrink_scale), "tensorrt"), "weight-range", "conv1")


def test_check_summary() -> None:
    assert check_summary([]) == "no breaches"
    line = check_summary(
        [
            Breach("weight-range", "conv1", "..."),
            Breach("weight-range", "conv2", "..."),
            Breach("output-qdq", "ydq", "..."),
        ]
    )
    assert line == "3 breaches: weight-range x2 (conv1, ...), output-qdq (ydq)"


def test_placement_decides_output_quantization() -> None:
    ov = scheme("openvino")
    assert ov.placements == ("inputs", "inputs+outputs")
    inputs_only = ort_arguments(ov.with_placement("inputs"))["extra_options"]
    assert "Conv" in inputs_only["OpTypesToExcludeOutputQuantization"]
    both = ort_arguments(ov.with_placement("inputs+outputs"))["extra_options"]
    assert "OpTypesToExcludeOutputQuantization" not in both
    assert (
        "OpTypesToExcludeOutputQuantization"
        not in ort_arguments(scheme("onnxruntime"))["extra_options"]
    )
    with pytest.raises(InvalidInputError, match="unknown placement"):
        ov.with_placement("outputs")  # type: ignore[arg-type]


def residual_block() -> onnx.ModelProto:
    """x -> Conv -> Relu = r; r -> Conv -> c; y = Add(c, r): the ResNet shape whose Add TensorRT
    fuses into the second Conv when r reaches the Add through Q/DQ."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((4, 4, 3, 3)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((4, 4, 3, 3)) * 0.2).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["a"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w2"], ["c"], pads=[1, 1, 1, 1], name="conv2"),
            helper.make_node("Add", ["c", "r"], ["y"], name="add"),
        ],
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_residual_add_gets_qdq_for_tensorrt() -> None:
    from ferry.optimizer.quantize import quantize, quantize_residual_inputs

    rng = np.random.default_rng(0)
    data = [{"x": rng.random((1, 4, 8, 8), dtype=np.float32)} for _ in range(8)]
    result = quantize(residual_block(), data=data, target="tensorrt", budget="5%", force=True)
    add = next(n for n in result.model.graph if n.op_type == "Add")
    producers = [v.producer().op_type for v in add.inputs if v is not None and v.producer()]
    assert sorted(producers) == ["Conv", "DequantizeLinear"], producers
    assert check(result.model, "tensorrt") == []
    # The skip read float (a model quantized elsewhere): the validator names the Add, the fix
    # gives it a Q/DQ pair of its own with the parameters of the skip's existing Q.
    bare = result.model
    dq = next(v for v in add.inputs if v is not None and v.producer().op_type == "DequantizeLinear")
    skip = dq.producer().inputs[0].producer().inputs[0]
    add.replace_input_with(list(add.inputs).index(dq), skip)
    breaches = check(bare, "tensorrt")
    assert [(b.rule, b.node) for b in breaches] == [("residual-qdq", "add")]
    assert check(bare, "portable")[0].rule == "residual-qdq"
    assert check(bare, "openvino") == []  # OpenVINO fuses it itself
    assert quantize_residual_inputs(bare) == ["add"]
    assert check(bare, "tensorrt") == []
    fixed = next(v for v in add.inputs if v is not None and v.name == "r_residual_dq")
    assert fixed.producer().inputs[1] is dq.producer().inputs[1]  # the same scale
