"""Sources already reduced-precision (issue 31): a static QDQ CNN (ONNX Runtime's quantize_static),
a dynamic-int8 MLP (quantize_dynamic: DynamicQuantizeLinear + MatMulInteger) and a weight-only
int8 MLP (int8 weights widened by Cast and scaled by Mul). ``quantize`` refuses each by default,
naming why and ``--requantize``; with it, each is quantized again from its dequantized float
graph and runs; ``optimize`` keeps each as it is (its int8 weights are not folded to float)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import ferry
from ferry.graph import load_model, reduced_precision
from ferry.optimizer import optimize
from ferry.optimizer.quantize import quantize
from ferry.optimizer.quantize._dequantize import dequantized

RNG = np.random.default_rng(0)


def _model(nodes: list, inputs: list, outputs: list, weights: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        outputs,
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def small_cnn(height: str | int = "H", width: str | int = "W") -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GlobalAveragePool-Gemm on ``x: [N, 3, height, width]``."""
    rng = np.random.default_rng(1)
    weights = {
        "w1": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": rng.normal(0, 0.1, 8).astype(np.float32),
        "w2": rng.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32),
        "b2": rng.normal(0, 0.1, 16).astype(np.float32),
        "wf": rng.normal(0, 0.2, (16, 10)).astype(np.float32),
        "bf": rng.normal(0, 0.1, 10).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4, strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, height, width])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])
    return _model(nodes, [x], [y], weights)


def _mlp_weights() -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    return [rng.normal(0, 0.2, (32, 64)).astype(np.float32), rng.normal(0, 0.2, (64, 16))]


def mlp() -> onnx.ModelProto:
    w1, w2 = _mlp_weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Relu", ["m1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    return _model(nodes, [x], [y], {"w1": w1, "w2": w2.astype(np.float32)})


def weight_only_int8() -> onnx.ModelProto:
    """The MLP with int8 weights (per column) widened by Cast and scaled by Mul."""
    weights: dict[str, np.ndarray] = {}
    nodes = []
    source = "x"
    for i, w in enumerate(_mlp_weights()):
        scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        weights[f"w{i}_q"] = np.round(w / scale).astype(np.int8)
        weights[f"w{i}_s"] = scale
        nodes += [
            helper.make_node("Cast", [f"w{i}_q"], [f"w{i}_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"w{i}_f", f"w{i}_s"], [f"w{i}"]),
            helper.make_node("MatMul", [source, f"w{i}"], [f"m{i}"]),
        ]
        if i == 0:
            nodes.append(helper.make_node("Relu", ["m0"], ["r0"]))
            source = "r0"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])
    y = helper.make_tensor_value_info("m1", TensorProto.FLOAT, ["N", 16])
    return _model(nodes, [x], [y], weights)


def cnn_feeds(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"x": rng.normal(size=(1, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


def mlp_feeds(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(4)
    return [{"x": rng.normal(size=(1, 32)).astype(np.float32)} for _ in range(count)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three sources as files: ``qdq``, ``dynamic``, ``weight_only``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_dynamic
    from onnxruntime.quantization import quantize_static as ort_static

    folder = tmp_path_factory.mktemp("sources")
    onnx.save(small_cnn(), folder / "cnn.onnx")
    onnx.save(mlp(), folder / "mlp.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(cnn_feeds(8))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    ort_static(folder / "cnn.onnx", folder / "qdq.onnx", Reader())
    ort_dynamic(folder / "mlp.onnx", folder / "dynamic.onnx", weight_type=QuantType.QInt8)
    onnx.save(weight_only_int8(), folder / "weight_only.onnx")
    return {k: folder / f"{k}.onnx" for k in ("qdq", "dynamic", "weight_only")}


FEEDS = {"qdq": cnn_feeds, "dynamic": mlp_feeds, "weight_only": mlp_feeds}
KINDS = {"qdq": "static QDQ", "dynamic": "dynamic int8", "weight_only": "weight-only int8"}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


@pytest.mark.parametrize("kind", KINDS)
def test_each_source_is_recognized(kind: str, sources: dict[str, Path]) -> None:
    held = reduced_precision(load_model(sources[kind]))
    assert held.kinds == (KINDS[kind],), held.describe()
    assert not reduced_precision(load_model(small_cnn()))


@pytest.mark.parametrize("kind", KINDS)
def test_quantize_refuses_a_quantized_source_naming_requantize(
    kind: str, sources: dict[str, Path]
) -> None:
    result = quantize(sources[kind], data=FEEDS[kind](8), force=True)
    assert not result.accepted  # --force cannot write what was never made
    refused = result.report.refused or ""
    assert "already quantized" in refused and KINDS[kind] in refused
    assert "--requantize" in refused
    assert result.model.graph.name == load_model(sources[kind]).graph.name  # the source, as is


@pytest.mark.parametrize("kind", KINDS)
def test_requantize_quantizes_the_float_graph_and_runs(kind: str, sources: dict[str, Path]) -> None:
    feeds = FEEDS[kind](8)
    result = quantize(sources[kind], data=feeds, requantize=True, force=True)
    report = result.report
    # Tiny models may time slower quantized; everything else must hold.
    assert report.refused is None or "slower" in report.refused, report.lines()
    assert report.quantized and KINDS[kind] in report.source
    assert "dequantized float graph" in report.source
    assert report.score_after >= report.budget
    # Quantized once, by ferry: plain QDQ ONNX Runtime runs, close to the source.
    assert reduced_precision(result.model).kinds == ("static QDQ",)
    source, requantized = ferry.load(sources[kind]), ferry.load(result.model)
    for feed in feeds[:2]:
        want, got = source.run(feed), requantized.run(feed)
        for name in want:
            assert _cosine(got[name], want[name]) > 0.99


def test_dequantized_qdq_keeps_the_relu_the_quantizer_left_to_clipping(
    sources: dict[str, Path],
) -> None:
    # quantize_static drops a Relu whose Q/DQ range starts at 0: dropping the pair must put the
    # Relu back, or the float graph computes something else.
    source = load_model(sources["qdq"])
    assert not any(n.op_type == "Relu" for n in source.graph)
    floating, how = dequantized(source)
    assert not reduced_precision(floating)
    assert "activation Q/DQ pair(s) dropped" in how
    a, b = ferry.load(source), ferry.load(floating)
    for feed in cnn_feeds(3):
        assert _cosine(a.run(feed)["logits"], b.run(feed)["logits"]) > 0.999


@pytest.mark.parametrize("kind", KINDS)
def test_optimize_keeps_a_quantized_source_as_it_is(kind: str, sources: dict[str, Path]) -> None:
    source = load_model(sources[kind])
    feed = FEEDS[kind](1)[0]
    result = optimize(source, example_inputs=feed, measure=False)
    assert result.accepted, result.report.refused
    assert result.report.parity.passed
    # Its int8 stays int8: nothing dequantized into float initializers.
    assert reduced_precision(result.model).kinds == (KINDS[kind],)
    assert result.report.bytes_after <= result.report.bytes_before * 1.5


def test_the_cli_refuses_with_exit_3_and_requantizes_when_asked(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    from ferry.cli.main import cli

    data = tmp_path / "calib.npz"
    np.savez(data, x=np.concatenate([f["x"] for f in mlp_feeds(8)]))
    out = tmp_path / "out.onnx"
    runner = CliRunner()
    refused = runner.invoke(
        cli, ["quantize", str(sources["weight_only"]), "-o", str(out), "--data", str(data)]
    )
    assert refused.exit_code == 3, refused.output
    assert "already quantized" in refused.output and "--requantize" in refused.output
    assert "Use --force" not in refused.output and not out.exists()
    made = runner.invoke(
        cli,
        [
            "quantize",
            str(sources["weight_only"]),
            "-o",
            str(out),
            "--data",
            str(data),
            "--requantize",
            "--force",
        ],
    )
    assert made.exit_code == 0, made.output
    assert "dequantized float graph" in made.output
    ferry.load(out).run(mlp_feeds(1)[0])


def test_a_qoperator_source_is_refused_and_cannot_be_requantized(tmp_path: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat
    from onnxruntime.quantization import quantize_static as ort_static

    from ferry.errors import InvalidInputError

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(cnn_feeds(4))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    onnx.save(small_cnn(), tmp_path / "cnn.onnx")
    source = tmp_path / "qop.onnx"
    ort_static(tmp_path / "cnn.onnx", source, Reader(), quant_format=QuantFormat.QOperator)
    assert "QOperator int8" in reduced_precision(load_model(source)).kinds
    refused = quantize(source, data=cnn_feeds(8))
    assert "already quantized" in (refused.report.refused or "")
    with pytest.raises(InvalidInputError, match="cannot recover the float graph"):
        quantize(source, data=cnn_feeds(8), requantize=True)


def _embedding_then_matmul() -> onnx.ModelProto:
    """ids -> Gather from an int8 table (Cast, Mul) -> MatMul by an int8 weight (Cast, Mul)."""
    rng = np.random.default_rng(5)
    table, weight = rng.normal(size=(50, 32)), rng.normal(0, 0.2, (32, 16))
    weights: dict[str, np.ndarray] = {}
    nodes = []
    for name, w in (("table", table), ("w", weight)):
        scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        weights[f"{name}_q"] = np.round(w / scale).astype(np.int8)
        weights[f"{name}_s"] = scale
        nodes += [
            helper.make_node("Cast", [f"{name}_q"], [f"{name}_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{name}_f", f"{name}_s"], [name]),
        ]
    nodes += [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["y"]),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16])
    return _model(nodes, [ids], [y], weights)


def test_requantize_keeps_an_int8_table_no_weighted_op_reads() -> None:
    # Static int8 quantizes Conv/Gemm/MatMul weights; an embedding table made float would stay
    # float, 4x larger than the source stored it.
    source = load_model(_embedding_then_matmul())
    _, how = dequantized(source)
    assert "1 weight(s) dequantized" in how and "1 int8 weight(s)" in how
    rng = np.random.default_rng(6)
    feeds = [{"ids": rng.integers(0, 50, (1, 4))} for _ in range(8)]
    result = quantize(source, data=feeds, requantize=True, force=True)
    assert result.report.quantized, result.report.lines()
    kinds = reduced_precision(result.model).kinds
    assert "static QDQ" in kinds and "weight-only int8" in kinds
    want, got = ferry.load(source).run(feeds[0]), ferry.load(result.model).run(feeds[0])
    assert _cosine(got["y"], want["y"]) > 0.99


def test_compress_refuses_a_quantized_source_unless_the_recipe_requantizes(
    sources: dict[str, Path],
) -> None:
    from ferry.optimizer import compress

    refused = compress(sources["qdq"], recipe="quantize:int8", data=cnn_feeds(8))
    assert not refused.accepted
    assert "already quantized" in (refused.report.refused or "")
    made = compress(
        sources["qdq"], recipe="quantize:int8:requantize", data=cnn_feeds(8), force=True
    )
    stage = made.report.rows[-1]
    assert stage.skipped is None or "slower" in stage.skipped, stage.skipped
    assert "dequantized float graph" in stage.details["source"]
