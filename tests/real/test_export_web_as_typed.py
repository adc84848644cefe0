"""``ferry export --target web`` on kit models as a new user types it: no ``--shape``, no
``--input``. The export finds inputs the model runs on, repairs declared shapes onnxruntime-web
would refuse, and verifies in Node; then the bundle answers a kit input (one the export did not
verify on) like ONNX Runtime on the source, at the kit's judge.

The models: the PP-OCR detector and recognizer as ``ferry convert`` makes them from Paddle (the
exporter's declared shapes), SVTRv2 (If nodes, dynamic height and width), MiniLM-L3 (token ids
that must stay inside the embedding table) and a dynamic-int8 CRNN, whose integer kernels round
differently in onnxruntime-web: elementwise parity cannot hold, so it is judged at its task.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import pytest
from click.testing import CliRunner

import kit_models
from ferry.cli.main import cli
from ferry.web import run_bundle_in_node

MODELS = ["ppocr_det_paddle", "ppocr_rec_paddle", "svtrv2", "minilm_l3", "captcha_ocr_dynint8"]


@pytest.mark.parametrize("mid", MODELS)
def test_export_web_as_typed(mid: str, onnx_file: Callable[[str], Path], tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the web export needs Node.js and npm: run scripts/browser-env.sh")
    source = onnx_file(mid)
    site = tmp_path / "site"
    result = CliRunner().invoke(cli, ["export", str(source), "--target", "web", "-o", str(site)])
    assert result.exit_code == 0, result.output
    verdict = "parity ok" if mid != "captcha_ocr_dynint8" else "at the task (dynamic int8"
    assert verdict in result.output, result.output
    feeds = kit_models.feeds(mid, index=1)
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(names, feeds), strict=True))
    got = run_bundle_in_node(site, feeds)
    kit_models.judged(mid, "export web", {k: got[k] for k in names}, want)
