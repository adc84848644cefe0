"""The ``iree`` backend on kit CNNs made by others (the real tier's kit): placed with ONNX
Runtime for what IREE refuses, run through ``ferry.load``, judged at the task against ONNX
Runtime alone as the kit says (``tests/real/kit_models.py``, reused when this plugin sits in
ferry's repository).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ferry

pytestmark = [pytest.mark.slow, pytest.mark.real]

#: The share of each model's nodes placed on iree, at least (measured; the rest: ONNX Runtime).
#: open_nsfw keeps one Pad on ONNX Runtime: its pads are computed (Cast of a shape chain), and
#: IREE, given the Pad alone, cannot lower a Pad whose pads are not constants.
ON_IREE = {
    "orientation": 1.0,
    "open_nsfw": 0.99,
    "captcha_det": 1.0,
    "mtcnn_torch": 1.0,
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("converted")


@pytest.mark.parametrize("mid", sorted(ON_IREE))
def test_kit_cnn_on_iree_matches_onnxruntime(kit_models: Any, converted: Path, mid: str) -> None:
    if kit_models.entry(mid)["format"] == "onnx":
        path = kit_models.path(mid)
    else:
        path = kit_models.convert(mid, converted / f"{mid}.onnx")
    session = ferry.load(path, backends=["iree", "onnxruntime"], check_pays=False)
    counts = {"iree": 0, "onnxruntime": 0}
    for partition in session.plan.partitions:
        counts[partition.backend] += len(partition.nodes)
    assert counts["iree"] / sum(counts.values()) >= ON_IREE[mid], (mid, counts)
    want = ferry.load(path, backends=["onnxruntime"])
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        kit_models.judged(mid, "load iree", session.run(feeds), want.run(feeds))
