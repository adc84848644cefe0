"""The web bundle end to end: ``ferry.web.export_web``, served on 127.0.0.1, run in headless
Chromium, checked against ONNX Runtime in Python on the same inputs.

Three models: the zoo's digits CNN on real digits, and two models made by other people from the
real-model kit (``scripts/fetch-kit.sh``): the vision classifier ``orientation``, exported with
ImageNet preprocessing and given a rendered document page as a PNG file through the page's file
input (the page's preprocessing is checked against Python's), and the CNN+LSTM CTC text
recognizer ``captcha_ocr`` on a rendered text line. Each is judged twice: element-wise against
ONNX Runtime within a float32 tolerance, and at the task (top-1 for the digits; the kit's judge,
top-1 or the decoded sequence, for the kit's). Served by ``ferry serve`` (its ``/web/<name>/``
route, with the cross-origin isolation headers) the page must be ``crossOriginIsolated`` and run
onnxruntime-web's wasm backend on more than one thread; from a plain static server without them
it must still work, on one. A corrupt model in a bundle must show a clear message in ``#error``
and reject ``window.ferryReady``.

A screenshot of each page goes into the artifacts folder (``$FERRY_TEST_ARTIFACTS/web`` or the
run's temp dir; its path is printed at the end of the run); the browser's console log is printed
with every failure.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import browser
import numpy as np
import onnxruntime as ort
import pytest

pytestmark = pytest.mark.slow

#: float32 in the page's wasm kernels vs ONNX Runtime's native ones: same algorithms, other
#: instruction sets and summation orders. Scaled by the largest reference magnitude.
ATOL, RTOL = 1e-4, 1e-4


# -- models and inputs ---------------------------------------------------------------------------

_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


@dataclass
class Case:
    """A model as the test runs it: its file, inputs, export options, and the kit's id."""

    model: Path
    feeds: dict[str, np.ndarray]
    kit_id: str | None = None
    #: An image (PNG) for bundles exported with image preprocessing: the page is given the file.
    image: Path | None = None
    export: dict[str, Any] = field(default_factory=dict)


def _digits(folder: Path) -> Case:
    """The zoo digits CNN, saved as ONNX, on 16 real held-out digits (a batch: the page must
    keep the dynamic batch dim)."""
    import onnx_ir as ir

    import ferry.zoo

    path = folder / "digits_cnn.onnx"
    if not path.exists():
        ir.save(ferry.zoo.build("digits_cnn"), path)
    _, _, x_test, _ = ferry.zoo.digits_data()
    return Case(path, {"input": np.ascontiguousarray(x_test[:16])})


def _need_kit() -> None:
    import kit_models

    if not kit_models.kit_ready():
        # In CI tests/conftest.py turns this skip into a failure: CI fetches the kit.
        pytest.skip(
            f"the real-model kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh "
            "(or set FERRY_KIT to where it is)"
        )


def _orientation(folder: Path) -> Case:
    """The kit's document orientation classifier, exported with ImageNet preprocessing, so the
    page takes an image file: the kit's rendered page, as the PNG it was rendered as. The
    reference input is that PNG preprocessed in Python."""
    from PIL import Image

    import kit_models
    from ferry.optimizer.quantize import ImagePreprocessing

    _need_kit()
    (x,) = kit_models.feeds("orientation").values()  # [1, 3, 224, 224], ImageNet-normalized
    # The kit renders 8-bit pixels and normalizes them: undoing that is exact after rounding.
    hwc = x[0].transpose(1, 2, 0) * _IMAGENET_STD + _IMAGENET_MEAN
    pixels = np.clip(np.rint(hwc * 255.0), 0, 255).astype(np.uint8)
    image = folder / "orientation_page.png"
    Image.fromarray(pixels, "RGB").save(image)
    feed = ((pixels.astype(np.float32) / 255.0 - _IMAGENET_MEAN) / _IMAGENET_STD).transpose(2, 0, 1)
    feeds = {"x": np.ascontiguousarray(feed[None], dtype=np.float32)}
    pre = ImagePreprocessing(
        size=(224, 224), mean=tuple(_IMAGENET_MEAN.tolist()), std=tuple(_IMAGENET_STD.tolist())
    )
    return Case(
        kit_models.path("orientation"),
        feeds,
        "orientation",
        image=image,
        export={"preprocessing": pre, "samples": feeds},
    )


def _captcha_ocr(folder: Path) -> Case:
    """The kit's CNN+LSTM CTC text recognizer (8210 symbols) on a rendered text line; its width
    is symbolic, so the export verifies on the kit's input."""
    import kit_models

    _need_kit()
    feeds = kit_models.feeds("captcha_ocr")
    return Case(kit_models.path("captcha_ocr"), feeds, "captcha_ocr", export={"samples": feeds})


MODELS: dict[str, Callable[[Path], Case]] = {
    "digits_cnn": _digits,
    "orientation": _orientation,  # a vision classifier (RapidOCR's text orientation, PP-LCNet)
    "captcha_ocr": _captcha_ocr,  # an OCR recognizer: CNN + LSTM, CTC over 8210 symbols
}


def _reference(model: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX Runtime (Python, CPU) on the same file and inputs."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


# -- serving and the page ------------------------------------------------------------------------


@contextlib.contextmanager
def _served(bundle: Path, *, isolate: bool = True) -> Iterator[str]:
    """The URL of the bundle's ``index.html`` on 127.0.0.1.

    Isolated: ``ferry serve BUNDLE`` (in this process), which serves the bundle's model over
    KServe and its page at ``/web/<folder name>/`` with the cross-origin isolation headers. Not
    isolated: a plain static server, as most static hosts are (no COOP/COEP).
    """
    if not isolate:
        with browser.serve_static(bundle, isolate=False) as base:
            yield base + "index.html"
        return
    from ferry.serving import ServerThread, create_app

    with ServerThread(create_app(bundle), port=0, ready_timeout=300) as server:
        yield f"{server.url}/web/{bundle.name}/index.html"


@contextlib.contextmanager
def _page(url: str) -> Iterator[browser.Page]:
    """The page, its console printed when the test ends (pytest shows it with a failure)."""
    page = browser.Page(url, timeout=180)
    try:
        yield page
    finally:
        log = page.console()
        page.close()
        print(f"--- browser console ({url}) ---", *log, sep="\n")


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, ONNX Runtime's {want.shape}"
    scale = max(1.0, float(np.abs(want).max()))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = diff > ATOL * scale + RTOL * np.abs(want)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.size} values differ from ONNX Runtime's; "
        f"max |diff| {diff.max():.3g} (scale {scale:.3g})"
    )


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.real] if n != "digits_cnn" else []) for n in MODELS],
)
def test_page_runs_model_like_onnxruntime(
    name: str,
    chromium: tuple[str, str],
    export_bundle: Callable[..., Path],
    artifacts: Path,
    tmp_path: Path,
) -> None:
    case = MODELS[name](tmp_path)
    want = _reference(case.model, case.feeds)
    bundle = export_bundle(name, case.model, **case.export)
    for required in ("index.html", "ferry.js", "model.onnx", "manifest.json", "ort"):
        assert (bundle / required).exists(), (
            f"the bundle has no {required}: {sorted(p.name for p in bundle.iterdir())}"
        )

    page_feeds = None
    with _served(bundle) as url, _page(url) as page:
        info = page.ready()
        assert page.evaluate("self.crossOriginIsolated") is True, (
            "served by ferry serve (COOP/COEP), the page is not cross-origin isolated"
        )
        cores = int(page.evaluate("navigator.hardwareConcurrency || 1"))
        got = page.run(case.feeds)
        # As a person uses the page: an image file for an image model, else the Run button
        # (generated input); either way it shows the outputs and the latency.
        if case.image is not None:
            page.upload("image", case.image)
            # The page's own preprocessing of that file, to compare with Python's.
            page_feeds = page.evaluate_async(
                "window.ferryImageFeeds(document.getElementById('image').files[0])",
                "the page's image preprocessing",
            )
        else:
            page.click("run")
        page.wait_until(
            "['Done.', 'Failed.'].includes(document.getElementById('status').textContent)",
            "the page's run to finish",
        )
        # onnxruntime-web's wasm backend runs numThreads - 1 pthread workers beside the page.
        workers = page.workers()
        status, error = page.text("status"), page.text("error")
        outputs, latency = page.text("outputs"), page.text("latency")
        shot = page.screenshot(artifacts / f"{name}.png")
    print(f"{name}: screenshot {shot}; page says {status!r}, {latency!r}; {info}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"

    assert not error, f"#error shows {error!r}"
    assert status == "Done.", f"#status shows {status!r}"
    assert outputs, "#outputs is empty after a run"
    assert any(c.isdigit() for c in latency), f"#latency shows no figure: {latency!r}"
    if cores > 1:
        assert info and info.get("threads", 0) > 1, f"the page chose one thread: {info}"
        assert workers, "cross-origin isolated, onnxruntime-web still ran on one thread"

    assert set(got) == set(want), f"outputs {sorted(got)}, ONNX Runtime's {sorted(want)}"
    for out in want:
        _close(got[out], want[out], f"{name} output {out!r}")
    if page_feeds is not None:
        for input_name, feed in case.feeds.items():
            mine = np.asarray(page_feeds[input_name]["data"], np.float32)
            _close(mine.reshape(page_feeds[input_name]["shape"]), feed, "the page's preprocessing")
    if case.kit_id is not None:
        import kit_models

        kit_models.judged(case.kit_id, "web", got, want)
    else:
        # The digits CNN: the same digit at every row.
        np.testing.assert_array_equal(
            got["logits"].argmax(-1), want["logits"].argmax(-1), "digits_cnn top-1"
        )


def test_page_without_isolation_headers_runs_single_threaded(
    chromium: tuple[str, str], export_bundle: Callable[..., Path], tmp_path: Path
) -> None:
    """A static host without COOP/COEP (most of them) still runs the model, on one thread."""
    case = _digits(tmp_path)
    bundle = export_bundle("digits_cnn", case.model)
    with _served(bundle, isolate=False) as url, _page(url) as page:
        info = page.ready()
        assert page.evaluate("self.crossOriginIsolated") is False
        got = page.run(case.feeds)
        assert page.workers() == [], "without cross-origin isolation there can be no threads"
    assert info and info.get("threads") == 1, f"not isolated, the page asked for threads: {info}"
    _close(got["logits"], _reference(case.model, case.feeds)["logits"], "digits_cnn, 1 thread")


def test_corrupt_model_shows_error_and_rejects_ready(
    chromium: tuple[str, str],
    export_bundle: Callable[..., Path],
    artifacts: Path,
    tmp_path: Path,
) -> None:
    case = _digits(tmp_path)
    good = export_bundle("digits_cnn", case.model)
    # A copy of the good bundle whose model file is garbage (a truncated download, say).
    bundle = tmp_path / "broken"
    shutil.copytree(good, bundle)
    data = (bundle / "model.onnx").read_bytes()
    (bundle / "model.onnx").write_bytes(b"\x00not an onnx model\xff" + data[: len(data) // 3])

    # ferry serve still serves the page (the model's KServe endpoint fails to load, not /web/).
    with _served(bundle) as url, _page(url) as page:
        with pytest.raises(browser.BrowserError, match="ferryReady rejected") as raised:
            page.ready()
        page.wait_until("document.getElementById('error').textContent", "a message in #error")
        error, status = page.text("error"), page.text("status")
        shot = page.screenshot(artifacts / "broken_model.png")
    print(f"broken model: screenshot {shot}\n#error: {error}")
    assert "model" in error.lower(), f"#error does not say the model failed: {error!r}"
    assert "fail" in status.lower(), f"#status does not say it failed: {status!r}"
    assert error.splitlines()[0] in str(raised.value), "ferryReady rejected with another error"
