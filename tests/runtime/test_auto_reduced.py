"""``backends="auto"`` on sources already reduced in precision (issue 32): each engine at each
precision it offers, labelled by what its engine computed of the source's int8, all judged at the
task.

A static QDQ CNN (ONNX Runtime's ``quantize_static``): OpenVINO's low-precision transformations run
its convolutions in u8, so its candidates are ``openvino int8 (QDQ)`` (precision ``int8``) and
``openvino int8 (QDQ) + bf16``, never ``openvino fp32``. The same CNN quantized dynamically
(``DynamicQuantizeLinear`` + ``ConvInteger``): OpenVINO refuses ``DynamicQuantizeLinear`` and runs
``ConvInteger`` in float, so its split candidates say ``widens dynamic int8``, and a split plan
still competes only if it beats ONNX Runtime alone.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.graph import prepare, reduced_precision
from ferry.parity import within_budget
from ferry.plan import Plan
from ferry.runtime import auto_plan
from ferry.runtime._auto import Candidate, choose
from ferry.runtime._auto_candidates import Computed

pytest.importorskip("openvino")


def _cnn() -> onnx.ModelProto:
    """x [1, 3, 16, 16] -> Conv 3x3 -> Relu -> Conv 3x3 -> Relu -> mean -> Gemm -> logits [1, 10]."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    weights = {"w1": w(16, 3, 3, 3), "w2": w(16, 16, 3, 3), "fc": w(16, 10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(seed: int = 7) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _quantized(dynamic: bool) -> ir.Model:
    """The CNN quantized by ONNX Runtime's tools: static QDQ, or dynamic int8."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([_feeds(seed) for seed in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(_cnn(), source)
        if dynamic:
            quantize_dynamic(source, out)
        else:
            quantize_static(source, out, Feeds(), quant_format=QuantFormat.QDQ)
        return prepare(ir.from_proto(onnx.load(out)))


@pytest.fixture(scope="module")
def qdq() -> ir.Model:
    model = _quantized(dynamic=False)
    assert reduced_precision(model).kinds == ("static QDQ",)
    return model


@pytest.fixture(scope="module")
def dynamic() -> ir.Model:
    model = _quantized(dynamic=True)
    assert "dynamic int8" in reduced_precision(model).kinds
    return model


def _rows(model: ir.Model) -> tuple[dict[str, dict], str, str]:
    choice = auto_plan(model, backends=["openvino"], feeds=_feeds(), cache=False, budget_s=0.3)
    rows = {row["label"]: row for row in choice.table}
    assert len(rows) == len(choice.table), "labels must tell candidates apart"
    assert choice.label in rows
    return rows, choice.judge, choice.label


def _judged_at_the_task(rows: dict[str, dict]) -> None:
    for label, row in rows.items():
        assert row["passed"], (label, row)
        assert {j["kind"] for j in row["accuracy"]["judgements"]} == {"top1"}, (label, row)


def test_a_qdq_source_on_openvino_is_labelled_int8(qdq: ir.Model) -> None:
    rows, judge, _ = _rows(qdq)
    assert "top1 on 'logits'" in judge and "static QDQ source" in judge
    _judged_at_the_task(rows)
    # ONNX Runtime computes the source's int8 (QLinearConv, QGemm): its row says so.
    base = rows["onnxruntime int8 (QDQ)"]
    assert base["precision"] == "int8" and base["speedup"] == 1.0
    assert base["computes"].startswith("onnxruntime: int8 in ")
    # OpenVINO at each precision it offers, each computing the QDQ layers in int8.
    ov = rows["openvino int8 (QDQ)"]
    assert ov["precision"] == "int8" and ov["partitions"] == 1
    assert ov["computes"] == "openvino: int8 in all 3 weighted layers"
    lower = rows["openvino int8 (QDQ) + bf16"]
    assert lower["precision"] == "int8+bf16" and "int8 in all 3" in lower["computes"]
    # fp16 is timed only where OpenVINO runs it as fp16 (here it would run as bf16: the same).
    from ferry.backends import get_backend

    fp16 = any(label.startswith("openvino int8 (QDQ) + fp16") for label in rows)
    assert fp16 == (get_backend("openvino").runs_in("fp16") == "fp16")
    # No candidate claims the float it did not compute in.
    assert not [label for label in rows if label.endswith(" fp32")]


def test_a_dynamic_int8_source_says_openvino_widens_it(dynamic: ir.Model) -> None:
    rows, judge, chosen = _rows(dynamic)
    assert "dynamic int8 source" in judge
    _judged_at_the_task(rows)
    assert rows["onnxruntime int8 (dynamic int8)"]["precision"] == "int8"
    widened = rows["openvino fp32 (widens dynamic int8)"]
    # DynamicQuantizeLinear stays on ONNX Runtime: OpenVINO's pieces are a split plan.
    assert widened["partitions"] > 1 and widened["precision"] == "fp32"
    assert "openvino: fp32 in all" in widened["computes"] and "int8 widened" in widened["computes"]
    assert "openvino bf16 (widens dynamic int8)" in rows
    # A split competes only if it beats ONNX Runtime alone.
    alone = rows["onnxruntime int8 (dynamic int8)"]["latency_ms"]
    assert rows[chosen]["partitions"] == 1 or rows[chosen]["latency_ms"] < alone


def _candidate(plan: Plan, label: str, ms: float, precision: str, option: str) -> Candidate:
    candidate = Candidate(label, plan, precision, latency_ms=ms, option=option)
    candidate.accuracy = within_budget({"y": np.ones(2)}, {"y": np.ones(2)})
    return candidate


def test_a_tie_goes_to_what_asks_no_precision_below_the_sources(qdq: ir.Model) -> None:
    """Two int8 candidates as fast: the one whose float layers stay fp32 is kept, though neither's
    precision is ``fp32``."""
    base = _candidate(
        Plan.whole_graph(qdq, "onnxruntime"), "onnxruntime int8 (QDQ)", 10, "int8", "fp32"
    )
    whole = Plan.whole_graph(qdq, "openvino")
    lower = _candidate(whole, "openvino int8 (QDQ) + bf16", 5.0, "int8+bf16", "bf16")
    same = _candidate(whole, "openvino int8 (QDQ)", 5.02, "int8", "fp32")
    assert choose([base, lower, same]).label == "openvino int8 (QDQ)"
    assert choose([base, lower]).label == "openvino int8 (QDQ) + bf16"
    assert not same.lowered and lower.lowered and not base.lowered


def test_what_each_engine_computed_in_words() -> None:
    computed = Computed(
        int8={"openvino": 5, "onnxruntime": 1},
        layers={"openvino": 15, "onnxruntime": 1, "litert": 0},
        ran={"openvino": "bf16"},
        silent=["acme"],
    )
    assert computed.words() == (
        "openvino: int8 in 5 of 15 weighted layers, the rest bf16; "
        "onnxruntime: int8 in its one weighted layer; acme: does not say"
    )
    widened = Computed(int8={}, layers={"openvino": 23}, ran={"openvino": "fp32"})
    assert widened.words() == "openvino: fp32 in all 23 weighted layers (int8 widened)"


def test_int8_asked_of_a_source_in_int8_takes_the_engines_that_compute_it(
    qdq: ir.Model, dynamic: ir.Model
) -> None:
    choice = auto_plan(
        qdq, backends=["openvino"], precision="int8", feeds=_feeds(), cache=False, budget_s=0.3
    )
    assert [row["label"] for row in choice.table] == [
        "onnxruntime int8 (QDQ)",
        "openvino int8 (QDQ)",
    ]
    assert all(row["passed"] for row in choice.table)
    # OpenVINO widens a dynamic-int8 source: not an int8 candidate, and the table says why.
    choice = auto_plan(
        dynamic, backends=["openvino"], precision="int8", feeds=_feeds(), cache=False, budget_s=0.3
    )
    rows = {row["label"]: row for row in choice.table}
    assert choice.label == "onnxruntime int8 (dynamic int8)"
    widened = rows["openvino fp32 (widens dynamic int8)"]
    assert "computes none of the source's layers in int8" in widened["error"]
