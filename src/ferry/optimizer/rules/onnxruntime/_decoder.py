"""A decoder's residual Add and the RMSNorm after it fused into ONNX Runtime's
``SkipSimplifiedLayerNormalization``.

Decoders exported by ``torch.onnx``, optimum and the like write each llama-family block's
``residual + sublayer`` sum and the RMSNorm that reads it as a dozen standard ops. Measured on
onnxruntime 1.32's CPU provider at ``ORT_ENABLE_ALL`` (the level ferry's sessions run), ORT fuses
the norm alone into ``SimplifiedLayerNormalization`` but never takes the residual ``Add`` in:
neither from the decomposition nor from an existing ``SimplifiedLayerNormalization``, and its
``SkipLayerNormalization`` fusion refuses a sum that is read again, which every decoder's residual
is. So this module fuses the pair::

    s = Add(a, b)
    y = Mul(w, Mul(s, Div(1, Sqrt(Add(ReduceMean(Pow(s, 2), axes=[-1]), eps)))))
                    ->  y, _, _, s = com.microsoft.SkipSimplifiedLayerNormalization(a, b, w, eps)
    s = Add(a, b);  y = SimplifiedLayerNormalization(s, w, axis=-1)
                    ->  the same

in the spellings exporters write: ``Pow(s, 2)`` or ``Mul(s, s)``; the ``ReduceMean`` axes as an
attribute (opset < 18) or an input; ``eps`` on either side of its ``Add``; ``Div(s, std)``,
``Mul(s, Reciprocal(std))`` or ``Mul(s, Div(1, std))`` (``torch.rsqrt``) either way round; the
weight on either side of the last ``Mul``. Transformers' ``LlamaRMSNorm`` casts to float32 and
back around the norm; in a float32 model those Casts are no-ops that onnxscript's cast rules
(run earlier in each pipeline round) remove, so they need no spelling here. The sum ``s`` is the
op's fourth output, so the next block's residual still reads it.

Guards (a failed one names itself in the rewriter's trace): float32 only (the type the contrib
kernel is measured with here); the mean over the last axis only with ``keepdims=1``; ``eps`` a
scalar constant; the weight a constant ``[D]`` vector with ``D`` the summed tensor's last dim;
``a`` and ``b`` of one shape, rank 2 or 3 (the op's contract: no broadcasting between them).
ONNX's shape inference loses a decoder's batch and sequence names through the attention's
computed reshapes and mask broadcasts, so where the recorded shapes cannot tell, the pass asks
ONNX Runtime's symbolic shape inference, without its ``auto_merge`` (which would assume two
broadcast dims equal): two dims it names alike are equal. A norm with no residual ``Add``
before it (a decoder's first block) is left as it is: ORT fuses that one itself, and a rule for
it would change nothing ORT runs.

Not here, measured the same way: ``DequantizeLinear`` (blocked, 4-bit) feeding ``MatMul`` ORT
turns into ``MatMulNBits`` itself at the extended level. The rotary embedding (``rotate_half``'s
``Slice``/``Neg``/``Concat`` and the cos/sin ``Mul``/``Add``) ORT leaves unfused, but its
``com.microsoft.RotaryEmbedding`` reads cos/sin from caches indexed by position, whose length an
exported graph does not state (it computes cos/sin from the positions for any length): a cache of
a guessed length turns every later position into a run-time error ("position_ids value .. is out
of range"), and one rebuilt in the graph up to the largest position would compute a cosine per
past position on every decode step where the export computes one per new token.
Extended level only.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule, RewriteRuleSet

from ferry.graph import inference_proto
from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._activations import (
    element_type,
    overridable_operand,
    scalar_operand,
)
from ferry.optimizer.rules.common._constants import constant, replace_value

# The mean's axes are checked exactly as the LayerNormalization fusion checks them.
from ferry.optimizer.rules.common._layer_norm import _reduces_last_axis

__all__ = ["SkipRMSNormFusion", "SkipRMSNormPass", "passes", "rules"]

logger = logging.getLogger(__name__)

#: ONNX Runtime's contrib op domain, and the op the rules write there.
MS_DOMAIN = "com.microsoft"
FUSED_OP = "SkipSimplifiedLayerNormalization"


#: A value's dims as a shape inference found them: ints, symbol names, None where unknown.
Dims = tuple[int | str | None, ...]


def _recorded(value: ir.Value) -> Dims | None:
    if value.shape is None:
        return None
    # An unnamed symbolic dim equals nothing, not even another unnamed one.
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def _dims(value: ir.Value, inferred: dict[str, Dims]) -> Dims | None:
    """``value``'s recorded dims where every one is known, else the symbolic inference's."""
    recorded = _recorded(value)
    if recorded is not None and all(d is not None for d in recorded):
        return recorded
    return inferred.get(value.name or "", recorded)


def _same_shape(a: ir.Value, b: ir.Value, inferred: dict[str, Dims]) -> bool:
    """Whether the recorded shapes, or else the symbolic inference's, show ``a`` and ``b`` of
    one shape (ONNX's inference names an unknown dim ``unk__N``, so recorded names that differ
    prove nothing either way)."""
    for da, db in (
        (_recorded(a), _recorded(b)),
        (inferred.get(a.name or ""), inferred.get(b.name or "")),
    ):
        if (
            da is not None
            and db is not None
            and len(da) == len(db)
            and all(x is not None and x == y for x, y in zip(da, db))
        ):
            return True
    return False


def symbolic_dims(model: ir.Model) -> dict[str, Dims]:
    """Each value's dims by ONNX Runtime's symbolic shape inference without ``auto_merge``, as
    far as it got; empty where it is unavailable (it needs sympy)."""
    try:
        from onnxruntime.tools import symbolic_shape_infer
    except Exception as e:  # ImportError without sympy or onnxruntime
        logger.debug("symbolic shape inference is unavailable: %s", e)
        return {}
    tool_logger = logging.getLogger(symbolic_shape_infer.__name__)
    level = tool_logger.level
    # It warns once per broadcast it cannot name ("unsupported broadcast"): an answer, not news.
    tool_logger.setLevel(logging.ERROR)
    inference = symbolic_shape_infer.SymbolicShapeInference(2**31 - 1, False, False, 0)
    try:
        inference._preprocess(inference_proto(model))
        while inference.run_:
            inference._infer_impl()
    except Exception as e:  # best effort: what it found before stopping still holds
        logger.debug("symbolic shape inference stopped early: %s", e)
    finally:
        tool_logger.setLevel(level)
    found: dict[str, Dims] = {}
    for name, info in getattr(inference, "known_vi_", {}).items():
        if not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
            continue
        found[name] = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in info.type.tensor_type.shape.dim
        )
    return found


class SkipRMSNormFusion(pattern.RewriteRuleClassBase):
    """``Add`` then RMSNorm (decomposed, or ORT's ``SimplifiedLayerNormalization``) ->
    ``com.microsoft.SkipSimplifiedLayerNormalization``.

    Args:
        form: ``"decomposed"`` with the ``ReduceMean`` axes as an attribute,
            ``"decomposed_axes_input"`` with them as an input (opset >= 18), or ``"fused"``: a
            ``SimplifiedLayerNormalization`` already there.
        swap_root: the weight is the last ``Mul``'s first operand (``w * norm(s)``, as
            transformers writes it); decomposed forms only.
        inferred: value name -> dims from :func:`symbolic_dims`, filled by the pass that runs
            the rule; consulted where the recorded shapes cannot tell.
    """

    def __init__(
        self,
        form: str = "decomposed",
        swap_root: bool = False,
        inferred: dict[str, Dims] | None = None,
    ) -> None:
        super().__init__(f"SkipRMSNorm_{form}{'_swapped' if swap_root else ''}")
        self.form = form
        self.swap_root = swap_root
        self.inferred = inferred if inferred is not None else {}

    def pattern(self, op: Any, s: Any, w: Any, epsilon: Any) -> Any:
        # One output: the sum ``s`` is an input of the match, its Add checked in ``check``
        # (onnxscript matches a two-output pattern by scanning the whole graph per node).
        if self.form == "fused":
            return op.SimplifiedLayerNormalization(
                s, w, _allow_other_attributes=True, _outputs=["norm"]
            )
        squared = pattern.OrValue([op.Pow(s, pattern.Constant(2.0)), op.Mul(s, s)])
        if self.form == "decomposed_axes_input":
            mean = op.ReduceMean(
                squared, pattern.Var("axes"), _allow_other_attributes=True, _outputs=["mean"]
            )
        else:
            mean = op.ReduceMean(squared, _allow_other_attributes=True, _outputs=["mean"])
        std = op.Sqrt(pattern.OrValue([op.Add(mean, epsilon), op.Add(epsilon, mean)]))
        inverse = pattern.OrValue([op.Reciprocal(std), op.Div(pattern.Constant(1.0), std)])
        normalized = pattern.OrValue([op.Div(s, std), op.Mul(s, inverse), op.Mul(inverse, s)])
        return op.Mul(w, normalized) if self.swap_root else op.Mul(normalized, w)

    def check(  # type: ignore[override]
        self,
        context: Any,
        s: ir.Value,
        w: ir.Value,
        epsilon: ir.Value | None = None,
        mean: ir.Value | None = None,
        norm: ir.Value | None = None,
        **_: Any,
    ) -> MatchResult:
        result = MatchResult()
        add = s.producer()
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            return result.fail(f"{s.name!r} is not the output of an Add", s)
        a, b = add.inputs[0], add.inputs[1]
        assert a is not None and b is not None
        self._operands = (a, b)
        dtype = element_type(s, [a, b, w])
        if dtype != ir.DataType.FLOAT:
            return result.fail(f"{s.name!r} is of type {dtype}, not float32", s)
        if not _same_shape(a, b, self.inferred):
            return result.fail(
                f"{a.name!r} {_dims(a, self.inferred)} and {b.name!r} {_dims(b, self.inferred)} "
                "are not provably of one shape",
                a,
            )
        dims = _dims(a, self.inferred)
        assert dims is not None
        d = dims[-1] if len(dims) in (2, 3) else None
        if not isinstance(d, int):
            return result.fail(f"{a.name!r} is not [B, S, D] or [N, D] with D static", a)
        weight = None if w.is_graph_input() else constant(w)
        if weight is None or weight.shape != (d,):
            return result.fail(f"the weight {w.name!r} is not a constant [{d}] vector", w)
        if (default := overridable_operand(context)) is not None:
            return result.fail(f"{default.name!r} is a graph input with a default", default)
        if norm is not None:
            node = norm.producer()
            assert node is not None
            axis = node.attributes.get_int("axis", -1)
            if axis not in (-1, len(dims) - 1):
                return result.fail(f"{node.name!r} normalizes from axis {axis}", node)
            if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
                return result.fail(f"{node.name!r}'s inverse-std output is read", node)
            self._epsilon = node.attributes.get_float("epsilon", 1e-5)
            return result
        assert mean is not None
        if (why := _reduces_last_axis(mean, s)) is not None:
            return result.fail(why, mean)
        eps = scalar_operand(epsilon, s)
        if eps is None:
            return result.fail(f"epsilon {getattr(epsilon, 'name', None)!r} is not a constant")
        self._epsilon = float(np.float32(eps))
        return result

    def rewrite(self, op: Any, w: ir.Value, **_: Any) -> Any:
        a, b = self._operands
        # The sum output is unread here; SkipRMSNormPass moves the Add's readers onto it.
        y, _mean, _inv_std, _sum = op.SkipSimplifiedLayerNormalization(
            a, b, w, epsilon=self._epsilon, _outputs=4, _domain=MS_DOMAIN
        )
        return y


class SkipRMSNormPass(ir.passes.InPlacePass):
    """The fusion, with ONNX Runtime's symbolic shape inference run first where a candidate
    (a residual ``Add`` read by a norm) is there to prove shapes for."""

    def __init__(self) -> None:
        super().__init__()
        self.inferred: dict[str, Dims] = {}
        decomposed = [
            SkipRMSNormFusion.rule(form, swap, self.inferred)
            for form in ("decomposed", "decomposed_axes_input")
            for swap in (False, True)
        ]
        self.rules = RewriteRuleSet(
            [*decomposed, SkipRMSNormFusion.rule("fused", False, self.inferred)]
        )

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not any(_reads_a_sum(node) for node in model.graph):
            return ir.passes.PassResult(model, False)
        self.inferred.update(symbolic_dims(model))
        try:
            count = self.rules.apply_to_model(model)
        finally:
            self.inferred.clear()
        if count:
            _share_sums(model.graph)
        logger.debug("residual + RMSNorm fusions: %d", count)
        return ir.passes.PassResult(model, bool(count))


def _share_sums(graph: ir.Graph) -> None:
    """Each fused op's ``Add(a, b)`` read elsewhere (the next residual) is read from the op's
    fourth output instead, the op moved up to where the Add was (it reads only the Add's inputs
    and a constant), so the Add is left dead for the sweep."""
    for node in list(graph):
        if node.op_type != FUSED_OP or node.domain != MS_DOMAIN or node.outputs[3].uses():
            continue
        a, b = node.inputs[0], node.inputs[1]
        assert a is not None and b is not None
        add = next(
            (
                use.node
                for use in a.uses()
                if use.node.op_type == "Add"
                and use.node.domain in ("", "ai.onnx")
                and use.node.graph is graph
                and {id(v) for v in use.node.inputs} == {id(a), id(b)}
                and len(use.node.inputs) == 2
            ),
            None,
        )
        if add is None:
            continue
        graph.remove(node)
        graph.insert_after(add, node)
        replace_value(graph, add.outputs[0], node.outputs[3])


def _reads_a_sum(node: ir.Node) -> bool:
    """Whether ``node`` may open a match: a square or a fused norm of an ``Add``'s output."""
    if node.op_type not in ("Pow", "Mul", "SimplifiedLayerNormalization") or not node.inputs:
        return False
    source = node.inputs[0]
    if node.op_type == "Mul" and (len(node.inputs) != 2 or node.inputs[1] is not source):
        return False  # a square is Mul(s, s)
    producer = source.producer() if source is not None else None
    return producer is not None and producer.op_type == "Add"


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """No rules on their own: the fusion needs its shape inference first (``passes``)."""
    return []


def passes(ctx: RuleContext) -> list[ir.passes.PassBase]:
    """The residual + RMSNorm fusion, at the extended level."""
    return [SkipRMSNormPass()] if ctx.extended else []
