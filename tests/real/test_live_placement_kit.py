"""Live placement on a kit model loaded without sizes (issue 32): the CRNN captcha recognizer
(``input1 [1, 1, 64, image_width]``) on OpenVINO and ONNX Runtime, fed real lines at two widths.

While it learns, every answer is ONNX Runtime's; once settled, each width runs on the plan its
measurement chose, judged at the kit's judge against ONNX Runtime; the next load knows both.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import ferry
import kit_models
from ferry.runtime import LiveSession

MID = "captcha_ocr"


def _feed_until_settled(
    session: LiveSession,
    calls: list[dict[str, np.ndarray]],
    want: Any,
    limit_s: float = 600,
) -> int:
    """Feed ``calls`` in turn until the session settles; a call made while its bucket had not
    switched must be ONNX Runtime's answer exactly (learning never answers from a plan on
    trial). Returns the calls made."""
    made = 0
    deadline = time.monotonic() + limit_s
    while True:
        for inputs in calls:
            switched = {str(s["bucket"]) for s in session.switches}
            got = session.run(inputs)
            made += 1
            key = str({n: list(a.shape) for n, a in inputs.items()})
            if key not in switched:
                for name, value in want(inputs).items():
                    np.testing.assert_array_equal(got[name], value)
        if session.placement_settled(0.01) or time.monotonic() > deadline:
            break
    assert session.placement_settled(1), session.placement_report()
    return made


def test_live_placement_learns_each_width_and_the_next_load_starts_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    pytest.importorskip("openvino")
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    path = kit_models.path(MID)
    wide = kit_models.feeds(MID)
    (name,) = wide
    # A real line cropped to half its width: a second bucket of real data.
    narrow = {name: np.ascontiguousarray(wide[name][..., : wide[name].shape[-1] // 2])}
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def want(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in reference.get_outputs()]
        return dict(zip(names, reference.run(names, inputs), strict=True))

    session = ferry.load(path, backends="openvino,onnxruntime")
    assert isinstance(session, LiveSession) and session.plan.backends == ["onnxruntime"]
    _feed_until_settled(session, [wide, narrow], want)
    report = session.placement_report()
    assert len(report["buckets"]) == 2, report
    for bucket in report["buckets"]:
        assert bucket["state"].startswith(("switched", "on onnxruntime (no plan")), bucket
        assert bucket["plan_ms"] and bucket["alone_ms"], bucket
    for inputs in (wide, narrow):
        kit_models.judged(MID, "live placement", session.run(inputs), want(inputs))
    again = ferry.load(path, backends="openvino,onnxruntime")
    known = {str(b["bucket"]): b["plan"] for b in again.placement_report()["buckets"]}
    assert known == {str(b["bucket"]): b["plan"] for b in report["buckets"]}
    assert again.placement_settled(1)


def test_live_auto_on_a_text_encoder_learns_each_length(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``backends="auto"`` with no sizes on MiniLM (``[batch, sequence]`` ids and mask): auto runs
    per length on the real sentences, judged at the task on them; the answers while it learns are
    ONNX Runtime's; each length ends within the kit's judge; the next load starts there."""
    pytest.importorskip("openvino")
    mid = "minilm_l3"
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    path = kit_models.path(mid)
    full = kit_models.feeds(mid)
    # The sentence's first 15 word pieces closed by [SEP]: a second length of real text.
    ids = np.concatenate([full["input_ids"][:, :15], np.full((1, 1), 102, np.int64)], axis=1)
    short = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def want(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in reference.get_outputs()]
        return dict(zip(names, reference.run(names, inputs), strict=True))

    session = ferry.load(path, backends="auto")
    assert isinstance(session, LiveSession)
    _feed_until_settled(session, [full, short], want)
    report = session.placement_report()
    assert {str(b["bucket"]["input_ids"]) for b in report["buckets"]} == {"[1, 32]", "[1, 16]"}
    for bucket in report["buckets"]:
        assert bucket["state"].startswith(("switched", "on onnxruntime")), bucket
        assert "failed" not in bucket["state"], bucket
    for inputs in (full, short):
        kit_models.judged(mid, "live placement (auto)", session.run(inputs), want(inputs))
    again = ferry.load(path, backends="auto")
    known = {str(b["bucket"]): b["plan"] for b in again.placement_report()["buckets"]}
    assert known == {str(b["bucket"]): b["plan"] for b in report["buckets"]}
