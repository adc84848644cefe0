"""The placement cost: partitions, engine calls, boundary tensors and their bytes, and warnings.

Byte counts are checked by hand on small models built here, symbolic and derived dims included;
``tests/real/test_kit_placement_cost.py`` checks them on the kit's models against what ONNX
Runtime actually computes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from ferry.backends import (
    LARGE_BOUNDARY_BYTES,
    LARGE_BOUNDARY_RATIO,
    MANY_PARTITIONS,
    BackendBase,
    EngineUse,
    OpRule,
    PlacementCost,
    PlacementReport,
    explain,
)
from ferry.errors import InvalidInputError

OPSET = 17
FALLBACK = "onnxruntime"


class Accel(BackendBase):
    """An accelerator that exists only as a rule table."""

    def __init__(self, ops: Iterable[str], name: str = "accel") -> None:
        self.name = name
        self._rules = [OpRule(op) for op in ops]

    def rules(self) -> list[OpRule]:
        return list(self._rules)


def chain(ops: Sequence[str], shape: Sequence[int | str] = (2, 3)) -> onnx.ModelProto:
    """x[shape] -> ops[0] -> ... -> y, float32, nodes named n0, n1, ..."""
    nodes = [
        helper.make_node(
            op, ["x" if i == 0 else f"v{i - 1}"], ["y" if i == len(ops) - 1 else f"v{i}"], f"n{i}"
        )
        for i, op in enumerate(ops)
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def strided() -> onnx.ModelProto:
    """x[N,3,H,W] -> Conv(8, 3x3, stride 2, pad 1) -> Relu -> Softmax -> Relu -> y.

    The boundaries are [N, 8, floor((H-1)/2)+1, floor((W-1)/2)+1]: derived dims, which only
    shape inference at fixed input shapes can size.
    """
    w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], "conv", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], "relu"),
        helper.make_node("Softmax", ["r"], ["s"], "softmax", axis=1),
        helper.make_node("Relu", ["s"], ["y"], "relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "strided",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def custom_between() -> onnx.ModelProto:
    """x[N,4] -> Relu -> acme::Foo -> Relu -> y: no shape inference sizes Foo's output, which is
    declared [N, 4]: its size comes from N alone."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], "relu"),
        helper.make_node("Foo", ["a"], ["b"], "foo", domain="acme"),
        helper.make_node("Relu", ["b"], ["y"], "relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        value_info=[helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("acme", 1)]
    )
    model.ir_version = 8
    return model


def cut(model: onnx.ModelProto, ops: Iterable[str]) -> PlacementReport:
    return explain(model, [Accel(ops)], min_partition_size=1)


# -- counts ------------------------------------------------------------------------------------


def test_one_engine_costs_nothing() -> None:
    report = cut(models.mlp(), ["Gemm", "Relu", "MatMul", "Softmax"])
    cost = report.cost()
    assert isinstance(cost, PlacementCost)
    assert (cost.partitions, cost.engine_calls, cost.boundary_tensors) == (1, 1, 0)
    assert cost.boundary_bytes == 0 and cost.unknown_sizes == () and cost.warnings == ()
    assert cost.engines == (EngineUse("accel", 1, 4),)
    text = report.format()
    assert "cost: 1 partition, 1 engine call per run, 0 boundary tensors, 0 B per run" in text
    assert "warning:" not in text


def test_counts_per_engine() -> None:
    report = cut(chain(["Relu", "Softmax", "Relu"]), ["Relu"])
    cost = report.cost()
    assert (cost.partitions, cost.engine_calls, cost.boundary_tensors) == (3, 3, 2)
    assert cost.engines == (EngineUse("accel", 2, 2), EngineUse(FALLBACK, 1, 1))
    assert cost.boundary_bytes == 2 * (2 * 3 * 4) == report.boundary_bytes
    assert cost.input_bytes == 2 * 3 * 4
    assert cost.shapes is None


def test_to_dict_is_json() -> None:
    cost = cut(chain(["Relu", "Softmax", "Relu"]), ["Relu"]).cost({"x": [2, 3]})
    data = json.loads(json.dumps(cost.to_dict()))
    assert data == {
        "partitions": 3,
        "engine_calls": 3,
        "engines": {
            "accel": {"partitions": 2, "nodes": 2},
            FALLBACK: {"partitions": 1, "nodes": 1},
        },
        "boundary_tensors": 2,
        "boundary_bytes": 48,
        "unknown_sizes": [],
        "known_bytes": 48,
        "input_bytes": 24,
        "shapes": {"x": [2, 3]},
        "warnings": [],
    }


# -- bytes at given shapes ---------------------------------------------------------------------


def test_symbolic_dims_need_shapes() -> None:
    report = cut(models.mlp(), ["Gemm"])  # Gemm -> [batch, 8] -> the rest on the fallback
    cost = report.cost()
    assert cost.boundary_bytes is None and cost.unknown_sizes == ("h",)
    assert cost.input_bytes is None and cost.known_bytes == 0
    assert "bytes depend on input sizes (give --shape)" in report.format()
    sized = report.cost({"x": [5, 16]})
    assert sized.boundary_bytes == 5 * 8 * 4 and sized.unknown_sizes == ()
    assert sized.boundaries[0].shape == (5, 8)
    assert sized.input_bytes == 5 * 16 * 4
    assert "cost: 2 partitions, 2 engine calls per run, 1 boundary tensor, 160 B per run" in (
        report.format({"x": [5, 16]})
    )


@pytest.mark.parametrize(("h", "w", "oh", "ow"), [(32, 48, 16, 24), (33, 47, 17, 24)])
def test_derived_dims_are_inferred_at_the_given_shapes(h: int, w: int, oh: int, ow: int) -> None:
    report = cut(strided(), ["Conv", "Relu"])
    assert [b.name for b in report.boundaries] == ["r", "s"]
    assert report.cost().boundary_bytes is None
    assert report.cost().unknown_sizes == ("r", "s")
    cost = report.cost({"x": [2, 3, h, w]})
    assert [b.shape for b in cost.boundaries] == [(2, 8, oh, ow)] * 2
    assert cost.boundary_bytes == 2 * (2 * 8 * oh * ow * 4)
    assert cost.unknown_sizes == ()
    text = report.format({"x": [2, 3, h, w]})
    assert f"  r: float32[2,8,{oh},{ow}]" in text
    # The report's own model is left as it was.
    assert report.cost().boundary_bytes is None
    assert report.boundaries[0].nbytes is None


def test_named_dims_bind_where_inference_cannot_go() -> None:
    report = cut(custom_between(), ["Relu"])
    assert [(b.name, b.shape) for b in report.boundaries] == [("a", ("N", 4)), ("b", ("N", 4))]
    cost = report.cost({"x": [3, 4]})
    assert cost.boundary_bytes == 2 * 3 * 4 * 4 and cost.unknown_sizes == ()


def test_static_model_unknown_boundary_is_named() -> None:
    """A boundary no inference sizes, in a model whose inputs are fixed: bytes known so far."""
    model = custom_between()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    del model.graph.value_info[:]
    model.graph.output[0].type.tensor_type.ClearField("shape")
    report = cut(model, ["Relu"])
    cost = report.cost()
    assert cost.boundary_bytes is None and cost.unknown_sizes == ("b",)
    assert cost.known_bytes == 3 * 4 * 4 and cost.input_bytes == 3 * 4 * 4
    assert "at least 48 B per run (1 tensor of unknown size)" in report.format()


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"nope": [1, 16]}, "'nope', which is not an input of the model; its inputs: x"),
        ({"x": [1, 16, 1]}, "'x' has rank 2 .* has 3 dims"),
        ({"x": [1, 15]}, "'x' has size 16 on axis 1"),
        ({"x": [-1, 16]}, "non-negative integers"),
        ({"x": [1.5, 16]}, "non-negative integers"),
        ({"x": [True, 16]}, "non-negative integers"),
        ({"x": "1,16"}, "sequence of sizes"),
    ],
)
def test_bad_shapes(shapes: dict[str, object], match: str) -> None:
    report = cut(models.mlp(), ["Gemm"])
    with pytest.raises(InvalidInputError, match=match):
        report.cost(shapes)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=match):
        report.format(shapes)  # type: ignore[arg-type]


def test_a_named_dim_binds_across_inputs() -> None:
    report = cut(models.two_inputs(), ["Add"])  # a[batch,4] + b[batch,4] -> s -> the fallback
    assert [(b.name, b.shape) for b in report.boundaries] == [("s", ("batch", 4))]
    cost = report.cost({"a": [2, 4]})  # b's batch is a's
    assert cost.boundary_bytes == 2 * 4 * 4
    assert cost.shapes == {"a": (2, 4), "b": (2, 4), "k": ()}
    assert cost.input_bytes == 2 * (2 * 4 * 4) + 8
    with pytest.raises(InvalidInputError, match="dim 'batch' is 2 .* for 'a' and 3 .* for 'b'"):
        report.cost({"a": [2, 4], "b": [3, 4]})


# -- warnings ----------------------------------------------------------------------------------


def alternating(partitions: int, shape: Sequence[int] = (2, 3)) -> PlacementReport:
    ops = ["Relu" if i % 2 == 0 else "Softmax" for i in range(partitions)]
    return cut(chain(ops, shape), ["Relu"])


def test_many_partitions_warn() -> None:
    at_limit = alternating(MANY_PARTITIONS).cost()
    assert at_limit.partitions == MANY_PARTITIONS and at_limit.warnings == ()
    report = alternating(MANY_PARTITIONS + 1)
    cost = report.cost()
    assert cost.partitions == MANY_PARTITIONS + 1
    (warning,) = cost.warnings
    assert warning.startswith(f"{MANY_PARTITIONS + 1} partitions (more than {MANY_PARTITIONS})")
    assert f"Softmax x{(MANY_PARTITIONS + 1) // 2}" in warning
    assert f"\nwarning: {warning}\n" in report.format()
    head = report.format().splitlines()
    assert head[1].startswith("cost: ") and head[2] == f"warning: {warning}"


def test_large_boundaries_warn() -> None:
    rows = LARGE_BOUNDARY_BYTES // (4 * 256)  # x: [rows, 256] float32 = LARGE_BOUNDARY_BYTES
    # One boundary the size of the input: LARGE_BOUNDARY_RATIO (1.0) times, not more.
    assert LARGE_BOUNDARY_RATIO == 1.0
    assert alternating(2, (rows, 256)).cost().warnings == ()
    cost = alternating(3, (rows, 256)).cost()
    assert cost.boundary_bytes == 2 * LARGE_BOUNDARY_BYTES
    (warning,) = cost.warnings
    assert warning.startswith("2.0 MiB cross engines per run, 2.0x the model's inputs (1.0 MiB)")
    # Twice the inputs, but tiny: not worth a warning.
    assert alternating(3, (2, 3)).cost().warnings == ()


def test_report_equality_ignores_the_model() -> None:
    a = cut(models.mlp(), ["Gemm"])
    b = cut(models.mlp(), ["Gemm"])
    assert a.model is not None and a.model is not b.model
    assert a == b
