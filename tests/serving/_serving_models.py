"""Small models and repository writers for the serving tests (imported by name: keep it unique)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def add_const(k: float, batch: str | int = "batch") -> onnx.ModelProto:
    """x[batch, 4] float32 -> y = x + k: versions that differ by k tell which one answered."""
    const = numpy_helper.from_array(np.full(4, k, np.float32), "k")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "k"], ["y"], name="add")],
        "add_const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [const],
    )
    return _model(graph)


def identity(elem_type: int, shape: list[Any] | None = None) -> onnx.ModelProto:
    """x -> Identity -> y of one element type (default shape [batch, 3])."""
    shape = ["batch", 3] if shape is None else shape
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="id")],
        "identity",
        [helper.make_tensor_value_info("x", elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)],
    )
    return _model(graph)


def gather_rows() -> onnx.ModelProto:
    """idx[batch] int64 -> Gather(table[4, 2], idx) -> y[batch, 2]: an index past 3 fails at run time."""
    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["y"], name="gather", axis=0)],
        "gather_rows",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [table],
    )
    return _model(graph)


def write_model(repo: Path, name: str, version: int, model: onnx.ModelProto) -> Path:
    folder = repo / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, path)
    return path


def write_config(repo: Path, name: str, config: Any) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (repo / name / "config.json").write_text(text)
