"""``prune`` on kit classifiers made by others: PP-LCNet (orientation, a Paddle export with
depthwise convs, squeeze-excitation and BatchNorms) and open_nsfw (ResNet-50 thin, a PyTorch
export of a Keras port: NHWC transposes, BatchNorms written as arithmetic, bottleneck residuals).

Channel pruning keeps the graph valid and runs on the kit's real photographs with outputs of the
same shapes, MACs drop as (1-s) to (1-s)^2; accuracy is won back by distillation (not here).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import kit_models
from ferry.optimizer.prune import check_2_4, macs, prune


def _run(model: ir.Model | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else ir.to_proto(model).SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


@pytest.mark.parametrize("mid", ["orientation", "open_nsfw"])
def test_channel_pruning_keeps_a_valid_runnable_graph(mid: str) -> None:
    path = str(kit_models.path(mid))
    feeds = kit_models.feeds(mid)
    want = _run(path, feeds)
    sparsity = 0.3
    result = prune(path, method="channel", sparsity=sparsity)
    onnx.checker.check_model(ir.to_proto(result.model), full_check=True)
    got = _run(result.model, feeds)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert all(np.isfinite(g).all() for g in got)
    report = result.report
    assert len(report.groups) >= 15, report.lines()
    ratio = report.macs_after / report.macs_before
    keep = 1 - sparsity
    assert keep**2 * 0.9 <= ratio <= keep, report.lines()
    assert report.after.bytes < report.before.bytes * keep
    assert macs(result.model) == report.macs_after
    # The classifier head reaches the output: kept, with the reason.
    assert any("Softmax" in s["reason"] for s in report.skipped), report.skipped


def test_orientation_by_batchnorm_scale() -> None:
    path = str(kit_models.path("orientation"))
    result = prune(path, sparsity=0.5, criterion="bn-gamma")
    # PP-LCNet's convs all have BatchNorms (folded first; their scales are kept for ranking);
    # only the squeeze-excitation groups have none.
    used = [g["criterion"] for g in result.report.groups]
    assert used.count("bn-gamma") >= 12, used
    feeds = kit_models.feeds("orientation")
    (probs,) = _run(result.model, feeds)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)


def test_orientation_as_exported_names_what_pins_it() -> None:
    """Without ferry's optimization first, the Paddle graph's dynamic Reshape (its target made
    by Shape -> Slice -> Concat) pins the last group; the rest is still pruned."""
    path = str(kit_models.path("orientation"))
    result = prune(path, sparsity=0.3, optimize=False)
    reasons = " ".join(s["reason"] for s in result.report.skipped)
    assert "Shape" in reasons and "Reshape" in reasons
    assert result.report.groups and result.report.macs_after < result.report.macs_before
    assert _run(result.model, kit_models.feeds("orientation"))[0].shape == (1, 4)


def test_2_4_on_orientation() -> None:
    path = str(kit_models.path("orientation"))
    result = prune(path, method="2:4", sparsity=0.5)
    assert result.report.layers and check_2_4(result.model) == []
    assert check_2_4(path)  # the original is dense
    assert _run(result.model, kit_models.feeds("orientation"))[0].shape == (1, 4)
