"""Numeric checks for optimizer rules: run a model through ONNX Runtime before and after a rewrite
and compare, and count what the rewrite left."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from ferry.optimizer._rewrite import apply_rules
from ferry.optimizer.rules import RuleContext


def run_ort(model: onnx.ModelProto | ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` in ONNX Runtime on the CPU, without ORT's own graph optimizations (so that the
    comparison sees our rewrite, not ORT's)."""
    proto = ir.serde.serialize_model(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, dict(feeds))


def ops(model: ir.Model) -> Counter[str]:
    """Op types in the main graph and every subgraph."""
    return Counter(node.op_type for node in ir.traversal.RecursiveGraphIterator(model.graph))


def rewritten(
    proto: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    rules: Sequence[object] | ModuleType | Callable[[ir.Model], object],
    *,
    ctx: RuleContext | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> ir.Model:
    """Rewrite ``proto`` with ``rules`` (a rule list, a rule module, or a function of the model),
    check in ONNX Runtime that every output still agrees on ``feeds``, and return the result."""
    onnx.checker.check_model(proto, full_check=True)
    want = run_ort(proto, feeds)
    model = ir.from_proto(proto)
    if callable(rules) and not isinstance(rules, ModuleType):
        rules(model)
    else:
        apply_rules(model, rules, ctx)  # type: ignore[arg-type]
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    got = run_ort(out, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return model
