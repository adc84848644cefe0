"""Graph optimization: a verified pass pipeline on ``onnx_ir`` with rewrite rules per target.

``optimize(model, level=..., target=..., fix_shapes=...)`` runs onnx_ir's and onnxscript's passes
and ferry's rules (``rules/common`` for every engine, ``rules/<target>`` where that engine
gains), to a fixed point; then checks the result computes what the input did and runs no slower,
and keeps the input otherwise.
"""

from __future__ import annotations

from ferry.optimizer._compress import (
    STAGES,
    CompressReport,
    CompressResult,
    Stage,
    StageRow,
    compress,
    parse,
)
from ferry.optimizer._optimize import (
    LatencyCheck,
    OptimizeReport,
    OptimizeResult,
    optimize,
    optimized_for_load,
)
from ferry.optimizer._pipeline import MAX_ROUNDS, FixInputShapesPass, pipeline, rule_context
from ferry.optimizer.rules import LEVELS, TARGETS, RuleContext

__all__ = [
    "LEVELS",
    "MAX_ROUNDS",
    "STAGES",
    "TARGETS",
    "CompressReport",
    "CompressResult",
    "FixInputShapesPass",
    "LatencyCheck",
    "OptimizeReport",
    "OptimizeResult",
    "RuleContext",
    "Stage",
    "StageRow",
    "compress",
    "optimize",
    "optimized_for_load",
    "parse",
    "pipeline",
    "rule_context",
]
