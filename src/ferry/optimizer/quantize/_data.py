"""Calibration data: where the samples come from, and the split into calibration and judging.

Before -> After::

    .npz / .npy file, folder of images (with declared preprocessing), or an iterable of feeds
        -> Samples: a list of feed dicts at the model's input names, split into ``calibration``
           (ranges are computed on them) and ``held_back`` (the result is judged on them, never
           calibrated on)

A quantized model judged on its own calibration data looks better than it is; the split keeps
them apart. Random data calibrates ranges that real inputs never have: only on request, loudly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError

__all__ = ["ImagePreprocessing", "Samples", "load_samples", "split"]

logger = logging.getLogger(__name__)

#: Fraction of the samples held back for judging (at least one sample, and one left to calibrate).
HELD_BACK = 0.25

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


@dataclasses.dataclass(frozen=True)
class ImagePreprocessing:
    """How a folder of images becomes a model input: ``(pixels / scale - mean) / std``.

    Attributes:
        size: ``(height, width)`` each image is resized to.
        layout: ``NCHW`` or ``NHWC``.
        mean / std: per channel, after dividing by ``scale``.
        scale: 255 for pixels in [0, 1]; 1 to keep [0, 255].
        channels: 3 (RGB) or 1 (grayscale).
    """

    size: tuple[int, int]
    layout: str = "NCHW"
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    scale: float = 255.0
    channels: int = 3

    def __post_init__(self) -> None:
        if self.layout not in ("NCHW", "NHWC"):
            raise InvalidInputError(f"image layout must be NCHW or NHWC, got {self.layout!r}")
        if self.channels not in (1, 3):
            raise InvalidInputError(f"images have 1 or 3 channels, got {self.channels}")
        for name, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, self.channels):
                raise InvalidInputError(
                    f"image {name} has {len(values)} values for {self.channels} channels"
                )
        if any(s == 0 for s in self.std) or self.scale == 0:
            raise InvalidInputError("image std and scale must not be 0")


@dataclasses.dataclass(frozen=True)
class Samples:
    """Feeds split into those that calibrate and those that judge."""

    calibration: list[dict[str, np.ndarray]]
    held_back: list[dict[str, np.ndarray]]
    source: str
    random: bool = False

    def describe(self) -> str:
        what = f"{self.source} (the result means nothing)" if self.random else self.source
        return f"{len(self.calibration)} calibration + {len(self.held_back)} held-back samples from {what}"


def load_samples(
    data: Any,
    inputs: Sequence[Any],
    *,
    preprocessing: ImagePreprocessing | None = None,
    held_back: float = HELD_BACK,
) -> Samples:
    """Samples from ``data`` for a model with ``inputs`` (``TensorSpec``s), split.

    Args:
        data: a ``.npz`` file (one array per input name, samples along the first axis), a
            ``.npy`` file (a one-input model), a folder of images (with ``preprocessing``), or an
            iterable of feed dicts (``{"x": array}``, each one sample).
        inputs: the model's input specs (name, dtype, shape).
        preprocessing: how images become the input (needed for a folder).
        held_back: the fraction kept for judging.

    Raises:
        InvalidInputError: the data is missing, empty, or does not fit the inputs (names the
            input, the shape or dtype it has and the one the model takes).
    """
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.exists():
            raise InvalidInputError(f"calibration data not found: {path}")
        if path.is_dir():
            feeds, source = _images(path, inputs, preprocessing), f"images in {path}"
        elif path.suffix == ".npz":
            feeds, source = _npz(path, inputs), str(path)
        elif path.suffix == ".npy":
            feeds, source = _npy(path, inputs), str(path)
        else:
            raise InvalidInputError(
                f"calibration data {path}: give a .npz (one array per input, samples along the "
                "first axis), a .npy (one-input models) or a folder of images"
            )
    elif isinstance(data, Mapping):
        raise InvalidInputError(
            "calibration data is one feed dict; give a list of them (one per sample), so that "
            "some can be held back for judging"
        )
    elif isinstance(data, Iterable):
        feeds, source = [dict(f) for f in data], "the given feeds"
    else:
        raise InvalidInputError(
            f"calibration data must be a path or an iterable of feed dicts, got {type(data).__name__}"
        )
    feeds = [_checked(feed, inputs, i) for i, feed in enumerate(feeds)]
    return split(feeds, source, held_back)


def split(
    feeds: list[dict[str, np.ndarray]],
    source: str,
    held_back: float = HELD_BACK,
    *,
    random: bool = False,
) -> Samples:
    """A ``held_back`` fraction of the samples, drawn at random with a fixed seed, held back;
    the rest calibrate."""
    if len(feeds) < 2:
        raise InvalidInputError(
            f"calibration needs at least 2 samples (one to calibrate on, one to judge with); "
            f"{source} has {len(feeds)}"
        )
    if not 0 < held_back < 1:
        raise InvalidInputError(f"the held-back fraction must be in (0, 1), got {held_back}")
    count = max(1, min(len(feeds) - 1, round(len(feeds) * held_back)))
    # Drawn at random (seeded: the same split every run), not every k-th sample: data often
    # comes in runs (each image at four rotations, each speaker's clips together), and every
    # 4th of 4 rotations judges on one rotation only.
    judged = set(np.random.default_rng(0).choice(len(feeds), size=count, replace=False).tolist())
    return Samples(
        calibration=[f for i, f in enumerate(feeds) if i not in judged],
        held_back=[f for i, f in enumerate(feeds) if i in judged],
        source=source,
        random=random,
    )


def _rows(spec: Any) -> int:
    """How many rows along the first axis one sample of ``spec`` takes: its declared first dim
    where that is a fixed size (a voice's 3 scales, a batch fixed at 9 tiles), else 1."""
    shape = getattr(spec, "shape", None)
    if shape and isinstance(shape[0], int) and shape[0] > 0:
        return int(shape[0])
    return 1


def _samples_of(path: Path, arrays: Mapping[str, np.ndarray], inputs: Sequence[Any]) -> int:
    """The number of samples in ``arrays`` (samples along the first axis, each input's
    :func:`_rows` at a time), the same for every input."""
    counts = {}
    for spec in inputs:
        rows, have = _rows(spec), len(arrays[spec.name])
        if have % rows:
            raise InvalidInputError(
                f"{path}: input {spec.name!r} has {have} rows; it takes {rows} per sample "
                f"({spec.describe()}), so samples come as multiples of {rows}"
            )
        counts[spec.name] = have // rows
    if len(set(counts.values())) != 1:
        raise InvalidInputError(
            f"{path}: the inputs have different sample counts: {counts} (samples along the "
            "first axis; an input of fixed first size n takes n rows per sample)"
        )
    return next(iter(counts.values()))


def _npz(path: Path, inputs: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    names = [spec.name for spec in inputs]
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except (ValueError, OSError) as e:
        raise InvalidInputError(f"cannot read calibration data {path}: {e}") from e
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InvalidInputError(
            f"{path} holds {sorted(arrays)}; the model's inputs are {names}: missing "
            f"{', '.join(map(repr, missing))} (one array per input, samples along the first axis)"
        )
    count = _samples_of(path, arrays, inputs)
    rows = {spec.name: _rows(spec) for spec in inputs}
    return [{n: arrays[n][i * rows[n] : (i + 1) * rows[n]] for n in names} for i in range(count)]


def _npy(path: Path, inputs: Sequence[Any]) -> list[dict[str, np.ndarray]]:
    names = [spec.name for spec in inputs]
    if len(names) != 1:
        raise InvalidInputError(
            f"{path} is one array but the model takes {len(names)} inputs ({names}); give a .npz "
            "with one array per input"
        )
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise InvalidInputError(f"cannot read calibration data {path}: {e}") from e
    rows = _rows(inputs[0])
    count = _samples_of(path, {names[0]: array}, inputs)
    return [{names[0]: array[i * rows : (i + 1) * rows]} for i in range(count)]


def _images(
    folder: Path, inputs: Sequence[Any], preprocessing: ImagePreprocessing | None
) -> list[dict[str, np.ndarray]]:
    if len(inputs) != 1:
        raise InvalidInputError(
            f"a folder of images feeds a one-input model; this one takes {len(inputs)}"
        )
    if preprocessing is None:
        raise InvalidInputError(
            f"{folder} is a folder of images: declare how they become the input (size, layout, "
            "mean/std), e.g. --image-size 224x224 --layout NCHW --mean 0.485,0.456,0.406 "
            "--std 0.229,0.224,0.225"
        )
    try:
        from PIL import Image
    except ImportError as e:
        raise InvalidInputError("reading images needs Pillow: pip install Pillow") from e
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
    if not files:
        raise InvalidInputError(f"{folder} holds no images ({', '.join(sorted(_IMAGE_SUFFIXES))})")
    p = preprocessing
    mean = np.array(p.mean, np.float32).reshape(-1)
    std = np.array(p.std, np.float32).reshape(-1)
    feeds = []
    for file in files:
        try:
            with Image.open(file) as image:
                pixels = image.convert("RGB" if p.channels == 3 else "L").resize(
                    (p.size[1], p.size[0]), Image.Resampling.BILINEAR
                )
                array = np.asarray(pixels, np.float32)
        except OSError as e:
            raise InvalidInputError(f"cannot read image {file}: {e}") from e
        if array.ndim == 2:
            array = array[:, :, None]
        array = (array / p.scale - mean) / std
        if p.layout == "NCHW":
            array = array.transpose(2, 0, 1)
        feeds.append({inputs[0].name: array[None].astype(np.float32)})
    return feeds


def _checked(feed: Mapping[str, Any], inputs: Sequence[Any], index: int) -> dict[str, np.ndarray]:
    """``feed`` as arrays of the model's dtypes; a wrong name, rank or fixed dim is an error."""
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.name not in feed:
            raise InvalidInputError(
                f"calibration sample {index} has no input {spec.name!r} (it has "
                f"{sorted(feed)}); the model takes {[s.name for s in inputs]}"
            )
        array = np.asarray(feed[spec.name])
        if spec.dtype is not None and array.dtype != spec.dtype:
            if array.dtype.kind != spec.dtype.kind:
                raise InvalidInputError(
                    f"calibration sample {index}: input {spec.name!r} is {array.dtype}, the model "
                    f"takes {spec.dtype}"
                )
            array = array.astype(spec.dtype)
        if spec.shape is not None:
            if array.ndim != len(spec.shape):
                raise InvalidInputError(
                    f"calibration sample {index}: input {spec.name!r} has shape {list(array.shape)}, "
                    f"the model takes rank {len(spec.shape)} ({spec.describe()})"
                )
            for axis, (have, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
                if isinstance(want, int) and have != want:
                    raise InvalidInputError(
                        f"calibration sample {index}: input {spec.name!r} dim {axis} is {have}, "
                        f"the model takes {want} ({spec.describe()})"
                    )
        out[spec.name] = array
    return out
