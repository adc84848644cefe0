"""Live placement on a kit model loaded without sizes (issue 32): the CRNN captcha recognizer
(``input1 [1, 1, 64, image_width]``) on OpenVINO and ONNX Runtime, fed real lines at two widths.

While it learns, every answer is ONNX Runtime's; once settled, each width runs on the plan its
measurement chose, judged at the kit's judge against ONNX Runtime; the next load knows both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import ferry
import kit_models
from ferry.runtime import LiveSession

MID = "captcha_ocr"


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
    for inputs in (wide, narrow, wide, narrow):
        got = session.run(inputs)
        for key, value in want(inputs).items():
            np.testing.assert_array_equal(got[key], value)  # learning: ONNX Runtime's answer
    assert session.placement_settled(300)
    report = session.placement_report()
    assert len(report["buckets"]) == 2, report
    for bucket in report["buckets"]:
        assert bucket["state"].startswith(("switched", "on onnxruntime (the plan")), bucket
        assert bucket["plan_ms"] and bucket["alone_ms"], bucket
    for inputs in (wide, narrow):
        kit_models.judged(MID, "live placement", session.run(inputs), want(inputs))
    again = ferry.load(path, backends="openvino,onnxruntime")
    known = {str(b["bucket"]): b["plan"] for b in again.placement_report()["buckets"]}
    assert known == {str(b["bucket"]): b["plan"] for b in report["buckets"]}
    assert again.placement_settled(1)
