"""The one comparison contract (lenient and strict) and the task-level judges."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ferry.errors import InvalidInputError
from ferry.parity import (
    JUDGE_KINDS,
    compare_outputs,
    default_tolerance,
    judge,
    parse_budget,
    within_budget,
)

# --------------------------------------------------------------------------------------------------
# compare_outputs, lenient: converters, plans, auto


def test_compare_outputs() -> None:
    a = np.array([[1.0, 2.0]], np.float32)
    ok = compare_outputs({"y": a}, [a + 1e-6])
    assert ok.passed and ok.outputs[0].max_abs_error == pytest.approx(1e-6, rel=0.1)
    bad = compare_outputs({"y": a}, {"y": a + 1.0})
    assert not bad.passed and bad.outputs[0].mismatched == 2
    assert "2 element(s) off" in bad.summary()
    labels = np.array([1, 2, 3])
    assert not compare_outputs({"label": labels}, [np.array([1, 2, 4])]).passed
    squeezed = compare_outputs({"v": np.ones((3, 1), np.float32)}, [np.ones(3)])
    assert squeezed.passed
    shape = compare_outputs({"v": np.ones((3, 2), np.float32)}, [np.ones((2, 3))])
    assert not shape.passed and "shape [3, 2]" in shape.summary()
    nan = np.array([np.nan, 1.0], np.float32)
    assert compare_outputs({"y": nan}, [nan.copy()]).passed
    assert not compare_outputs({"y": nan}, [np.array([0.0, 1.0])]).passed
    renamed = compare_outputs({"y": a}, {"output_0": a})
    assert renamed.passed
    assert default_tolerance(np.dtype(np.float16)) == (1e-2, 1e-2)
    assert default_tolerance(np.dtype(np.int64)) == (0.0, 0.0)


def test_a_missing_reference_output_fails_that_output() -> None:
    a = np.ones(2, np.float32)
    report = compare_outputs({"y": a, "z": a}, [a])
    assert [o.passed for o in report.outputs] == [True, False]
    assert "output 'z': missing from the reference" in report.summary()


def test_the_first_mismatch_is_located() -> None:
    a = np.zeros((2, 3), np.float32)
    b = a.copy()
    b[1, 2] = 1.0
    (out,) = compare_outputs({"y": a}, [b]).outputs
    assert out.first_mismatch is not None and out.first_mismatch.startswith("first at (1, 2): ")
    assert out.first_mismatch in out.describe()


def test_an_explicit_tolerance_applies_to_integers_too() -> None:
    got = {"y": np.array([10, 20])}
    assert not compare_outputs(got, [np.array([11, 20])]).passed
    assert compare_outputs(got, [np.array([11, 20])], tolerance=(1.0, 0.0)).passed


# --------------------------------------------------------------------------------------------------
# compare_outputs, strict: as ONNX's backend test runner (conformance)


def _strict(expected: list[Any], actual: list[Any], **kw: Any) -> tuple[bool, str]:
    report = compare_outputs(
        {f"out{i}": a for i, a in enumerate(actual)}, expected, strict=True, **kw
    )
    if len(actual) < len(expected):
        return False, f"{len(actual)} outputs, expected {len(expected)}"
    return report.passed, report.summary()


def test_compare_outputs_tolerance_nan_inf_dtype_shape_strings() -> None:
    onnx_tol = (1e-7, 1e-3)  # ONNX's runner defaults (atol, rtol)
    f = np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    assert _strict([f], [f.copy()], tolerance=onnx_tol)[0]
    report = compare_outputs({"y": f + np.float32(0.01)}, [f], strict=True, tolerance=onnx_tol)
    (out,) = report.outputs
    assert not report.passed and out.mismatched == 1 and out.shape == (4,)
    assert out.max_abs_error == pytest.approx(0.01, rel=1e-3)
    assert _strict([f], [f * np.float32(1.0005)], tolerance=onnx_tol)[0]
    ok, reason = _strict([f], [f.astype(np.float64)], tolerance=onnx_tol)
    assert not ok and "dtype float64, expected float32" in reason  # dtypes must match
    ok, reason = _strict([f], [f[:2]], tolerance=onnx_tol)
    assert not ok and "shape [2], expected [4]" in reason
    s = np.array(["a", "b"], dtype=object)
    assert _strict([s], [s.copy()])[0]
    assert not _strict([s], [np.array(["a", "c"], dtype=object)])[0]
    assert not _strict([f], [])[0]
    b = np.array([True, False])
    assert _strict([b], [b.copy()])[0] and not _strict([b], [~b])[0]
    i = np.array([1, 2], dtype=np.int64)
    assert not _strict([i], [i + 1], tolerance=onnx_tol)[0]
    assert _strict([[f, f]], [[f, f]], tolerance=onnx_tol)[0]  # sequences, elementwise
    assert not _strict([[f, f]], [[f]], tolerance=onnx_tol)[0]


def test_strict_and_lenient_differ_only_in_shape_and_dtype() -> None:
    a = np.ones((3, 1), np.float32)
    assert compare_outputs({"y": a}, [np.ones(3)]).passed
    assert not compare_outputs({"y": a}, [np.ones(3)], strict=True).passed
    assert not compare_outputs({"y": a}, [np.ones((3, 1))], strict=True).passed  # float64
    assert compare_outputs({"y": a}, [np.ones((3, 1), np.float32)], strict=True).passed


def test_compare_outputs_ml_dtypes() -> None:
    import ml_dtypes

    x = np.array([1.0, 2.5, -3.0], dtype=ml_dtypes.bfloat16)
    assert _strict([x], [x.copy()], tolerance=(1e-7, 1e-3))[0]
    # bfloat16 gets two ULPs of relative tolerance (2**-6), as in ONNX's runner.
    near = (x.astype(np.float32) * np.float32(1.01)).astype(ml_dtypes.bfloat16)
    assert _strict([x], [near], tolerance=(1e-7, 1e-3))[0]
    e4m3 = np.array([1.0, 0.5], dtype=ml_dtypes.float8_e4m3fn)
    assert _strict([e4m3], [e4m3.copy()])[0]
    assert not _strict([e4m3], [e4m3.view(np.uint8)])[0]


# --------------------------------------------------------------------------------------------------
# Judges


def test_top1_judges_each_sample_over_all_but_the_first_axis() -> None:
    want = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)
    same_answer = want * 2 + 0.05  # other numbers, same classes
    (v,) = judge("top1")({"p": same_answer}, {"p": want})
    assert v.passed and v.score == 1.0 and v.kind == "top1" and v.output == "p"
    flipped = same_answer.copy()
    flipped[1] = [0.0, 0.0, 1.0]
    (v,) = judge({"kind": "top1"})({"p": flipped}, {"p": want})
    assert not v.passed and v.score == 0.5
    (v,) = judge({"kind": "top1", "min_agreement": 0.5})({"p": flipped}, {"p": want})
    assert v.passed
    # A [1, C, 1, 1] classifier output is one sample.
    (v,) = judge("top1")({"p": want[:1, :, None, None]}, {"p": want[:1, :, None, None]})
    assert v.passed and "1 sample" in v.detail


def test_cosine() -> None:
    rng = np.random.default_rng(0)
    want = rng.standard_normal((1, 100)).astype(np.float32)
    (v,) = judge({"kind": "cosine", "min": 0.999})({"y": want * 3}, {"y": want})
    assert v.passed and v.score == pytest.approx(1.0)
    noisy = want + rng.standard_normal(want.shape).astype(np.float32)
    (v,) = judge("cosine")({"y": noisy}, {"y": want})
    assert not v.passed and 0 < v.score < 0.9
    zeros = np.zeros(4, np.float32)
    assert judge("cosine")({"y": zeros}, {"y": zeros})[0].passed
    assert not judge("cosine")({"y": zeros}, {"y": np.ones(4, np.float32)})[0].passed
    assert not judge("cosine")({"y": np.full(4, np.nan)}, {"y": np.ones(4)})[0].passed


def test_mask_agreement_and_iou() -> None:
    want = np.zeros((10, 10), np.float32)
    want[2:6, 2:6] = 0.9  # 16 pixels set
    got = want.copy()
    got[2, 2:6] = 0.1  # 4 of them lost
    spec: dict[str, Any] = {"kind": "mask", "threshold": 0.3, "min_agreement": 0.95}
    (v,) = judge(spec)({"m": got}, {"m": want})
    assert v.passed and v.score == pytest.approx(0.96)
    (v,) = judge({**spec, "min_iou": 0.9})({"m": got}, {"m": want})
    assert not v.passed and "IoU 0.7500" in v.detail
    empty = np.zeros((4, 4))
    assert judge({**spec, "min_iou": 0.9})({"m": empty}, {"m": empty})[0].passed


def test_argmax_seq_counts_positions() -> None:
    want = np.eye(5, dtype=np.float32)[None]  # [1, 5 positions, 5 classes]
    got = want.copy()
    got[0, 4] = [1, 0, 0, 0, 0]
    (v,) = judge({"kind": "argmax_seq", "min_agreement": 0.8})({"s": got}, {"s": want})
    assert v.passed and v.score == pytest.approx(0.8)
    assert not judge("argmax_seq")({"s": got}, {"s": want})[0].passed


def test_one_output_and_dequantized_outputs() -> None:
    q = np.array([[-128, 127]], np.int8)  # -> [[0.0, 1.0]] with scale 1/255, zero point -128
    spec: dict[str, Any] = {"kind": "mask", "threshold": 0.5, "output": "q"}
    j = judge(spec, dequantize={"q": (1 / 255, -128)})
    verdicts = j({"q": q, "other": np.zeros(3)}, {"q": q, "other": np.ones(3)})
    assert [v.output for v in verdicts] == ["q"] and verdicts[0].passed
    flipped = np.array([[127, -128]], np.int8)
    assert not j({"q": flipped}, {"q": q})[0].passed


def test_custom_judges() -> None:
    def same_sign(got: np.ndarray, want: np.ndarray) -> float:
        return float(np.mean(np.sign(got) == np.sign(want)))

    want = np.array([1.0, -1.0, 2.0, -2.0])
    got = np.array([0.5, -3.0, 1.0, 2.0])
    (v,) = judge({"kind": "custom", "function": same_sign, "min": 0.75})({"y": got}, {"y": want})
    assert v.passed and v.score == 0.75 and "same_sign" in v.detail
    (v,) = judge({"kind": "custom", "function": lambda g, w: bool(np.all(g == w))})(
        {"y": got}, {"y": want}
    )
    assert not v.passed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "top5"}, "unknown judge kind 'top5'"),
        ({"kind": "cosine", "minimum": 0.9}, "judge 'cosine' has no setting 'minimum'"),
        ({"kind": "mask"}, "needs a threshold"),
        ({"kind": "custom"}, "needs a function"),
    ],
)
def test_bad_judge_specs_are_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        judge(spec)


def test_a_missing_output_is_named() -> None:
    with pytest.raises(InvalidInputError, match="output 'z' is missing"):
        judge({"kind": "top1", "output": "z"})({"y": np.ones(2)}, {"y": np.ones(2)})


def test_every_kind_is_described() -> None:
    assert set(JUDGE_KINDS) == {"top1", "cosine", "mask", "argmax_seq", "boxes", "labels", "custom"}


# --------------------------------------------------------------------------------------------------
# Accuracy budgets


def test_default_budget_keeps_answers_and_closeness() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 10)).astype(np.float32)
    ids = np.array([1, 2, 3])
    close = within_budget({"y": logits * 1.0001, "ids": ids}, {"y": logits, "ids": ids})
    assert close.passed and close.worst > 0.999
    kinds = {(j.output, j.kind) for j in close.judgements}
    assert kinds == {("y", "cosine"), ("y", "argmax_seq"), ("ids", "exact")}
    flipped = logits.copy()
    flipped[0] = -flipped[0]  # one row's answer changes: 75% top-1 agreement
    far = within_budget({"y": flipped}, {"y": logits})
    assert not far.passed and "outside budget" in far.summary()
    wrong_ids = within_budget({"ids": np.array([1, 2, 4])}, {"ids": ids})
    assert not wrong_ids.passed and wrong_ids.worst == pytest.approx(2 / 3)
    # The argmax measure needs a last axis of two or more: a scalar per sample is judged by cosine.
    scores = np.array([[0.2], [0.9]], np.float32)
    assert {j.kind for j in within_budget({"s": scores}, {"s": scores}).judgements} == {"cosine"}


def test_budgets_given_as_text_specs_or_functions() -> None:
    assert parse_budget("cosine=0.9995,top1=0.98") == [
        {"kind": "cosine", "min": 0.9995},
        {"kind": "argmax_seq", "min_agreement": 0.98},
    ]
    assert parse_budget("mask@0.3=0.99") == [
        {"kind": "mask", "threshold": 0.3, "min_agreement": 0.99}
    ]
    for bad in ("cosine=2", "psnr=30", "", "mask@x=0.9"):
        with pytest.raises(InvalidInputError):
            parse_budget(bad)
    a = np.array([[0.1, 0.9]], np.float32)
    b = np.array([[0.2, 0.8]], np.float32)
    assert within_budget({"y": a}, {"y": b}, {"kind": "argmax_seq", "min_agreement": 1.0}).passed
    assert not within_budget({"y": a}, {"y": b}, [{"kind": "cosine", "min": 0.9999}]).passed
    same_top = within_budget({"y": a}, {"y": b}, lambda g, w: bool(g.argmax() == w.argmax()))
    assert same_top.passed


def test_argmax_near_ties_are_agreement_but_real_flips_are_not() -> None:
    # A probability map's background rows are all ~0: which near-zero entry wins is rounding.
    want = np.full((1, 1, 4, 6), 1e-6, np.float32)
    want[0, 0, 0, :] = [0.1, 0.9, 0.2, 0.0, 0.0, 0.0]
    got = want.copy()
    got[0, 0, 1:, 3] += 1e-5  # background rows: a different argmax, within the tie margin
    assert within_budget({"p": got}, {"p": want}).passed
    got[0, 0, 0, 2] = 0.95  # the one decisive row now picks another class
    (flip,) = judge("argmax_seq")({"p": got}, {"p": want})
    assert flip.score == 0.75 and not flip.passed


def test_recurrent_state_is_judged_by_cosine_not_argmax() -> None:
    rng = np.random.default_rng(0)
    want = rng.integers(-128, 127, (1, 16, 64)).astype(np.int8)
    got = want.copy()
    got[0, :, 0] = 127  # every row's argmax moves; the values barely do (cosine stays high)
    kinds = {j.kind for j in within_budget({"state_out:s": got}, {"state_out:s": want}).judgements}
    assert kinds == {"cosine"}
    assert "argmax_seq" in {j.kind for j in within_budget({"y": got}, {"y": want}).judgements}
