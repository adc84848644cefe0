"""The real-model kit as the real tier sees it: where it is, each model's entry, inputs and judge.

The kit (``tests/real/kit``: a copy of the project's shared kit) describes 23 trained models
made by other people; ``scripts/fetch-kit.sh`` downloads them into ``$FERRY_KIT`` (default
``~/.cache/ferry-kit``). Each model's ``judge`` says how a transformed model is compared with the
model's own runtime at the task (``ferry.parity.judge``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ferry.parity import Judgement, judge

HERE = Path(__file__).parent
KIT_TOOLS = HERE / "kit"
sys.path.insert(0, str(KIT_TOOLS))

import inputs as _inputs  # noqa: E402  (the kit's own module: manifest and input recipes)

KIT_DIR = Path(os.environ.get("FERRY_KIT") or Path.home() / ".cache" / "ferry-kit")
MANIFEST: dict[str, dict[str, Any]] = _inputs.manifest()


def kit_ready() -> bool:
    """Whether ``scripts/fetch-kit.sh`` has filled the kit folder."""
    return (KIT_DIR / "models" / ".done").is_file()


def ids(*formats: str) -> list[str]:
    """Kit model ids, of the given formats (``onnx``, ``tflite``, ``paddle``...) or all."""
    return [m for m, e in MANIFEST.items() if not formats or e["format"] in formats]


def tensor_ids() -> list[str]:
    """Kit model ids of the tensor models: all but the generative ones (GGUF chat decoders)."""
    return [m for m, e in MANIFEST.items() if e["format"] != "gguf"]


def entry(model_id: str) -> dict[str, Any]:
    return MANIFEST[model_id]


def path(model_id: str) -> Path:
    """The model's file (the folder for a SavedModel or the state_dicts, ``.pdmodel`` for Paddle).

    A test reaching a model whose own framework is not installed here (its converter and its
    reference need it) skips, naming what installs it; ``bash scripts/test.sh`` installs them all.
    """
    missing = missing_framework(model_id)
    if missing is not None:
        import pytest

        pytest.skip(f"{model_id}: {missing}")
    return Path(_inputs.model_path(model_id, KIT_DIR))


#: What each source format needs besides ferry's own packages, and what installs it.
_FRAMEWORKS: dict[str, tuple[tuple[str, ...], str]] = {
    "tf-savedmodel": (("tensorflow", "tf2onnx"), "pip install tensorflow-cpu tf2onnx"),
    "keras-h5": (("tensorflow", "tf2onnx", "keras"), "pip install tensorflow-cpu tf2onnx"),
    "torch-state-dict": (("torch",), "pip install torch==2.13.0"),
}


def missing_framework(model_id: str) -> str | None:
    """Why the framework a kit model comes from cannot run here, or None when it can."""
    fmt = entry(model_id)["format"]
    if fmt == "paddle":
        from ferry.converters import find_paddle_python

        if os.environ.get("FERRY_PADDLE_PYTHON") or find_paddle_python() is not None:
            return None
        return "needs PaddlePaddle and paddle2onnx: run scripts/setup-paddle.sh"
    modules, install = _FRAMEWORKS.get(fmt, ((), ""))
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        return f"needs {', '.join(absent)}: {install} (bash scripts/test.sh installs it)"
    return None


def feeds(model_id: str, index: int = 0) -> dict[str, np.ndarray]:
    """Realistic inputs for the model at its kit shapes (photos, rendered text, audio...)."""
    return dict(_inputs.feeds(model_id, KIT_DIR, index=index))


def convert(model_id: str, out: Path) -> Path:
    """Convert a non-ONNX kit model with ``ferry.convert`` (verified against its source on the kit
    inputs) and save it to ``out``. The MTCNN state_dicts go through the modules in ``mtcnn``."""
    import ferry

    source: Any = path(model_id)
    if entry(model_id)["format"] == "torch-state-dict":
        import mtcnn

        source = mtcnn.MTCNN(source)
    result = ferry.convert(source, example_inputs=feeds(model_id), trust_pickle=True)
    result.save(out)
    return out


def judged(
    model_id: str,
    verb: str,
    got: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray] | Iterable[np.ndarray],
    *,
    dequantize: Mapping[str, tuple[float, int]] | None = None,
    budget: str | None = None,
) -> list[Judgement]:
    """Judge ``got`` (what ``verb`` gave) against the reference ``want`` as the kit says; fail
    naming what differs.

    ``want`` may be keyed by other names than ``got`` (a framework's own output names) or be a
    sequence in ``got``'s order. ``budget`` (``"1%"``): a lossy verb's allowance, loosening a
    cosine judge's threshold to 0.99 (agreement judges keep the kit's thresholds). Returns the
    verdicts (their scores go into the README's table).
    """
    if not isinstance(want, Mapping) or set(want) != set(got):
        values = list(want.values()) if isinstance(want, Mapping) else list(want)
        assert len(values) == len(got), (
            f"{model_id}: {len(values)} reference outputs, {len(got)} got"
        )
        want = dict(zip(got, values))
    spec = dict(entry(model_id)["judge"])
    if budget is not None and spec["kind"] == "cosine":
        spec["min"] = min(float(spec["min"]), 1.0 - float(budget.rstrip("%")) / 100)
    output = spec.get("output")
    if output is not None and output not in got:
        # The judged output by position, when a conversion renamed the outputs.
        names = [o["name"] for o in entry(model_id)["outputs"]]
        spec["output"] = list(got)[names.index(output)]
    verdicts = judge(spec, dequantize=dequantize)(dict(got), dict(want))
    failed = [v for v in verdicts if not v.passed]
    assert not failed, f"{model_id}: " + "; ".join(f"{v.output}: {v.detail}" for v in failed)
    RESULTS.append((model_id, verb, verdicts))
    return verdicts


#: Every judgement made in this run, for ``--real-report`` (the README's table).
RESULTS: list[tuple[str, str, list[Judgement]]] = []


#: Colour photographs bundled with scikit-image and scikit-learn (no download).
_PHOTOS = (
    "astronaut", "cat", "coffee", "hubble_deep_field", "immunohistochemistry", "retina", "rocket",
)  # fmt: skip
_IMAGENET = (np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225]))


def unlabeled_images(size: int, *, pages: int = 8, crops: int = 4) -> list[np.ndarray]:
    """Unlabeled ImageNet-normalized ``[1, 3, size, size]`` images for distillation and
    calibration: ``crops`` square crops (seeded; 50-100% of the short side, anywhere) of each
    photograph scikit-image and scikit-learn ship, and ``pages`` of the kit's rendered document
    pages, each at the four right-angle rotations (what an orientation classifier sees).
    """
    from skimage import data as skdata
    from skimage.transform import resize
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    photos = [np.asarray(getattr(skdata, n)())[..., :3] for n in _PHOTOS]
    photos += list(load_sample_images().images)
    squares: list[np.ndarray] = []
    for photo in photos:
        h, w = photo.shape[:2]
        for _ in range(crops):
            side = int(min(h, w) * rng.uniform(0.5, 1.0))
            y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = photo[y : y + side, x : x + side].astype(np.float64) / 255.0
            squares.append(resize(crop, (size, size), order=1, anti_aliasing=True))
    mean, std = _IMAGENET
    images = [((sq - mean) / std).transpose(2, 0, 1)[None].astype(np.float32) for sq in squares]
    rotated = [
        np.ascontiguousarray(np.rot90(im, k, axes=(2, 3))) for im in images for k in range(4)
    ]
    return rotated + rotated_pages(size, pages)


def rotated_pages(size: int, count: int, *, first: int = 0) -> list[np.ndarray]:
    """``count`` of the kit's rendered document pages (from index ``first``), ImageNet-
    normalized ``[1, 3, size, size]``, each at the four right-angle rotations."""
    pages = [
        _inputs.text_page(size, size, norm="imagenet", index=first + i).astype(np.float32)
        for i in range(count)
    ]
    return [np.ascontiguousarray(np.rot90(p, k, axes=(2, 3))) for p in pages for k in range(4)]
