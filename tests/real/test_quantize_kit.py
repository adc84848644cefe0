"""``ferry quantize`` on kit models made by others: each target's int8, calibrated on the kit's
realistic inputs and judged at the task on held-back ones; the result follows the target's rules
(the validator); a portable one follows every target's. Speed against fp32 and against ONNX
Runtime's and NNCF's defaults is ``benchmarks/quantize.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import ferry
import kit_models
from ferry.optimizer.quantize import TARGETS, check

ONNX_OF = Callable[[str], Path]
METRIC = {"top1": "top1", "argmax_seq": "seq", "cosine": "cosine"}


@pytest.mark.parametrize("mid", ["ppocr_cls_paddle", "orientation"])
@pytest.mark.parametrize("target", ["onnxruntime", "openvino", "portable"])
def test_int8_for_each_target(mid: str, target: str, onnx_file: ONNX_OF) -> None:
    path = onnx_file(mid)
    data = [kit_models.feeds(mid, index=i) for i in range(8)]
    kind = kit_models.entry(mid)["judge"]["kind"]
    result = ferry.quantize(
        path, data=data, target=target, metric=METRIC[kind], budget="2%", force=True
    )
    report = result.report
    # Forced: a result refused only for speed is still judged here (the benchmark times it).
    assert report.refused is None or "slower" in report.refused, report.lines()
    assert report.score_after >= report.budget, report.lines()
    assert report.quantized, "nothing was quantized"
    assert check(result.model, target) == []
    if target == "portable":
        for other in TARGETS:
            assert check(result.model, other) == [], other
    reference, quantized = ferry.load(path), ferry.load(result.model)
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        kit_models.judged(mid, f"quantize {target}", quantized.run(feeds), reference.run(feeds))
