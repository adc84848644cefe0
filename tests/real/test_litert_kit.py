"""The ``litert`` backend on kit CNNs made by others: placed with ONNX Runtime for the rest,
run through ``ferry.load``, judged at the task against ONNX Runtime alone.

Each model (ONNX as shipped, or as ``ferry convert`` makes it) is loaded at its kit sizes
(TFLite fixes every size but the batch: inputs with other symbolic dims are fixed first) with
``backends=["litert", "onnxruntime"]``; the share of its nodes that LiteRT runs is held to what
was measured, and its outputs on two realistic inputs are judged as the kit says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir
import pytest

import ferry
import kit_models
from ferry.graph import graph_inputs, load_model, shape_of

pytest.importorskip("ai_edge_litert", reason="LiteRT runs the partitions")

ONNX_OF = Callable[[str], Path]

#: The share of each model's nodes placed on litert, at least (measured; the rest: ONNX Runtime).
ON_LITERT = {
    "orientation": 1.0,
    "open_nsfw": 1.0,
    "ppocr_cls_paddle": 1.0,
    "emotion_keras": 1.0,
    "mtcnn_torch": 1.0,
    "captcha_det": 1.0,
}


def _at_kit_sizes(mid: str, path: Path) -> ir.Model:
    """The model with the kit's sizes on inputs whose dims past the batch are symbolic."""
    from ferry.optimizer import FixInputShapesPass

    model = load_model(path)
    sizes = {i["name"]: tuple(i["shape"]) for i in kit_models.entry(mid)["inputs"]}
    feeds = kit_models.feeds(mid)
    fix = {}
    for value in graph_inputs(model):
        shape = shape_of(value)
        name = value.name or ""
        if shape is not None and not all(isinstance(d, int) for d in shape[1:]):
            fix[name] = tuple(feeds[name].shape) if name in feeds else sizes[name]
    if fix:
        FixInputShapesPass(fix)(model)
    return model


@pytest.mark.parametrize("mid", sorted(ON_LITERT))
def test_litert_with_onnxruntime_matches_onnxruntime(mid: str, onnx_file: ONNX_OF) -> None:
    path = onnx_file(mid)
    model = _at_kit_sizes(mid, path)
    session = ferry.load(
        model, backends=["litert", "onnxruntime"], cache_dir=False, check_pays=False
    )
    counts = {"litert": 0, "onnxruntime": 0}
    for partition in session.plan.partitions:
        counts[partition.backend] += len(partition.nodes)
    share = counts["litert"] / sum(counts.values())
    assert share >= ON_LITERT[mid], (mid, counts, session.plan.partitions)
    want_session = ferry.load(path)
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        kit_models.judged(mid, "load litert", session.run(feeds), want_session.run(feeds))
