"""The small model the adapter checks run, built in code, and what they share: compiling it whole
on a backend, its reference answers (ONNX Runtime through ferry), and comparing answers.

The model is ``x[batch, 8] -> Gemm -> Relu -> Gemm -> y[batch, 4]``: ops every engine in ferry
takes (the example NPU adapter too), a symbolic batch (the dynamic-sizes check), weights (the
engine cache hashes them) and a Relu whose wrong answer shows in the output. A backend whose
rules take neither op is not asked to run it (:func:`probe_refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from ferry.backends import Backend, CompiledPartition, CompileSpec

__all__ = [
    "PROBE_INPUT",
    "PROBE_OUTPUT",
    "PROBE_WIDTH",
    "compile_whole",
    "differs",
    "probe_feeds",
    "probe_model",
    "probe_refusal",
    "reference",
]

PROBE_INPUT = "x"
PROBE_OUTPUT = "y"
#: Features of the probe model's input.
PROBE_WIDTH = 8
_HIDDEN = 16
_CLASSES = 4


def probe_model(batch: int | str = "batch") -> onnx.ModelProto:
    """The probe model, its batch dim symbolic (a name) or fixed (an int)."""
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((PROBE_WIDTH, _HIDDEN)).astype(np.float32)
    b1 = rng.standard_normal(_HIDDEN).astype(np.float32)
    w2 = rng.standard_normal((_HIDDEN, _CLASSES)).astype(np.float32)
    b2 = rng.standard_normal(_CLASSES).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", [PROBE_INPUT, "w1", "b1"], ["g1"], name="gemm1"),
        helper.make_node("Relu", ["g1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], [PROBE_OUTPUT], name="gemm2"),
    ]
    inits = [
        numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))
    ]
    graph = helper.make_graph(
        nodes,
        "ferry_conformance_probe",
        [helper.make_tensor_value_info(PROBE_INPUT, TensorProto.FLOAT, [batch, PROBE_WIDTH])],
        [helper.make_tensor_value_info(PROBE_OUTPUT, TensorProto.FLOAT, [batch, _CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def probe_refusal(backend: Backend) -> str | None:
    """Why ``backend``'s rules do not take the probe model (its first node refused), or None when
    they take every node (or it publishes no rules: then the engine is asked directly)."""
    from ferry.backends import rule_table
    from ferry.graph import prepare

    table = rule_table(backend)
    if table is None:
        return None
    model = prepare(ir.from_proto(probe_model()))
    for node in model.graph:
        verdict = table.supports(node, model.opset_imports)
        if verdict is not True:
            return (
                f"its rules do not take the probe model's {node.op_type} ({verdict}): "
                "nothing of it to check"
            )
    return None


def probe_feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the probe model at ``batch`` rows; ``seed`` gives other values (half negative, so
    that the Relu matters)."""
    rng = np.random.default_rng(seed)
    return {PROBE_INPUT: rng.standard_normal((batch, PROBE_WIDTH)).astype(np.float32)}


def reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's answers on ONNX Runtime alone (through ferry, no engine cache): the truth the
    checks compare with."""
    from ferry.runtime import load

    return load(model, backends=["onnxruntime"], cache_dir=False).run(dict(feeds))


def compile_whole(
    backend: Backend, model: onnx.ModelProto, options: Mapping[str, Any] | None = None
) -> tuple[CompiledPartition, CompileSpec]:
    """``model`` compiled whole on ``backend`` through the adapter API, as the Session would a
    one-partition plan; with the spec (``load`` needs it)."""
    from ferry.backends import CompileSpec
    from ferry.graph import prepare
    from ferry.plan import Plan

    prepared = prepare(ir.from_proto(model))
    opts = dict(options or {"threads": 1})
    partition = Plan.whole_graph(prepared, backend.name, opts).partitions[0]
    spec = CompileSpec(partition=partition, model=prepared, options=opts)
    return backend.compile(spec), spec


def differs(
    got: Mapping[str, Any], want: Mapping[str, np.ndarray], *, exact: bool = False
) -> str | None:
    """None when ``got`` answers ``want`` (every output of ``want``, within ferry's default
    tolerance for its dtype, or bit for bit with ``exact``), else one line saying what differs."""
    from ferry.parity import compare_outputs

    missing = [n for n in want if n not in got]
    if missing:
        return f"output {', '.join(map(repr, missing))} missing from the answer"
    picked = {n: np.asarray(got[n]) for n in want}
    report = compare_outputs(picked, dict(want), tolerance=(0.0, 0.0) if exact else None)
    for out in report.outputs:
        if not out.passed:
            from ferry.conformance._compare import mismatch_text

            return f"{out.name}: {mismatch_text(out)}"
    return None
