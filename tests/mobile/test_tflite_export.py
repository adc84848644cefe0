"""``export_tflite`` and ``ferry export``: options, errors, the report, and what is (not) written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from tflite_graphs import export, model, opcodes, weights

from ferry.cli.main import cli
from ferry.errors import ConversionError, InvalidInputError, UnsupportedOpError
from ferry.mobile import export_tflite, lower_model, to_tflite_model
from ferry.tflite import TRANSLATORS, TFLiteModel, read_tflite, write_tflite

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")

N = helper.make_node


def _small() -> onnx.ModelProto:
    return model(
        [
            N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            N("Relu", ["c"], ["r"]),
            N("GlobalAveragePool", ["r"], ["g"]),
            N("Flatten", ["g"], ["f"]),
            N("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
        ],
        {"x": ["batch", 3, 16, 16]},
        ["y"],
        {"w": weights(8, 3, 3, 3), "b": weights(8), "fw": weights(4, 8), "fb": weights(4)},
    )


def test_to_tflite_model_is_plain_data_and_leaves_the_model_alone() -> None:
    proto = _small()
    before = proto.SerializeToString()
    tflite = to_tflite_model(proto)
    assert isinstance(tflite, TFLiteModel)
    assert proto.SerializeToString() == before
    sg = tflite.subgraphs[0]
    assert [sg.tensors[i].name for i in sg.inputs] == ["x"]
    assert [sg.tensors[o].name for o in sg.outputs] == ["y"]
    again = read_tflite(write_tflite(tflite), "memory")
    assert [op.opcode for op in again.subgraphs[0].operators] == [op.opcode for op in sg.operators]


def test_report_names_what_was_done(tmp_path: Path) -> None:
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    result = export(_small(), tmp_path, samples=[feeds, {"x": feeds["x"] * 2}])
    report = result.report
    assert report.precision == "fp32" and report.samples == 2
    assert report.size_bytes == result.path.stat().st_size
    assert report.ops == {op: opcodes(result).count(op) for op in set(opcodes(result))}
    assert report.transposes == ["model input x [1, 3, 16, 16] -> CONV_2D"]
    assert report.fixed_shapes == {"x": (1, 3, 16, 16)}
    for check in report.verification:
        (out,) = check.parity.outputs
        assert out.name == "y" and out.max_abs_error < 1e-4
    xnnpack = report.verification[0].placement
    assert xnnpack.kernels == "xnnpack" and xnnpack.delegated == xnnpack.total > 0
    text = "\n".join(result.lines())
    assert "transposes left: 1" in text and "XNNPACK delegate" in text
    json.dumps(report.to_dict())  # the CLI's --report


def test_nhwc_io_takes_and_gives_channels_last(tmp_path: Path) -> None:
    proto = model(
        [N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        {"x": [1, 3, 8, 8]},
        ["y"],
        {"w": weights(4, 3, 3, 3)},
    )
    result = export(proto, tmp_path, nhwc_io=True)
    assert [(io.shape, io.layout) for io in result.report.inputs] == [((1, 8, 8, 3), "NHWC")]
    assert [(io.shape, io.layout) for io in result.report.outputs] == [((1, 8, 8, 4), "NHWC")]
    assert opcodes(result) == ["CONV_2D"]


def test_nhwc_io_leaves_a_channels_last_input_alone(tmp_path: Path) -> None:
    """A TensorFlow model's input is NHWC already (its graph transposes it for the conv)."""
    proto = model(
        [N("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), N("Conv", ["t", "w"], ["c"]),
         N("GlobalAveragePool", ["c"], ["g"]), N("Flatten", ["g"], ["y"])],
        {"x": [1, 8, 8, 3]},
        ["y"],
        {"w": weights(4, 3, 1, 1)},
    )  # fmt: skip
    for nhwc_io in (False, True):
        result = export(proto, tmp_path / str(nhwc_io), nhwc_io=nhwc_io)
        assert [(io.shape, io.layout) for io in result.report.inputs] == [((1, 8, 8, 3), "as ONNX")]
        assert result.report.transposes == []


def test_fp16_stores_half_weights_behind_dequantize(tmp_path: Path) -> None:
    result = export(_small(), tmp_path, precision="fp16")
    tflite = read_tflite(result.path.read_bytes(), "fp16")
    sg = tflite.subgraphs[0]
    halves = [t for t in sg.tensors if t.type == 1 and t.data is not None]
    assert len(halves) == result.report.fp16_weights >= 2
    assert opcodes(result).count("DEQUANTIZE") == len(halves)
    assert not [t for t in sg.tensors if t.type == 0 and t.data is not None and t.data.size >= 16]
    for check in result.report.verification:
        assert check.budget is not None and check.budget.passed
    fp32 = export(_small(), tmp_path / "fp32")
    assert result.report.size_bytes < fp32.report.size_bytes


def test_every_unsupported_node_is_listed_at_once() -> None:
    proto = model(
        [
            N("Relu", ["x"], ["r"]),
            N("Det", ["r"], ["d"], name="the_det"),
            N("NonZero", ["r"], ["nz"], name="the_nonzero"),
            N("Resize", ["r", "", "sc"], ["up"], mode="cubic", name="the_cubic"),
            N("Relu", ["up"], ["y"]),
        ],
        {"x": [1, 2, 4, 4]},
        ["y", "nz", "d"],
        {"sc": np.array([1, 1, 2, 2], dtype=np.float32)},
    )
    with pytest.raises(UnsupportedOpError) as caught:
        lower_model(proto)
    message = str(caught.value)
    for name, op in (("the_det", "Det"), ("the_nonzero", "NonZero"), ("the_cubic", "Resize")):
        assert f"{name} ({op})" in message
        assert (op, name) in caught.value.ops
    assert "mode='cubic'" in message and "depends on the data" in message
    assert len(caught.value.ops) == 3
    assert "ort-mobile" in message


def test_a_dynamic_dim_names_the_input_and_the_option() -> None:
    proto = model([N("Relu", ["x"], ["y"])], {"x": [1, 3, "height", "width"]}, ["y"])
    with pytest.raises(
        InvalidInputError,
        match=r"input 'x' dim 2 \(height\) is dynamic.*--shape x=1,3,HEIGHT,WIDTH",
    ):
        lower_model(proto)
    ok = lower_model(proto, shapes={"x": (1, 3, 5, 7)})
    assert ok.inputs[0].shape == (1, 3, 5, 7)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"shapes": {"nope": (1, 3, 4, 4)}}, "not an input of the model"),
        ({"shapes": {"x": (1, 3, 4)}}, "has rank 3, but the input has rank 4"),
        ({"shapes": {"x": (1, 4, 4, 4)}}, "dim 1 is fixed at 3"),
        ({"shapes": {"x": (1, 3, 0, 4)}}, "sizes must be positive"),
        ({"precision": "int4"}, "unknown precision 'int4'"),
        ({"precision": "int8"}, "ferry quantize MODEL --target tflite"),
    ],
)
def test_bad_options(options: dict[str, object], match: str) -> None:
    proto = model([N("Relu", ["x"], ["y"])], {"x": ["N", 3, "H", "W"]}, ["y"])
    options.setdefault("shapes", {"x": (1, 3, 4, 4)})
    with pytest.raises(InvalidInputError, match=match):
        lower_model(proto, **options)  # type: ignore[arg-type]


def test_a_failed_verification_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong_relu(cx, node) -> None:  # RELU6 computes something else above 6
        x = node.inputs[0]
        cx.emit("RELU6", [cx.get(x)], [cx.output(node.outputs[0], cx.perm(x))])

    monkeypatch.setitem(TRANSLATORS, "Relu", wrong_relu)
    proto = model([N("Relu", ["x"], ["y"])], {"x": [1, 4]}, ["y"])
    out = tmp_path / "model.tflite"
    big = {"x": np.array([[1.0, 7.0, -2.0, 12.0]], dtype=np.float32)}
    with pytest.raises(ConversionError, match="was not written") as caught:
        export_tflite(proto, out, samples=big)
    assert not out.exists() and not list(tmp_path.iterdir())
    report = caught.value.report  # type: ignore[attr-defined]
    assert not report.passed and report.verification[0].parity.outputs[0].max_abs_error == 6.0
    unchecked = export_tflite(proto, out, samples=big, verify=False)
    assert out.is_file() and unchecked.report.verify_skipped


def test_a_sample_of_another_size_is_refused(tmp_path: Path) -> None:
    wrong = {"x": np.zeros((1, 3, 8, 8), dtype=np.float32)}
    with pytest.raises(InvalidInputError, match=r"sample 'x' has shape \[1, 3, 8, 8\]"):
        export_tflite(_small(), tmp_path / "m.tflite", samples=wrong, shapes={"x": (1, 3, 16, 16)})
    assert not (tmp_path / "m.tflite").exists()


def test_the_input_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_small(), path)
    before = path.read_bytes()
    with pytest.raises(InvalidInputError, match="refusing to overwrite"):
        export_tflite(path, path)
    assert path.read_bytes() == before


def test_int64_inputs_and_outputs_keep_their_type(tmp_path: Path) -> None:
    proto = model(
        [N("Gather", ["table", "ids"], ["e"], axis=0), N("ReduceSum", ["e", "ax"], ["y"], keepdims=0),
         N("ArgMax", ["y"], ["best"], axis=-1, keepdims=0)],
        {"ids": [1, 6]},
        ["y", "best"],
        {"table": weights(20, 8), "ax": np.array([1], dtype=np.int64)},
        input_types={"ids": TensorProto.INT64},
    )  # fmt: skip
    result = export(proto, tmp_path)
    assert [io.dtype for io in result.report.inputs] == ["int64"]
    assert [io.dtype for io in result.report.outputs] == ["float32", "int64"]


# -------------------------------------------------------------------------------------- CLI


def test_cli_exports_and_reports(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_small(), src)
    out = tmp_path / "m.tflite"
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "tflite", "-o", str(out), "--shape", "x=2,3,16,16", "--report", str(report)]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "transposes left: 1" in result.output and f"wrote {out}" in result.output
    data = json.loads(report.read_text())
    assert data["written"] and data["inputs"][0]["shape"] == [2, 3, 16, 16]
    assert read_tflite(out.read_bytes(), str(out)).subgraphs[0].operators


def test_cli_lists_unsupported_ops_without_traceback(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(
        model([N("Det", ["x"], ["y"], name="e1")], {"x": [1, 4, 4]}, ["y"]),
        src,
    )
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "tflite", "-o", str(tmp_path / "m.tflite")]
    )
    assert result.exit_code == 2
    assert "e1 (Det)" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "m.tflite").exists()


def test_cli_refused_export_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong_relu(cx, node) -> None:
        x = node.inputs[0]
        cx.emit("NEG", [cx.get(x)], [cx.output(node.outputs[0], cx.perm(x))])

    monkeypatch.setitem(TRANSLATORS, "Relu", wrong_relu)
    src = tmp_path / "m.onnx"
    onnx.save(model([N("Relu", ["x"], ["y"])], {"x": [1, 4]}, ["y"]), src)
    result = CliRunner().invoke(
        cli, ["export", str(src), "--target", "tflite", "-o", str(tmp_path / "m.tflite")]
    )
    assert result.exit_code == 3, result.output
    assert "not written" in result.output and "FAILED" in result.output


def test_cli_options_of_the_other_target_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_small(), src)
    result = CliRunner().invoke(
        cli,
        ["export", str(src), "--target", "ort-mobile", "-o", str(tmp_path / "out"), "--nhwc-io"],
    )
    assert result.exit_code == 2 and "--nhwc-io apply to --target tflite" in result.output
