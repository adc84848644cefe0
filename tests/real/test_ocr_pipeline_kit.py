"""The OCR pipeline example (examples/ocr_pipeline) served by ``ferry serve``: the kit's PP-OCR
detector -> crop -> recognizer returning text from rendered pages, through Triton's client.

The pipeline's answer must equal what its three steps give run by hand (the same converted
detector and recognizer loaded with ``ferry.load``, the same crop and decode functions), on
pages of two sizes sent concurrently; and the text is the page's (its title is read back).
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http

import ferry
import kit_models
from ferry.serving import ServerThread, create_app

pytestmark = pytest.mark.paddle

EXAMPLE = Path(__file__).parents[2] / "examples" / "ocr_pipeline"
#: (height, width, page index): the second size is not a multiple of the detector's 32.
PAGES = [(640, 480, 0), (700, 530, 1), (640, 480, 2)]


def _module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _page(h: int, w: int, index: int) -> np.ndarray:
    """A rendered document page as a client sends it: uint8 [H, W, 3] RGB."""
    page = kit_models._inputs.text_page(h, w, norm="raw", index=index)[0]
    return np.ascontiguousarray(page.transpose(1, 2, 0).round().clip(0, 255).astype(np.uint8))


def test_ocr_pipeline_gives_the_text_of_its_steps_run_by_hand(
    onnx_file: Any, tmp_path: Path
) -> None:
    for mid in ("ppocr_det_paddle", "ppocr_rec_paddle"):
        why = kit_models.missing_framework(mid)
        if why is not None:
            pytest.skip(why)
    build = _module("ocr_pipeline_build", EXAMPLE / "build.py")
    det_file, rec_file = onnx_file("ppocr_det_paddle"), onnx_file("ppocr_rec_paddle")
    repo = build.build(tmp_path / "repo", det=det_file, rec=rec_file)
    steps = _module("ocr_pipeline_steps", repo / "ocr" / "ocr_steps.py")
    pages = [_page(h, w, i) for h, w, i in PAGES]

    # By hand: the same calls the pipeline makes, one after the other.
    det, rec = ferry.load(det_file), ferry.load(rec_file)
    want = []
    for image in pages:
        x = steps.prepare({"image": image})["x"]
        probability = det.run({"x": x})["sigmoid_0.tmp_0"]
        cut = steps.crop({"image": image, "probability": probability})
        scores = rec.run({"x": cut["lines"]})["softmax_11.tmp_0"]
        text = steps.decode({"scores": scores, "count": cut["count"]})["text"]
        want.append(([str(t) for t in text], cut["boxes"]))

    with ServerThread(create_app(repo), port=0) as server:
        client = http.InferenceServerClient(server.url.removeprefix("http://"), concurrency=3)
        try:
            assert client.is_model_ready("ocr")
            meta = client.get_model_metadata("ocr")
            assert meta["platform"] == "ensemble"
            assert [o["name"] for o in meta["outputs"]] == ["text", "boxes"]

            requests = []
            for image in pages:  # all in flight at once
                tensor = http.InferInput("image", list(image.shape), "UINT8")
                tensor.set_data_from_numpy(image)
                requests.append(client.async_infer("ocr", [tensor]))
            got = []
            for request in requests:
                result = request.get_result()
                text = [t.decode() for t in result.as_numpy("text")]
                got.append((text, result.as_numpy("boxes")))
            stats = client.get_inference_statistics("ocr")["model_stats"][0]
            assert int(stats["inference_stats"]["success"]["count"]) == len(pages)
        finally:
            client.close()

    for (h, w, index), (text, boxes), (want_text, want_boxes) in zip(PAGES, got, want):
        assert text == want_text, f"page {index} ({h}x{w}): the pipeline read other text"
        np.testing.assert_array_equal(boxes, want_boxes)
        assert len(text) >= 10, f"page {index}: only {len(text)} lines read"
        title = kit_models._inputs._TITLES[index % len(kit_models._inputs._TITLES)]
        ratio = difflib.SequenceMatcher(None, text[0], title).ratio()
        assert ratio > 0.8, f"page {index}: read {text[0]!r} for the title {title!r}"
