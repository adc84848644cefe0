"""The web bundle repairs declared shapes its graph contradicts instead of failing to load.

ONNX Runtime only warns when a declared shape contradicts its inference; onnxruntime-web refuses
the model ("Mismatch between number of inferred and declared dimensions"). Exporters leave such
declarations (paddle2onnx declares an OCR detector's rank-4 map ``[?, ?]``): the export rewrites
them in the bundle's copy, says so, and the bundle runs in Node. The user's file is untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from ferry.cli.main import cli
from ferry.graph import load_model
from ferry.web import export_web, run_bundle_in_node
from ferry.web._shapes import describe_repairs, repair_declared_shapes


def _conv_sigmoid(
    output_shape: list[int | str] | None,
    value_info: dict[str, list[int | str]] | None = None,
    *,
    contrib: bool = False,
) -> onnx.ModelProto:
    """x [N, 3, H, W] -> Conv 1x1 (or com.microsoft Gelu) -> Sigmoid -> y, really [N, 1, H, W]
    (Gelu: [N, 3, H, W]), declared as told."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "w")
    first = (
        helper.make_node("Gelu", ["x"], ["c"], name="gelu", domain="com.microsoft")
        if contrib
        else helper.make_node("Conv", ["x", "w"], ["c"], name="conv")
    )
    graph = helper.make_graph(
        [first, helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")],
        "declared_wrong",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        [] if contrib else [w],
        value_info=[
            helper.make_tensor_value_info(k, TensorProto.FLOAT, v)
            for k, v in (value_info or {}).items()
        ],
    )
    opsets = [helper.make_opsetid("", 17)]
    if contrib:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _repairs(model: onnx.ModelProto, produced: dict[str, tuple[int, ...]] | None = None) -> list:
    loaded = load_model(model)
    proto = ir.to_proto(loaded)
    repairs = repair_declared_shapes(proto, loaded, produced)
    return [(r.name, r.before, r.after, r.output) for r in repairs]


def test_output_rank_repaired_from_inference() -> None:
    # N passes through Conv by name; inference gives the spatial sizes none (they vary).
    got = _repairs(_conv_sigmoid(["a", "b"]))
    assert got == [("y", ("a", "b"), ("N", 1, None, None), True)]


def test_output_dim_repaired_and_names_kept() -> None:
    got = _repairs(_conv_sigmoid(["N", 2, "H", "W"]))
    assert got == [("y", ("N", 2, "H", "W"), ("N", 1, "H", "W"), True)]


def test_intermediate_repaired() -> None:
    got = _repairs(_conv_sigmoid(["N", 1, "H", "W"], {"c": [7]}))
    assert got == [("c", (7,), ("N", 1, None, None), False)]


def test_run_decides_where_inference_cannot() -> None:
    # Gelu (com.microsoft) is unknown to ONNX's inference: only the run knows y's rank, and its
    # sizes that may vary stay unnamed.
    got = _repairs(_conv_sigmoid(["a", "b"], contrib=True), {"y": (2, 3, 5, 5)})
    assert got == [("y", ("a", "b"), (None, None, None, None), True)]


def test_true_declarations_untouched() -> None:
    assert _repairs(_conv_sigmoid(["N", 1, "H", "W"], {"c": ["N", 1, "H", "W"]})) == []
    assert _repairs(_conv_sigmoid(["batch", "?", "h", "w"])) == []


def test_report_line_names_each_repair() -> None:
    loaded = load_model(_conv_sigmoid(["a", "b"]))
    line = describe_repairs(repair_declared_shapes(ir.to_proto(loaded), loaded))
    assert line is not None and "'y' rank 2 -> 4" in line


@pytest.mark.usefixtures("npm")
def test_export_repairs_rank_and_bundle_runs_in_node(tmp_path: Path) -> None:
    src = tmp_path / "wrong.onnx"
    onnx.save(_conv_sigmoid(["a", "b"]), src)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    result = export_web(src, tmp_path / "site")
    assert result.verification is not None and result.verification.passed
    assert any("repaired declared shapes" in line and "'y' rank 2 -> 4" in line for line in
               result.lines())  # fmt: skip
    manifest = json.loads((tmp_path / "site" / "manifest.json").read_text())
    assert manifest["shape_repairs"] == [
        {"name": "y", "declared": ["a", "b"], "written": ["N", 1, None, None], "output": True}
    ]
    assert len(manifest["outputs"][0]["shape"]) == 4
    # The bundle's copy carries the repair; the user's file is as it was.
    bundled = onnx.load(tmp_path / "site" / "model.onnx")
    assert len(bundled.graph.output[0].type.tensor_type.shape.dim) == 4
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 5)).astype(np.float32)
    (y,) = run_bundle_in_node(tmp_path / "site", {"x": x}).values()
    assert y.shape == (2, 1, 6, 5)


@pytest.mark.usefixtures("npm")
def test_export_drops_what_only_the_runtime_contradicts(tmp_path: Path) -> None:
    # c's declaration is contradicted by onnxruntime-web's inference of Gelu, which ONNX's does
    # not know: the first Node load fails, the export drops c's declaration and tries again.
    src = tmp_path / "contrib.onnx"
    onnx.save(_conv_sigmoid(None, {"c": ["a", "b"]}, contrib=True), src)
    result = export_web(src, tmp_path / "site")
    assert result.verification is not None and result.verification.passed
    assert [(r.name, r.after) for r in result.repairs] == [("c", None)]


@pytest.mark.usefixtures("npm")
def test_cli_prints_the_repair(tmp_path: Path) -> None:
    src = tmp_path / "wrong.onnx"
    onnx.save(_conv_sigmoid(["N", 2, "H", "W"]), src)
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "web", "-o", str(tmp_path / "site")]
    )
    assert result.exit_code == 0, result.output
    assert "'y' [N, 2, H, W] -> [N, 1, H, W]" in result.output
