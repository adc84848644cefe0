"""LayerNormalization from its decomposition: ``rules/common/_layer_norm.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter
from tests.optimizer.check import ops, rewritten
from tests.optimizer.test_activations import behind_relu, export, reasons

from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.common import _layer_norm

RNG = np.random.default_rng(0)
D = 16


def ctx(opset: int) -> RuleContext:
    return RuleContext(level="extended", opset=opset)


def layer_norm(
    opset: int = 18,
    *,
    axes: Sequence[int] = (-1,),
    square: str = "Pow",
    normalize: str = "Div",
    gamma: Any = "vector",
    beta: bool = True,
    eps_input: bool = False,
    x_shape: Sequence[int | str] = ("N", "S", D),
    dtype: Any = np.float32,
    extra_output: str | None = None,
) -> onnx.ModelProto:
    """The decomposition torch wrote below opset 17, in the variants other exporters write.

    ``gamma``: ``"vector"`` (a ``[D]`` initializer), ``"broadcast"`` (``[1, 1, D]``), a float
    (a scalar constant) or None (no ``Mul``).
    """
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.array(2.0, dtype), "two")]
    inputs = [helper.make_tensor_value_info("x", elem, list(x_shape))]
    if eps_input:
        inputs.append(helper.make_tensor_value_info("eps", elem, []))
    else:
        inits.append(numpy_helper.from_array(np.array(1e-5, dtype), "eps"))

    def mean(src: str, dst: str) -> list[onnx.NodeProto]:
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), f"{dst}_axes"))
            return [helper.make_node("ReduceMean", [src, f"{dst}_axes"], [dst])]
        return [helper.make_node("ReduceMean", [src], [dst], axes=list(axes))]

    nodes = mean("x", "mean")
    nodes.append(helper.make_node("Sub", ["x", "mean"], ["d"]))
    if square == "Pow":
        nodes.append(helper.make_node("Pow", ["d", "two"], ["d2"]))
    else:
        nodes.append(helper.make_node("Mul", ["d", "d"], ["d2"]))
    nodes += mean("d2", "var")
    nodes += [
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
    ]
    if normalize == "Div":
        nodes.append(helper.make_node("Div", ["d", "std"], ["n"]))
    else:
        nodes += [
            helper.make_node("Reciprocal", ["std"], ["inv"]),
            helper.make_node("Mul", ["inv", "d"], ["n"]),
        ]
    last = "n"
    if gamma is not None:
        if gamma == "vector":
            value = RNG.standard_normal(D).astype(dtype)
        elif gamma == "broadcast":
            value = RNG.standard_normal((1, 1, D)).astype(dtype)
        else:
            value = np.array(gamma, dtype)
        inits.append(numpy_helper.from_array(value, "gamma"))
        nodes.append(helper.make_node("Mul", ["gamma", last], ["scaled"]))
        last = "scaled"
    if beta:
        inits.append(numpy_helper.from_array(RNG.standard_normal(D).astype(dtype), "beta"))
        nodes.append(helper.make_node("Add", [last, "beta"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    outputs = [helper.make_tensor_value_info("y", elem, list(x_shape))]
    if extra_output:
        shape = [*x_shape[:-1], 1] if extra_output == "mean" else list(x_shape)
        outputs.append(helper.make_tensor_value_info(extra_output, elem, shape))
    graph = helper.make_graph(nodes, "ln", inputs, outputs, inits)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset < 19 else 9
    )


def feeds(shape: Sequence[int] = (2, 5, D), dtype: Any = np.float32, **more: Any) -> dict[str, Any]:
    return {"x": (RNG.standard_normal(shape) * 3 + 1).astype(dtype), **more}


def fused(result: Any) -> Any:
    return next(n for n in result.graph if n.op_type == "LayerNormalization")


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("normalize", ["Div", "Reciprocal"])
def test_decomposition_fuses_with_axes_as_attribute_or_input(
    opset: int, square: str, normalize: str
) -> None:
    proto = layer_norm(opset, square=square, normalize=normalize)
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(opset), atol=1e-5)
    assert ops(result) == {"LayerNormalization": 1}
    node = fused(result)
    assert [v.name for v in node.inputs] == ["x", "gamma", "beta"]
    assert node.attributes.get_int("axis") == -1
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-5)


def test_positive_last_axis_counts_as_the_last_axis() -> None:
    result = rewritten(layer_norm(17, axes=(2,)), feeds(), _layer_norm, ctx=ctx(17), atol=1e-5)
    assert ops(result)["LayerNormalization"] == 1


def test_without_gamma_a_ones_scale_stands_in() -> None:
    result = rewritten(layer_norm(gamma=None), feeds(), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert ops(result) == {"LayerNormalization": 1}
    scale = fused(result).inputs[1]
    assert scale.const_value is not None
    np.testing.assert_array_equal(scale.const_value.numpy(), np.ones(D, np.float32))


def test_without_gamma_or_beta() -> None:
    proto = layer_norm(gamma=None, beta=False)
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert ops(result) == {"LayerNormalization": 1, "Identity": 1}
    assert len(fused(result).inputs) == 2


@pytest.mark.parametrize("gamma", ["broadcast", 1.5])
def test_broadcast_gamma_becomes_a_vector(gamma: Any) -> None:
    result = rewritten(layer_norm(gamma=gamma), feeds(), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert ops(result)["LayerNormalization"] == 1
    scale = fused(result).inputs[1]
    assert scale.const_value is not None and scale.const_value.shape == (D,)


@pytest.mark.parametrize("gamma", [None, "vector"])
def test_symbolic_normalized_dim_is_left(gamma: Any) -> None:
    # Without gamma no ones vector can be built; with a [16] gamma nothing proves the symbolic
    # dim is 16 (were it 1, Mul would broadcast the result to 16 wide).
    proto = layer_norm(gamma=gamma, beta=False, x_shape=("N", "S", "H"))
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert "LayerNormalization" not in ops(result)
    why = "not static" if gamma is None else "not a vector over the last axis"
    assert any(why in r for r in reasons(proto, _layer_norm, ctx(18)))


def test_untyped_intermediate_input_fuses_with_a_vector_gamma() -> None:
    # x's type and shape are unrecorded: the epsilon gives the type, gamma and beta the width.
    proto = behind_relu(layer_norm(17))
    result = rewritten(proto, {"x_in": feeds()["x"]}, _layer_norm, ctx=ctx(17), atol=1e-5)
    assert ops(result) == {"Relu": 1, "LayerNormalization": 1}
    # Without gamma the width is unknown: no ones vector can stand in.
    proto = behind_relu(layer_norm(17, gamma=None, beta=False))
    result = rewritten(proto, {"x_in": feeds()["x"]}, _layer_norm, ctx=ctx(17), atol=1e-5)
    assert "LayerNormalization" not in ops(result)


def test_symbolic_batch_dims_fuse() -> None:
    proto = layer_norm(x_shape=("batch", "seq", D))
    result = rewritten(proto, feeds((3, 7, D)), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert ops(result)["LayerNormalization"] == 1


def test_float16_computes_in_float32_and_double_in_double() -> None:
    proto = layer_norm(dtype=np.float16)
    result = rewritten(
        proto, feeds(dtype=np.float16), _layer_norm, ctx=ctx(18), rtol=1e-2, atol=1e-2
    )
    assert fused(result).attributes.get_int("stash_type") == 1
    proto = layer_norm(17, dtype=np.float64)
    result = rewritten(proto, feeds(dtype=np.float64), _layer_norm, ctx=ctx(17), atol=1e-9)
    assert fused(result).attributes.get_int("stash_type") == int(TensorProto.DOUBLE)


def test_reduction_over_a_non_last_axis_is_left() -> None:
    proto = layer_norm(axes=(1,))
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(18))
    assert "LayerNormalization" not in ops(result)
    assert any("not over the last axis only" in r for r in reasons(proto, _layer_norm, ctx(18)))


def test_reduction_over_two_axes_is_left() -> None:
    proto = layer_norm(17, axes=(-2, -1))
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(17))
    assert "LayerNormalization" not in ops(result)


def test_runtime_epsilon_is_left() -> None:
    proto = layer_norm(eps_input=True)
    eps = np.array(1e-5, np.float32)
    result = rewritten(proto, feeds(eps=eps), _layer_norm, ctx=ctx(18))
    assert "LayerNormalization" not in ops(result)
    assert any("epsilon" in r for r in reasons(proto, _layer_norm, ctx(18)))


def test_mean_read_elsewhere_is_left() -> None:
    # The mean is also a model output: fusing would remove the node that computes it.
    proto = layer_norm(extra_output="mean")
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(18))
    assert "LayerNormalization" not in ops(result)
    assert any("other uses" in r for r in reasons(proto, _layer_norm, ctx(18)))


def test_normalized_value_read_elsewhere_keeps_that_reader() -> None:
    # The normalization (before gamma) is also an output: it may fuse, but the Mul(gamma) then
    # cannot fold into it, and the output must still be the unscaled value.
    proto = layer_norm(extra_output="n")
    result = rewritten(proto, feeds(), _layer_norm, ctx=ctx(18), atol=1e-5)
    assert ops(result)["Mul"] == 1 and ops(result)["Add"] == 1


def test_needs_opset_17_and_the_extended_level() -> None:
    assert _layer_norm.rules(RuleContext(level="extended", opset=16)) == []
    assert _layer_norm.rules(RuleContext(level="basic", opset=18)) == []
    result = rewritten(layer_norm(), feeds(), _layer_norm, ctx=RuleContext(opset=18))
    assert "LayerNormalization" not in ops(result)


def test_bias_of_another_shape_is_not_folded() -> None:
    # Add(LayerNormalization(x, s), b) with b of x's full shape is a residual, not a bias.
    nodes = [
        helper.make_node("LayerNormalization", ["x", "s"], ["ln"], axis=-1),
        helper.make_node("Add", ["ln", "r"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, D]),
        helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 4, D]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, D])],
        [numpy_helper.from_array(np.ones(D, np.float32), "s")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    r = RNG.standard_normal((2, 4, D)).astype(np.float32)
    result = rewritten(proto, feeds((2, 4, D), r=r), _layer_norm, ctx=ctx(17))
    assert ops(result) == {"LayerNormalization": 1, "Add": 1}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("affine", ["full", "no_bias", "none"])
def test_torch_layer_norm_exported_at_16_and_upgraded_fuses(opset: int, affine: str) -> None:
    nn = pytest.importorskip("torch.nn")
    # torch writes LayerNormalization itself from opset 17; at 16 it writes the decomposition,
    # which a model upgraded later keeps.
    module = {
        "full": nn.LayerNorm(D),
        "no_bias": nn.LayerNorm(D, bias=False),
        "none": nn.LayerNorm(D, elementwise_affine=False),
    }[affine]
    if affine != "none":
        with pytest.importorskip("torch").no_grad():
            module.weight.normal_()
            if module.bias is not None:
                module.bias.normal_()
    proto = version_converter.convert_version(export(module, 16, shape=(2, 3, D)), opset)
    result = rewritten(proto, feeds((4, 3, D)), _layer_norm, ctx=ctx(opset), atol=1e-5)
    assert ops(result) == {"LayerNormalization": 1}
    assert len(fused(result).inputs) == (3 if affine == "full" else 2)
