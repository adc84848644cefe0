"""A 2-D MatMul and the bias added after it, as one Gemm (onnxscript's rules, guarded).

Before -> After::

    Add(MatMul(A[M, K], B[K, N]), C)             ->  Gemm(A, B, C)
    Add(C, MatMul(A, B))                         ->  Gemm(A, B, C)
    Add(MatMul(Transpose(A), B), C)              ->  Gemm(A, B, C, transA=1)   (and transB, both)

onnxscript's rules check the ranks of A and B but not C: Gemm broadcasts C one way, to
``[M, N]``, where Add broadcasts both ways, so a ``C`` of rank 3 or of ``[M2, N]`` against
``M = 1`` would make Add's result larger than Gemm's. These match only a C that fits ``[M, N]``.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule
from onnxscript.rewriter.rules.common import _matmul_add_to_gemm as upstream

from ferry.optimizer.rules._context import RuleContext

__all__ = ["rules"]


def _c_fits(a: ir.Value, b: ir.Value, c: ir.Value, trans_a: bool, trans_b: bool) -> str | None:
    """None when ``c`` broadcasts one way to the ``[M, N]`` result; else why not."""
    if a.shape is None or b.shape is None or c.shape is None:
        return "a shape is unknown"
    if c.shape.rank() > 2:
        return f"the bias has rank {c.shape.rank()}; Gemm's is at most 2"
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    for have, want in zip(reversed(list(c.shape)), (n, m), strict=False):
        if have != 1 and have != want:
            return f"the bias's shape {list(c.shape)} does not broadcast to [M, N] one way"
    return None


class _Guarded(upstream._MatMulAddToGemmBase):
    """Adds the bias check to onnxscript's MatMul+Add -> Gemm rules (each subclass takes its
    pattern and ``trans_a``/``trans_b`` from the upstream rule after this in its bases)."""

    # Narrowed like the upstream rule it guards (PatternBase takes *args).
    def check(self, context: Any, input_a: Any, input_b: Any, **kwargs: Any) -> MatchResult:  # type: ignore[override]
        result: MatchResult = super().check(context, input_a, input_b, **kwargs)
        if not result:
            return result
        problem = _c_fits(input_a, input_b, kwargs["input_c"], self.trans_a, self.trans_b)
        return result.fail(problem) if problem else result


class MatMulAddToGemm(_Guarded, upstream.MatMulAddToGemm):
    """``Add(MatMul(A, B), C) -> Gemm(A, B, C)``"""


class TransAMatMulAddToGemm(_Guarded, upstream.TransAMatMulAddToGemm):
    """``Add(MatMul(Transpose(A), B), C) -> Gemm(A, B, C, transA=1)``"""


class TransBMatMulAddToGemm(_Guarded, upstream.TransBMatMulAddToGemm):
    """``Add(MatMul(A, Transpose(B)), C) -> Gemm(A, B, C, transB=1)``"""


class TransABMatMulAddToGemm(_Guarded, upstream.TransABMatMulAddToGemm):
    """``Add(MatMul(Transpose(A), Transpose(B)), C) -> Gemm(A, B, C, transA=1, transB=1)``"""


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level; each rule also in its ``Add(C, MatMul)`` order."""
    found: list[RewriteRule] = []
    for cls in (
        MatMulAddToGemm,
        TransAMatMulAddToGemm,
        TransBMatMulAddToGemm,
        TransABMatMulAddToGemm,
    ):
        found += cls.rule().commute()
    return found
