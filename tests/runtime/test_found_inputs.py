"""Valid inputs, found not guessed (issue 31): small graphs whose inputs only work at the sizes
and values the graph asks for; each test fails if ferry goes back to guessing (224, ids in [0, 10))."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.errors import InvalidInputError
from ferry.runtime import FoundInputs, found_inputs, load, random_feeds
from ferry.runtime._found import clear_found

F, I64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.fixture(autouse=True)
def _fresh() -> None:
    clear_found()


def _model(nodes, inputs, outputs, inits=()) -> ir.Model:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return ir.from_proto(proto)


def _out() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("y", F, None)  # rank unknown: the shapes vary


def _runs(model: ir.Model, feeds: dict[str, np.ndarray]) -> None:
    data = ir.to_proto(model).SerializeToString()
    ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _height_pinned(rows: int, *, pool: bool = True) -> ir.Model:
    """x [N, 3, H, W] -> (AveragePool 16x1 when ``pool``) -> Concat on the width with a constant
    of ``rows`` rows: runs only where the pooled height is ``rows`` (a recognizer's head)."""
    nodes = []
    src = "x"
    if pool:
        nodes.append(
            helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[16, 1], strides=[16, 1])
        )
        src = "p"
    side = numpy_helper.from_array(np.zeros((1, 3, rows, 1), np.float32), "side")
    nodes.append(helper.make_node("Concat", [src, "side"], ["y"], axis=3))
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, ["batch", 3, "height", "width"])],
        [_out()],
        [side],
    )


def test_a_height_the_graph_pins_is_found() -> None:
    model = _height_pinned(3)  # 3 pooled rows: height 48 to 63
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail):  # the guess: 224 high
        _runs(model, random_feeds([_spec(model)]))
    found = found_inputs(model)
    assert isinstance(found, FoundInputs)
    assert found.shapes["x"][2] == 48, found.how
    assert found.shapes["x"][0] == 1
    _runs(model, found.feeds)
    assert "text line" in found.how


def test_a_height_no_stride_shows_is_found_by_probing() -> None:
    model = _height_pinned(32, pool=False)
    found = found_inputs(model)
    assert found.shapes["x"][2] == 32
    assert "did not run" in found.how


def test_nothing_runs_is_one_line_naming_the_dims_and_the_fix() -> None:
    model = _height_pinned(37, pool=False)
    with pytest.raises(InvalidInputError) as e:
        found_inputs(model)
    message = str(e.value)
    assert "\n" not in message
    assert "could not find inputs that run x float32 [batch, 3, height, width]" in message
    assert "--shape x=1,3,H,W" in message
    assert "Concat" in message or "concat" in message


def test_given_shapes_are_kept() -> None:
    model = _height_pinned(3)
    found = found_inputs(model, {"x": (1, 3, 50, 10)})
    assert found.shapes["x"] == (1, 3, 50, 10)
    assert "given" in found.how
    with pytest.raises(
        InvalidInputError, match=r"does not run at the sizes given \(x 1x3x100x10\)"
    ):
        found_inputs(model, {"x": (1, 3, 100, 10)})


def _bert() -> ir.Model:
    """input_ids -> a 50-row table; token_type_ids -> a 2-row table; attention_mask multiplies."""
    words = numpy_helper.from_array(np.ones((50, 4), np.float32), "words")
    types = numpy_helper.from_array(np.ones((2, 4), np.float32), "types")
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["w"]),
        helper.make_node("Cast", ["token_type_ids"], ["t64"], to=I64),
        helper.make_node("Gather", ["types", "t64"], ["t"]),
        helper.make_node("Add", ["w", "t"], ["e"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=F),
        helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["y"]),
    ]
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
    ids = ["batch", "sequence"]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("input_ids", I64, ids),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT32, ids),
            helper.make_tensor_value_info("attention_mask", I64, ids),
        ],
        [_out()],
        [words, types, axes],
    )


def test_ids_stay_within_the_tables_they_index() -> None:
    model = _bert()
    found = found_inputs(model, seed=3)
    feeds = found.feeds
    assert feeds["input_ids"].max() < 50 and feeds["input_ids"].min() >= 0
    assert feeds["input_ids"].max() >= 10  # the whole table, not [0, 10)
    assert feeds["token_type_ids"].max() < 2
    assert feeds["token_type_ids"].dtype == np.int32
    assert (feeds["attention_mask"] == 1).all()
    assert found.shapes["input_ids"] == found.shapes["attention_mask"]
    assert "[0, 50)" in found.how and "mask" in found.how


def test_token_types_bounded_by_their_table_whatever_their_name() -> None:
    model = _bert()
    # Renamed: the graph alone says the ids index a table of 2 rows.
    for value in model.graph.inputs:
        if value.name == "token_type_ids":
            value.name = "segment_b"
    found = found_inputs(model)
    assert found.feeds["segment_b"].max() < 2


def test_a_one_hot_depth_bounds_its_indices() -> None:
    depth = numpy_helper.from_array(np.array(5, np.int64), "depth")
    values = numpy_helper.from_array(np.array([0, 1], np.float32), "values")
    model = _model(
        [
            helper.make_node("Cast", ["labels"], ["l"], to=I64),
            helper.make_node("OneHot", ["l", "depth", "values"], ["y"]),
        ],
        [helper.make_tensor_value_info("labels", I64, [1, 64])],
        [_out()],
        [depth, values],
    )
    found = found_inputs(model, seed=1)
    assert found.feeds["labels"].max() < 5
    assert len(np.unique(found.feeds["labels"])) > 1


def _with_lengths(name: str) -> ir.Model:
    """ids [B, T] reshaped to [1, L]: runs only where the lengths input equals T."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    table = numpy_helper.from_array(np.ones((20, 2), np.float32), "table")
    return _model(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"]),
            helper.make_node("ReduceSum", ["e"], ["s"], keepdims=0, noop_with_empty_axes=1),
            helper.make_node("Concat", ["one", name], ["shape"], axis=0),
            helper.make_node("Cast", ["ids"], ["f"], to=F),
            helper.make_node("Reshape", ["f", "shape"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("ids", I64, ["batch", "phonemes"]),
            helper.make_tensor_value_info(name, I64, [1]),
        ],
        [_out()],
        [one, table],
    )


@pytest.mark.parametrize("name", ["input_lengths", "n"])
def test_a_lengths_input_is_the_sequence_length(name: str) -> None:
    found = found_inputs(_with_lengths(name))
    assert found.feeds[name].tolist() == [found.shapes["ids"][1]]
    assert found.feeds["ids"].max() < 20


def test_scalars_float64_and_knobs_keep_their_type_and_sign() -> None:
    model = _model(
        [
            helper.make_node("Mul", ["x", "scales"], ["a"]),
            helper.make_node("Cast", ["t"], ["t32"], to=F),
            helper.make_node("Div", ["a", "t32"], ["y"]),
        ],
        [
            helper.make_tensor_value_info("x", F, ["batch", 3]),
            helper.make_tensor_value_info("scales", F, [3]),
            helper.make_tensor_value_info("t", TensorProto.DOUBLE, []),
        ],
        [_out()],
    )
    found = found_inputs(model)
    assert found.feeds["t"].shape == () and found.feeds["t"].dtype == np.float64
    assert found.feeds["t"] > 0
    assert np.allclose(found.feeds["scales"], [1.0, 1.0, 1.0])


def test_found_once_per_model_content_and_from_a_session_or_a_path(tmp_path: Path) -> None:
    model = _height_pinned(3)
    first = found_inputs(model)
    start = time.perf_counter()
    again = found_inputs(model)
    assert time.perf_counter() - start < 0.5
    assert again.shapes == first.shapes
    file = tmp_path / "model.onnx"
    ir.save(model, file)
    assert found_inputs(file).shapes == first.shapes
    assert found_inputs(load(file, backends=["onnxruntime"])).shapes == first.shapes


def test_remembered_in_the_artifact(tmp_path: Path) -> None:
    model = _height_pinned(3)
    ir.save(model, tmp_path / "model.onnx")
    (tmp_path / "ferry.json").write_text(json.dumps({"provenance": "x"}), encoding="utf-8")
    found = found_inputs(tmp_path)
    saved = json.loads((tmp_path / "ferry.json").read_text(encoding="utf-8"))
    assert saved["provenance"] == "x"
    assert saved["found_inputs"]["shapes"] == {"x": list(found.shapes["x"])}
    clear_found()
    again = found_inputs(tmp_path)
    assert again.shapes == found.shapes and "remembered" in again.how


def test_given_arrays_fix_the_dims_they_share() -> None:
    model = _bert()
    ids = np.full((1, 7), 3, np.int64)
    found = found_inputs(model, given={"input_ids": ids})
    assert found.feeds["input_ids"] is ids
    assert found.shapes["attention_mask"] == (1, 7)


def test_unknown_names_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="unknown input 'nope'"):
        found_inputs(_bert(), {"nope": (1, 2)})


def _spec(model: ir.Model):
    from ferry.runtime import spec_of

    return spec_of(model.graph.inputs[0])


def test_given_sizes_keep_ids_in_range() -> None:
    model = _bert()
    feeds = found_inputs(model, {"input_ids": (1, 40)}).feeds
    assert feeds["token_type_ids"].max() < 2 and (feeds["attention_mask"] == 1).all()
    assert feeds["input_ids"].shape == (1, 40) and feeds["input_ids"].max() < 50
    _runs(model, feeds)


def test_the_exporters_metadata_sizes_come_first() -> None:
    model = _height_pinned(3)
    model.metadata_props["imgsz"] = "[48, 96]"
    found = found_inputs(model)
    assert found.shapes["x"] == (1, 3, 48, 96) and "metadata" in found.how
