"""A model is batched by default only when its rows are independent samples (found by running it)."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnx.helper as h
import pytest

from ferry.serving import ModelConfig
from ferry.serving._scheduler import load_version


def _write(path: Path, nodes: list[onnx.NodeProto]) -> Path:
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    model = h.make_model(h.make_graph(nodes, "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_rows_that_see_each_other_are_not_batched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Softmax over the leading dim: each row's answer depends on the other rows (like the tiles
    # of one round attending to each other).
    model = _write(tmp_path / "round.onnx", [h.make_node("Softmax", ["x"], ["y"], axis=0)])
    with caplog.at_level(logging.WARNING):
        loaded = load_version("round", model, ModelConfig(), cores=1)
    assert loaded.resolved.max_batch_size == 0
    assert not loaded.resolved.dynamic_batching
    assert "served without batching" in caplog.text and "depend on each other" in caplog.text


def test_independent_rows_are_batched(tmp_path: Path) -> None:
    model = _write(tmp_path / "rows.onnx", [h.make_node("Softmax", ["x"], ["y"], axis=1)])
    loaded = load_version("rows", model, ModelConfig(), cores=1)
    assert loaded.resolved.max_batch_size == 8 and loaded.resolved.dynamic_batching


def test_a_config_that_says_how_to_batch_is_kept(tmp_path: Path) -> None:
    model = _write(tmp_path / "round.onnx", [h.make_node("Softmax", ["x"], ["y"], axis=0)])
    loaded = load_version("round", model, ModelConfig(max_batch_size=4), cores=1)
    assert loaded.resolved.max_batch_size == 4
