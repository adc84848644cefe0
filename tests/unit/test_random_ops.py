"""Random ops fixed at their expected value: two runs, two sessions and two engines agree."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as h
import onnx_ir as ir
import onnxruntime as ort
import pytest

from ferry.graph import random_nodes, without_randomness


def _model(
    nodes: list[onnx.NodeProto], outputs: list[tuple[str, int]], *, opset: int = 17
) -> ir.Model:
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    outs = [h.make_tensor_value_info(name, dtype, None) for name, dtype in outputs]
    graph = h.make_graph(nodes, "g", [x], outs)
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", opset)]))


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})


X = np.array([[0.0, 1.0, 2.0], [5.0, 1.0, 0.0]], np.float32)


def test_each_random_op_gives_its_expected_value() -> None:
    model = _model(
        [
            h.make_node("RandomNormalLike", ["x"], ["noise"], mean=0.5, scale=3.0, name="noise"),
            h.make_node("Add", ["noise", "x"], ["y"]),
            h.make_node(
                "Multinomial", ["x"], ["classes"], sample_size=4, dtype=onnx.TensorProto.INT64
            ),
            h.make_node("RandomUniform", [], ["uniform"], shape=[2, 2], low=1.0, high=3.0),
            h.make_node("Bernoulli", ["x"], ["coin"]),
        ],
        [
            ("y", onnx.TensorProto.FLOAT),
            ("classes", onnx.TensorProto.INT64),
            ("uniform", onnx.TensorProto.FLOAT),
            ("coin", onnx.TensorProto.FLOAT),
        ],
    )
    fixed, names = without_randomness(model)
    assert names == ["noise", "Multinomial", "RandomUniform", "Bernoulli"]
    assert random_nodes(fixed) == []
    assert len(random_nodes(model)) == 4, "the user's model is left as it is"
    y, classes, uniform, coin = _run(fixed, X)
    np.testing.assert_array_equal(y, X + 0.5)
    np.testing.assert_array_equal(classes, [[2] * 4, [0] * 4])
    assert classes.dtype == np.int64
    np.testing.assert_array_equal(uniform, np.full((2, 2), 2.0, np.float32))
    np.testing.assert_array_equal(coin, (X >= 0.5).astype(np.float32))


def test_runs_and_sessions_agree_only_once_fixed() -> None:
    model = _model(
        [h.make_node("RandomNormalLike", ["x"], ["r"]), h.make_node("Mul", ["r", "x"], ["y"])],
        [("y", onnx.TensorProto.FLOAT)],
    )
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    first, second = session.run(None, {"x": X})[0], session.run(None, {"x": X})[0]
    assert not np.array_equal(first, second), "the draw changes from run to run"
    fixed, _ = without_randomness(model)
    assert np.array_equal(_run(fixed, X)[0], _run(fixed, X)[0])


def test_random_ops_inside_a_branch_are_fixed() -> None:
    branch = h.make_graph(
        [h.make_node("RandomUniformLike", ["x"], ["b"], low=-1.0, high=1.0)],
        "then",
        [],
        [h.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [2, 3])],
    )
    cond = h.make_tensor("cond", onnx.TensorProto.BOOL, [], [True])
    model = _model(
        [
            h.make_node("Constant", [], ["c"], value=cond),
            h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
        ],
        [("y", onnx.TensorProto.FLOAT)],
    )
    fixed, names = without_randomness(model)
    assert len(names) == 2
    np.testing.assert_array_equal(_run(fixed, X)[0], np.zeros((2, 3), np.float32))


def test_a_model_without_random_ops_is_returned_as_it_is() -> None:
    model = _model([h.make_node("Relu", ["x"], ["y"])], [("y", onnx.TensorProto.FLOAT)])
    fixed, names = without_randomness(model)
    assert fixed is model and names == []


@pytest.mark.parametrize("dtype", [onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE])
def test_the_declared_dtype_is_kept(dtype: int) -> None:
    model = _model(
        [h.make_node("RandomNormal", [], ["y"], shape=[3], mean=2.0, dtype=dtype)], [("y", dtype)]
    )
    fixed, _ = without_randomness(model)
    (y,) = _run(fixed, X)
    assert y.dtype == onnx.helper.tensor_dtype_to_np_dtype(dtype)
    np.testing.assert_array_equal(y, [2.0, 2.0, 2.0])
