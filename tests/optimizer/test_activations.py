"""HardSwish/HardSigmoid and GELU fusions: ``rules/common/_activations.py`` (ONNX ops) and
``rules/onnxruntime/_activations.py`` (ORT's contrib ``Gelu``/``FastGelu`` below opset 20)."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter
from onnxscript.rewriter._basics import MatchingTracer
from onnxscript.rewriter._rewrite_rule import RewriteRuleSet
from tests.optimizer.check import ops, rewritten

from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.common import _activations as common_activations
from ferry.optimizer.rules.onnxruntime import _activations as ort_activations

EXT20 = RuleContext(level="extended", opset=20)
ORT17 = RuleContext(level="extended", target="onnxruntime", opset=17)
RNG = np.random.default_rng(0)


def model(
    nodes: Sequence[onnx.NodeProto],
    opset: int,
    *,
    inputs: Sequence[tuple[str, Sequence[int | str]]] = (("x", ("N", "S", 8)),),
    outputs: Sequence[str] = ("y",),
    output_shape: Sequence[int | str] | None = None,
    initializers: Sequence[onnx.TensorProto] = (),
    dtype: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """A one-graph model at ``opset`` (ir_version 8 below opset 19, else 9); the outputs have the
    first input's shape unless told."""
    out_shape = list(output_shape if output_shape is not None else inputs[0][1])
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(name, dtype, list(shape)) for name, shape in inputs],
        [helper.make_tensor_value_info(name, dtype, out_shape) for name in outputs],
        list(initializers),
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8 if opset < 19 else 9
    )


def const(
    name: str, value: float | Sequence[float] | np.ndarray, dtype: Any = np.float32
) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype))
    )


def feeds(
    shape: Sequence[int] = (2, 3, 8), dtype: Any = np.float32, **more: Any
) -> dict[str, np.ndarray]:
    return {"x": (RNG.standard_normal(shape) * 2).astype(dtype), **more}


def behind_relu(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its input ``x`` computed by a ``Relu`` from a new input: ``x`` is then an
    intermediate value whose type and shape the model does not record, as in an export that
    ran no shape inference."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    (source,) = (i for i in proto.graph.input if i.name == "x")
    source.name = "x_in"
    proto.graph.node.insert(0, helper.make_node("Relu", ["x_in"], ["x"]))
    return proto


def reasons(proto: onnx.ModelProto, module: ModuleType, ctx: RuleContext) -> list[str]:
    """Why ``module``'s rules for ``ctx`` did not fuse ``proto``: the failure reason of each
    rule's furthest match."""
    rules = module.rules(ctx)
    tracer = MatchingTracer()
    RewriteRuleSet(rules).apply_to_model(ir.from_proto(proto), tracer=tracer)
    return [
        str(info.match_result.reason)
        for infos in tracer.best_matches_map.values()
        for info in infos
        if info.match_result.reason
    ]


def export(
    module: Any, opset: int, *, dynamo: bool = False, shape: Sequence[int] = (2, 3, 8)
) -> onnx.ModelProto:
    """``module`` exported by ``torch.onnx.export`` with a dynamic batch."""
    torch = pytest.importorskip("torch")
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch = torch.export.Dim("batch")
            program = torch.onnx.export(
                module.eval(),
                (x,),
                dynamo=True,
                opset_version=opset,
                input_names=["x"],
                output_names=["y"],
                dynamic_shapes=({0: batch},),
                verbose=False,
            )
            return program.model_proto
        f = io.BytesIO()
        torch.onnx.export(
            module.eval(),
            (x,),
            f,
            dynamo=False,
            opset_version=opset,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}},
        )
    return onnx.load_from_string(f.getvalue())


# -- GELU: hand-built forms --------------------------------------------------------------------


def erf_gelu(
    association: str = "half_last",
    *,
    half: float = 0.5,
    scale_op: str = "Div",
    swap: bool = False,
    opset: int = 20,
    extra_output: str | None = None,
) -> onnx.ModelProto:
    """``0.5 * x * (1 + Erf(x / sqrt(2)))`` in the given association (see ``GeluFusion``)."""
    scale = math.sqrt(2) if scale_op == "Div" else 1 / math.sqrt(2)
    nodes = [
        const("c_scale", scale),
        const("c_one", 1.0),
        const("c_half", half),
        helper.make_node(scale_op, ["x", "c_scale"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["c_one", "erf"] if swap else ["erf", "c_one"], ["e"]),
    ]
    pair = (lambda a, b: [b, a]) if swap else (lambda a, b: [a, b])
    if association == "half_first":
        nodes += [
            helper.make_node("Mul", pair("c_half", "x"), ["hx"]),
            helper.make_node("Mul", pair("hx", "e"), ["y"]),
        ]
    elif association == "half_last":
        nodes += [
            helper.make_node("Mul", pair("x", "e"), ["xe"]),
            helper.make_node("Mul", pair("xe", "c_half"), ["y"]),
        ]
    else:
        nodes += [
            helper.make_node("Mul", pair("c_half", "e"), ["he"]),
            helper.make_node("Mul", pair("x", "he"), ["y"]),
        ]
    outputs = ("y", extra_output) if extra_output else ("y",)
    return model(nodes, opset, outputs=outputs)


def tanh_gelu(
    cube: str = "pow", *, coeff: float = 0.044715, swap: bool = False, opset: int = 20
) -> onnx.ModelProto:
    """``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, the cube by ``Pow`` or ``Mul``."""
    pair = (lambda a, b: [b, a]) if swap else (lambda a, b: [a, b])
    nodes = [const("c_three", 3.0), const("c_coeff", coeff), const("c_k", math.sqrt(2 / math.pi))]
    nodes += [const("c_one", 1.0), const("c_half", 0.5)]
    if cube == "pow":
        nodes.append(helper.make_node("Pow", ["x", "c_three"], ["cube"]))
    else:
        nodes += [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("Mul", pair("x", "sq"), ["cube"]),
        ]
    nodes += [
        helper.make_node("Mul", pair("c_coeff", "cube"), ["t"]),
        helper.make_node("Add", pair("x", "t"), ["inner"]),
        helper.make_node("Mul", pair("c_k", "inner"), ["arg"]),
        helper.make_node("Tanh", ["arg"], ["tanh"]),
        helper.make_node("Add", pair("tanh", "c_one"), ["e"]),
        helper.make_node("Mul", pair("x", "e"), ["xe"]),
        helper.make_node("Mul", pair("c_half", "xe"), ["y"]),
    ]
    return model(nodes, opset)


@pytest.mark.parametrize("association", ["half_first", "half_last", "half_inner"])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_erf_gelu_every_association_fuses_to_gelu(
    association: str, swap: bool, scale_op: str
) -> None:
    proto = erf_gelu(association, swap=swap, scale_op=scale_op)
    result = rewritten(proto, feeds(), common_activations, ctx=EXT20)
    assert ops(result) == {"Gelu": 1}
    gelu = next(iter(result.graph))
    assert gelu.domain == "" and "approximate" not in gelu.attributes


@pytest.mark.parametrize("cube", ["pow", "mul"])
@pytest.mark.parametrize("swap", [False, True])
def test_tanh_gelu_fuses_to_gelu_tanh(cube: str, swap: bool) -> None:
    result = rewritten(
        tanh_gelu(cube, swap=swap), feeds(), common_activations, ctx=EXT20, atol=1e-5
    )
    assert ops(result) == {"Gelu": 1}
    assert next(iter(result.graph)).attributes.get_string("approximate") == "tanh"


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_of_an_untyped_intermediate_value_fuses(approximate: str) -> None:
    # x's type is unrecorded; the constants it is multiplied with tell it is float.
    proto = behind_relu(erf_gelu() if approximate == "none" else tanh_gelu())
    result = rewritten(proto, {"x_in": feeds()["x"]}, common_activations, ctx=EXT20)
    assert ops(result) == {"Relu": 1, "Gelu": 1}


def test_gelu_with_a_wrong_constant_is_left_with_the_reason() -> None:
    proto = erf_gelu(half=0.4)
    result = rewritten(proto, feeds(), common_activations, ctx=EXT20)
    assert ops(result)["Erf"] == 1 and "Gelu" not in ops(result)
    assert any("expected 0.5, got 0.4" in r for r in reasons(proto, common_activations, EXT20))


def test_tanh_gelu_with_a_wrong_coefficient_is_left() -> None:
    result = rewritten(tanh_gelu(coeff=0.05), feeds(), common_activations, ctx=EXT20)
    assert "Gelu" not in ops(result) and ops(result)["Tanh"] == 1


def test_gelu_needs_opset_20_in_common_and_the_extended_level() -> None:
    proto = erf_gelu(opset=17)
    older = rewritten(
        proto, feeds(), common_activations, ctx=RuleContext(level="extended", opset=17)
    )
    assert "Gelu" not in ops(older)
    basic = rewritten(erf_gelu(), feeds(), common_activations, ctx=RuleContext(opset=20))
    assert "Gelu" not in ops(basic)
    assert common_activations.rules(RuleContext(level="basic", opset=20)) == []


def test_gelu_whose_inner_value_is_read_elsewhere_is_left() -> None:
    # Erf's output is also a model output: fusing would remove the node that computes it.
    proto = erf_gelu(extra_output="erf")
    result = rewritten(proto, feeds(), common_activations, ctx=EXT20)
    assert "Gelu" not in ops(result)
    assert any("other uses" in r for r in reasons(proto, common_activations, EXT20))


def test_gelu_with_an_overridable_constant_is_left() -> None:
    # The 0.5 is an initializer that is also a graph input: the caller may feed another value.
    proto = erf_gelu()
    half = next(n for n in proto.graph.node if n.output[0] == "c_half")
    proto.graph.node.remove(half)
    proto.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "c_half"))
    proto.graph.input.append(helper.make_tensor_value_info("c_half", TensorProto.FLOAT, []))
    result = rewritten(
        proto, feeds(c_half=np.array(0.5, np.float32)), common_activations, ctx=EXT20
    )
    assert "Gelu" not in ops(result)


# -- GELU: what exporters emit -----------------------------------------------------------------


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_gelu_at_opset_17_fuses_to_contrib_ops_for_onnxruntime(approximate: str) -> None:
    nn = pytest.importorskip("torch.nn")
    proto = export(nn.GELU(approximate=approximate), 17)
    assert "Erf" in ops(ir.from_proto(proto)) or "Tanh" in ops(ir.from_proto(proto))
    result = rewritten(proto, feeds((4, 3, 8)), ort_activations, ctx=ORT17, atol=1e-5)
    want = "Gelu" if approximate == "none" else "FastGelu"
    assert ops(result) == {want: 1}
    node = next(iter(result.graph))
    assert node.domain == "com.microsoft"
    assert result.opset_imports["com.microsoft"] == 1


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_gelu_upgraded_to_opset_20_fuses_to_onnx_gelu(approximate: str) -> None:
    nn = pytest.importorskip("torch.nn")
    # torch writes Gelu itself at opset 20; a model exported at 17 and upgraded keeps the
    # decomposition, which is what the common rule is for.
    proto = version_converter.convert_version(export(nn.GELU(approximate=approximate), 17), 20)
    result = rewritten(proto, feeds((4, 3, 8)), common_activations, ctx=EXT20, atol=1e-5)
    assert ops(result) == {"Gelu": 1}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_dynamo_gelu_fuses(approximate: str) -> None:
    nn = pytest.importorskip("torch.nn")
    # The dynamo exporter writes x * (0.5 * (1 + Erf(..))) and Pow(x, 3): other associations.
    proto = export(nn.GELU(approximate=approximate), 18, dynamo=True)
    ctx = RuleContext(level="extended", target="onnxruntime", opset=18)
    result = rewritten(proto, feeds((4, 3, 8)), ort_activations, ctx=ctx, atol=1e-5)
    assert ops(result) == {("Gelu" if approximate == "none" else "FastGelu"): 1}


def test_contrib_gelu_rules_stand_back_at_opset_20_and_basic() -> None:
    assert (
        ort_activations.rules(RuleContext(level="extended", target="onnxruntime", opset=20)) == []
    )
    assert ort_activations.rules(RuleContext(level="basic", target="onnxruntime", opset=17)) == []


def test_contrib_gelu_keeps_float16() -> None:
    proto = erf_gelu(opset=17)
    for value in proto.graph.input[:] + proto.graph.output[:]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    for node in proto.graph.node:
        if node.op_type == "Constant":
            array = numpy_helper.to_array(node.attribute[0].t).astype(np.float16)
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(array))
    result = rewritten(
        proto, feeds(dtype=np.float16), ort_activations, ctx=ORT17, rtol=1e-2, atol=1e-2
    )
    assert ops(result) == {"Gelu": 1}


# -- HardSwish / HardSigmoid -------------------------------------------------------------------


def clip_form(
    *,
    scale_op: str = "Div",
    scale: float = 6.0,
    times_x: bool = True,
    bias_shape: Sequence[int] = (),
    opset: int = 14,
) -> onnx.ModelProto:
    """``Clip(x + 3, 0, 6) [* x] / 6`` (or ``* (1/6)``)."""
    nodes = [
        const("c_bias", np.full(bias_shape, 3.0)),
        const("c_min", 0.0),
        const("c_max", 6.0),
        const("c_scale", scale),
        helper.make_node("Add", ["x", "c_bias"], ["shifted"]),
        helper.make_node("Clip", ["shifted", "c_min", "c_max"], ["clipped"]),
    ]
    if times_x:
        nodes += [
            helper.make_node("Mul", ["clipped", "x"], ["prod"]),
            helper.make_node(scale_op, ["prod", "c_scale"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node(scale_op, ["clipped", "c_scale"], ["y"]))
    rank = max(2, len(bias_shape))
    out_shape = ["a", "b", "c"][:rank]
    return model(nodes, opset, inputs=(("x", ("N", 8)),), output_shape=out_shape)


@pytest.mark.parametrize(("scale_op", "scale"), [("Div", 6.0), ("Mul", 1 / 6)])
def test_clip_form_fuses_to_hardswish(scale_op: str, scale: float) -> None:
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(
        clip_form(scale_op=scale_op, scale=scale), feeds((4, 8)), common_activations, ctx=ctx
    )
    assert ops(result) == {"HardSwish": 1}


@pytest.mark.parametrize(("scale_op", "scale"), [("Div", 6.0), ("Mul", 1 / 6)])
def test_clip_form_without_x_fuses_to_hardsigmoid_at_any_opset(scale_op: str, scale: float) -> None:
    ctx = RuleContext(level="extended", opset=13)
    proto = clip_form(scale_op=scale_op, scale=scale, times_x=False, opset=13)
    result = rewritten(proto, feeds((4, 8)), common_activations, ctx=ctx)
    assert ops(result) == {"HardSigmoid": 1}


def test_hardsigmoid_times_x_fuses_to_hardswish() -> None:
    nodes = [
        helper.make_node("HardSigmoid", ["x"], ["hs"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["x", "hs"], ["y"]),
    ]
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(model(nodes, 14), feeds(), common_activations, ctx=ctx)
    assert ops(result) == {"HardSwish": 1}


def test_hardswish_needs_opset_14() -> None:
    ctx = RuleContext(level="extended", opset=13)
    result = rewritten(clip_form(opset=13), feeds((4, 8)), common_activations, ctx=ctx)
    assert "HardSwish" not in ops(result)


def test_hardswish_with_other_hardsigmoid_parameters_is_left() -> None:
    nodes = [
        helper.make_node("HardSigmoid", ["x"], ["hs"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["x", "hs"], ["y"]),
    ]
    proto = model(nodes, 14)
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(proto, feeds(), common_activations, ctx=ctx)
    assert ops(result) == {"HardSigmoid": 1, "Mul": 1}
    assert any("alpha is 0.2, not 1/6" in r for r in reasons(proto, common_activations, ctx))


def test_clip_form_whose_bias_would_broadcast_is_left() -> None:
    # A [1, 1, 1] bias makes the rank-2 x rank 3: HardSwish(x) would have the wrong shape.
    proto = clip_form(bias_shape=(1, 1, 1))
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(proto, feeds((4, 8)), common_activations, ctx=ctx)
    assert "HardSwish" not in ops(result)
    assert any("not a scalar constant" in r for r in reasons(proto, common_activations, ctx))


def test_clip_form_with_a_wrong_divisor_is_left() -> None:
    proto = clip_form(scale=5.0)
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(proto, feeds((4, 8)), common_activations, ctx=ctx)
    assert "HardSwish" not in ops(result) and "HardSigmoid" not in ops(result)


def test_clip_form_on_integers_is_left() -> None:
    # On int32 Div(_, 6) truncates, which HardSwish does not: not the same function.
    proto = clip_form()
    for value in [*proto.graph.input, *proto.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.INT32
    for node in proto.graph.node:
        if node.op_type == "Constant":
            array = numpy_helper.to_array(node.attribute[0].t).astype(np.int32)
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(array))
    ctx = RuleContext(level="extended", opset=14)
    x = np.arange(-8, 8, dtype=np.int32).reshape(2, 8)
    result = rewritten(proto, {"x": x}, common_activations, ctx=ctx)
    assert "HardSwish" not in ops(result) and "HardSigmoid" not in ops(result)
    assert any("defined for floats" in r for r in reasons(proto, common_activations, ctx))


def test_hardswish_clip_read_elsewhere_is_left() -> None:
    proto = clip_form()
    proto.graph.output.append(helper.make_tensor_value_info("clipped", TensorProto.FLOAT, ["N", 8]))
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(proto, feeds((4, 8)), common_activations, ctx=ctx)
    assert "HardSwish" not in ops(result)


def test_torch_hardswish_at_opset_13_keeps_its_hardsigmoid_form_until_upgraded() -> None:
    nn = pytest.importorskip("torch.nn")
    # Below opset 14 torch writes x * HardSigmoid(x); upgraded to 14 that fuses.
    proto = version_converter.convert_version(export(nn.Hardswish(), 13), 14)
    ctx = RuleContext(level="extended", opset=14)
    result = rewritten(proto, feeds((4, 3, 8)), common_activations, ctx=ctx)
    assert ops(result) == {"HardSwish": 1}
