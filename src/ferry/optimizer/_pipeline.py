"""The optimization pipeline: onnx_ir's and onnxscript's passes, then ferry's rule modules, to a
fixed point.

Before -> After::

    exported graph (Constant-node weights, folding leftovers, unfused BatchNorms and biases,
    transpose pairs, Cast chains, shape arithmetic, reshape chains)
        -> the same function in fewer, larger nodes; weights as deduplicated initializers

The loop repeats until a round changes nothing (at most :data:`MAX_ROUNDS`), so running the
pipeline on its own output changes nothing: optimization is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript import rewriter
from onnxscript.optimizer._constant_folding import (
    DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
    DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
    FoldConstantsPass,
)
from onnxscript.rewriter.pattern import RewriteRule
from onnxscript.rewriter.rules.common import _materialize_reshape_shape, _no_op

from ferry.errors import InvalidInputError
from ferry.graph import INTEGER_WEIGHTS, with_input_shapes
from ferry.optimizer._rewrite import module_passes
from ferry.optimizer.rules import LEVELS, TARGETS, RuleContext, rule_modules

__all__ = ["MAX_ROUNDS", "FixInputShapesPass", "LegalReshapesPass", "pipeline", "rule_context"]

logger = logging.getLogger(__name__)

#: Rounds of folding and rewriting before the pipeline gives up on reaching a fixed point.
MAX_ROUNDS = 8


class FixInputShapesPass(ir.passes.InPlacePass):
    """Fix the named inputs' sizes, so shape arithmetic can fold (``--fix-shapes``).

    Before -> After::

        input x: [N, 3, H, W], values inside: shapes in N, H, W
            -> input x: [1, 3, 224, 224], values inside: shapes cleared (inferred again)

    Raises:
        InvalidInputError: a name is not an input, or a size contradicts a fixed dim or the rank.
    """

    def __init__(self, shapes: Mapping[str, Sequence[int]]) -> None:
        super().__init__()
        self.shapes = {name: tuple(int(d) for d in dims) for name, dims in shapes.items()}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # Graph outputs keep their declared shapes: the model goes back to the user.
        with_input_shapes(
            model, self.shapes, in_place=True, keep_output_shapes=True, option="--fix-shapes"
        )
        return ir.passes.PassResult(model, modified=bool(self.shapes))


class LegalReshapesPass(ir.passes.InPlacePass):
    """Reshape's ``allowzero`` dropped where the model's opset predates it (onnxscript's rules
    write it at every opset; ONNX Runtime then refuses the model).

    Before -> After (opset < 14)::

        Reshape(x, [2, -1], allowzero=0)  ->  Reshape(x, [2, -1])
        Reshape(x, [2, -1], allowzero=1)  ->  Reshape(x, [2, -1])     (no 0 in the target)
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.opset_imports.get("", 14) >= 14:
            return ir.passes.PassResult(model, modified=False)
        modified = False
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
                continue
            if "allowzero" not in node.attributes:
                continue
            target = node.inputs[1].const_value if len(node.inputs) > 1 and node.inputs[1] else None
            if node.attributes.get_int("allowzero", 0) and (
                target is None or 0 in target.numpy().tolist()
            ):
                continue  # cannot be said at this opset; verification will refuse the model
            del node.attributes["allowzero"]
            modified = True
        return ir.passes.PassResult(model, modified=modified)


def rule_context(
    model: ir.Model, level: str, target: str | None, fix_shapes: bool = False
) -> RuleContext:
    """The :class:`RuleContext` for ``model``, checking ``level`` and ``target``."""
    if level not in LEVELS:
        raise InvalidInputError(
            f"unknown optimization level {level!r}; use one of {', '.join(LEVELS)}"
        )
    if target is not None and target not in TARGETS:
        raise InvalidInputError(
            f"unknown optimization target {target!r}; use one of {', '.join(TARGETS)} "
            "(or none: rules valid for every engine)"
        )
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    return RuleContext(level=level, target=target, opset=opset, fix_shapes=fix_shapes)


#: A ConstantOfShape up to this many elements is folded (onnxscript keeps them all, so that a
#: model does not grow; a small one is shape arithmetic, e.g. PyTorch's pads for F.pad).
_SMALL_CONSTANT_OF_SHAPE = 1024
#: An int8 constant up to this many elements widened by a Cast is folded (arithmetic on a few
#: numbers, not a stored weight).
_SMALL_INTEGER_CAST = 16


def _should_fold(node: ir.Node) -> bool | None:
    """Fold small ConstantOfShape nodes; keep stored reduced-precision weights as they are;
    leave every other choice to onnxscript (None).

    A DequantizeLinear of a constant is how a QDQ model hands an engine its int8 weight (folded,
    the engine sees a float Conv and the model grows 4x); a Cast widening an int8 constant is a
    weight-only int8 model's weight (folded, the model is no longer weight-only int8)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "DequantizeLinear":
        return False
    if node.op_type == "Cast" and node.inputs and node.inputs[0] is not None:
        stored = node.inputs[0].const_value
        if stored is not None and stored.dtype in INTEGER_WEIGHTS:
            return stored.size <= _SMALL_INTEGER_CAST
    if node.op_type != "ConstantOfShape":
        return None
    shape = node.inputs[0].const_value if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return None
    return int(np.prod(shape.numpy())) <= _SMALL_CONSTANT_OF_SHAPE


def _onnxscript_rules() -> list[RewriteRule]:
    """onnxscript's default rules (cast/transpose/reshape pairs, min/max to Clip, Pad into Conv,
    BatchNormalization into Conv/ConvTranspose/Gemm, ...) but two that change results on real
    models: its no-op arithmetic matches ``x + 1e-10`` as ``x + 0`` (NaNs where a log needed the
    epsilon: ``rules/common/_noop`` is exact), and its Reshape materialization trusts declared
    output shapes, which exporters get wrong (``rules/common/_shapes`` infers them)."""
    dropped = {id(r) for r in (*_no_op.rules, *_materialize_reshape_shape.rules)}
    kept = {id(r) for r in (_no_op.dropout_zero_rule, _no_op.dropout_inference_rule)}
    return [r for r in rewriter._DEFAULT_REWRITE_RULES if id(r) not in dropped or id(r) in kept]


def pipeline(ctx: RuleContext) -> ir.passes.Sequential:
    """The passes that optimize a model for ``ctx``, in order."""
    rounds: list[ir.passes.PassBase] = [
        FoldConstantsPass(
            shape_inference=True,
            input_size_limit=DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
            output_size_limit=DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
            should_fold=_should_fold,
        ),
        rewriter.RewritePass(_onnxscript_rules()),
    ]
    for module in rule_modules(ctx.target):
        rounds += module_passes(module, ctx)
    rounds += [
        common_passes.IdentityEliminationPass(),
        common_passes.RemoveUnusedNodesPass(),
        # Folding makes Constant nodes; rules read weights from initializers.
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        # Subgraph (If/Loop body) constants join the main graph, where the next round folds them.
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
    ]
    return ir.passes.Sequential(
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        ir.passes.PassManager(rounds, steps=MAX_ROUNDS, early_stop=True),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.RemoveUnusedFunctionsPass(),
        common_passes.RemoveUnusedOpsetsPass(),
        LegalReshapesPass(),
        # Exporters' per-node debug records (PyTorch writes each node's stack trace): a fifth of
        # a small model's file, nothing an engine reads. The model's own metadata stays.
        common_passes.ClearMetadataAndDocStringPass(),
    )
