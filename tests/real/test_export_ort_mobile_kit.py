"""``export_ort_mobile`` on the kit: every ONNX model as shipped and a few that ``ferry convert``
makes (Keras, TFLite). The ``.ort`` file must load in a plain ``InferenceSession`` and answer the
task like ONNX Runtime on the source, on a kit input the export did not verify on; the reduced
build config must list exactly the ops of the optimized graph, read from ONNX Runtime's optimized
ONNX model (protobuf) rather than from the ``.ort`` flatbuffer the config was made from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema
from onnxruntime.tools.reduced_build_config_parser import parse_config

import kit_models
from ferry.mobile._ort_mobile import export_ort_mobile

ONNX_OF = Callable[[str], Path]
CPU = ["CPUExecutionProvider"]
#: Kit models converted first: Keras (tf2onnx) and a hybrid-int8 TFLite (ferry's own reader).
CONVERTED = ["emotion_keras", "emotion_tflite_hybrid"]
MODELS = kit_models.ids("onnx") + CONVERTED


def _run(session: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def _optimized_graph_ops(source: Path, folder: Path) -> dict[str, dict[int, set[str]]]:
    """``{domain: {since_version: {op}}}`` of the graph ONNX Runtime makes of ``source`` with the
    export's options (level all, no NCHWc, no int8 QDQ fusion), saved as ONNX and read back."""
    optimized = folder / "optimized.onnx"
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(optimized)
    so.add_session_config_entry("session.qdqisint8allowed", "0")
    so.log_severity_level = 4
    ort.InferenceSession(str(source), so, providers=CPU, disabled_optimizers=["NchwcTransformer"])
    model = onnx.load(str(optimized), load_external_data=False)
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    since: dict[tuple[str, str], list[int]] = {}
    for schema in get_all_operator_schema():
        since.setdefault((schema.domain or "ai.onnx", schema.name), []).append(schema.since_version)
    found: dict[str, dict[int, set[str]]] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            domain = node.domain or "ai.onnx"
            version = max(v for v in since[(domain, node.op_type)] if v <= opsets[domain])
            found.setdefault(domain, {}).setdefault(version, set()).add(node.op_type)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(sub)

    walk(model.graph)
    return found


@pytest.mark.parametrize("mid", MODELS)
def test_ort_file_answers_like_the_source(mid: str, onnx_file: ONNX_OF, tmp_path: Path) -> None:
    path = onnx_file(mid)
    before = path.read_bytes()
    result = export_ort_mobile(path, tmp_path / "out", samples=kit_models.feeds(mid, 0))
    assert path.read_bytes() == before  # the input file is never touched
    assert result.verification is not None and result.verification.passed, (
        result.verification.summary() if result.verification else None
    )
    assert result.usability.skipped is None, result.usability.skipped
    assert len(result.usability.eps) == 3

    # The file as an app loads it, on a kit input the export never ran, judged at the task.
    deployed = ort.InferenceSession(str(result.model_path), providers=CPU)
    source = ort.InferenceSession(str(path), providers=CPU)
    inputs = kit_models.feeds(mid, 1)
    kit_models.judged(mid, "export ort-mobile", _run(deployed, inputs), _run(source, inputs))

    required, _ = parse_config(str(result.files["config"]))
    assert required == _optimized_graph_ops(path, tmp_path)


@pytest.mark.parametrize("mid", ["captcha_ocr_dynint8", "emotion_tflite_hybrid"])
def test_runtime_style_with_its_optimizations_replayed(
    mid: str, onnx_file: ONNX_OF, tmp_path: Path
) -> None:
    """Quantized models: the ``runtime`` style, loaded with the saved optimizations replayed."""
    path = onnx_file(mid)
    result = export_ort_mobile(
        path, tmp_path / "out", optimization="runtime", samples=kit_models.feeds(mid, 0)
    )
    assert result.verification is not None and result.verification.passed
    assert len(result.verification.runs) == 2
    so = ort.SessionOptions()
    so.add_session_config_entry("session.enable_saved_runtime_optimizations", "1")
    deployed = ort.InferenceSession(str(result.model_path), so, providers=CPU)
    source = ort.InferenceSession(str(path), providers=CPU)
    inputs = kit_models.feeds(mid, 1)
    kit_models.judged(
        mid, "export ort-mobile runtime", _run(deployed, inputs), _run(source, inputs)
    )


@pytest.mark.parametrize("mid", ["layout", "captcha_ocr_dynint8"])
def test_config_is_what_onnxruntimes_converter_writes(
    mid: str, onnx_file: ONNX_OF, tmp_path: Path
) -> None:
    """ORT's own ``convert_onnx_models_to_ort`` on the same model: the same op and type lines."""
    from onnxruntime.tools.convert_onnx_models_to_ort import (
        OptimizationStyle,
        convert_onnx_models_to_ort,
    )

    # ORT's script makes a scratch folder beside the model it converts: not in the kit.
    path = tmp_path / "model.onnx"
    path.write_bytes(onnx_file(mid).read_bytes())
    theirs = tmp_path / "theirs"
    convert_onnx_models_to_ort(
        path,
        output_dir=theirs,
        optimization_styles=[OptimizationStyle.Runtime],
        enable_type_reduction=True,
    )
    ours = export_ort_mobile(
        path, tmp_path / "ours", optimization="runtime", type_reduction=True, verify=False
    )

    def op_lines(config: Path) -> list[str]:
        text = config.read_text(encoding="utf-8")
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    [their_config] = theirs.glob("*.config")
    assert op_lines(ours.files["config"]) == op_lines(their_config)
