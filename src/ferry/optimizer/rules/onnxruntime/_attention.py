"""Transformer attention fused into ONNX Runtime's ``com.microsoft`` attention ops.

An exported attention block is a dozen ops (projections, head split, ``MatMul``, scale, mask,
``Softmax``, ``MatMul``, head merge); ORT has one fused kernel for it on every execution
provider. onnxscript's ``ort_fusions`` recognise it in stages, each consuming the last one's
result, and this module runs them as one pass (``AttentionFusionPass``), in the order
``fuse_xformers`` does::

    MatMul(Softmax(MatMul(q, k^T) * scale + mask), v)       ->  SDPA(q, k, v, mask)   [temporary]
    Reshape/Transpose heads around SDPA                      ->  MultiHeadAttention(q, k, v, ...)
    MultiHeadAttention(Mul(q, s), ...)                       ->  MultiHeadAttention(q, ..., scale)
    MultiHeadAttention(Add(q, bq), Add(k, bk), Add(v, bv))   ->  MultiHeadAttention(.., bias)
    MultiHeadAttention(MatMul(x, Wq), MatMul(x, Wk), MatMul(x, Wv), bias)
                                                             ->  Attention(x, [Wq|Wk|Wv], bias)
    any SDPA left (heads not split by a Reshape/Transpose)   ->  MultiHeadAttention

The first stage needs shapes (to tell query, key and value and the head count apart), so the
pass runs ONNX shape inference first. Each onnxscript stage is used as it is, with the checks
this module adds where a stage would rewrite something it has not proved:

- SDPA: the head count must be static (else no MultiHeadAttention could replace the temporary
  op), a key transposed through ``Reshape -> Transpose -> Reshape`` must be the plain
  ``[B*H, S, Dh]`` merge of its heads, and a softmax guarded by ``Where(IsNaN(p), 0, p)`` stays
  (ORT's ops give NaN for a fully masked row, not 0);
- MultiHeadAttention: the merged output must be ``[B, S, H * Dh]`` (torch's
  ``nn.MultiheadAttention`` merges to ``[S * B, D]``, which the fused op does not produce);
- bias: each bias must be a vector over the hidden dim (not, say, a position term), and either
  operand order of the ``Add`` is accepted (``torch.onnx.export`` writes ``Add(bias, MatMul)``);
- scale: only into a MultiHeadAttention without bias (the op adds the bias before scaling).

Between stages the dead remains are swept, since a stage refuses a match whose nodes have other
readers, and the mask broadcast a MultiHeadAttention rewrite adds reads the query's sequence
length through the projection it is about to absorb; that ``Shape`` is re-pointed at the
projection's input first. The weights and biases the last stages concatenate are folded into
initializers. Extended level only; the package is used for target ``onnxruntime``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule, RewriteRuleSet
from onnxscript.rewriter.ort_fusions import attention, mha, mha_bias, mha_scale, sdpa, sdpa_via_mha

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant

__all__ = ["AttentionFusionPass", "passes", "rules"]

logger = logging.getLogger(__name__)

#: The domain of onnxscript's temporary SDPA op; none may be left in a model.
FUSION_DOMAIN = "ai.onnxruntime._fusion"
MS_DOMAIN = "com.microsoft"


def _dims(value: ir.Value | None) -> tuple[int | ir.SymbolicDim, ...] | None:
    if value is None or value.shape is None:
        return None
    return tuple(value.shape)


def _same(a: int | ir.SymbolicDim, b: int | ir.SymbolicDim) -> bool:
    # A dim without a name (None) equals nothing, not even another unnamed dim.
    if isinstance(a, ir.SymbolicDim) and a.value is None:
        return False
    return bool(a == b)


class GuardedSDPA(sdpa.SDPA):
    """onnxscript's SDPA fusion, with a static head count and a proven key head merge."""

    def check(  # type: ignore[override]
        self,
        context: Any,
        query: ir.Value,
        key: ir.Value,
        value: ir.Value,
        mask: ir.Value | None,
        key_format: str,
        **bindings: Any,
    ) -> MatchResult:
        result = super().check(context, query, key, value, mask, key_format, **bindings)
        if not result:
            return result
        q = _dims(query)
        assert q is not None  # the base check has read it
        if not isinstance(q[1], int):
            return result.fail(f"the head count of {query.name!r} ({q[1]}) is not static", query)
        if any(node.op_type == "IsNaN" for node in context.nodes):
            # Where(IsNaN(p), 0, p) makes a fully masked row 0; ORT's ops give NaN there, which
            # the next layer spreads to every row (0 * NaN in the next attention's MatMul).
            return result.fail(
                "the softmax has a NaN guard for fully masked rows, which ORT's attention lacks"
            )
        k = _dims(key)
        assert k is not None
        for node in context.nodes:
            perm = node.attributes.get_ints("perm", [])
            if node.op_type != "Transpose" or list(perm or []) != [0, 2, 1]:
                continue
            # key [B, H, S, Dh] -> Reshape -> [B*H, S, Dh] -> Transpose -> Reshape -> [B, H, Dh, S]
            merged = _dims(node.inputs[0])
            uses = node.outputs[0].uses()
            split = _dims(uses[0].node.outputs[0]) if len(uses) == 1 else None
            if (
                merged is None
                or split is None
                or len(merged) != 3
                or not (_same(merged[1], k[2]) and _same(merged[2], k[3]))
                or len(split) != 4
                or not all(_same(a, b) for a, b in zip(split, (k[0], k[1], k[3], k[2])))
            ):
                return result.fail(
                    f"the key's 3-D transpose {node.name!r} is not provably a transpose of "
                    f"each head of {key.name!r}",
                    node,
                )
        return result


class GuardedMHA(mha.MultiHeadAttention):
    """onnxscript's MultiHeadAttention fusion, with the merged output's shape proven."""

    def check(self, context: Any, **bindings: Any) -> MatchResult:  # type: ignore[override]
        result = super().check(context, **bindings)
        if not result:
            return result
        query, value = bindings["query_BSD"], bindings["value"]
        out, heads = bindings["attention_reshaped"], bindings["query_BSHDh"]
        q, v, o, h = _dims(query), _dims(value), _dims(out), _dims(heads)
        if q is None or v is None or o is None or h is None or not isinstance(h[2], int):
            return result.fail("the head count or the merged output's shape is unknown", out)
        if len(v) == 3:
            hidden: int | ir.SymbolicDim | None = v[2]
        elif isinstance(v[3], int):
            hidden = h[2] * v[3]
        else:
            hidden = None
        if (
            hidden is None
            or len(o) != 3
            or not (_same(o[0], q[0]) and _same(o[1], q[1]) and _same(o[2], hidden))
        ):
            return result.fail(
                f"the merged attention {out.name!r} has shape {list(o)}, not "
                f"[batch, sequence, hidden] = [{q[0]}, {q[1]}, {hidden}]",
                out,
            )
        return result


class GuardedMHAScale(mha_scale.FuseMHAScale):
    """onnxscript's query-scale fusion, only where the head size is static and there is no bias
    (``MultiHeadAttention`` adds its bias to the query before scaling)."""

    def check(  # type: ignore[override]
        self, context: Any, query: ir.Value, scale: ir.Value, mha_output: ir.Value, **_: Any
    ) -> MatchResult:
        result = MatchResult()
        node = mha_output.producer()
        assert node is not None
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return result.fail(f"{node.name!r} has a bias, added before the scale", node)
        q = _dims(query)
        if q is None or not isinstance(q[-1], int):
            return result.fail(f"the hidden size of {query.name!r} is not static", query)
        base = super().check(context, scale)  # a MatchResult on failure, True on success
        return base if isinstance(base, MatchResult) else result


class GuardedBiasMHA(mha_bias.FuseBiasMHA):
    """onnxscript's bias fusion, only for biases that are vectors over the hidden dim."""

    def check(self, context: Any, **bindings: Any) -> MatchResult:  # type: ignore[override]
        result = super().check(context, **bindings)
        if not result:
            return result
        for role, bias, hidden in (
            ("query", bindings.get("q_bias"), self.Dh_q),
            ("key", bindings.get("k_bias"), self.Dh_k),
            ("value", bindings.get("v_bias"), self.Dh_v),
        ):
            if bias is not None and _dims(bias) != (hidden,):
                return result.fail(
                    f"the {role} bias {bias.name!r} (shape {_dims(bias)}) is not a [{hidden}] vector",
                    bias,
                )
        return result


class ShapeThroughProjection(pattern.RewriteRuleClassBase):
    """``Shape(Add(v, b))`` / ``Shape(Mul(v, s))`` / ``Shape(MatMul(v, W))`` -> ``Shape(v)``
    over the leading dims.

    A vector (or scalar) operand or a 2-D weight changes only the last dim, so the leading dims
    can be read before the projection, which then has no reader besides the attention that
    absorbs it. Keeps the projection (``remove_nodes=False``): it has other readers.
    """

    def __init__(self, op_type: str) -> None:
        super().__init__(f"ShapeThrough{op_type}", remove_nodes=False)
        self.op_type = op_type

    def pattern(self, op: Any, v: Any, w: Any) -> Any:
        return op.Shape(
            getattr(op, self.op_type)(v, w), _allow_other_attributes=True, _outputs=["dims"]
        )

    def check(  # type: ignore[override]
        self, context: Any, v: ir.Value, w: ir.Value, dims: ir.Value, **_: Any
    ) -> MatchResult:
        result = MatchResult()
        vd, wd = _dims(v), _dims(w)
        if vd is None or wd is None or len(vd) < 2:
            return result.fail(f"the rank of {v.name!r} or {w.name!r} is unknown", v)
        if (len(wd) != 2) if self.op_type == "MatMul" else (len(wd) > 1):
            return result.fail(f"{w.name!r} (shape {list(wd)}) may change the leading dims", w)
        node = dims.producer()
        assert node is not None
        rank = len(vd)
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", rank)
        start, end = start + rank if start < 0 else start, end + rank if end < 0 else end
        if not 0 <= start < end <= rank - 1:
            return result.fail(f"{node.name!r} reads the last dim", node)
        return result

    def rewrite(self, op: Any, v: ir.Value, dims: ir.Value, **_: Any) -> Any:
        node = dims.producer()
        assert node is not None
        return op.Shape(v, **node.attributes)


def _ruleset(
    rules: Sequence[RewriteRule] | RewriteRuleSet, *, commute: bool = False
) -> RewriteRuleSet:
    return RewriteRuleSet(list(rules), commute=commute)


def _mha_rules(has_past: bool) -> RewriteRuleSet:
    return _ruleset(
        [
            GuardedMHA.rule(
                f"MHA{'_Rotary' if rotary else ''}{'_Past' if has_past else ''}"
                f"{'_CrossAttention' if cross else ''}",
                is_rotary=rotary,
                has_past_present=has_past,
                is_cross_attention=cross,
            )
            for rotary in (False, True)
            for cross in ((False,) if has_past else (False, True))
        ]
    )


def _fold_constant_concats(graph: ir.Graph) -> None:
    """Fold the ``Concat`` of constant weights or biases that a fused op reads into one
    initializer (the bias and Attention stages concatenate Q, K and V's)."""
    for node in list(graph):
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
            continue
        out = node.outputs[0]
        uses = out.uses()
        if not uses or out.is_graph_output() or any(u.node.domain != MS_DOMAIN for u in uses):
            continue
        arrays = [None if v is None or v.is_graph_input() else constant(v) for v in node.inputs]
        if any(a is None for a in arrays):
            continue
        folded: np.ndarray = np.concatenate(arrays, axis=node.attributes.get_int("axis", 0))  # type: ignore[arg-type]
        name, n = f"{out.name}_folded", 0
        while name in graph.initializers:
            n += 1
            name = f"{out.name}_folded_{n}"
        init = ir.Value(
            name=name,
            shape=ir.Shape(folded.shape),
            type=ir.TensorType(ir.DataType.from_numpy(folded.dtype)),
            const_value=ir.tensor(folded, name=name),
        )
        graph.register_initializer(init)
        out.replace_all_uses_with(init)


def _nodes(model: ir.Model) -> list[ir.Node]:
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes += list(ir.traversal.RecursiveGraphIterator(function))
    return nodes


class AttentionFusionPass(ir.passes.InPlacePass):
    """Attention blocks -> ``com.microsoft`` ``Attention`` / ``MultiHeadAttention`` (see the
    module's docstring for the stages). ``counts`` holds each stage's fusions after a run."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.counts = {}
        if not any(n.op_type == "Softmax" and n.domain in ("", "ai.onnx") for n in _nodes(model)):
            return ir.passes.PassResult(model, False)
        # The SDPA stage tells query, key and value apart by their shapes.
        common_passes.ShapeInferencePass()(model)
        sweep = common_passes.RemoveUnusedNodesPass()

        def stage(name: str, ruleset: RewriteRuleSet) -> int:
            count = ruleset.apply_to_model(model)
            self.counts[name] = count
            if count:
                sweep(model)
            return count

        if not stage("sdpa", _ruleset([GuardedSDPA.rule()])):
            return ir.passes.PassResult(model, False)
        mha_count = stage("mha_past", _mha_rules(True)) + stage("mha", _mha_rules(False))
        if mha_count:
            # A Shape may have to move through Mul(scale), Add(bias) then MatMul(weight).
            shape_rules = [ShapeThroughProjection.rule(t) for t in ("Add", "Mul", "MatMul")]
            for _ in range(3):
                if not stage("shape", _ruleset(shape_rules, commute=True)):
                    break
            stage("mha_scale", _ruleset([GuardedMHAScale.rule()]))
            if stage("mha_bias", _ruleset([GuardedBiasMHA.rule()], commute=True)):
                stage("attention", attention.attention_rules)
        stage("sdpa_via_mha", _ruleset([sdpa_via_mha.SDPAImplementation.rule()]))
        self.counts.pop("shape", None)

        left = [n for n in _nodes(model) if n.domain == FUSION_DOMAIN]
        if left:
            # GuardedSDPA admits only what sdpa_via_mha can lower: a leftover is a bug here.
            raise RuntimeError(
                f"ferry's attention fusion left {len(left)} temporary {FUSION_DOMAIN} op(s) "
                f"({left[0].name!r}) in the model; please report this with the model"
            )
        model.opset_imports.pop(FUSION_DOMAIN, None)
        for function in model.functions.values():
            function.opset_imports.pop(FUSION_DOMAIN, None)
        _fold_constant_concats(model.graph)
        sweep(model)
        logger.debug("attention fusions: %s", self.counts)
        return ir.passes.PassResult(model, True)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """No single-pattern rules: the fusion runs in stages (``passes``)."""
    return []


def passes(ctx: RuleContext) -> list[ir.passes.PassBase]:
    """The staged attention fusion, at the extended level."""
    return [AttentionFusionPass()] if ctx.extended else []
