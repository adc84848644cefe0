"""``backends="auto"`` judges a source already reduced in precision at its task.

Two engines' int8 kernels round a QDQ model differently: OpenVINO's int8 of a QDQ ResNet-50 is
cosine 0.995 from ONNX Runtime's, with the same top-1, and 3.9x faster; judged by cosine, auto
kept ONNX Runtime. A QDQ source is now judged by the judge its task calls for
(:func:`ferry.parity.infer_judge`); a float source keeps the numbers budget.

``rounding`` is a made-up engine (as in ``fake_engines``): it answers ONNX Runtime's outputs from a
cache, moved off by a few percent with each sample's top-1 kept, so it is faster than ONNX Runtime
whatever the machine's noise and its accuracy is known in advance.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import fake_engines
from ferry.cli.main import cli
from ferry.graph import prepare
from ferry.parity import DEFAULT_BUDGET, within_budget
from ferry.runtime import auto_plan


def rounding(y: np.ndarray) -> np.ndarray:
    """Off by ~5% of the largest value, each row's argmax kept: cosine ~0.99, top-1 the same."""
    rng = np.random.default_rng(0)
    z = y + 0.05 * float(np.abs(y).max()) * rng.standard_normal(y.shape).astype(y.dtype)
    rows = z.reshape(-1, y.shape[-1])
    best = y.reshape(-1, y.shape[-1]).argmax(-1)
    rows[np.arange(len(rows)), best] = rows.max(-1) + 1e-3 * float(np.abs(y).max())
    return rows.reshape(y.shape).astype(y.dtype)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.backends._registry as registry

    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, "rounding": "-"})
    monkeypatch.setitem(
        registry._instances, "rounding", fake_engines.FakeEngine("rounding", rounding)
    )


def _float_classifier(width: int = 64) -> onnx.ModelProto:
    """x [1, 3, 32, 32] -> Conv 3x3 -> Relu -> Conv 3x3 -> Relu -> mean -> Gemm -> Softmax."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    weights = {"w1": w(width, 3, 3, 3), "w2": w(width, width, 3, 3), "fc": w(width, 10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` quantized to static QDQ by ONNX Runtime's quantizer on random calibration."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.feeds = iter(
                [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, source)
        quantize_static(source, out, Feeds(), quant_format=QuantFormat.QDQ)
        return onnx.load(out)


@pytest.fixture(scope="module")
def models() -> dict[str, ir.Model]:
    proto = _float_classifier()
    return {"float": prepare(ir.from_proto(proto)), "qdq": prepare(ir.from_proto(_qdq(proto)))}


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)}


def test_a_qdq_source_is_judged_at_its_task(engine: None, models: dict[str, ir.Model]) -> None:
    choice = auto_plan(
        models["qdq"], backends=["rounding"], feeds=_feeds(), cache=False, budget_s=0.5
    )
    assert choice.label == "rounding fp32", choice.table
    assert "top1 on 'prob'" in choice.judge and "static QDQ source" in choice.judge
    row = next(r for r in choice.table if r["label"] == "rounding fp32")
    assert row["passed"]
    assert {j["kind"] for j in row["accuracy"]["judgements"]} == {"top1"}
    # By the numbers budget the same answers are refused: the rounding is not the task.
    want = _reference(models["qdq"])
    assert not within_budget({"prob": rounding(want)}, {"prob": want}, DEFAULT_BUDGET).passed
    assert choice.to_dict()["judge"] == choice.judge


def test_a_float_source_keeps_the_numbers_budget(engine: None, models: dict[str, ir.Model]) -> None:
    choice = auto_plan(
        models["float"], backends=["rounding"], feeds=_feeds(), cache=False, budget_s=0.5
    )
    assert choice.label == "onnxruntime fp32"
    assert "cosine >= 0.999" in choice.judge and "a float source" in choice.judge


def test_a_given_budget_still_rules(engine: None, models: dict[str, ir.Model]) -> None:
    choice = auto_plan(
        models["qdq"],
        backends=["rounding"],
        feeds=_feeds(),
        cache=False,
        budget_s=0.5,
        accuracy={"kind": "cosine", "min": 0.9999},
    )
    assert choice.label == "onnxruntime int8 (QDQ)"  # ONNX Runtime, named by what it computed
    assert choice.judge == "judge: the accuracy budget given"


def _reference(model: ir.Model) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(["prob"], _feeds())[0]


@pytest.mark.openvino
@pytest.mark.slow
def test_openvino_runs_a_qdq_classifier_within_its_task_judge(models: dict[str, ir.Model]) -> None:
    pytest.importorskip("openvino")
    choice = auto_plan(
        models["qdq"], backends=["openvino"], feeds=_feeds(), cache=False, budget_s=1.0
    )
    rows = [r for r in choice.table if r["label"].startswith("openvino") and not r["error"]]
    assert rows, choice.table
    for row in rows:
        assert row["passed"], row
        assert {j["kind"] for j in row["accuracy"]["judgements"]} == {"top1"}


@pytest.mark.slow
def test_plan_prints_the_judge(tmp_path: Path, models: dict[str, ir.Model]) -> None:
    path = tmp_path / "q.onnx"
    onnx.save(ir.to_proto(models["qdq"]), path)
    result = CliRunner().invoke(
        cli, ["plan", str(path), "--backends", "auto", "--budget", "0.2", "--remeasure"]
    )
    assert result.exit_code == 0, result.output
    assert "auto: judge: top1 on 'prob'" in result.output
