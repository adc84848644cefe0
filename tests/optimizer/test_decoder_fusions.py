"""A decoder's residual Add + RMSNorm into ONNX Runtime's SkipSimplifiedLayerNormalization:
``rules/onnxruntime/_decoder.py`` (issue 29)."""

from __future__ import annotations

import io
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.optimizer.check import ops, run_ort

from ferry.optimizer import optimize
from ferry.optimizer._rewrite import apply_rules
from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.onnxruntime import _decoder

D = 16
RNG = np.random.default_rng(0)
FUSED = "SkipSimplifiedLayerNormalization"


def rms_block(
    opset: int = 18,
    *,
    square: str = "Pow",
    inverse: str = "DivOne",
    weight: Any = "vector",
    weight_first: bool = True,
    axes: Sequence[int] = (-1,),
    eps_input: bool = False,
    skip_shape: Sequence[int | str] = ("N", "S", D),
    fused: bool = False,
    sum_output: bool = False,
) -> onnx.ModelProto:
    """``s = a + b``, RMSNorm(s) * w, and ``s`` read again by the next residual ``Add``.

    ``inverse``: ``"Div"`` (``s / std``), ``"Reciprocal"`` (``s * 1/std``) or ``"DivOne"``
    (``s * Div(1, std)``, torch.rsqrt's export). ``weight``: ``"vector"`` (a ``[D]``
    initializer), ``"input"`` (a graph input) or a float (a scalar constant). ``fused``: the norm
    is already ORT's ``SimplifiedLayerNormalization``. ``sum_output``: ``s`` is a graph output
    too.
    """
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("a", f, ["N", "S", D]),
        helper.make_tensor_value_info("b", f, list(skip_shape)),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    if eps_input:
        inputs.append(helper.make_tensor_value_info("eps", f, []))
    else:
        inits.append(numpy_helper.from_array(np.array(1e-6, np.float32), "eps"))
    if weight == "vector":
        inits.append(numpy_helper.from_array(1 + RNG.standard_normal(D).astype(np.float32), "w"))
    elif weight == "input":
        inputs.append(helper.make_tensor_value_info("w", f, [D]))
    else:
        inits.append(numpy_helper.from_array(np.array(weight, np.float32), "w"))
    nodes = [helper.make_node("Add", ["a", "b"], ["s"])]
    if fused:
        nodes.append(
            helper.make_node(
                "SimplifiedLayerNormalization", ["s", "w"], ["y"], axis=-1, epsilon=1e-6
            )
        )
    else:
        if square == "Pow":
            nodes.append(helper.make_node("Pow", ["s", "two"], ["sq"]))
        else:
            nodes.append(helper.make_node("Mul", ["s", "s"], ["sq"]))
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]))
        else:
            nodes.append(helper.make_node("ReduceMean", ["sq"], ["ms"], axes=list(axes)))
        nodes += [
            helper.make_node("Add", ["ms", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["std"]),
        ]
        if inverse == "Div":
            nodes.append(helper.make_node("Div", ["s", "std"], ["n"]))
        else:
            if inverse == "Reciprocal":
                nodes.append(helper.make_node("Reciprocal", ["std"], ["inv"]))
            else:
                nodes.append(helper.make_node("Div", ["one", "std"], ["inv"]))
            nodes.append(helper.make_node("Mul", ["s", "inv"], ["n"]))
        pair = ["w", "n"] if weight_first else ["n", "w"]
        nodes.append(helper.make_node("Mul", pair, ["y"]))
    nodes.append(helper.make_node("Add", ["s", "y"], ["next"]))
    outputs = [
        helper.make_tensor_value_info("y", f, None),
        helper.make_tensor_value_info("next", f, None),
    ]
    if sum_output:
        outputs.append(helper.make_tensor_value_info("s", f, None))
    graph = helper.make_graph(nodes, "rms_block", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def feeds(proto: onnx.ModelProto, n: int = 2, s: int = 5) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for value in proto.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else (n if d.dim_param == "N" else s)
            for d in value.type.tensor_type.shape.dim
        ]
        out[value.name] = RNG.standard_normal(dims).astype(np.float32)
    if "eps" in out:
        out["eps"] = np.array(1e-6, np.float32)
    return out


def fuse(proto: onnx.ModelProto) -> ir.Model:
    """Apply the module's rules; every output must still agree (atol 1e-5) in ONNX Runtime with
    its own optimizations off, so the comparison sees this rewrite only."""
    inputs = feeds(proto)
    want = run_ort(proto, inputs)
    model = ir.from_proto(proto)
    apply_rules(model, _decoder, RuleContext(level="extended", target="onnxruntime", opset=18))
    got = run_ort(model, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return model


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("inverse", ["Div", "Reciprocal", "DivOne"])
@pytest.mark.parametrize("weight_first", [True, False])
def test_residual_add_and_rms_norm_fuse(square: str, inverse: str, weight_first: bool) -> None:
    model = fuse(rms_block(square=square, inverse=inverse, weight_first=weight_first))
    counts = ops(model)
    assert counts[FUSED] == 1, counts
    # the sum is the op's fourth output: the next residual Add reads it
    assert counts["Add"] == 1 and "ReduceMean" not in counts and "Sqrt" not in counts, counts
    node = next(n for n in model.graph if n.op_type == FUSED)
    assert node.domain == "com.microsoft"
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-6)


def test_a_sum_that_is_a_graph_output_keeps_its_name() -> None:
    model = fuse(rms_block(sum_output=True))
    assert ops(model)[FUSED] == 1
    assert [v.name for v in model.graph.outputs] == ["y", "next", "s"]


def test_axes_as_an_attribute_fuse() -> None:
    assert ops(fuse(rms_block(opset=17)))[FUSED] == 1


def test_an_existing_simplified_layer_norm_takes_its_residual_add() -> None:
    assert ops(fuse(rms_block(fused=True)))[FUSED] == 1


@pytest.mark.parametrize(
    ("why", "kwargs"),
    [
        ("mean over another axis", {"axes": (1,)}),
        ("epsilon a graph input", {"eps_input": True}),
        ("weight a graph input", {"weight": "input"}),
        ("weight a scalar, not a [D] vector", {"weight": 1.5}),
        ("skip broadcast over the batch", {"skip_shape": (1, "S", D)}),
    ],
)
def test_near_misses_are_left(why: str, kwargs: dict[str, Any]) -> None:
    counts = ops(fuse(rms_block(**kwargs)))
    assert FUSED not in counts, why
    assert counts["Add"] >= 2, why


def test_basic_level_offers_nothing() -> None:
    assert _decoder.passes(RuleContext(level="basic", target="onnxruntime")) == []


def test_ort_does_not_fuse_the_residual_itself() -> None:
    """Why the rule exists: ONNX Runtime at ORT_ENABLE_ALL fuses the norm alone
    (SimplifiedLayerNormalization) and leaves the residual Add beside it. Should a later ORT fuse
    it too, this fails, and the rule can go."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "optimized.onnx"
        options.optimized_model_filepath = str(path)
        ort.InferenceSession(
            rms_block().SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        kinds = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "SimplifiedLayerNormalization" in kinds and FUSED not in kinds, kinds


def llama_export() -> tuple[onnx.ModelProto, Any]:
    """transformers' LlamaForCausalLM (the tiny llama of tests/gguf_files.py) exported by
    torch.onnx, as tests/generate/test_onnx_source.py makes it, without the cache."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gguf_files import tiny_llama

    config_json, tensors = tiny_llama()
    hf_config = transformers.LlamaConfig(
        **{k: v for k, v in config_json.items() if k != "architectures"}
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            ).logits

    example = (
        torch.tensor([[1, 10, 20]]),
        torch.ones(1, 3, dtype=torch.int64),
        torch.arange(3)[None],
    )
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Logits(),
            example,
            buffer,
            input_names=["input_ids", "attention_mask", "position_ids"],
            output_names=["logits"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "position_ids": {0: "batch", 1: "sequence"},
                "logits": {0: "batch", 1: "sequence"},
            },
            dynamo=False,
            opset_version=17,
        )
    return onnx.load_from_string(buffer.getvalue()), model


def test_a_torch_exported_llama_gets_skip_rms_norms_and_the_same_logits() -> None:
    proto, _ = llama_export()
    ids = np.array([[1, 10, 20, 30, 40, 5], [7, 8, 9, 11, 12, 13]], np.int64)
    inputs = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(6, dtype=np.int64)[None].repeat(2, 0),
    }
    result = optimize(
        proto, level="extended", target="onnxruntime", example_inputs=inputs, measure=False
    )
    assert result.accepted, result.report.refused
    counts = ops(result.model)
    # two blocks: each residual Add but the embedding's feeds the next norm (the attention's into
    # the MLP's norm, the MLP's into the next block's or the final one)
    assert counts[FUSED] == 4, counts
    want = run_ort(proto, inputs)[0]
    got = run_ort(result.model, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
