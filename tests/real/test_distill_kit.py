"""Distillation on the kit: ferry's ONNX -> torch module matches ONNX Runtime on models made by
others (PP-LCNet orientation from paddle2onnx, open_nsfw from tf2onnx), and a damaged orientation
classifier is won back from the original on rendered pages, without labels."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import kit_models

torch = pytest.importorskip("torch")

from ferry.optimizer.distill import distill, to_torch, write_back  # noqa: E402

TOLERANCE = 1e-4


def _ort(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return [np.asarray(v) for v in session.run(None, feeds)]


def _as_constant_nodes(model: ir.Model) -> ir.Model:
    """Every float initializer moved into a Constant node (how Paddle exports hold weights)."""
    out = model.clone()
    graph = out.graph
    first = next(iter(graph))
    for name in [n for n, v in graph.initializers.items() if v.dtype == ir.DataType.FLOAT]:
        value = graph.initializers.pop(name)
        node = ir.node("Constant", [], attributes={"value": value.const_value}, name=f"c_{name}")
        graph.insert_before(first, node)
        value.replace_all_uses_with(node.outputs[0])
        node.outputs[0].name = name
    return out


@pytest.mark.parametrize("model_id", ["orientation", "open_nsfw"])
def test_kit_model_as_torch_matches_onnxruntime(model_id: str) -> None:
    model = ir.load(str(kit_models.path(model_id)))
    module = to_torch(model)
    assert module.trainable
    for index in range(2):
        feeds = kit_models.feeds(model_id, index=index)
        want = _ort(model, feeds)
        with torch.no_grad():
            got = module(*[torch.from_numpy(feeds[n]) for n in module.input_names])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.numpy(), w, atol=TOLERANCE, rtol=TOLERANCE)
    # Written back untrained, the model computes exactly what it did.
    feeds = kit_models.feeds(model_id)
    for a, b in zip(_ort(write_back(model, module), feeds), _ort(model, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_orientation_with_constant_node_weights() -> None:
    model = _as_constant_nodes(ir.load(str(kit_models.path("orientation"))))
    assert not any(v.dtype == ir.DataType.FLOAT for v in model.graph.initializers.values())
    module = to_torch(model)
    assert {kind for kind, _ in module.sources.values()} == {"constant"}
    feeds = kit_models.feeds("orientation")
    with torch.no_grad():
        got = module(torch.from_numpy(feeds["x"]))[0].numpy()
    np.testing.assert_allclose(got, _ort(model, feeds)[0], atol=TOLERANCE)


def pages(count: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    """Rendered text pages turned by 0, 90, 180 and 270 degrees, in a shuffled order."""
    feeds, labels = [], []
    for index in range(count):
        x = kit_models.feeds("orientation", index=index)["x"]
        for turn in range(4):
            feeds.append({"x": np.ascontiguousarray(np.rot90(x, turn, axes=(2, 3)))})
            labels.append(turn)
    order = np.random.default_rng(1).permutation(len(feeds))
    return [feeds[i] for i in order], np.asarray(labels)[order]


def damaged(model: ir.Model, noise: float) -> ir.Model:
    out = model.clone()
    rng = np.random.default_rng(0)
    for name, value in out.graph.initializers.items():
        array = value.const_value.numpy()
        if array.dtype == np.float32 and array.ndim == 4:  # the conv kernels
            noisy = array + rng.normal(0, noise * array.std(), array.shape)
            value.const_value = ir.tensor(noisy.astype(np.float32), name=name)
    return out


def test_damaged_orientation_classifier_is_won_back() -> None:
    teacher = ir.load(str(kit_models.path("orientation")))
    student = damaged(teacher, 0.2)
    feeds, _ = pages(12)
    result = distill(
        teacher,
        student,
        data=feeds,
        epochs=3,
        batch_size=8,
        lr=3e-4,
        threads=1,
        progress=False,
        # Bounded explicitly, whatever the defaults (this test: 25 s on 2 busy cores, load 9).
        max_seconds=120,
    )
    r = result.report
    assert r.outputs == {"fetch_name_0": "kl-probs"}  # the model ends in a Softmax
    assert r.improved, r.lines()
    assert r.agreement_before is not None and r.agreement_after is not None
    assert r.agreement_after > r.agreement_before
    assert r.cosine_after > r.cosine_before + 0.05, r.lines()
    assert r.parity_max_abs is not None and r.parity_max_abs < TOLERANCE
