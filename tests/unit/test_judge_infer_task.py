"""Quantize and compress judge by the task's judge when no --metric is given
(``ferry.optimizer._task.metric_spec`` with ``infer_judge``), and say which in their reports."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.optimizer._task import judge_line, metric_spec, task_score


def _recognizer(steps: int = 40, classes: int = 97) -> ir.Model:
    """x [1, 40, 16] -> MatMul -> Softmax over the classes: a CTC recognizer's tail."""
    w = np.random.default_rng(0).standard_normal((16, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["l"]),
            helper.make_node("Softmax", ["l"], ["softmax_0"], axis=-1),
        ],
        "rec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, steps, 16])],
        [helper.make_tensor_value_info("softmax_0", TensorProto.FLOAT, [1, steps, classes])],
        [numpy_helper.from_array(w, "w")],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_no_metric_judges_a_sequence_by_argmax_seq() -> None:
    spec = metric_spec(None, 0.99, _recognizer())
    assert spec["kind"] == "argmax_seq" and spec["min_agreement"] == 0.99
    assert spec["output"] == "softmax_0"
    assert judge_line(spec) == (
        "judge: argmax_seq on 'softmax_0' (a [1, 40, 97] sequence: Softmax over 97 classes); "
        "--metric overrides"
    )


def test_a_metric_overrides_and_says_so() -> None:
    spec = metric_spec("cosine", 0.99, _recognizer())
    assert spec["kind"] == "cosine" and spec["min"] == 0.99
    assert judge_line(spec) == "judge: cosine (--metric cosine)"
    assert judge_line(metric_spec(None, 0.99)) == "judge: cosine on every output"


def test_several_outputs_make_one_composite_spec() -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Softmax", ["a"], ["prob"], axis=-1),
            helper.make_node("Gemm", ["a", "w"], ["reg"]),
        ],
        "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4])],
        [
            helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("reg", TensorProto.FLOAT, [1, 4]),
        ],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    spec = metric_spec(None, 0.98, model)
    assert spec["kind"] == "top1+cosine"
    assert [(j["kind"], j["output"]) for j in spec["judges"]] == [
        ("top1", "prob"),
        ("cosine", "reg"),
    ]
    assert spec["judges"][0]["min_agreement"] == 0.98 and spec["judges"][1]["min"] == 0.98
    # task_score takes the worst of the judges: the classes agree, the regression does not.
    feeds = [{"a": np.array([[0.1, 0.2, 0.9, 0.3]], np.float32)}]
    want = [{"prob": np.array([[0.1, 0.2, 0.6, 0.1]]), "reg": np.array([[1.0, 2.0, 3.0, 4.0]])}]
    score = task_score(model, feeds, want, spec)
    assert score < 0.98


def test_a_sequence_judged_by_its_positions_not_its_cosine() -> None:
    model = _recognizer()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 40, 16)).astype(np.float32)}]
    import onnxruntime as ort

    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    out = session.run(None, feeds[0])[0]
    # The reference picks another class at 2 of 40 steps: 95% of the positions agree.
    want = out.copy()
    for step in (3, 17):
        want[0, step] = 0.0
        want[0, step, (out[0, step].argmax() + 1) % 97] = 1.0
    spec = metric_spec(None, 0.99, model, {"softmax_0": out})
    assert task_score(model, feeds, [{"softmax_0": want}], spec) == pytest.approx(38 / 40)


def test_quantize_without_a_metric_judges_a_sequence_by_argmax_seq() -> None:
    from ferry.optimizer.quantize import quantize

    rng = np.random.default_rng(2)
    data = [{"x": rng.standard_normal((1, 40, 16)).astype(np.float32)} for _ in range(8)]
    result = quantize(_recognizer(), data=data, budget="50%", force=True)
    assert result.report.metric["kind"] == "argmax_seq"
    lines = result.report.lines()
    assert any(line.startswith("judge: argmax_seq on 'softmax_0'") for line in lines), lines
    assert any(line.startswith("argmax_seq: 1.0000 -> ") for line in lines), lines
