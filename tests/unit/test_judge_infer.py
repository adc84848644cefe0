"""The task's judge inferred from a model's outputs and graph tail (``ferry.parity.infer_judge``),
and the ``boxes`` judge that matches detections in any order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.parity import DEFAULT_BUDGET, default_budget, infer_judge, judge, within_budget

F, I64, U8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[Any]]],
    outputs: Sequence[tuple[str, int, Sequence[Any] | None]],
    weights: dict[str, np.ndarray] | None = None,
) -> ir.Model:
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in (weights or {}).items()],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _w(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _kinds(specs: list[dict[str, Any]]) -> dict[str, str]:
    return {s["output"]: s["kind"] for s in specs}


def _consistent(specs: list[dict[str, Any]], outputs: dict[str, np.ndarray]) -> None:
    """Every inferred spec is a valid judge, and the outputs agree with themselves under it."""
    for spec in specs:
        assert all(j.passed for j in judge(spec)(outputs, outputs)), spec


def test_softmax_over_classes_is_top1() -> None:
    m = _model(
        [helper.make_node("Gemm", ["x", "w"], ["l"]), helper.make_node("Softmax", ["l"], ["prob"])],
        [("x", F, ["N", 8])],
        [("prob", F, ["N", 10])],
        {"w": _w(8, 10)},
    )
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "top1", "output": "prob", "min_agreement": 1.0}]
    assert "top1 on 'prob'" in reason and "Softmax over 10 classes" in reason
    _consistent(specs, {"prob": np.eye(10, dtype=np.float32)[:3]})


def test_gemm_logits_without_softmax_are_top1() -> None:
    m = _model([helper.make_node("Gemm", ["x", "w"], ["logits"])], [("x", F, [1, 8])],
               [("logits", F, [1, 1000])], {"w": _w(8, 1000)})  # fmt: skip
    specs, reason = infer_judge(m)
    assert _kinds(specs) == {"logits": "top1"}
    assert "Gemm logits over 1000 classes" in reason


def test_sequence_softmax_is_argmax_seq() -> None:
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["l"]),
         helper.make_node("Softmax", ["l"], ["softmax_0"], axis=2)],
        [("x", F, [1, 40, 8])],
        [("softmax_0", F, [1, 40, 6625])],
        {"w": _w(8, 6625)},
    )  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "argmax_seq", "output": "softmax_0", "min_agreement": 0.99}]
    assert reason == (
        "argmax_seq on 'softmax_0' (a [1, 40, 6625] sequence: Softmax over 6625 classes)"
    )


def test_token_logits_are_argmax_seq_and_outputs_beat_declared_shapes() -> None:
    # Declared [1, ?] (an exporter's mistake); the model gives [T, 1, C] (a time-major CTC head).
    m = _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"]),
         helper.make_node("Reshape", ["g", "s"], ["387"])],
        [("x", F, [20, 8])],
        [("387", F, [1, "seqlen"])],
        {"w": _w(8, 50), "b": _w(50), "s": np.array([20, 1, 50], np.int64)},
    )  # fmt: skip
    specs, _ = infer_judge(m, {"387": np.zeros((20, 1, 50), np.float32)})
    assert _kinds(specs) == {"387": "argmax_seq"}


def test_segmentation_logits_are_judged_per_pixel() -> None:
    m = _model([helper.make_node("Conv", ["x", "w"], ["seg"])], [("x", F, [1, 6, 16, 16])],
               [("seg", F, [1, 5, 16, 16])], {"w": _w(5, 6, 1, 1)})  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "argmax_seq", "output": "seg", "min_agreement": 0.99, "axis": 1}]
    assert "per position" in reason
    # A pixel's class changed in 2% of the pixels fails (cosine would pass it).
    rng = np.random.default_rng(0)
    want = rng.standard_normal((1, 5, 16, 16)).astype(np.float32)
    got = want.copy()
    flat = got.reshape(5, -1)
    for p in range(6):  # 6 of 256 pixels: 97.7% agreement
        flat[:, p] = flat[::-1, p] + 0.01 * np.arange(5)
        flat[np.argmin(want.reshape(5, -1)[:, p]), p] = 10.0
    (verdict,) = judge(specs[0])({"seg": got}, {"seg": want})
    assert not verdict.passed and verdict.score < 0.99


def test_softmax_over_channels_is_per_pixel() -> None:
    m = _model([helper.make_node("Softmax", ["x"], ["p"], axis=1)], [("x", F, [1, 3, 8, 8])],
               [("p", F, [1, 3, 8, 8])])  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "argmax_seq", "output": "p", "min_agreement": 0.99, "axis": 1}]
    assert "Softmax over 3 classes on axis 1" in reason


def test_sigmoid_map_is_a_mask_at_half() -> None:
    m = _model(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["m"])],
        [("x", F, [1, 3, 32, 32])],
        [("m", F, [1, 1, 32, 32])],
        {"w": _w(1, 3, 1, 1)},
    )
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "mask", "output": "m", "min_agreement": 0.99, "threshold": 0.5}]
    assert "Sigmoid map, set above 0.5" in reason


def test_quantized_sigmoid_map_is_thresholded_in_its_own_numbers() -> None:
    m = _model(
        [helper.make_node("Sigmoid", ["x"], ["s"]),
         helper.make_node("QuantizeLinear", ["s", "scale", "zp"], ["q"])],
        [("x", F, [1, 1])],
        [("q", U8, [1, 1])],
        {"scale": np.array(1 / 256, np.float32), "zp": np.array(0, np.uint8)},
    )  # fmt: skip
    specs, _ = infer_judge(m)
    assert specs[0]["kind"] == "mask" and specs[0]["threshold"] == pytest.approx(128.0)


def test_rescaled_sigmoid_is_a_value_not_a_map() -> None:
    m = _model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "k"], ["lsnr"])],
        [("x", F, [1, 10, 1])],
        [("lsnr", F, [1, 10, 1])],
        {"k": np.array(35.0, np.float32)},
    )
    assert _kinds(infer_judge(m)[0]) == {"lsnr": "cosine"}


@pytest.mark.parametrize("op", ["ReduceMean", "LpNormalization", "LayerNormalization"])
def test_embeddings_are_cosine(op: str) -> None:
    if op == "ReduceMean":
        node = helper.make_node(op, ["x"], ["e"], axes=[1], keepdims=0)
        weights: dict[str, np.ndarray] = {}
    elif op == "LayerNormalization":
        node = helper.make_node(op, ["x", "g"], ["e"])
        weights = {"g": np.ones(384, np.float32)}
    else:
        node = helper.make_node(op, ["x"], ["e"])
        weights = {}
    shape = [1, 32, 384] if op != "LpNormalization" else [1, 384]
    out_shape = [1, 384] if op == "ReduceMean" else shape
    m = _model([node], [("x", F, shape)], [("e", F, out_shape)], weights)
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "cosine", "output": "e", "min": 0.999}]
    assert "embedding" in reason


def test_a_projection_named_an_embedding_is_cosine() -> None:
    m = _model([helper.make_node("MatMul", ["x", "w"], ["image_embeds"])], [("x", F, [1, 8])],
               [("image_embeds", F, [1, 512])], {"w": _w(8, 512)})  # fmt: skip
    assert _kinds(infer_judge(m)[0]) == {"image_embeds": "cosine"}


def test_topk_detector_is_judged_by_boxes() -> None:
    # DETR-style: scores [1, Q, C] -> TopK over Q*C -> boxes gathered by the chosen queries.
    m = _model(
        [
            helper.make_node("Sigmoid", ["logits"], ["p"]),
            helper.make_node("Reshape", ["p", "flat"], ["pf"]),
            helper.make_node("TopK", ["pf", "k"], ["scores", "idx"], axis=1),
            helper.make_node("Div", ["idx", "c"], ["q"]),
            helper.make_node("Mod", ["idx", "c"], ["labels"]),
            helper.make_node("Unsqueeze", ["q", "ax"], ["q3"]),
            helper.make_node("Expand", ["q3", "four"], ["qi"]),
            helper.make_node("GatherElements", ["raw", "qi"], ["boxes"], axis=1),
        ],
        [("logits", F, [1, 20, 3]), ("raw", F, [1, 20, 4])],
        [("labels", I64, [1, 5]), ("boxes", F, [1, 5, 4]), ("scores", F, [1, 5])],
        {
            "flat": np.array([1, 60], np.int64), "k": np.array([5], np.int64),
            "c": np.array(3, np.int64), "ax": np.array([2], np.int64),
            "four": np.array([1, 5, 4], np.int64),
        },
    )  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "boxes", "output": "boxes", "scores": "scores", "labels": "labels",
                      "min_agreement": 0.95}]  # fmt: skip
    assert "selected by TopK inside" in reason and "in any order" in reason


def test_decoded_boxes_beside_class_scores_are_a_detection() -> None:
    m = _model(
        [
            helper.make_node("Sigmoid", ["a"], ["scores"]),
            helper.make_node("Relu", ["b"], ["boxes"]),
        ],
        [("a", F, [1, 100, 80]), ("b", F, [1, 100, 4])],
        [("boxes", F, [1, 100, 4]), ("scores", F, [1, 100, 80])],
    )
    specs, _ = infer_judge(m)
    assert specs == [
        {"kind": "boxes", "output": "boxes", "scores": "scores", "min_agreement": 0.95}
    ]


def test_state_passthrough_and_regressions() -> None:
    m = _model(
        [
            helper.make_node("Gemm", ["x", "w1"], ["l"]),
            helper.make_node("Softmax", ["l"], ["prob"]),
            helper.make_node("Gemm", ["x", "w2"], ["reg"]),
            helper.make_node("Identity", ["h"], ["state_out:h"]),
            helper.make_node("Identity", ["ids"], ["ids_out"]),
        ],
        [("x", F, [1, 8]), ("h", F, [1, 4]), ("ids", I64, [1, 3])],
        [("prob", F, [1, 2]), ("reg", F, [1, 4]), ("state_out:h", F, [1, 4]),
         ("ids_out", I64, [1, 3])],
        {"w1": _w(8, 2), "w2": _w(8, 4)},
    )  # fmt: skip
    specs, reason = infer_judge(m)
    assert _kinds(specs) == {"prob": "top1", "reg": "cosine"}
    assert "regression beside the classes" in reason
    assert "'state_out:h' (recurrent state" in reason and "passes input" in reason


def test_values_riding_on_a_sequence_are_not_judged() -> None:
    m = _model(
        [helper.make_node("Softmax", ["a"], ["tokens"], axis=-1),
         helper.make_node("Tanh", ["b"], ["cells"])],
        [("a", F, [1, 501, 30]), ("b", F, [1, 501, 4])],
        [("cells", F, [1, 501, 4]), ("tokens", F, [1, 501, 30])],
    )  # fmt: skip
    specs, reason = infer_judge(m)
    assert _kinds(specs) == {"tokens": "argmax_seq"}
    assert "'cells' (per-step values riding on the sequence 'tokens')" in reason


def test_argmax_labels_and_nothing_to_say() -> None:
    m = _model([helper.make_node("ArgMax", ["x"], ["cls"], axis=1, keepdims=0)],
               [("x", F, [1, 4, 8, 8])], [("cls", I64, [1, 8, 8])])  # fmt: skip
    assert _kinds(infer_judge(m)[0]) == {"cls": "labels"}
    m = _model([helper.make_node("Identity", ["x"], ["y"])], [("x", F, [1, 4])],
               [("y", F, [1, 4])])  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [{"kind": "cosine", "min": 0.999}] and "do not say" in reason


# ---------------------------------------------------------------------------------------------
# The boxes judge


def _detections(count: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 600, (1, count, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(10, 60, (1, count, 2))], -1)
    scores = np.sort(rng.uniform(0, 1, (1, count)))[:, ::-1].copy()
    labels = rng.integers(0, 80, (1, count))
    return boxes.astype(np.float32), scores.astype(np.float32), labels


BOXES = {"kind": "boxes", "output": "boxes", "scores": "scores", "labels": "labels"}


def test_reordered_boxes_agree() -> None:
    boxes, scores, labels = _detections()
    order = np.random.default_rng(1).permutation(boxes.shape[1])
    want = {"boxes": boxes, "scores": scores, "labels": labels}
    got = {"boxes": boxes[:, order], "scores": scores[:, order], "labels": labels[:, order]}
    (verdict,) = judge(BOXES)(got, want)
    assert verdict.passed and verdict.score == 1.0
    # Element by element the same outputs look far apart.
    assert not within_budget(got, want, {"kind": "cosine", "min": 0.999}).passed


def test_shifted_boxes_and_other_labels_disagree() -> None:
    boxes, scores, labels = _detections()
    want = {"boxes": boxes, "scores": scores, "labels": labels}
    (shifted,) = judge(BOXES)({**want, "boxes": boxes + 45}, want)
    assert not shifted.passed and "matched at IoU >= 0.5" in shifted.detail
    (relabelled,) = judge(BOXES)({**want, "labels": (labels + 1) % 80}, want)
    assert not relabelled.passed


def test_a_score_near_the_threshold_still_matches() -> None:
    boxes = np.array([[[0, 0, 10, 10], [50, 50, 80, 80]]], np.float32)
    want = {"boxes": boxes, "scores": np.array([[0.9, 0.51]], np.float32)}
    got = {"boxes": boxes, "scores": np.array([[0.9, 0.49]], np.float32)}
    spec = {"kind": "boxes", "output": "boxes", "scores": "scores"}
    assert judge(spec)(got, want)[0].score == 1.0


def test_boxes_with_score_columns_and_centre_format() -> None:
    # [N, K, 6]: x, y, w, h (centre), score, label; a YOLO end-to-end export's one output.
    det = np.array([[[50, 50, 20, 20, 0.9, 1], [10, 10, 4, 4, 0.8, 2], [0, 0, 1, 1, 0.1, 0]]],
                   np.float32)  # fmt: skip
    spec = {"kind": "boxes", "output": "det", "format": "cxcywh"}
    assert judge(spec)({"det": det[:, ::-1]}, {"det": det})[0].score == 1.0
    moved = det.copy()
    moved[0, 0, 0] += 15  # the first box moves most of its width: IoU < 0.5
    verdict = judge(spec)({"det": moved}, {"det": det})[0]
    assert verdict.score == pytest.approx(0.5)


def test_named_specs_judge_only_their_outputs() -> None:
    want = {"prob": np.array([[0.1, 0.9]], np.float32), "aux": np.ones((1, 4), np.float32)}
    got = {"prob": np.array([[0.3, 0.7]], np.float32), "aux": -np.ones((1, 4), np.float32)}
    verdict = within_budget(got, want, [{"kind": "top1", "output": "prob"}])
    assert verdict.passed and [j.output for j in verdict.judgements] == ["prob"]


def test_default_budget_is_the_numbers_for_float_and_the_task_for_int8() -> None:
    tail = [helper.make_node("Gemm", ["d", "w"], ["l"]), helper.make_node("Softmax", ["l"], ["p"])]
    weights = {"w": _w(8, 4), "s": np.array(0.1, np.float32), "z": np.array(0, np.uint8)}
    io = ([("x", F, [1, 8])], [("p", F, [1, 4])])
    float_model = _model([helper.make_node("Identity", ["x"], ["d"]), *tail], *io, weights)
    budget, words = default_budget(float_model)
    assert budget == [dict(s) for s in DEFAULT_BUDGET] and "a float source" in words
    qdq = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
    ]
    budget, words = default_budget(_model([*qdq, *tail], *io, weights))
    assert budget == [{"kind": "top1", "output": "p", "min_agreement": 1.0}]
    assert words.startswith("judge: top1 on 'p'") and "a static QDQ source" in words


def test_nms_detector_with_a_varying_count_of_boxes() -> None:
    def ints(*v: int) -> np.ndarray:
        return np.array(v, np.int64)

    m = _model(
        [
            helper.make_node("NonMaxSuppression", ["b", "s", "top", "iou", "least"], ["sel"]),
            helper.make_node("Gather", ["sel", "two"], ["k1"], axis=1),
            helper.make_node("Squeeze", ["k1", "one"], ["k"]),
            helper.make_node("Squeeze", ["b", "zero"], ["b50"]),
            helper.make_node("Gather", ["b50", "k"], ["boxes"], axis=0),
            helper.make_node("Squeeze", ["s", "zero_one"], ["s50"]),
            helper.make_node("Gather", ["s50", "k"], ["scores"], axis=0),
        ],
        [("b", F, [1, 50, 4]), ("s", F, [1, 1, 50])],
        [("boxes", F, ["M", 4]), ("scores", F, ["M"])],
        {
            "top": ints(10), "iou": np.array([0.5], np.float32),
            "least": np.array([0.3], np.float32), "two": ints(2), "one": ints(1),
            "zero": ints(0), "zero_one": ints(0, 1),
        },
    )  # fmt: skip
    specs, reason = infer_judge(m)
    assert specs == [
        {"kind": "boxes", "output": "boxes", "scores": "scores", "min_agreement": 0.95}
    ]
    assert "NonMaxSuppression" in reason
    boxes, scores, _ = _detections(10)
    want = {"boxes": boxes[0], "scores": scores[0]}
    # Reordered, and the best box missing: each side's other boxes still match.
    got = {"boxes": boxes[0, 1:][::-1], "scores": scores[0, 1:][::-1]}
    (verdict,) = judge(specs[0])(got, want)
    kept = int((scores[0] > 0.5).sum())
    assert verdict.score == pytest.approx((2 * kept - 2) / (2 * kept - 1))
