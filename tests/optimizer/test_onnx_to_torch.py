"""ferry's ONNX -> torch module (distillation's student): parity with ONNX Runtime op by op and on
the zoo, weights in initializers or Constant nodes, the write-back, and unsupported ops listed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry import zoo
from ferry.errors import UnsupportedOpError

torch = pytest.importorskip("torch")

from ferry.optimizer.distill import supported_ops, to_torch, write_back  # noqa: E402

TOLERANCE = 1e-4


def _ort(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in session.run(None, feeds)]


def _torch(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    module = to_torch(model)
    with torch.no_grad():
        out = module(*[torch.from_numpy(feeds[n]) for n in module.input_names])
    return [o.numpy() for o in out]


def assert_parity(model: ir.Model, feeds: dict[str, np.ndarray]) -> None:
    want, got = _ort(model, feeds), _torch(model, feeds)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=TOLERANCE, rtol=TOLERANCE)


def one_node(
    op: str,
    inputs: Sequence[tuple[str, np.ndarray]],
    *,
    constants: Sequence[tuple[str, np.ndarray]] = (),
    opset: int = 17,
    outputs: int = 1,
    **attrs: Any,
) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """A model of one ``op`` node: ``inputs`` are graph inputs (fed), ``constants`` initializers."""
    node_inputs = [n for n, _ in inputs] + [n for n, _ in constants]
    outs = [f"y{i}" for i in range(outputs)]
    graph = helper.make_graph(
        [helper.make_node(op, node_inputs, outs, name=f"the_{op}", **attrs)],
        op,
        [
            helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for n, a in inputs
        ],
        [helper.make_empty_tensor_value_info(o) for o in outs],
        [numpy_helper.from_array(a, n) for n, a in constants],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    return ir.from_proto(proto), {n: a for n, a in inputs}


RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


X = rand(2, 4, 9, 11)
W = rand(6, 4, 3, 3)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "conv_asymmetric_pads": ("Conv", {"inputs": [("x", X)], "constants": [("w", W)]},
                             {"pads": [0, 1, 2, 1], "strides": [2, 1]}),
    "conv_same_upper": ("Conv", {"inputs": [("x", X)], "constants": [("w", W)]},
                                {"auto_pad": "SAME_UPPER", "strides": [2, 1]}),
    "conv_same_lower": ("Conv", {"inputs": [("x", X)], "constants": [("w", W)]},
                        {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "conv_depthwise_bias": ("Conv", {"inputs": [("x", X)],
                                     "constants": [("w", rand(8, 1, 3, 3)), ("b", rand(8))]},
                            {"group": 4, "pads": [1, 1, 1, 1]}),
    "conv_transpose": ("ConvTranspose", {"inputs": [("x", X)], "constants": [("w", rand(4, 3, 3, 3))]},
                       {"strides": [2, 2], "pads": [1, 0, 1, 1], "output_padding": [1, 1]}),
    "conv_transpose_groups_shape": ("ConvTranspose",
                                    {"inputs": [("x", X)], "constants": [("w", rand(4, 2, 4, 4))]},
                                    {"strides": [2, 2], "group": 2, "output_shape": [18, 22]}),
    "maxpool_ceil_pads": ("MaxPool", {"inputs": [("x", X)]},
                          {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1],
                           "ceil_mode": 1}),
    "maxpool_same": ("MaxPool", {"inputs": [("x", X)]},
                     {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "avgpool_exclude_pad": ("AveragePool", {"inputs": [("x", X)]},
                            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "avgpool_asymmetric_exclude": ("AveragePool", {"inputs": [("x", X)]},
                                   {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1]}),
    "avgpool_include_pad": ("AveragePool", {"inputs": [("x", X)]},
                            {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "batchnorm": ("BatchNormalization",
                  {"inputs": [("x", X)], "constants": [("s", rand(4)), ("b", rand(4)), ("m", rand(4)),
                                                        ("v", np.abs(rand(4)) + 0.1)]},
                  {"epsilon": 1e-3}),
    "gemm_trans_alpha_beta": ("Gemm", {"inputs": [("a", rand(5, 3))],
                                       "constants": [("b", rand(4, 5)), ("c", rand(4))]},
                              {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
    "softmax_opset11": ("Softmax", {"inputs": [("x", X)], "opset": 11}, {"axis": 1}),
    "softmax_axis": ("Softmax", {"inputs": [("x", X)]}, {"axis": 1}),
    "prelu": ("PRelu", {"inputs": [("x", X)], "constants": [("s", rand(4, 1, 1))]}, {}),
    "hardsigmoid": ("HardSigmoid", {"inputs": [("x", X)]}, {"alpha": 0.3, "beta": 0.4}),
    "leakyrelu": ("LeakyRelu", {"inputs": [("x", X)]}, {"alpha": 0.2}),
    "clip": ("Clip", {"inputs": [("x", X)], "constants": [("lo", np.array(-0.5, np.float32)),
                                                          ("hi", np.array(0.7, np.float32))]}, {}),
    "pad_reflect": ("Pad", {"inputs": [("x", X)],
                            "constants": [("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))]},
                    {"mode": "reflect"}),
    "pad_edge": ("Pad", {"inputs": [("x", X)],
                         "constants": [("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))]},
                 {"mode": "edge"}),
    "pad_constant_crop": ("Pad", {"inputs": [("x", X)],
                                  "constants": [("p", np.array([0, 1, 1, -2, 0, 0, 2, 1], np.int64)),
                                                ("v", np.array(1.5, np.float32))]}, {}),
    "slice_negative_step": ("Slice", {"inputs": [("x", X)],
                                      "constants": [("s", np.array([-1, 8], np.int64)),
                                                    ("e", np.array([-100, 1], np.int64)),
                                                    ("a", np.array([3, 2], np.int64)),
                                                    ("t", np.array([-2, -3], np.int64))]}, {}),
    "slice_clamped": ("Slice", {"inputs": [("x", X)],
                                "constants": [("s", np.array([1, -4], np.int64)),
                                              ("e", np.array([1000, -1], np.int64))]}, {}),
    "resize_nearest_asymmetric_floor": (
        "Resize", {"inputs": [("x", X)], "constants": [("r", np.zeros(0, np.float32)),
                                                      ("sc", np.array([1, 1, 2, 1.5], np.float32))]},
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
         "nearest_mode": "floor"}),
    "resize_nearest_half_pixel": (
        "Resize", {"inputs": [("x", X)], "constants": [("r", np.zeros(0, np.float32)),
                                                      ("sc", np.array([1, 1, 1.7, 0.6], np.float32))]},
        {"mode": "nearest"}),
    "resize_linear_half_pixel": (
        "Resize", {"inputs": [("x", X)], "constants": [("r", np.zeros(0, np.float32)),
                                                      ("sc", np.array([1, 1, 2, 0.5], np.float32))]},
        {"mode": "linear"}),
    "resize_linear_align_corners_sizes": (
        "Resize", {"inputs": [("x", X)], "constants": [("r", np.zeros(0, np.float32)),
                                                      ("sc", np.zeros(0, np.float32)),
                                                      ("sz", np.array([2, 4, 5, 20], np.int64))]},
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    "reducemean_opset13": ("ReduceMean", {"inputs": [("x", X)], "opset": 13},
                           {"axes": [2, 3], "keepdims": 0}),
    "reducemean_opset18": ("ReduceMean", {"inputs": [("x", X)], "opset": 18,
                                          "constants": [("a", np.array([-1], np.int64))]}, {}),
    "flatten": ("Flatten", {"inputs": [("x", X)]}, {"axis": 2}),
    "transpose": ("Transpose", {"inputs": [("x", X)]}, {"perm": [0, 2, 3, 1]}),
    "global_average_pool": ("GlobalAveragePool", {"inputs": [("x", X)]}, {}),
    "gather_negative": ("Gather", {"inputs": [("x", X)],
                                   "constants": [("i", np.array([[0, -1], [2, 1]], np.int64))]},
                        {"axis": 1}),
    "unsqueeze": ("Unsqueeze", {"inputs": [("x", X)], "constants": [("a", np.array([-1, 0], np.int64))]},
                  {}),
    "layer_norm": ("LayerNormalization", {"inputs": [("x", X)],
                                          "constants": [("s", rand(9, 11)), ("b", rand(9, 11))]},
                   {"axis": 2}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_onnxruntime(case: str) -> None:
    op, spec, attrs = CASES[case]
    model, feeds = one_node(op, **spec, **attrs)
    assert_parity(model, feeds)


def test_split_outputs_and_sizes() -> None:
    model, feeds = one_node(
        "Split",
        [("x", X)],
        constants=[("s", np.array([2, 7], np.int64))],
        outputs=2,
        axis=2,
    )
    assert_parity(model, feeds)
    model, feeds = one_node("Split", [("x", X)], outputs=3, axis=3, opset=18, num_outputs=3)
    assert_parity(model, feeds)


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_models_match_onnxruntime(name: str) -> None:
    assert_parity(zoo.build(name), zoo.example_inputs(name, batch=3))


def as_constant_nodes(model: ir.Model) -> ir.Model:
    """``model`` with every float initializer moved into a Constant node (Paddle's habit)."""
    proto = ir.to_proto(model)
    constants = []
    for init in list(proto.graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            constants.append(
                helper.make_node("Constant", [], [init.name], value=init, name=f"const_{init.name}")
            )
            proto.graph.initializer.remove(init)
    nodes = constants + list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return ir.from_proto(proto)


def test_constant_node_weights_train_and_write_back() -> None:
    model = as_constant_nodes(zoo.build("digits_cnn"))
    assert not [v for v in model.graph.initializers.values() if v.dtype == ir.DataType.FLOAT]
    feeds = zoo.example_inputs("digits_cnn", batch=4)
    assert_parity(model, feeds)

    module = to_torch(model)
    assert module.trainable and {k for k, _ in module.sources.values()} == {"constant"}
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(1.1)
    written = write_back(model, module)
    with torch.no_grad():
        want = module(torch.from_numpy(feeds[module.input_names[0]]))[0].numpy()
    np.testing.assert_allclose(_ort(written, feeds)[0], want, atol=TOLERANCE)
    # The input model is untouched, and the structure (ops, names) is the same.
    np.testing.assert_allclose(_ort(model, feeds)[0], _torch(model, feeds)[0], atol=TOLERANCE)
    assert [n.op_type for n in written.graph] == [n.op_type for n in model.graph]


def test_write_back_changes_only_weights() -> None:
    model = zoo.build("mobilenet_v2")
    module = to_torch(model)
    written = write_back(model, module)
    for name, value in model.graph.initializers.items():
        np.testing.assert_array_equal(
            written.graph.initializers[name].const_value.numpy(), value.const_value.numpy()
        )


def test_batchnorm_stats_are_frozen_scale_and_bias_train() -> None:
    model, _ = one_node(
        "BatchNormalization",
        [("x", X)],
        constants=[("s", rand(4)), ("b", rand(4)), ("m", rand(4)), ("v", np.abs(rand(4)) + 0.1)],
    )
    module = to_torch(model)
    assert sorted(module.trainable) == ["b", "s"]


def test_unsupported_ops_are_all_listed() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="fine"),
            helper.make_node("TopK", ["a", "k"], ["v", "i"], axis=-1, name="first_bad"),
            helper.make_node("Resize", ["v", "", "sc"], ["r"], mode="cubic", name="second_bad"),
            helper.make_node("MyOp", ["r"], ["y"], domain="com.example", name="third_bad"),
        ],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_empty_tensor_value_info("y")],
        [
            numpy_helper.from_array(np.array([2], np.int64), "k"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc"),
        ],
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedOpError) as info:
        to_torch(ir.from_proto(proto))
    message = str(info.value)
    for name in ("first_bad", "second_bad", "third_bad"):
        assert name in message
    assert "fine" not in message.split("Supported ops")[0]
    assert info.value.ops == [
        ("TopK", "first_bad"),
        ("Resize", "second_bad"),
        ("MyOp", "third_bad"),
    ]
    assert "cubic" in message and "Conv" in message


def test_supported_ops_cover_the_kit_cnns() -> None:
    needed = {
        "Conv", "ConvTranspose", "BatchNormalization", "Relu", "Clip", "Sigmoid", "HardSigmoid",
        "HardSwish", "LeakyRelu", "PRelu", "Tanh", "Softmax", "Add", "Sub", "Mul", "Div",
        "MatMul", "Gemm", "Flatten", "Reshape", "Transpose", "Concat", "Split", "Slice",
        "Squeeze", "Unsqueeze", "GlobalAveragePool", "AveragePool", "MaxPool", "Pad", "Resize",
        "Identity", "Dropout", "Shape", "Gather", "Cast", "Constant", "ConstantOfShape",
        "ReduceMean",
    }  # fmt: skip
    assert needed <= set(supported_ops())


def test_importing_distill_does_not_import_torch() -> None:
    code = "import sys, ferry.optimizer.distill; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
