"""Fused attention for ONNX Runtime: ``rules/onnxruntime/_attention.py`` (onnxscript's
``ort_fusions`` in stages, with ferry's guards)."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript.rewriter._basics import MatchingTracer
from onnxscript.rewriter._rewrite_rule import RewriteRuleSet
from tests.optimizer.check import ops, rewritten

from ferry.optimizer._rewrite import apply_rules
from ferry.optimizer.rules import RuleContext
from ferry.optimizer.rules.common import _layer_norm, _shapes
from ferry.optimizer.rules.onnxruntime import _activations, _attention

RNG = np.random.default_rng(0)
D, H = 32, 4
DH = D // H
RTOL = ATOL = 1e-4  # the fused kernels sum in another order
ORT = RuleContext(level="extended", target="onnxruntime")


def feeds(batch: int = 3, seq: int = 7, **more: Any) -> dict[str, np.ndarray]:
    """Activations and an additive padding mask (0 or -10000) over the key positions."""
    mask = np.where(RNG.random((batch, 1, 1, seq)) > 0.3, 0.0, -10000.0).astype(np.float32)
    return {"x": RNG.standard_normal((batch, seq, D)).astype(np.float32), "mask": mask, **more}


def fuse(model: ir.Model) -> _attention.AttentionFusionPass:
    """Run the module's passes, as the pipeline does, and return the fusion pass (its counts)."""
    (fusion,) = _attention.passes(ORT)
    assert isinstance(fusion, _attention.AttentionFusionPass)
    fusion(model)
    return fusion


def check_reasons(
    proto: onnx.ModelProto, rules: RewriteRuleSet, *stages: RewriteRuleSet
) -> list[str]:
    """The failure reasons of ``rules`` on ``proto`` after shape inference and ``stages``."""
    model = ir.from_proto(proto)
    ir.passes.common.ShapeInferencePass()(model)
    for stage in stages:
        stage.apply_to_model(model)
        ir.passes.common.RemoveUnusedNodesPass()(model)
    tracer = MatchingTracer()
    rules.apply_to_model(model, tracer=tracer)
    return [
        str(info.match_result.reason)
        for infos in tracer.best_matches_map.values()
        for info in infos
        if info.match_result.reason
    ]


# -- hand-built graphs -------------------------------------------------------------------------


def bert_attention(
    *,
    merged_shape: Sequence[int] = (0, 0, D),
    q_bias: str = "vector",
    probs_output: bool = False,
) -> onnx.ModelProto:
    """A BERT self-attention block as TorchScript exports it once its shapes are constant:
    projections with bias, heads split by ``Reshape(0, 0, H, Dh)`` (the key left in
    ``[B, S, H, Dh]`` and transposed to ``[B, H, Dh, S]`` in one step), scaled scores plus a
    ``[B, 1, 1, S]`` mask, softmax, heads merged by ``Reshape(merged_shape)``, output projection.

    ``q_bias``: ``"vector"`` (a ``[D]`` initializer) or ``"input"`` (a ``[B, S, D]`` term, like
    a position embedding). ``probs_output``: the attention probabilities are a model output too.
    """
    inits = [
        numpy_helper.from_array(
            (RNG.standard_normal((D, D)) / math.sqrt(D)).astype(np.float32), f"W{n}"
        )
        for n in "qkvo"
    ]
    inits += [
        numpy_helper.from_array(RNG.standard_normal(D).astype(np.float32), f"b{n}") for n in "qkvo"
    ]
    inits += [
        numpy_helper.from_array(np.array([0, 0, H, DH], np.int64), "split"),
        numpy_helper.from_array(np.array(merged_shape, np.int64), "merge"),
        numpy_helper.from_array(np.array(math.sqrt(DH), np.float32), "sqrt_dh"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", D]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, 1, "S"]),
    ]
    nodes = []
    for n in "qkv":
        bias = "pos" if (n == "q" and q_bias == "input") else f"b{n}"
        nodes += [
            helper.make_node("MatMul", ["x", f"W{n}"], [f"{n}_mm"]),
            helper.make_node("Add", [bias, f"{n}_mm"], [f"{n}_proj"]),
            helper.make_node("Reshape", [f"{n}_proj", "split"], [f"{n}_heads"]),
        ]
    if q_bias == "input":
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["B", "S", D]))
    nodes += [
        helper.make_node("Transpose", ["q_heads"], ["q_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k_heads"], ["k_t"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v_heads"], ["v_t"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q_t", "k_t"], ["scores"]),
        helper.make_node("Div", ["scores", "sqrt_dh"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_t"], ["context"]),
        helper.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["context_t", "merge"], ["merged"]),
        helper.make_node("MatMul", ["merged", "Wo"], ["o_mm"]),
        helper.make_node("Add", ["o_mm", "bo"], ["y"]),
    ]
    out_shape: list[Any] = ["B", "S", D] if len(merged_shape) == 3 else ["BS", D]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)]
    if probs_output:
        outputs.append(
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["B", H, "S", "S"])
        )
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_bert_block_fuses_into_one_attention_op() -> None:
    model = rewritten(bert_attention(), feeds(), fuse, rtol=RTOL, atol=ATOL)
    # Left: the output projection, and the mask broadcast to [B, 1, S, S] that ORT's op needs.
    assert ops(model) == {
        "Attention": 1,
        "MatMul": 1,
        "Add": 1,
        "Shape": 1,
        "Concat": 1,
        "Expand": 1,
        "Constant": 1,
    }
    (node,) = (n for n in model.graph if n.op_type == "Attention")
    assert node.domain == "com.microsoft"
    assert node.attributes.get_int("num_heads") == H
    # Q, K and V's weights and biases are folded into one constant each.
    weight, bias = node.inputs[1], node.inputs[2]
    assert weight is not None and weight.const_value is not None and weight.shape == [D, 3 * D]
    assert bias is not None and bias.const_value is not None and bias.shape == [3 * D]
    assert "ai.onnxruntime._fusion" not in model.opset_imports


def test_symbolic_batch_and_sequence_run_at_other_sizes() -> None:
    model = ir.from_proto(bert_attention())
    fuse(model)
    proto = ir.to_proto(model)
    for batch, seq in ((1, 1), (5, 12)):
        rewritten(proto, feeds(batch, seq), lambda m: None, rtol=RTOL, atol=ATOL)


def test_heads_merged_to_a_flat_matrix_get_no_multi_head_fusion() -> None:
    # torch's nn.MultiheadAttention merges heads to [B*S, D]; MultiHeadAttention writes
    # [B, S, D]. Only the core (SDPA) fuses, wrapped in the original transposes.
    proto = bert_attention(merged_shape=(-1, D))
    model = rewritten(proto, feeds(), fuse, rtol=RTOL, atol=ATOL)
    assert ops(model)["MultiHeadAttention"] == 1 and "Attention" not in ops(model)
    sdpa = RewriteRuleSet([_attention.GuardedSDPA.rule()])
    found = check_reasons(proto, _attention._mha_rules(False), sdpa)
    assert any("not [batch, sequence, hidden]" in r for r in found)


def test_a_bias_that_is_not_a_vector_is_not_folded_into_the_attention() -> None:
    pos = RNG.standard_normal((3, 7, D)).astype(np.float32)
    model = rewritten(bert_attention(q_bias="input"), feeds(pos=pos), fuse, rtol=RTOL, atol=ATOL)
    assert ops(model)["MultiHeadAttention"] == 1 and "Attention" not in ops(model)


def test_probabilities_read_elsewhere_leave_the_block_alone() -> None:
    # output_attentions=True: the softmax is a model output, so nothing in between can go.
    proto = bert_attention(probs_output=True)
    pass_ = None

    def run(model: ir.Model) -> None:
        nonlocal pass_
        pass_ = fuse(model)

    model = rewritten(proto, feeds(), run, rtol=RTOL, atol=ATOL)
    assert "MultiHeadAttention" not in ops(model) and ops(model)["Softmax"] == 1
    assert pass_ is not None and pass_.counts == {"sdpa": 0}
    sdpa = RewriteRuleSet([_attention.GuardedSDPA.rule()])
    assert any("other uses" in r for r in check_reasons(proto, sdpa))


def core(heads: int | str, *, nan_guard: bool = False) -> onnx.ModelProto:
    """Bare scaled dot-product attention over ``[B, H, S, 8]`` query/key/value inputs, with an
    additive ``[B, 1, S, S]`` mask; ``nan_guard``: ``Where(IsNaN(p), 0, p)`` after the softmax
    (torch's export of a boolean mask)."""
    shape = ["B", heads, "S", DH]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, "S", "S"]))
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Add", ["ss", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
    ]
    if nan_guard:
        nodes += [
            helper.make_node("IsNaN", ["p"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "p"], ["pg"]),
            helper.make_node("MatMul", ["pg", "v"], ["y"]),
        ]
    else:
        nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    consts = [
        numpy_helper.from_array(np.array(1 / math.sqrt(DH), np.float32), "scale"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    graph = helper.make_graph(
        nodes,
        "sdpa",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        consts,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def core_feeds(masked_row: bool = False) -> dict[str, np.ndarray]:
    qkv = {n: RNG.standard_normal((2, H, 5, DH)).astype(np.float32) for n in "qkv"}
    mask = np.zeros((2, 1, 5, 5), np.float32)
    mask[..., -1] = -10000.0
    if masked_row:
        mask[0, 0, 2, :] = -np.inf  # one query row sees no key at all
    return {**qkv, "mask": mask}


def test_bare_sdpa_with_static_heads_becomes_multi_head_attention() -> None:
    model = rewritten(core(H), core_feeds(), fuse, rtol=RTOL, atol=ATOL)
    assert ops(model)["MultiHeadAttention"] == 1 and "Softmax" not in ops(model)


def test_bare_sdpa_with_symbolic_heads_is_left() -> None:
    # No MultiHeadAttention can take an unknown head count, so the temporary op must not appear.
    proto = core("H")
    model = rewritten(proto, core_feeds(), fuse, rtol=RTOL, atol=ATOL)
    assert ops(model) == {"Transpose": 1, "MatMul": 2, "Mul": 1, "Add": 1, "Softmax": 1}
    sdpa = RewriteRuleSet([_attention.GuardedSDPA.rule()])
    assert any("head count" in r and "not static" in r for r in check_reasons(proto, sdpa))


def test_nan_guarded_softmax_is_left() -> None:
    # The guard makes a fully masked row 0 where ORT's attention ops give NaN.
    proto = core(H, nan_guard=True)
    model = rewritten(proto, core_feeds(masked_row=True), fuse, rtol=RTOL, atol=ATOL)
    assert "MultiHeadAttention" not in ops(model) and ops(model)["IsNaN"] == 1
    sdpa = RewriteRuleSet([_attention.GuardedSDPA.rule()])
    assert any("NaN guard" in r for r in check_reasons(proto, sdpa))


def test_no_softmax_no_change_and_basic_level_offers_nothing() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", D])],
    )
    model = ir.from_proto(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    assert not _attention.AttentionFusionPass()(model).modified
    assert _attention.passes(RuleContext(level="basic", target="onnxruntime")) == []
    assert _attention.rules(ORT) == []


# -- what exporters emit -----------------------------------------------------------------------


def _torch() -> Any:
    return pytest.importorskip("torch")


def hf_attention(prescale: bool = False) -> Any:
    """A Hugging Face style self-attention (BERT's; BART's with ``prescale``: the query scaled
    before the heads are split)."""
    torch: Any = _torch()

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))

        def split(self, t: Any) -> Any:
            return t.view((*t.size()[:-1], H, DH)).permute(0, 2, 1, 3)

        def forward(self, x: Any, mask: Any) -> Any:
            q = self.q(x) * DH**-0.5 if prescale else self.q(x)
            q, k, v = self.split(q), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2))
            if not prescale:
                scores = scores / math.sqrt(DH)
            probs = torch.softmax(scores + mask, dim=-1)
            context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            return self.o(context.view((*context.size()[:-2], D)))

    return Attention().eval()


def export(
    module: Any, args: tuple[Any, ...], names: Sequence[str], *, dynamo: bool
) -> onnx.ModelProto:
    torch: Any = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            dims: dict[str, Any] = {names[0]: {0: batch, 1: seq}}
            if len(names) > 1:
                dims[names[1]] = {0: batch, 3: seq}
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=18,
                input_names=["x", "mask"][: len(args)],
                output_names=["y"],
                dynamic_shapes=dims,
                verbose=False,
            )
            return program.model_proto
        f = io.BytesIO()
        axes = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 3: "seq"}}
        torch.onnx.export(
            module,
            args,
            f,
            dynamo=False,
            opset_version=17,
            input_names=["x", "mask"][: len(args)],
            output_names=["y"],
            dynamic_axes={k: axes[k] for k in ["x", "mask"][: len(args)]},
        )
    return onnx.load_from_string(f.getvalue())


def _example() -> tuple[Any, Any]:
    torch: Any = _torch()
    return torch.randn(2, 5, D), torch.zeros(2, 1, 1, 5)


def test_torch_dynamo_bert_attention_fuses_into_attention() -> None:
    proto = export(hf_attention(), _example(), ["x", "mask"], dynamo=True)
    counts: dict[str, int] = {}
    model = rewritten(proto, feeds(), lambda m: counts.update(fuse(m).counts), rtol=RTOL, atol=ATOL)
    assert ops(model)["Attention"] == 1 and "Softmax" not in ops(model)
    assert counts["sdpa"] == counts["mha"] == counts["mha_bias"] == counts["attention"] == 1


def test_torch_dynamo_prescaled_query_folds_the_scale() -> None:
    proto = export(hf_attention(prescale=True), _example(), ["x", "mask"], dynamo=True)
    counts: dict[str, int] = {}
    model = rewritten(proto, feeds(), lambda m: counts.update(fuse(m).counts), rtol=RTOL, atol=ATOL)
    assert ops(model)["Attention"] == 1
    assert counts["mha_scale"] == 1


def test_torchscript_bert_attention_fuses_after_static_shapes() -> None:
    # TorchScript computes every Reshape target at run time (Shape -> Gather -> Concat); those
    # Shape nodes read the very values the fusion removes. ``_shapes`` (run before, as in the
    # pipeline) makes the targets constant.
    proto = export(hf_attention(), _example(), ["x", "mask"], dynamo=False)

    def pipeline(model: ir.Model) -> None:
        ir.passes.Sequential(*_shapes.passes(ORT), ir.passes.common.RemoveUnusedNodesPass())(model)
        fuse(model)

    model = rewritten(proto, feeds(), pipeline, rtol=RTOL, atol=ATOL)
    assert ops(model)["Attention"] == 1 and "Softmax" not in ops(model)


@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_bert_layer_fuses_end_to_end(dynamo: bool) -> None:
    torch: Any = _torch()

    class Layer(torch.nn.Module):
        """A post-norm BERT layer: attention, residual, LayerNorm, GELU feed-forward."""

        def __init__(self) -> None:
            super().__init__()
            self.attention = hf_attention()
            self.norm1, self.norm2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            self.up, self.down = torch.nn.Linear(D, 64), torch.nn.Linear(64, D)

        def forward(self, x: Any, mask: Any) -> Any:
            h = self.norm1(x + self.attention(x, mask))
            return self.norm2(h + self.down(torch.nn.functional.gelu(self.up(h))))

    proto = export(Layer().eval(), _example(), ["x", "mask"], dynamo=dynamo)
    ctx = RuleContext(level="extended", target="onnxruntime", opset=18 if dynamo else 17)

    def pipeline(model: ir.Model) -> None:
        # The modules in the pipeline's order: common first, then the target's.
        for module in (_shapes, _layer_norm, _activations, _attention):
            apply_rules(model, module, ctx)

    model = rewritten(proto, feeds(), pipeline, rtol=RTOL, atol=ATOL)
    counts = ops(model)
    assert counts["Attention"] == counts["Gelu"] == 1 and counts["LayerNormalization"] == 2
    assert not {"Softmax", "Erf", "Reshape", "Transpose"} & set(counts)


def test_torch_transformer_encoder_layer_gets_multi_head_attention() -> None:
    torch: Any = _torch()
    layer = torch.nn.TransformerEncoderLayer(D, H, 64, dropout=0.0, batch_first=True).eval()
    # (TorchScript cannot export it in torch 2.13: its fast path passes is_causal as a tensor.)
    proto = export(layer, (_example()[0],), ["src"], dynamo=True)
    x = feeds()["x"]
    model = rewritten(proto, {"x": x}, fuse, rtol=RTOL, atol=ATOL)
    # nn.MultiheadAttention packs Q/K/V and works sequence-first, merging heads to [S*B, D]:
    # the core fuses, the projections stay.
    assert ops(model)["MultiHeadAttention"] == 1 and "Softmax" not in ops(model)
