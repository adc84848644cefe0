"""Never a slower model or a no-op handed back (issue 31): ``optimize`` times a model with dynamic
sizes at sizes found by running it (the report names them and how they were found) and refuses a
slower result there; ``quantize`` and ``compress`` refuse (exit 3) a result that quantized
nothing instead of writing the float model labelled int8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from ferry.optimizer import compress, optimize
from ferry.optimizer.quantize import quantize
from optimizer.test_quantized_sources import small_cnn


def test_dynamic_sizes_are_timed_at_found_sizes_and_named() -> None:
    result = optimize(small_cnn("H", "W"))
    latency = result.report.latency
    assert latency is not None and latency.skipped is None, latency
    assert latency.before_ms is not None and latency.after_ms is not None
    height, width = latency.inputs["x"][2:]
    assert height > 1 and width > 1  # a size the model runs at, not a placeholder
    summary = latency.summary()
    assert f"x 1x3x{height}x{width}" in summary and "found by running the model" in summary
    assert result.report.to_dict()["latency"]["how"] == latency.how


def test_slower_at_found_sizes_is_refused_with_exit_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import ferry.runtime
    from ferry.cli.main import cli

    monkeypatch.setattr(ferry.runtime, "block_medians", lambda runs, budget: [0.010, 0.015])
    result = optimize(small_cnn("H", "W"))
    assert not result.accepted
    assert "runs slower" in (result.report.refused or "")
    assert "found by running the model" in (result.report.refused or "")
    source = tmp_path / "cnn.onnx"
    onnx.save(small_cnn("H", "W"), source)
    out = tmp_path / "out.onnx"
    ran = CliRunner().invoke(cli, ["optimize", str(source), "-o", str(out)])
    assert ran.exit_code == 3, ran.output
    assert not out.exists()


def _no_weights() -> onnx.ModelProto:
    """Nothing int8 quantization touches: no Conv, Gemm or MatMul."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Sigmoid", ["r"], ["y"]),
        ],
        "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.normal(size=(1, 16)).astype(np.float32)} for _ in range(count)]


def test_a_no_op_quantize_is_refused_with_the_figures(tmp_path: Path) -> None:
    from ferry.cli.main import cli

    result = quantize(_no_weights(), data=_feeds(8))
    assert not result.accepted
    refused = result.report.refused or ""
    assert "nothing was quantized" in refused and "nodes quantized: 0 of 0" in refused
    source, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "q.onnx"
    onnx.save(_no_weights(), source)
    np.savez(data, x=np.concatenate([f["x"] for f in _feeds(8)]))
    ran = CliRunner().invoke(cli, ["quantize", str(source), "-o", str(out), "--data", str(data)])
    assert ran.exit_code == 3, ran.output
    assert "nodes quantized: 0 of 0" in ran.output and not out.exists()


def test_a_compress_that_changes_nothing_is_refused() -> None:
    result = compress(_no_weights(), recipe="quantize:int8", data=_feeds(8))
    assert not result.accepted
    refused = result.report.refused or ""
    assert "no stage changed the model" in refused and "nothing was quantized" in refused


def test_a_model_with_random_ops_is_verified_at_their_expected_value() -> None:
    # x + noise, and an Identity to remove: two runs never agree on the noise, so parity is
    # judged with the draw at its expected value (the kit's VITS voice was refused before).
    graph = helper.make_graph(
        [
            helper.make_node("RandomNormalLike", ["x"], ["noise"], scale=0.5),
            helper.make_node("Identity", ["x"], ["xi"]),
            helper.make_node("Add", ["xi", "noise"], ["y"]),
        ],
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    result = optimize(model, measure=False)
    assert result.accepted, result.report.refused
    assert result.report.parity.passed
