"""The ``iree`` backend among the other engines: a three-engine placement, ``backends="auto"``
counting it as a candidate, and ``ferry bench`` timing it beside ONNX Runtime and OpenVINO.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import ferry
from ferry import zoo
from ferry.backends import explain

pytestmark = pytest.mark.slow

ENGINES = ["iree", "openvino", "onnxruntime"]


def convs_around_a_cubic_resize() -> ir.Model:
    """Conv -> Relu -> Conv -> Resize (cubic, exclude_outside: IREE has no lowering) -> Conv ->
    Sigmoid."""
    rng = np.random.default_rng(0)

    def weight(name: str, shape: list[int]) -> object:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node(
            "Resize", ["c2", "roi", "scales"], ["s"], mode="cubic", exclude_outside=1, name="resize"
        ),
        helper.make_node("Conv", ["s", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c3"], ["y"], name="sigmoid"),
    ]
    weights = [weight("w1", [8, 3, 3, 3]), weight("w2", [8, 8, 3, 3]), weight("w3", [4, 8, 3, 3])]
    weights += [
        helper.make_tensor("roi", TensorProto.FLOAT, [0], []),
        helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2]),
    ]
    graph = helper.make_graph(nodes, "three", [x], [y], initializer=weights)  # type: ignore[arg-type]
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((batch, 3, 16, 16)).astype(np.float32)}


def test_three_engines_place_each_node_where_it_runs() -> None:
    model = convs_around_a_cubic_resize()
    report = explain(model, backends=ENGINES)
    verdicts = {v.node: v for v in report.nodes}
    assert verdicts["conv1"].backend == "iree"
    resize = verdicts["resize"]
    assert resize.backend != "iree"
    assert "failed to legalize onnx.Resize" in resize.reasons["iree"]
    session = ferry.load(model, backends=ENGINES, cache_dir=False, check_pays=False)
    assert session.plan.partitions[0].backend == "iree"
    want = ferry.load(model, backends=["onnxruntime"], cache_dir=False).run(_feeds())
    np.testing.assert_allclose(session.run(_feeds())["y"], want["y"], rtol=1e-4, atol=1e-5)
    # With the pays check (the default) the plan stands only where it beats ONNX Runtime
    # alone; either way the answer is the same.
    checked = ferry.load(model, backends=ENGINES, cache_dir=False)
    np.testing.assert_allclose(checked.run(_feeds())["y"], want["y"], rtol=1e-4, atol=1e-5)


def test_auto_measures_iree_as_a_candidate() -> None:
    from ferry.graph import prepare
    from ferry.runtime import auto_engines, auto_plan

    assert "iree" in auto_engines(None)
    choice = auto_plan(
        prepare(zoo.build("mlp")), backends=["iree", "onnxruntime"], budget_s=3.0, cache=False
    )
    rows = {row["label"]: row for row in choice.table}
    assert "iree fp32" in rows, list(rows)
    assert rows["iree fp32"]["passed"], rows["iree fp32"]
    assert choice.label in rows


def test_bench_shows_iree_beside_onnxruntime_and_openvino(tmp_path: Path) -> None:
    from ferry.cli.main import cli

    path = tmp_path / "mlp.onnx"
    ir.save(zoo.build("mlp"), path)
    out = tmp_path / "bench.json"
    args = ["bench", str(path), "--backends", "iree,onnxruntime,openvino", "--iterations", "5"]
    args += ["--warmup", "1", "--no-isolate", "--json", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = {
        (c["backend"], c["precision"]): c for c in json.loads(out.read_text())["configurations"]
    }
    for backend in ("iree", "onnxruntime", "openvino"):
        row = rows[(backend, "fp32")]
        assert not row.get("error"), row
        assert row["latency_ms"]["p50"] > 0
    table = CliRunner().invoke(cli, args[:-2])
    assert table.exit_code == 0, table.output
    assert all(name in table.output for name in ("iree fp32", "onnxruntime fp32", "openvino"))
