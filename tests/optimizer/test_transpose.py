"""Transpose sinking and cancelling (``rules/common/_transpose.py``): each rewrite on a small model,
checked in ONNX Runtime before and after, and the Transposes counted."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.optimizer.check import ops, rewritten, run_ort

from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.common import _transpose

NHWC = (0, 2, 3, 1)
NCHW = (0, 3, 1, 2)
RNG = np.random.default_rng(0)


def _info(
    name: str, shape: Sequence[int | str] | None, dtype: int = TensorProto.FLOAT
) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: Sequence[str | onnx.ValueInfoProto],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model with shapes inferred, as the pipeline's earlier passes leave it."""
    outs = [_info(o, None) if isinstance(o, str) else o for o in outputs]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        outs,
        initializer=[numpy_helper.from_array(a, n) for n, a in (inits or {}).items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset < 21 else 10
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    # A value whose rank inference could not tell is left without a value_info entry.
    known = [v for v in model.graph.value_info if v.type.tensor_type.HasField("shape")]
    del model.graph.value_info[:]
    model.graph.value_info.extend(known)
    return model


def _t(x: str, y: str, perm: Sequence[int]) -> onnx.NodeProto:
    return helper.make_node("Transpose", [x], [y], perm=list(perm))


def _x(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def _count(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if n.op_type == "Transpose")


def _sink(
    proto: onnx.ModelProto, feeds: dict[str, np.ndarray], *, before: int | None = None
) -> ir.Model:
    """Run the module through the harness; check the Transposes never grew."""
    start = _count(proto) if before is None else before
    model = rewritten(proto, feeds, _transpose)
    assert ops(model)["Transpose"] <= start
    return model


def _producer_of_output(model: ir.Model, index: int = 0) -> ir.Node:
    node = model.graph.outputs[index].producer()
    assert node is not None
    return node


# ---------------------------------------------------------------- the module's interface


def test_module_offers_the_pass_at_every_level() -> None:
    for level in ("basic", "extended"):
        (only,) = _transpose.passes(RuleContext(level=level))
        assert isinstance(only, _transpose.SinkTransposesPass)
        assert isinstance(only, ir.passes.InPlacePass)


# ---------------------------------------------------------------- 1. Transpose pairs


def test_inverse_pair_cancels() -> None:
    proto = _model(
        [_t("x", "a", NHWC), _t("a", "b", NCHW), helper.make_node("Relu", ["b"], ["y"])],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_pair_merges_into_one_transpose() -> None:
    proto = _model(
        [_t("x", "a", NHWC), _t("a", "y", (0, 2, 1, 3))],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 1
    node = _producer_of_output(model)
    assert node.op_type == "Transpose"
    # Transpose(Transpose(x, (0,2,3,1)), (0,2,1,3)) == Transpose(x, (0,3,2,1))
    assert tuple(node.attributes["perm"].as_ints()) == (0, 3, 2, 1)


def test_pair_cancels_when_the_first_transpose_has_other_users() -> None:
    # Tp feeds its inverse and a Relu: the inverse goes, Tp stays for the Relu.
    proto = _model(
        [
            _t("x", "a", NHWC),
            _t("a", "b", NCHW),
            helper.make_node("Sigmoid", ["b"], ["y1"]),
            helper.make_node("MatMul", ["a", "w"], ["y2"]),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y1", "y2"],
        {"w": _x(3, 2)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 1
    sigmoid = next(n for n in model.graph if n.op_type == "Sigmoid")
    assert sigmoid.inputs[0] is model.graph.inputs[0]


def test_pair_feeding_a_graph_output_from_a_graph_input_keeps_the_name() -> None:
    proto = _model(
        [_t("x", "a", NHWC), _t("a", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    assert [o.name for o in model.graph.outputs] == ["y"]
    assert _producer_of_output(model).op_type == "Identity"


def test_identity_transpose_is_removed() -> None:
    proto = _model(
        [helper.make_node("Relu", ["x"], ["r"]), _t("r", "y", (0, 1, 2))],
        [_info("x", [2, 3, 4])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4)})
    assert ops(model)["Transpose"] == 0
    assert model.graph.outputs[0].name == "y"
    assert _producer_of_output(model).op_type == "Relu"


def test_duplicate_transposes_of_one_value_are_merged() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            _t("x", "b", NHWC),
            helper.make_node("MatMul", ["a", "w"], ["y1"]),
            helper.make_node("MatMul", ["b", "w"], ["y2"]),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y1", "y2"],
        {"w": _x(3, 2)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 1


# ---------------------------------------------------------------- 2. elementwise ops

UNARY: list[tuple[str, dict[str, object], int]] = [
    ("Relu", {}, 17),
    ("LeakyRelu", {"alpha": 0.2}, 17),
    ("Sigmoid", {}, 17),
    ("Tanh", {}, 17),
    ("Neg", {}, 17),
    ("Abs", {}, 17),
    ("Exp", {}, 17),
    ("Log", {}, 17),
    ("Sqrt", {}, 17),
    ("Erf", {}, 17),
    ("HardSigmoid", {"alpha": 0.3}, 17),
    ("HardSwish", {}, 17),
    ("Elu", {"alpha": 0.5}, 17),
    ("Selu", {}, 17),
    ("Softplus", {}, 17),
    ("Reciprocal", {}, 17),
    ("Identity", {}, 17),
    ("Gelu", {}, 20),
]


@pytest.mark.parametrize(("op", "attrs", "opset"), UNARY, ids=[u[0] for u in UNARY])
def test_unary_op_between_inverse_transposes(op: str, attrs: dict[str, object], opset: int) -> None:
    # Before: x -> T(0,2,3,1) -> op -> T(0,3,1,2) -> y; after: x -> op -> y.
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node(op, ["a"], ["b"], **attrs), _t("b", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        opset=opset,
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5, low=0.5, high=2.0)})
    assert ops(model)["Transpose"] == 0
    assert ops(model)[op] == 1
    assert model.graph.outputs[0].name == "y"


def test_cast_and_clip_with_constant_bounds() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Clip", ["a", "lo", "hi"], ["b"]),
            helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["c"], ["d"], to=TensorProto.FLOAT),
            _t("d", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_prelu_with_constant_slope_is_permuted() -> None:
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("PRelu", ["a", "slope"], ["b"]), _t("b", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"slope": np.array([0.1, 0.2, 0.3], np.float32)},  # per channel, NHWC's last axis
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    prelu = next(n for n in model.graph if n.op_type == "PRelu")
    slope = prelu.inputs[1]
    assert slope is not None and slope.const_value is not None
    assert slope.const_value.numpy().shape == (1, 3, 1, 1)


BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize(
    "const_shape", [(3,), (1, 1, 1, 3), (), (5, 3), (1, 4, 5, 3)], ids=lambda s: str(list(s))
)
def test_binary_op_with_constant_is_permuted(op: str, const_shape: tuple[int, ...]) -> None:
    # E(T_p(x), c) -> T_p(E(x, T_p^-1(c))): c unsqueezed to rank 4 (numpy broadcasting), permuted.
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node(op, ["a", "c"], ["b"]), _t("b", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"c": _x(*const_shape, low=0.5, high=1.5)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5, low=0.5, high=2.0)})
    assert ops(model)["Transpose"] == 0
    assert model.graph.outputs[0].name == "y"


def test_constant_on_the_left_and_comparison_then_where() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Sub", ["c", "a"], ["b"]),
            helper.make_node("Greater", ["b", "zero"], ["m"]),
            helper.make_node("Where", ["m", "b", "c"], ["w"]),
            _t("w", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"c": _x(5, 3), "zero": np.array(0.0, np.float32)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_two_transposed_inputs_merge() -> None:
    # E(T_p(x), T_p(z)) -> T_p(E(x, z)): three Transposes, none left.
    proto = _model(
        [
            _t("x", "a", NHWC),
            _t("z", "b", NHWC),
            helper.make_node("Add", ["a", "b"], ["c"]),
            _t("c", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5]), _info("z", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5), "z": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_residual_branches_meet_and_cancel() -> None:
    # open_nsfw's residual block: two NHWC branches with constants, added, Relu, back to NCHW.
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Add", ["a", "c1"], ["a1"]),
            helper.make_node("Mul", ["a1", "c2"], ["a2"]),
            _t("z", "b", NHWC),
            helper.make_node("Sub", ["b", "c3"], ["b1"]),
            helper.make_node("Add", ["a2", "b1"], ["s"]),
            helper.make_node("Relu", ["s"], ["r"]),
            _t("r", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5]), _info("z", ["N", 3, 4, 5])],
        ["y"],
        {"c1": _x(3), "c2": _x(1, 1, 1, 3), "c3": _x(3)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5), "z": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    # The per-channel constants now sit in NCHW, right behind where a Conv would be.
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert mul.inputs[1] is not None and mul.inputs[1].shape == ir.Shape([1, 3, 1, 1])


def test_constant_node_operand_is_permuted_and_dropped() -> None:
    # Paddle exports keep constants as Constant nodes.
    const = helper.make_node(
        "Constant", [], ["c"], value=numpy_helper.from_array(_x(1, 1, 1, 3), "c")
    )
    proto = _model(
        [const, _t("x", "a", NHWC), helper.make_node("Mul", ["a", "c"], ["b"]), _t("b", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    assert ops(model)["Constant"] == 0  # unused once the permuted copy replaced it


def test_shared_initializer_is_copied_not_modified() -> None:
    c = _x(1, 1, 1, 3)
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Mul", ["a", "c"], ["b"]),
            _t("b", "y", NCHW),
            helper.make_node("Add", ["z", "c"], ["y2"]),  # another user, in NHWC
        ],
        [_info("x", ["N", 3, 4, 5]), _info("z", ["N", 4, 5, 3])],
        ["y", "y2"],
        {"c": c},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5), "z": _x(2, 4, 5, 3)})
    assert ops(model)["Transpose"] == 0
    original = model.graph.initializers["c"]
    assert original.const_value is not None
    np.testing.assert_array_equal(original.const_value.numpy(), c)
    assert len(model.graph.initializers) == 2


def test_quantize_dequantize_per_tensor_and_per_axis() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("QuantizeLinear", ["a", "s", "zp"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"]),
            helper.make_node("QuantizeLinear", ["d", "sc", "zpc"], ["q2"], axis=3),
            helper.make_node("DequantizeLinear", ["q2", "sc", "zpc"], ["d2"], axis=-1),
            _t("d2", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {
            "s": np.array(0.01, np.float32),
            "zp": np.array(3, np.uint8),
            "sc": np.array([0.01, 0.02, 0.03], np.float32),
            "zpc": np.array([1, 2, 3], np.uint8),
        },
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5, low=0.0, high=1.0)})
    assert ops(model)["Transpose"] == 0
    axes = [n.attributes.get_int("axis") for n in model.graph if n.op_type.endswith("Linear")]
    assert axes == [None, None, 1, 1]


# ---------------------------------------------------------------- 3. ops with axes


def test_concat_axis_is_remapped_and_constants_permuted() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            _t("z", "b", NHWC),
            helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=-1),
            _t("cat", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5]), _info("z", ["N", 2, 4, 5])],
        ["y"],
        {"c": _x(2, 4, 5, 1)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5), "z": _x(2, 2, 4, 5)})
    assert ops(model)["Transpose"] == 0
    concat = next(n for n in model.graph if n.op_type == "Concat")
    assert concat.attributes.get_int("axis") == 1


def test_split_outputs_each_cancel() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Split", ["a", "sizes"], ["p", "q"], axis=3),
            _t("p", "y1", NCHW),
            _t("q", "y2", NCHW),
        ],
        [_info("x", ["N", 4, 4, 5])],
        ["y1", "y2"],
        {"sizes": np.array([1, 3], np.int64)},
    )
    model = _sink(proto, {"x": _x(2, 4, 4, 5)})
    assert ops(model)["Transpose"] == 0
    assert [o.name for o in model.graph.outputs] == ["y1", "y2"]


@pytest.mark.parametrize("with_axes", [True, False])
def test_slice_axes_are_remapped(with_axes: bool) -> None:
    inputs = ["a", "starts", "ends"] + (["axes"] if with_axes else [])
    inits = {"starts": np.array([1], np.int64), "ends": np.array([3], np.int64)}
    if with_axes:
        inits["axes"] = np.array([-1], np.int64)
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Slice", inputs, ["s"]), _t("s", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        inits,
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_pad_pads_are_remapped() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Pad", ["a", "pads", "v"], ["p"], mode="constant"),
            _t("p", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"pads": np.array([0, 1, 2, 0, 0, 3, 4, 1], np.int64), "v": np.array(0.5, np.float32)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_reduce_keepdims_remaps_axes() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("ReduceMean", ["a"], ["m"], axes=[1, 2], keepdims=1),
            helper.make_node("Sub", ["a", "m"], ["s"]),
            _t("s", "y", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    mean = next(n for n in model.graph if n.op_type == "ReduceMean")
    assert sorted(mean.attributes["axes"].as_ints()) == [2, 3]


def test_global_pool_without_keepdims_needs_no_transpose() -> None:
    # open_nsfw's head: NHWC ReduceMean over H, W -> [N, C], the same numbers in either layout.
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("ReduceSum", ["r", "axes"], ["m"], keepdims=0),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["m"],
        {"axes": np.array([1, 2], np.int64)},
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    assert model.graph.outputs[0].name == "m"


def test_softmax_axis_is_remapped() -> None:
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Softmax", ["a"], ["s"]), _t("s", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    assert softmax.attributes.get_int("axis") == 1


def test_unsqueeze_places_the_new_axis_so_the_next_transpose_cancels() -> None:
    # pitch_tflite's conv1d: [N,1,L] -> T(0,2,1) -> Unsqueeze(1) -> T(0,3,1,2) -> [N,1,1,L].
    proto = _model(
        [
            _t("x", "a", (0, 2, 1)),
            helper.make_node("Unsqueeze", ["a", "one"], ["u"]),
            _t("u", "y", NCHW),
        ],
        [_info("x", ["N", 1, 7])],
        ["y"],
        {"one": np.array([1], np.int64)},
    )
    model = _sink(proto, {"x": _x(2, 1, 7)})
    assert ops(model)["Transpose"] == 0


def test_squeezing_reshape_between_transposes_cancels() -> None:
    # pitch_tflite after each Conv: [N,C,1,L] -> T(0,2,3,1) -> Reshape [N,L,C] -> T(0,2,1).
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Reshape", ["a", "shape"], ["r"]),
            _t("r", "y", (0, 2, 1)),
        ],
        [_info("x", ["N", 6, 1, 7])],
        ["y"],
        {"shape": np.array([-1, 7, 6], np.int64)},
    )
    model = _sink(proto, {"x": _x(2, 6, 1, 7)})
    assert ops(model)["Transpose"] == 0


def test_squeeze_moves_the_pending_permutation() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Squeeze", ["a", "axes"], ["s"]),
            helper.make_node("Relu", ["s"], ["r"]),
            _t("r", "y", (0, 2, 1)),
        ],
        [_info("x", ["N", 6, 1, 7])],
        ["y"],
        {"axes": np.array([1], np.int64)},
    )
    model = _sink(proto, {"x": _x(2, 6, 1, 7)})
    assert ops(model)["Transpose"] == 0


def test_leftover_transpose_of_size_one_dims_becomes_a_reshape() -> None:
    proto = _model(
        [helper.make_node("Relu", ["x"], ["r"]), _t("r", "y", NHWC)],
        [_info("x", ["N", 64, 1, 1])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 64, 1, 1)})
    assert ops(model)["Transpose"] == 0
    assert _producer_of_output(model).op_type == "Reshape"
    assert model.graph.outputs[0].name == "y"


# ---------------------------------------------------------------- what must not change


def _unchanged(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> ir.Model:
    model = rewritten(proto, feeds, _transpose)
    assert ops(model) == ops(ir.from_proto(proto))
    return model


def test_no_sink_when_nothing_cancels() -> None:
    # Moving the Transpose below the Relu gains nothing: leave it where it is.
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("MatMul", ["r", "w"], ["y"]),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
        {"w": _x(3, 2)},
    )
    model = _unchanged(proto, {"x": _x(2, 3, 4, 5)})
    relu = next(n for n in model.graph if n.op_type == "Relu")
    producer = relu.inputs[0].producer() if relu.inputs[0] is not None else None
    assert producer is not None and producer.op_type == "Transpose"


def test_no_sink_into_a_graph_output() -> None:
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Relu", ["a"], ["y"])],
        [_info("x", ["N", 3, 4, 5])],
        ["y"],
    )
    model = _unchanged(proto, {"x": _x(2, 3, 4, 5)})
    assert _producer_of_output(model).op_type == "Relu"


def test_other_input_with_a_different_permutation_is_not_merged() -> None:
    # Add(T_p(x), T_q(z)): the perms differ and nothing downstream cancels either.
    proto = _model(
        [
            _t("x", "a", NHWC),
            _t("z", "b", (0, 1, 3, 2)),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        [_info("x", ["N", 3, 4, 4]), _info("z", ["N", 4, 3, 4])],
        ["y"],
    )
    _unchanged(proto, {"x": _x(2, 3, 4, 4), "z": _x(2, 4, 3, 4)})


def test_non_constant_operand_costs_a_transpose_so_one_pair_only_pays_once() -> None:
    # Add(T_p(x), z) -> T_p^-1: sinking removes two and adds one on z, never more than before.
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Add", ["a", "z"], ["s"]), _t("s", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5]), _info("z", ["N", 4, 5, 3])],
        ["y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5), "z": _x(2, 4, 5, 3)})
    assert ops(model)["Transpose"] == 1


def test_unknown_rank_stops_the_sink() -> None:
    # zr's rank is unknown (a Reshape to a runtime shape), and so is how it broadcasts.
    proto = _model(
        [
            helper.make_node("Reshape", ["z", "shape"], ["zr"]),
            _t("x", "a", NHWC),
            helper.make_node("Add", ["a", "zr"], ["s"]),
            _t("s", "y", NCHW),
        ],
        [
            _info("x", ["N", 3, 4, 5]),
            _info("z", ["M"]),
            _info("shape", ["K"], TensorProto.INT64),
        ],
        [_info("y", ["N", 3, 4, 5])],
    )
    model = ir.from_proto(proto)
    zr = next(n for n in model.graph if n.op_type == "Reshape").outputs[0]
    assert zr.shape is None
    shape = np.array([2, 4, 5, 3], np.int64)
    _unchanged(proto, {"x": _x(2, 3, 4, 5), "z": _x(120), "shape": shape})


def test_lower_rank_non_constant_operand_is_not_permuted() -> None:
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Mul", ["a", "z"], ["s"]), _t("s", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5]), _info("z", [3])],
        ["y"],
    )
    _unchanged(proto, {"x": _x(2, 3, 4, 5), "z": _x(3)})


def test_split_into_graph_outputs_is_not_worth_it() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Split", ["a", "sizes"], ["p", "q", "r"], axis=3),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["p", "q", "r"],
        {"sizes": np.array([1, 1, 1], np.int64)},
    )
    _unchanged(proto, {"x": _x(2, 3, 4, 5)})


# ---------------------------------------------------------------- names, consumers, subgraphs


def test_graph_output_of_a_rewritten_node_keeps_its_name() -> None:
    # The Relu's output is a graph output (NHWC) and also feeds the inverse Transpose.
    proto = _model(
        [_t("x", "a", NHWC), helper.make_node("Relu", ["a"], ["nhwc"]), _t("nhwc", "y", NCHW)],
        [_info("x", ["N", 3, 4, 5])],
        ["nhwc", "y"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert [o.name for o in model.graph.outputs] == ["nhwc", "y"]
    assert ops(model)["Transpose"] == 1
    assert _producer_of_output(model, 0).op_type == "Transpose"
    assert _producer_of_output(model, 1).op_type == "Relu"


def test_transpose_with_several_sinkable_consumers() -> None:
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("Sigmoid", ["a"], ["s"]),
            _t("r", "y1", NCHW),
            _t("s", "y2", NCHW),
        ],
        [_info("x", ["N", 3, 4, 5])],
        ["y1", "y2"],
    )
    model = _sink(proto, {"x": _x(2, 3, 4, 5)})
    assert ops(model)["Transpose"] == 0


def test_values_read_by_a_subgraph_keep_their_layout() -> None:
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["t_out"])], "then", [], [_info("t_out", None)]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["e_out"])], "else", [], [_info("e_out", None)]
    )
    proto = _model(
        [
            _t("x", "a", NHWC),
            helper.make_node("Relu", ["a"], ["r"]),
            _t("r", "y", NCHW),
            helper.make_node(
                "If", ["cond"], ["z"], then_branch=then_branch, else_branch=else_branch
            ),
        ],
        [_info("x", ["N", 3, 4, 5]), _info("cond", [], TensorProto.BOOL)],
        ["y", "z"],
    )
    for cond in (True, False):
        model = _sink(proto, {"x": _x(2, 3, 4, 5), "cond": np.array(cond)})
        assert ops(model)["Transpose"] == 1  # one, for the branches that read r in NHWC


def test_pairs_inside_a_subgraph_cancel() -> None:
    # The branch reads an outer initializer; its permuted copy becomes the branch's own.
    body = helper.make_graph(
        [
            _t("x", "a", NHWC),
            helper.make_node("Add", ["a", "c"], ["s"]),
            helper.make_node("Relu", ["s"], ["r"]),
            _t("r", "b_out", NCHW),
        ],
        "then",
        [],
        [_info("b_out", None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["o_out"])], "else", [], [_info("o_out", None)]
    )
    proto = _model(
        [helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)],
        [_info("x", ["N", 3, 4, 5]), _info("cond", [], TensorProto.BOOL)],
        ["y"],
        {"c": _x(3)},
    )
    for cond in (True, False):
        model = _sink(proto, {"x": _x(2, 3, 4, 5), "cond": np.array(cond)})
        assert ops(model)["Transpose"] == 0
        assert [o.name for o in model.graph.outputs] == ["y"]


def test_pass_reports_unmodified_model() -> None:
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", [2, 3])], ["y"])
    model = ir.from_proto(proto)
    assert not _transpose.SinkTransposesPass()(model).modified


# ---------------------------------------------------------------- real model

REAL = Path(__file__).resolve().parents[1] / "real"


@pytest.mark.real
def test_open_nsfw_transposes_cancel() -> None:
    """open_nsfw (PyTorch export of a TF-ported ResNet-50): 106 Transposes after onnxscript's
    optimizer, 53 NCHW<->NHWC pairs around each Conv's batch-norm constants and residual Adds."""
    import onnxscript.optimizer

    sys.path.insert(0, str(REAL))
    import kit_models

    if not kit_models.kit_ready():
        pytest.skip(
            f"the real-model kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh "
            "(or set FERRY_KIT to where it is)"
        )
    model = ir.load(kit_models.path("open_nsfw"))
    onnxscript.optimizer.optimize_ir(model)
    before = ir.serde.serialize_model(model)
    start = ops(model)["Transpose"]
    assert start >= 100

    assert _transpose.SinkTransposesPass()(model).modified
    assert ops(model)["Transpose"] <= 10
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)

    feeds = kit_models.feeds("open_nsfw")
    (want,) = run_ort(before, feeds)
    (got,) = run_ort(after, feeds)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- random graphs

_PERMS = [(0, 1, 2, 3), (0, 1, 3, 2), (0, 2, 1, 3), (0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 2, 1)]


def _random_graph(seed: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random DAG of Transposes and layout-agnostic ops on [N, 3|1, 3|1, 3|1] values (every
    pair broadcasts), with a few outputs."""
    rng = np.random.default_rng(seed)
    values = ["x0", "x1"]
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, np.ndarray] = {}
    for i in range(int(rng.integers(6, 16))):
        v = values[int(rng.integers(len(values)))]
        out = f"v{i}"
        kind = rng.choice(["transpose", "transpose", "unary", "binary", "reduce", "softmax"])
        if kind == "transpose":
            nodes.append(_t(v, out, _PERMS[int(rng.integers(len(_PERMS)))]))
        elif kind == "unary":
            nodes.append(helper.make_node(str(rng.choice(["Relu", "Neg", "Sigmoid"])), [v], [out]))
        elif kind == "binary":
            if rng.random() < 0.5:
                other = values[int(rng.integers(len(values)))]
            else:
                other = f"c{i}"
                shape = [(3,), (1, 3, 1, 1), (3, 3, 3), ()][int(rng.integers(4))]
                inits[other] = np.asarray(rng.uniform(-1, 1, shape), np.float32)
            nodes.append(
                helper.make_node(str(rng.choice(["Add", "Mul", "Max"])), [v, other], [out])
            )
        elif kind == "reduce":
            axes = sorted({int(a) for a in rng.integers(1, 4, 2)})
            nodes.append(helper.make_node("ReduceMax", [v], [out], axes=axes, keepdims=1))
        else:
            nodes.append(helper.make_node("Softmax", [v], [out], axis=int(rng.integers(1, 4))))
        values.append(out)
    chosen = {values[-1]} | {values[int(i)] for i in rng.integers(2, len(values), 2)}
    inputs = [_info("x0", ["N", 3, 3, 3]), _info("x1", ["N", 3, 3, 3])]
    proto = _model(nodes, inputs, sorted(chosen), inits)
    feeds = {"x0": _x(2, 3, 3, 3), "x1": _x(2, 3, 3, 3)}
    return proto, feeds


@pytest.mark.parametrize("seed", range(60))
def test_random_graphs_never_gain_transposes(seed: int) -> None:
    proto, feeds = _random_graph(seed)
    model = _sink(proto, feeds)
    assert [o.name for o in model.graph.outputs] == [o.name for o in proto.graph.output]
