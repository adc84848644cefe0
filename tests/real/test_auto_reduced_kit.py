"""``backends="auto"`` on a kit model already reduced in precision (issue 32): the microWakeWord
detector, a full-int8 TFLite model converted to static QDQ ONNX.

Auto's table offers OpenVINO at int8: its low-precision transformations compute the QDQ
convolutions in u8, and the row says so (``openvino int8 (QDQ)``, precision ``int8``), judged at
the task (the wake-word mask) like every candidate; what auto chooses answers as LiteRT does at the
kit's judge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import kit_models
from ferry.graph import load_model, prepare, reduced_precision
from ferry.runtime import auto_plan
from tf_references import litert_output_quantization, litert_outputs

MID = "wakeword_int8"
STATE_OUT = "state_out:"


def test_auto_offers_openvino_int8_judged_at_the_task(
    onnx_file: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("openvino")
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    model = prepare(load_model(onnx_file(MID)))
    assert reduced_precision(model).kinds == ("static QDQ",)
    feeds = kit_models.feeds(MID, 0)
    choice = auto_plan(model, feeds=feeds, cache=False, budget_s=3.0)
    rows = {row["label"]: row for row in choice.table}
    assert len(rows) == len(choice.table)
    assert "mask on 'StatefulPartitionedCall:0'" in choice.judge
    assert "static QDQ source" in choice.judge

    ov = rows["openvino int8 (QDQ)"]
    assert ov["precision"] == "int8" and ov["partitions"] == 1 and ov["passed"], ov
    assert ov["computes"].startswith("openvino: int8 in "), ov["computes"]
    assert {j["kind"] for j in ov["accuracy"]["judgements"]} == {"mask"}
    assert rows["openvino int8 (QDQ) + bf16"]["precision"] == "int8+bf16"
    assert rows["onnxruntime int8 (QDQ)"]["precision"] == "int8"
    # Every candidate measured is judged at the task, none by the numbers.
    for label, row in rows.items():
        if row["accuracy"] is not None:
            assert {j["kind"] for j in row["accuracy"]["judgements"]} == {"mask"}, label

    assert choice.session is not None
    got = {k: v for k, v in choice.session.run(feeds).items() if not k.startswith(STATE_OUT)}
    source = kit_models.path(MID)
    want = litert_outputs(source, feeds)
    kit_models.judged(
        MID, f"auto ({choice.label})", got, want, dequantize=litert_output_quantization(source)
    )
