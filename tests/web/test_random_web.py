"""A model with random ops (a voice's noise) exports for the web: verified with its draws at
their expected value in both runtimes, shipped as it is. Two runs of the model itself never
agree, so comparing them would refuse every such model (the kit's VITS voice)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from ferry.web import export_web


def _noisy() -> onnx.ModelProto:
    """y = x + RandomNormalLike(x) * 0.5."""
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    graph = helper.make_graph(
        [
            helper.make_node("RandomNormalLike", ["x"], ["noise"], name="noise"),
            helper.make_node("Mul", ["noise", "half"], ["scaled"], name="scale"),
            helper.make_node("Add", ["x", "scaled"], ["y"], name="add"),
        ],
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.usefixtures("npm")
def test_random_model_verified_at_expected_value_shipped_as_is(tmp_path: Path) -> None:
    src = tmp_path / "noisy.onnx"
    onnx.save(_noisy(), src)
    result = export_web(src, tmp_path / "site")
    assert result.verification is not None and result.verification.passed
    assert (
        result.inputs is not None and "random ops at their expected value (noise)" in result.inputs
    )
    shipped = onnx.load(tmp_path / "site" / "model.onnx")
    assert "RandomNormalLike" in {n.op_type for n in shipped.graph.node}
