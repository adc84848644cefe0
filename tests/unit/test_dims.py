"""How exporters spell "any size", and what ferry makes of it everywhere a shape is read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import ferry
from ferry.cli.main import cli
from ferry.errors import ModelLoadError
from ferry.graph import dim, load_model, summarize


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        (3, 3),
        (0, 0),
        (-1, None),  # dim_value: -1, as some exporters write "dynamic"
        ("batch", "batch"),
        ("unk__3", "unk__3"),  # a name ONNX shape inference made: still a name
        ("?", None),
        ("", None),
        ("-1", None),
        ("None", None),
        ("dynamic", None),
        (None, None),
    ],
)
def test_dim(raw: int | str | None, read: int | str | None) -> None:
    assert dim(raw) == read


def _model(path: Path) -> Path:
    """x[-1, 3, '?', '?'] -> Conv 3x3 -> y: a detector's input as some exporters declare it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    x.type.tensor_type.shape.dim[0].ClearField("dim_param")
    x.type.tensor_type.shape.dim[0].dim_value = -1
    w = onnx.numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 2, "?", "?"])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_minus_one_and_question_marks_are_open_dims(tmp_path: Path) -> None:
    path = _model(tmp_path / "m.onnx")
    session = ferry.load(path)
    (spec,) = session.inputs
    assert spec.shape == (None, 3, None, None)
    # Any batch, and H != W: '?' twice is two unknown dims, not one shared symbol.
    out = session.run({"x": np.ones((2, 3, 10, 7), np.float32)})["y"]
    assert out.shape == (2, 2, 8, 5)
    summary = summarize(load_model(path))
    assert summary.flops > 0 and summary.inputs[0].shape == (None, 3, None, None)
    # FLOPs depend on H and W: say so, and count them exactly at given shapes.
    assert summary.flops_assumed == ("x[2]", "x[3]")
    at = summarize(load_model(path), {"x": (1, 3, 10, 7)})
    assert at.flops == 2 * (1 * 2 * 8 * 5) * (3 * 3 * 3) and at.flops_shapes == {"x": [1, 3, 10, 7]}
    with pytest.raises(ModelLoadError, match="does not fit its declared shape"):
        summarize(load_model(path), {"x": (1, 4, 10, 7)})
    result = CliRunner().invoke(cli, ["info", str(path), "--json"])
    info = json.loads(result.output)
    assert info["inputs"][0]["shape"] == [None, 3, None, None] and info["flops"] > 0
    # Generated inputs take sizes that run: not negative, not 1x1 pixels.
    result = CliRunner().invoke(cli, ["run", str(path), "--random"])
    assert result.exit_code == 0, result.output
    assert "[1, 2, 222, 222]" in result.output


def test_a_failure_on_guessed_sizes_says_which_to_give(tmp_path: Path) -> None:
    # A Reshape to a fixed size fails on any size of x's open dim but one.
    shape = onnx.numpy_helper.from_array(np.array([6, 7], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 7])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "r.onnx")
    # The Reshape's constant pins n at 7: found, not guessed (issue 31).
    found = CliRunner().invoke(cli, ["run", str(tmp_path / "r.onnx"), "--random"])
    assert found.exit_code == 0, found.output
    assert "x 6x7 (7 from the Reshape reshape to [6, 7])" in found.output
    # A Reshape no size of n fits (6 * n = 5 * 7): one line naming the dim and the fix.
    shape.CopyFrom(onnx.numpy_helper.from_array(np.array([5, 7], np.int64), "shape"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 7]))
    model.graph.initializer[0].CopyFrom(shape)
    onnx.save(model, tmp_path / "r.onnx")
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "r.onnx"), "--random"])
    assert result.exit_code == 2
    message = result.stderr
    assert "could not find inputs that run x float32 [6, n]" in message
    assert "--shape x=6,n (n replaced by sizes)" in message
    assert "Traceback" not in message and "onnxruntime_src" not in message
    assert "[E:onnxruntime" not in message  # ONNX Runtime's own log line stays quiet
    given = CliRunner().invoke(
        cli, ["run", str(tmp_path / "r.onnx"), "--random", "--shape", "x=6x7"]
    )
    assert given.exit_code == 2 and "does not run at the sizes given (x 6x7)" in given.stderr


def test_weights_in_constant_nodes_count_as_parameters() -> None:
    # Paddle's exporter keeps every weight in a Constant node, none in initializers.
    w = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32))
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["w"], name="w", value=w),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    summary = summarize(load_model(model))
    assert summary.param_count == 16 and summary.param_bytes == 64
