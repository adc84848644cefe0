"""auto times a precision only where the engine computes in it: OpenVINO's fp16 hint on a CPU
without fp16 units compiles to bf16, the same computation as its bf16 candidate, so timing both
ranked noise (issue 32's quiet run: "fastest openvino fp16" 4% ahead of the bf16 auto chose)."""

from __future__ import annotations

from typing import Any

import pytest

from ferry import zoo
from ferry.backends import _openvino as ov_module
from ferry.backends import get_backend
from ferry.graph import prepare
from ferry.runtime._auto_candidates import candidates


class _Core:
    def __init__(self, caps: list[str]) -> None:
        self.caps = caps

    def get_property(self, device: str, key: str) -> Any:
        assert key == "OPTIMIZATION_CAPABILITIES"
        return self.caps


@pytest.mark.parametrize(
    ("caps", "fp16", "bf16"),
    [
        (["FP32", "BF16", "INT8"], "bf16", "bf16"),  # this machine: AVX-512 BF16, no FP16
        (["FP32", "FP16", "BF16"], "fp16", "bf16"),  # Sapphire Rapids with AMX-FP16
        (["FP32", "INT8"], "fp32", "fp32"),  # neither: both hints run fp32
    ],
)
def test_openvino_says_what_a_precision_hint_runs_in(
    monkeypatch: pytest.MonkeyPatch, caps: list[str], fp16: str, bf16: str
) -> None:
    pytest.importorskip("openvino")
    monkeypatch.setattr(ov_module, "ov_core", lambda: _Core(caps))
    backend = get_backend("openvino")
    assert backend.runs_in("fp16") == fp16 and backend.runs_in("bf16") == bf16
    assert backend.runs_in("fp32") == "fp32"


def test_auto_leaves_out_a_precision_run_as_another(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openvino")
    model = prepare(zoo.build("digits_cnn"))
    monkeypatch.setattr(ov_module, "ov_core", lambda: _Core(["FP32", "BF16"]))
    labels = [
        c.label for c in candidates(model, ["openvino", "onnxruntime"], exact=False, precision=None)
    ]
    assert "openvino bf16" in labels and "openvino fp16" not in labels
    asked = candidates(model, ["openvino", "onnxruntime"], exact=False, precision="fp16")
    assert [c.label for c in asked][1:] == ["openvino fp16"]  # asked for by name: kept
    monkeypatch.setattr(ov_module, "ov_core", lambda: _Core(["FP32", "FP16", "BF16"]))
    labels = [
        c.label for c in candidates(model, ["openvino", "onnxruntime"], exact=False, precision=None)
    ]
    assert "openvino fp16" in labels and "openvino bf16" in labels
