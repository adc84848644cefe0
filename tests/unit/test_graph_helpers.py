"""The one helper per job in ``ferry.graph``: constants, tensors, external files, input shapes, FLOPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.errors import InvalidInputError, ModelLoadError
from ferry.graph import (
    FlopCount,
    constant,
    constant_tensor,
    external_files,
    flops,
    load_model,
    save_model,
    shape_of,
    tensors,
    with_input_shapes,
)


def _constants_model() -> ir.Model:
    """y = x + w + state + c_* for each Constant attribute form; ``state`` is an initializer that
    is also an input (a default the caller may override)."""
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    state = numpy_helper.from_array(np.ones(4, np.float32), "state")
    nodes = [
        helper.make_node(
            "Constant", [], ["c_tensor"], value=numpy_helper.from_array(np.float32(2))
        ),
        helper.make_node("Constant", [], ["c_float"], value_float=1.5),
        helper.make_node("Constant", [], ["c_floats"], value_floats=[1.0, 2.0]),
        helper.make_node("Constant", [], ["c_int"], value_int=3),
        helper.make_node("Constant", [], ["c_ints"], value_ints=[4, 5]),
        helper.make_node("Constant", [], ["c_string"], value_string="hi"),
        helper.make_node("Add", ["x", "w"], ["a"]),
        helper.make_node("Add", ["a", "state"], ["b"]),
        helper.make_node("Add", ["b", "c_tensor"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[w, state],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _value(model: ir.Model, name: str) -> ir.Value:
    for node in model.graph:
        for out in node.outputs:
            if out.name == name:
                return out
    for value in model.graph.inputs:
        if value.name == name:
            return value
    return model.graph.initializers[name]


def test_constant_reads_initializers_and_every_constant_form() -> None:
    model = _constants_model()
    np.testing.assert_array_equal(constant(_value(model, "w")), np.arange(4, dtype=np.float32))
    assert constant(_value(model, "c_tensor")) == np.float32(2)
    float_ = constant(_value(model, "c_float"))
    assert (
        float_ is not None and float_.dtype == np.float32 and float_.shape == () and float_ == 1.5
    )
    floats = constant(_value(model, "c_floats"))
    assert floats is not None and floats.dtype == np.float32 and floats.tolist() == [1.0, 2.0]
    int_ = constant(_value(model, "c_int"))
    assert int_ is not None and int_.dtype == np.int64 and int_ == 3
    ints = constant(_value(model, "c_ints"))
    assert ints is not None and ints.dtype == np.int64 and ints.tolist() == [4, 5]
    string = constant(_value(model, "c_string"))
    assert string is not None and string.reshape(-1)[0] in (b"hi", "hi")
    tensor = constant_tensor(_value(model, "c_ints"))
    assert tensor is not None and tensor.dtype == ir.DataType.INT64


def test_constant_is_none_for_runtime_values_and_overridable_inputs() -> None:
    model = _constants_model()
    assert constant(None) is None
    assert constant(_value(model, "x")) is None  # a plain input
    assert constant(_value(model, "a")) is None  # computed
    # An initializer that is also an input may be fed another value: not a constant...
    assert constant(_value(model, "state")) is None
    assert constant_tensor(_value(model, "state")) is None
    # ...unless the caller asks for such inputs' defaults.
    default = constant(_value(model, "state"), input_defaults=True)
    assert default is not None and default.tolist() == [1.0] * 4


def test_constant_refuses_malformed_and_foreign_constant_nodes() -> None:
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 17})
    two = ir.node("Constant", [], attributes={"value_int": 1, "value_float": 2.0})
    foreign = ir.node("Constant", [], attributes={"value_int": 1}, domain="com.example")
    graph.extend([two, foreign])
    assert constant(two.outputs[0]) is None
    assert constant(foreign.outputs[0]) is None


def _with_subgraph_and_function() -> ir.Model:
    """An If whose branch holds an initializer and a Constant; a ConstantOfShape at the top."""
    inner_w = numpy_helper.from_array(np.full((2,), 7, np.float32), "inner_w")
    then_branch = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["t"], value=numpy_helper.from_array(np.ones(3, np.float32))
            )
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])],
        initializer=[inner_w],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["e"], value=numpy_helper.from_array(np.zeros(3, np.float32))
            )
        ],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])],
    )
    shape = numpy_helper.from_array(np.array([3], np.int64), "shape")
    nodes = [
        helper.make_node("If", ["cond"], ["r"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["z"],
            value=numpy_helper.from_array(np.array([0.0], np.float32)),
        ),
        helper.make_node("Add", ["r", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[shape],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_tensors_walks_subgraphs_and_every_tensor_attribute() -> None:
    model = _with_subgraph_and_function()
    sizes = sorted(t.size for t in tensors(model))
    # shape (1), ConstantOfShape's value (1), inner_w (2), then's and else's Constants (3 each).
    assert sizes == [1, 1, 2, 3, 3]
    # Weights: initializers and Constant nodes' values, not the ConstantOfShape fill value.
    assert sorted(t.size for t in tensors(model, weights_only=True)) == [1, 2, 3, 3]


def _external_model(folder: Path) -> Path:
    w = numpy_helper.from_array(np.arange(256, dtype=np.float32).reshape(16, 16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        initializer=[w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (folder / "weights").mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, location="weights/m.data", size_threshold=0)
    return path


def test_external_files_names_each_file_once(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    model = load_model(path)
    assert external_files(model) == ["weights/m.data"]
    assert external_files(model, inside=path.parent) == ["weights/m.data"]
    inline = tmp_path / "inline.onnx"
    save_model(model, inline, external_data=False)
    assert external_files(load_model(inline)) == []


def test_external_files_inside_refuses_files_outside_or_missing(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "a")
    model = load_model(path)
    with pytest.raises(ModelLoadError, match=r"weight 'w' .*'weights/m.data', outside its folder"):
        external_files(model, inside=tmp_path / "elsewhere")
    (path.parent / "weights" / "m.data").unlink()
    with pytest.raises(ModelLoadError, match="which is missing"):
        external_files(model, inside=path.parent)
    (tensor,) = [t for t in tensors(model) if isinstance(t, ir.ExternalTensor)]
    escaping = ir.ExternalTensor(
        "../secret.bin",
        0,
        tensor.nbytes,
        tensor.dtype,
        shape=tensor.shape,
        name="w",
        base_dir=str(path.parent),
    )
    model.graph.initializers["w"].const_value = escaping
    with pytest.raises(ModelLoadError, match=r"'\.\./secret\.bin', outside its folder"):
        external_files(model, inside=path.parent)


def _conv() -> ir.Model:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w_"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "h", "w_"])],
        initializer=[w],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_with_input_shapes_copies_and_clears_what_follows() -> None:
    model = _conv()
    fixed = with_input_shapes(model, {"x": (2, 3, 8, 8)})
    assert fixed is not model
    assert shape_of(fixed.graph.inputs[0]) == (2, 3, 8, 8)
    assert fixed.graph.outputs[0].shape is None
    assert shape_of(model.graph.inputs[0]) == ("n", 3, "h", "w_")  # the original is untouched
    kept = with_input_shapes(model, {"x": (1, 3, 4, 4)}, in_place=True, keep_output_shapes=True)
    assert kept is model and shape_of(model.graph.outputs[0]) == ("n", 4, "h", "w_")


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"z": (1, 3, 8, 8)}, "--opt names 'z', not an input of the model; its inputs are 'x'"),
        (
            {"x": (1, 3, 8)},
            "does not fit its declared shape .* has rank 3, but the input has rank 4",
        ),
        (
            {"x": (1, 4, 8, 8)},
            "does not fit its declared shape .*dim 1 is fixed at 3 in the model, not 4",
        ),
        ({"x": (0, 3, 8, 8)}, "sizes must be positive"),
    ],
)
def test_with_input_shapes_refuses_what_does_not_fit(
    shapes: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        with_input_shapes(_conv(), shapes, option="--opt")


def test_flops_per_sample_and_at_given_shapes() -> None:
    model = _conv()
    per_sample = flops(model)
    assert isinstance(per_sample, FlopCount)
    assert per_sample.flops == 2 * (1 * 4 * 1 * 1) * (3 * 3 * 3) and per_sample.unknown_nodes == 0
    at = flops(model, {"x": (2, 3, 8, 8)})
    assert at.flops == 2 * (2 * 4 * 8 * 8) * 27 and at.macs == at.flops // 2


def test_flops_counts_constant_node_weights_and_unknown_shapes() -> None:
    # A Gemm whose weight is a Constant node (Paddle's habit): its dims are the constant's.
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["w"], value=numpy_helper.from_array(np.ones((8, 5), np.float32))
            ),
            helper.make_node("Gemm", ["x", "w"], ["y"]),
            helper.make_node("MatMul", ["u", "v"], ["z"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
            helper.make_tensor_value_info("u", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    counted = flops(model)
    assert counted.flops == 2 * (2 * 5) * 8 and counted.unknown_nodes == 1
