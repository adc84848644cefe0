"""The sizes hint when an export's sizes cannot be decided: every dim to replace is named in
capitals (a dim with no name, or one named ``?``, after its axis), never a bare ``?``."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from ferry.errors import InvalidInputError
from ferry.graph import load_model
from ferry.tflite import static_inputs


def _model(dims: list[int | str | None]) -> object:
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [value],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return load_model(proto)


@pytest.mark.parametrize(
    ("dims", "hint"),
    [
        (["N", 3, "?", "?"], "--shape x=1,3,DIM2,DIM3 "),
        (["N", 3, None, None], "--shape x=1,3,DIM2,DIM3 "),
        (["N", 3, "height", "width"], "--shape x=1,3,HEIGHT,WIDTH "),
        (["N", 3, "p2o.DynamicDimension.1", 64], "--shape x=1,3,DIM2,64 "),
    ],
)
def test_every_dim_to_replace_is_named(dims: list[int | str | None], hint: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        static_inputs(_model(dims), {})  # type: ignore[arg-type]
    message = str(caught.value)
    assert hint in message and "with the capitals replaced by sizes" in message
    assert ",?" not in message
