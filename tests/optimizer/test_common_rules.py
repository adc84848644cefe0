"""The rules of ``optimizer/rules/common``: each one's match (numerics in ONNX Runtime before and
after), and its refusals, each with the reason it gives."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.common import (
    _chains,
    _conv,
    _gemm,
    _noop,
    _pad,
    _reshape,
    _shapes,
)
from optimizer.check import ops, rewritten

RNG = np.random.default_rng(0)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, Sequence[int | str]]],
    outputs: Sequence[tuple[str, Sequence[int | str] | None]],
    weights: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (weights or {}).items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def unchanged(proto: onnx.ModelProto, module: object) -> None:
    """The module's rules leave ``proto`` as it is."""
    from ferry.optimizer._rewrite import apply_rules

    m = ir.from_proto(proto)
    before = ops(m)
    apply_rules(m, module, RuleContext())  # type: ignore[arg-type]
    assert ops(m) == before


def reasons(proto: onnx.ModelProto, rule: object) -> list[str]:
    """Why ``rule`` (an onnxscript RewriteRule) refuses each place it could match."""
    from onnxscript.rewriter import MatchingTracer, MatchStatus

    m = ir.from_proto(proto)
    tracer = MatchingTracer()
    rule.apply_to_model(m, tracer=tracer)  # type: ignore[attr-defined]
    found = []
    for infos in tracer.best_matches_map.values():
        for info in infos:
            if info.status == MatchStatus.CONDITION_FAILED:
                found.append(info.match_result.reason)
    return found


# -- Conv + per-channel affine -------------------------------------------------------------------


# c - Conv and c / Conv are not affine in the Conv's weights: only Add and Mul commute.
@pytest.mark.parametrize(
    ("op", "swapped"),
    [("Add", False), ("Add", True), ("Sub", False), ("Mul", False), ("Mul", True), ("Div", False)],
)
def test_conv_channel_affine_folds(op: str, swapped: bool) -> None:
    args = ["c", "y"] if swapped else ["y", "c"]
    proto = model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
            helper.make_node(op, args, ["z"]),
        ],
        [("x", ["N", 3, 8, 8])],
        [("z", ["N", 4, 8, 8])],
        {
            "w": floats(4, 3, 3, 3),
            "b": floats(4),
            "c": RNG.uniform(0.5, 2, (4, 1, 1)).astype(np.float32),
        },
    )
    result = rewritten(proto, {"x": floats(2, 3, 8, 8)}, _conv)
    assert ops(result) == {"Conv": 1}


def test_conv_chain_and_constant_node_weights_fold() -> None:
    """A decomposed BatchNorm (Sub, Mul, Add) after a bias-less Conv whose weight is a Constant
    node (Paddle's habit) becomes one Conv with a bias."""
    w = numpy_helper.from_array(floats(4, 3, 1, 1), "wv")
    proto = model(
        [
            helper.make_node("Constant", [], ["w"], value=w),
            helper.make_node("Conv", ["x", "w"], ["y"]),
            helper.make_node("Sub", ["y", "mean"], ["a"]),
            helper.make_node("Mul", ["a", "scale"], ["b"]),
            helper.make_node("Add", ["b", "shift"], ["z"]),
        ],
        [("x", [1, 3, 5, 5])],
        [("z", [1, 4, 5, 5])],
        {"mean": floats(1, 4, 1, 1), "scale": floats(4, 1, 1), "shift": floats(4, 1, 1)},
    )
    result = rewritten(proto, {"x": floats(1, 3, 5, 5)}, _conv)
    assert ops(result) == {"Conv": 1, "Constant": 1} or ops(result) == {"Conv": 1}


def test_conv_affine_refuses_spatial_operand_and_shared_output() -> None:
    spatial = model(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "c"], ["z"])],
        [("x", [1, 3, 4, 4])],
        [("z", [1, 4, 4, 4])],
        {"w": floats(4, 3, 1, 1), "c": floats(1, 1, 4, 4)},
    )
    unchanged(spatial, _conv)
    assert any(
        "varies along more than the channel axis" in r
        for r in reasons(spatial, _conv.ConvAdd.rule())
    )
    shared = model(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "c"], ["z"])],
        [("x", [1, 3, 4, 4])],
        [("z", [1, 4, 4, 4]), ("y", [1, 4, 4, 4])],
        {"w": floats(4, 3, 1, 1), "c": floats(4, 1, 1)},
    )
    unchanged(shared, _conv)  # the Conv's output is read elsewhere: the matcher refuses it


def test_conv_div_refuses_zero_divisor() -> None:
    proto = model(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Div", ["y", "c"], ["z"])],
        [("x", [1, 3, 4, 4])],
        [("z", [1, 2, 4, 4])],
        {"w": floats(2, 3, 1, 1), "c": np.array([[[1.0]], [[0.0]]], np.float32)},
    )
    unchanged(proto, _conv)


# -- reshape chains ------------------------------------------------------------------------------


def test_reshape_unsqueeze_reshape_squeeze_collapse() -> None:
    """tf2onnx's conv1d: Reshape -> Unsqueeze -> Reshape, and Reshape -> Squeeze after."""
    proto = model(
        [
            helper.make_node("Reshape", ["x", "s1"], ["a"]),
            helper.make_node("Unsqueeze", ["a", "ax"], ["b"]),
            helper.make_node("Reshape", ["b", "s2"], ["c"]),
            helper.make_node("Relu", ["c"], ["d"]),
            helper.make_node("Reshape", ["d", "s3"], ["e"]),
            helper.make_node("Squeeze", ["e", "ax2"], ["z"]),
        ],
        [("x", ["N", 12, 1])],
        [("z", ["N", 12])],
        {
            "s1": i64(-1, 12, 1),
            "ax": i64(-3),
            "s2": i64(-1, 1, 1, 12),
            "s3": i64(-1, 1, 12),
            "ax2": i64(1),
        },
    )
    result = rewritten(proto, {"x": floats(3, 12, 1)}, _reshape)
    assert ops(result) == {"Reshape": 2, "Relu": 1}


def test_reshape_chain_refuses_copying_target() -> None:
    """A 0 in the outer target copies the inner result's dim: skipping the inner one moves it."""
    proto = model(
        [
            helper.make_node("Reshape", ["x", "s1"], ["a"]),
            helper.make_node("Reshape", ["a", "s2"], ["z"]),
        ],
        [("x", [2, 3, 4])],
        [("z", [6, 4])],
        {"s1": i64(6, 4), "s2": i64(0, -1)},
    )
    assert any(
        "copies input dims" in r
        for r in reasons(proto, _reshape.ReshapeOfReshapeLike.rule("Reshape"))
    )


def test_reduce_then_restore_keeps_dims() -> None:
    proto = model(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], axes=[1, 2], keepdims=0),
            helper.make_node("Reshape", ["m", "s"], ["r"]),
            helper.make_node("Div", ["x", "r"], ["z"]),
        ],
        [("x", ["N", 5, 7])],
        [("z", ["N", 5, 7])],
        {"s": i64(0, 1, 1)},
    )
    result = rewritten(proto, {"x": floats(2, 5, 7)}, _reshape)
    assert ops(result) == {"ReduceMax": 1, "Div": 1}


def test_reduce_then_other_shape_is_kept() -> None:
    proto = model(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], axes=[2], keepdims=0),
            helper.make_node("Reshape", ["m", "s"], ["z"]),
        ],
        [("x", [2, 5, 7])],
        [("z", [10, 1])],
        {"s": i64(10, 1)},
    )
    unchanged(proto, _reshape)


# -- Pad into pools ------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["AveragePool", "MaxPool"])
def test_pad_folds_into_pool(pool: str) -> None:
    proto = model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Pad", ["r", "p"], ["a"]),
            helper.make_node(pool, ["a"], ["z"], kernel_shape=[3, 3], strides=[2, 2]),
        ],
        [("x", ["N", 3, 9, 9])],
        [("z", ["N", 3, 5, 5])],
        {"p": i64(0, 0, 1, 1, 0, 0, 1, 1)},
    )
    result = rewritten(proto, {"x": floats(2, 3, 9, 9)}, _pad)
    assert ops(result) == {"Relu": 1, pool: 1}


def test_pad_into_maxpool_refuses_negative_input_and_ceil_mode() -> None:
    negative = model(
        [
            helper.make_node("Pad", ["x", "p"], ["a"]),
            helper.make_node("MaxPool", ["a"], ["z"], kernel_shape=[3, 3]),
        ],
        [("x", [1, 3, 6, 6])],
        [("z", [1, 3, 6, 6])],
        {"p": i64(0, 0, 1, 1, 0, 0, 1, 1)},
    )
    unchanged(negative, _pad)
    assert any(
        "could win the max" in r for r in reasons(negative, _pad.PadIntoPool.rule("MaxPool"))
    )
    ceil = model(
        [
            helper.make_node("Pad", ["x", "p"], ["a"]),
            helper.make_node(
                "AveragePool", ["a"], ["z"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1
            ),
        ],
        [("x", [1, 3, 5, 5])],
        [("z", [1, 3, 4, 4])],
        {"p": i64(0, 0, 1, 1, 0, 0, 1, 1)},
    )
    unchanged(ceil, _pad)


# -- chains --------------------------------------------------------------------------------------


def test_nested_concats_flatten() -> None:
    proto = model(
        [
            helper.make_node("Concat", ["a", "b"], ["ab"], axis=2),
            helper.make_node("Concat", ["c", "ab"], ["abc"], axis=2),
            helper.make_node("Concat", ["abc", "a"], ["z"], axis=2),
        ],
        [("a", ["N", 2, 3]), ("b", ["N", 2, 4]), ("c", ["N", 2, 5])],
        [("z", ["N", 2, 15])],
    )
    feeds = {"a": floats(2, 2, 3), "b": floats(2, 2, 4), "c": floats(2, 2, 5)}
    result = rewritten(proto, feeds, _chains)
    assert ops(result) == {"Concat": 1}
    assert result.graph.outputs[0].name == "z"


def test_concat_on_another_axis_stays() -> None:
    proto = model(
        [
            helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
            helper.make_node("Concat", ["ab", "ab"], ["z"], axis=2),
        ],
        [("a", [1, 2, 3]), ("b", [1, 2, 3])],
        [("z", [1, 4, 6])],
    )
    unchanged(proto, _chains)


def test_slices_on_disjoint_axes_merge() -> None:
    """PyTorch's x[:, :, ::2, 1::2] is a Slice per axis; the two read one window."""
    proto = model(
        [
            helper.make_node("Slice", ["x", "s0", "e", "a2", "st"], ["h"]),
            helper.make_node("Slice", ["h", "s1", "e", "a3", "st"], ["z"]),
        ],
        [("x", [1, 3, 8, 8])],
        [("z", [1, 3, 4, 4])],
        {"s0": i64(0), "s1": i64(1), "e": i64(2**63 - 1), "a2": i64(2), "a3": i64(3), "st": i64(2)},
    )
    result = rewritten(proto, {"x": floats(1, 3, 8, 8)}, _chains)
    assert ops(result) == {"Slice": 1}


def test_slices_on_one_axis_stay() -> None:
    proto = model(
        [
            helper.make_node("Slice", ["x", "s0", "e", "a"], ["h"]),
            helper.make_node("Slice", ["h", "s0", "e", "a"], ["z"]),
        ],
        [("x", [8, 3])],
        [("z", [4, 3])],
        {"s0": i64(1), "e": i64(7), "a": i64(0)},
    )
    assert any("share an axis" in r for r in reasons(proto, _chains.SliceOfSlice.rule()))


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_constant_chains_merge(op: str) -> None:
    proto = model(
        [helper.make_node(op, ["x", "c1"], ["a"]), helper.make_node(op, ["c2", "a"], ["z"])],
        [("x", ["N", 4])],
        [("z", ["N", 4])],
        {"c1": floats(4), "c2": floats(1, 4)},
    )
    result = rewritten(proto, {"x": floats(3, 4)}, _chains)
    assert ops(result) == {op: 1}


def test_constant_chain_that_broadcasts_the_input_stays() -> None:
    proto = model(
        [helper.make_node("Mul", ["x", "c1"], ["a"]), helper.make_node("Mul", ["a", "c2"], ["z"])],
        [("x", [4])],
        [("z", [2, 3, 4])],
        {"c1": floats(2, 1, 4), "c2": floats(3, 1)},
    )
    assert any(
        "higher rank" in r for r in reasons(proto, _chains.ConstantChain.rule("Mul", True, True))
    )


# -- exact no-ops --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "value", "first"),
    [
        ("Add", 0.0, False),
        ("Add", 0.0, True),
        ("Sub", 0.0, False),
        ("Mul", 1.0, True),
        ("Div", 1.0, False),
    ],
)
def test_exact_noops_go(op: str, value: float, first: bool) -> None:
    args = ["c", "x"] if first else ["x", "c"]
    proto = model(
        [helper.make_node(op, args, ["a"]), helper.make_node("Relu", ["a"], ["z"])],
        [("x", [2, 3])],
        [("z", [2, 3])],
        {"c": np.full(1, value, np.float32)},
    )
    result = rewritten(proto, {"x": floats(2, 3)}, _noop)
    assert ops(result) == {"Identity": 1, "Relu": 1}


def test_epsilon_stays() -> None:
    """``Log(x*x + 1e-10)`` must keep its epsilon (onnxscript's tolerant x+0 rule drops it:
    the kit's pitch model then answers NaN on a silent frame)."""
    proto = model(
        [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("Add", ["sq", "eps"], ["c"]),
            helper.make_node("Log", ["c"], ["z"]),
        ],
        [("x", [2, 3])],
        [("z", [2, 3])],
        {"eps": np.full(1, 1e-10, np.float32)},
    )
    unchanged(proto, _noop)
    assert any("not exactly 0" in r for r in reasons(proto, _noop.NoOpArithmetic.rule("Add")))


def test_noop_that_broadcasts_is_kept() -> None:
    proto = model(
        [helper.make_node("Add", ["x", "zero"], ["z"])],
        [("x", [3])],
        [("z", [1, 3])],
        {"zero": np.zeros((1, 1), np.float32)},
    )
    unchanged(proto, _noop)


# -- static shapes -------------------------------------------------------------------------------


def torch_view(batch_dim: str | int = "N") -> onnx.ModelProto:
    """``x.view(x.size(0), x.size(1), -1)`` as PyTorch's tracer writes it."""
    return model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
            helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
            helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
            helper.make_node("Unsqueeze", ["d1", "ax"], ["u1"]),
            helper.make_node("Concat", ["u0", "u1", "minus1"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["z"]),
        ],
        [("x", [batch_dim, "S", 4, 4])],
        [("z", [batch_dim, "S", 16])],
        {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "ax": i64(0), "minus1": i64(-1)},
    )


def test_runtime_reshape_target_becomes_constant() -> None:
    result = rewritten(torch_view(), {"x": floats(2, 5, 4, 4)}, _shapes)
    assert ops(result) == {"Reshape": 1}


def test_shape_of_static_dims_folds() -> None:
    """Shape -> Gather of a dim that is fixed although others are symbolic."""
    proto = model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
            helper.make_node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "f"], ["z"]),
        ],
        [("x", ["N", 3, 7])],
        [("z", ["N", 3, 7])],
        {"i": np.array(2, np.int64)},
    )
    result = rewritten(proto, {"x": floats(2, 3, 7)}, _shapes)
    assert "Shape" not in ops(result) or ops(result)["Gather"] == 0


def test_unit_dim_transpose_is_a_reshape() -> None:
    proto = model(
        [helper.make_node("Transpose", ["x"], ["z"], perm=[0, 2, 1, 3])],
        [("x", ["N", 2, 1, 5])],
        [("z", ["N", 1, 2, 5])],
    )
    result = rewritten(proto, {"x": floats(3, 2, 1, 5)}, _shapes)
    assert ops(result) == {"Reshape": 1}
    assert result.graph.outputs[0].name == "z"


def test_declared_output_shape_is_not_trusted() -> None:
    """An old PyTorch export declares its output [1, seqlen]; the tensor is [T, 1, C]. A target
    made from the declaration would reshape to the wrong shape."""
    proto = model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
            helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
            helper.make_node("Concat", ["u0", "one", "minus1"], ["target"], axis=0),
            helper.make_node("Reshape", ["y", "target"], ["z"]),
        ],
        [("x", ["T", 8]), ("y", ["T", 8])],
        [("z", [1, "seqlen"])],
        {"i0": np.array(0, np.int64), "ax": i64(0), "one": i64(1), "minus1": i64(-1)},
    )
    m = ir.from_proto(proto)
    _shapes.StaticShapesPass()(m)
    from optimizer.check import run_ort

    feeds = {"x": floats(5, 8), "y": floats(5, 8)}
    (got,) = run_ort(m, feeds)
    assert got.shape == (5, 1, 8)


# -- MatMul + Add -> Gemm ------------------------------------------------------------------------


@pytest.mark.parametrize(("swapped", "transposed"), [(False, False), (True, False), (False, True)])
def test_matmul_add_becomes_gemm(swapped: bool, transposed: bool) -> None:
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])] if transposed else []
    nodes += [
        helper.make_node("MatMul", ["x", "wt" if transposed else "w"], ["y"]),
        helper.make_node("Add", ["c", "y"] if swapped else ["y", "c"], ["z"]),
    ]
    weight = floats(3, 4) if transposed else floats(4, 3)
    proto = model(nodes, [("x", ["M", 4])], [("z", ["M", 3])], {"w": weight, "c": floats(3)})
    result = rewritten(proto, {"x": floats(5, 4)}, _gemm)
    assert ops(result) == {"Gemm": 1}


def test_bias_that_broadcasts_the_product_up_stays() -> None:
    """Add broadcasts both ways, Gemm only C to [M, N]: a [2, 1, 3] bias makes Add's result 3-D."""
    proto = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "c"], ["z"])],
        [("x", [1, 4])],
        [("z", [2, 1, 3])],
        {"w": floats(4, 3), "c": floats(2, 1, 3)},
    )
    unchanged(proto, _gemm)
    assert any("rank 3" in r for r in reasons(proto, _gemm.MatMulAddToGemm.rule()))
