"""``ferry export --target tflite`` as typed, on a kit transformer encoder: MiniLM-L3 (BERT,
``input_ids`` and ``attention_mask`` both ``[batch, seq]``, GELU as Erf, LayerNormalization,
attention heads split by Reshape/Transpose, mean pooling in the graph) exported with no
``--shape``, no samples: its sizes and ids are found (``ferry.runtime.found_inputs``), the export
is verified in LiteRT inside ``export_tflite``, and then judged here at the kit's judge (cosine
on the sentence embedding) on realistic sentences, per kernel set. Before issue 31 it was
refused for its open sequence length."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ferry
import kit_models
from ferry.cli.main import cli
from ferry.mobile import export_tflite
from ferry.mobile._litert import KERNELS, LiteRT

pytest.importorskip("ai_edge_litert", reason="LiteRT runs the exports")

MID = "minilm_l3"


def _at_length(feeds: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """The kit's sentence padded or cut to the export's sequence length (mean pooling over the
    mask is unchanged by padding)."""
    out = {}
    for name, array in feeds.items():
        if array.shape[1] >= length:
            out[name] = np.ascontiguousarray(array[:, :length])
        else:
            pad = np.zeros((array.shape[0], length - array.shape[1]), dtype=array.dtype)
            out[name] = np.concatenate([array, pad], axis=1)
    return out


def test_minilm_exports_as_typed_and_keeps_its_embedding(tmp_path: Path) -> None:
    """``ferry export MODEL --target tflite -o OUT``, nothing else: written, verified, and at
    the kit's judge in LiteRT on sentences the export was not verified on."""
    source = kit_models.path(MID)
    out = tmp_path / "minilm.tflite"
    report_file = tmp_path / "report.json"
    run = CliRunner().invoke(
        cli,
        ["export", str(source), "--target", "tflite", "-o", str(out), "--report", str(report_file)],
    )
    assert run.exit_code == 0, run.output
    assert out.is_file()
    report = json.loads(report_file.read_text())
    assert report["passed"] and report["precision"] == "fp32"
    assert any(n.startswith("inputs found") for n in report["notes"]), report["notes"]
    length = report["fixed_shapes"]["input_ids"][1]
    inputs = [(io["name"], tuple(range(len(io["shape"])))) for io in report["inputs"]]
    outputs = [(io["name"], tuple(range(len(io["shape"])))) for io in report["outputs"]]
    data = out.read_bytes()
    reference = ferry.load(source)
    for kernels in KERNELS:
        runtime = LiteRT(data, kernels, inputs, outputs)
        for index in (0, 1, 2):
            feeds = _at_length(kit_models.feeds(MID, index), length)
            kit_models.judged(
                MID, f"export tflite as typed ({kernels})", runtime.run(feeds), reference.run(feeds)
            )


@pytest.mark.parametrize("mid", ["svtrv2", "detr_tiles"])
def test_transformer_kit_models_export_as_typed(mid: str, tmp_path: Path) -> None:
    """SVTRv2 (a learned query times computed keys) and the DETR tiles (an IsNaN guard in
    cross-attention) were refused; as typed they are written, verified in LiteRT (XNNPACK and
    the reference kernels) against ONNX Runtime at sizes found for them."""
    out = tmp_path / f"{mid}.tflite"
    result = export_tflite(kit_models.path(mid), out)
    assert result.report.passed and out.is_file()
    assert [v.placement.kernels for v in result.report.verification] == list(KERNELS)
    assert any(n.startswith("inputs found") for n in result.report.notes)


def test_a_dynamic_int8_model_exports_as_its_float_computation(tmp_path: Path) -> None:
    """The captcha recognizer quantized dynamically (DynamicQuantizeLinear, ConvInteger, a
    DynamicQuantizeLSTM) was refused; it exports as the float computation it stands for, and
    LiteRT reads the kit's captchas as ONNX Runtime reads them with the int8 model."""
    mid = "captcha_ocr_dynint8"
    source = kit_models.path(mid)
    shapes = {k: v.shape for k, v in kit_models.feeds(mid).items()}
    result = export_tflite(source, tmp_path / "ocr.tflite", shapes=shapes)
    assert result.report.passed and result.report.precision == "fp32"
    assert any(n.startswith("dynamic int8 model") for n in result.report.notes)
    io = (
        [(x.name, x.perm) for x in result.report.inputs],
        [(x.name, x.perm) for x in result.report.outputs],
    )
    reference = ferry.load(source)
    for kernels in KERNELS:
        runtime = LiteRT(result.path.read_bytes(), kernels, *io)
        for index in (0, 1, 2):
            feeds = kit_models.feeds(mid, index)
            got, want = runtime.run(feeds), reference.run(feeds)
            kit_models.judged(mid, f"export tflite dynamic int8 ({kernels})", got, want)
