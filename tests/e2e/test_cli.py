from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import models
from ferry._version import __version__
from ferry.cli.main import cli


def ferry(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_version_and_help() -> None:
    code, out, _ = ferry("--version")
    assert code == 0 and __version__ in out
    for command in ("info", "run", "convert", "bench"):
        code, out, _ = ferry(command, "--help")
        assert code == 0 and "Usage:" in out and ("MODEL" in out or "SOURCE" in out)


def test_info_text_and_json(mlp_path: Path) -> None:
    code, out, _ = ferry("info", mlp_path)
    assert code == 0
    for text in ("x", "float32", "[batch, 16]", "Gemm", "parameters: 168", "FLOPs/sample: 320"):
        assert text in out
    code, out, _ = ferry("info", mlp_path, "--json")
    data = json.loads(out)
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 16]}]
    assert data["op_counts"]["Softmax"] == 1 and data["flops"] == 320
    assert data["flops_shapes"] is None and data["flops_assumed"] == []  # only the batch is open
    code, out, _ = ferry("info", mlp_path, "--json", "--shape", "x=8,16")
    assert code == 0 and json.loads(out)["flops"] == 8 * 320


def test_info_on_control_flow_and_external_data(tmp_path: Path) -> None:
    onnx.save(models.with_if(), tmp_path / "if.onnx")
    code, out, _ = ferry("info", tmp_path / "if.onnx")
    assert code == 0 and "control flow: yes" in out
    path = models.save_external(models.conv(), tmp_path / "ext.onnx")
    code, out, _ = ferry("info", path)
    assert code == 0 and "external data" in out and "[N, 4, 32, 32]" in out


def test_run_random_and_from_files(tmp_path: Path, mlp_path: Path) -> None:
    code, out, _ = ferry("run", mlp_path, "--random", "--shape", "x=3x16", "-o", tmp_path / "out")
    assert code == 0 and "[3, 4]" in out
    y = np.load(tmp_path / "out" / "y.npy")
    assert y.shape == (3, 4) and np.allclose(y.sum(axis=1), 1.0, atol=1e-5)

    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, _, _ = ferry(
        "run", mlp_path, "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out2"
    )
    assert code == 0
    import ferry as ferry_lib

    expected = ferry_lib.load(mlp_path).run({"x": x})["y"]
    np.testing.assert_array_equal(np.load(tmp_path / "out2" / "y.npy"), expected)
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == ["y.npy"]


def test_run_saves_outputs_with_unsafe_names(tmp_path: Path) -> None:
    proto = models.mlp()
    proto.graph.node[-1].output[0] = "../../escape/y:0"
    proto.graph.output[0].name = "../../escape/y:0"
    onnx.save(proto, tmp_path / "m.onnx")
    code, _, _ = ferry("run", tmp_path / "m.onnx", "--random", "-o", tmp_path / "out")
    assert code == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["_.._escape_y_0.npy"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "{mlp}"], "no data for input 'x'"),
        (["run", "{mlp}", "--input", "x"], "--input expects NAME=VALUE"),
        (["run", "{mlp}", "--input", "z={tmp}/x.npy"], "unknown input 'z'"),
        (["run", "{mlp}", "--input", "x={tmp}/missing.npy"], "not found"),
        (["run", "{mlp}", "--input", "x={tmp}/x64.npy"], "must be float32, got float64"),
        (["run", "{mlp}", "--random", "--shape", "x=2x17"], "dim 1 is fixed at 16"),
        (["run", "{mlp}", "--random", "--shape", "x=2xq"], "bad shape"),
        (["run", "{tmp}/corrupt.onnx", "--random"], "not a valid ONNX model"),
        (["info", "{tmp}/missing.onnx"], "not found"),
        (["info", "{tmp}/empty.onnx"], "empty"),
        (["run", "{tmp}/custom.onnx", "--random"], "acme::FancyAct x2"),
        (["run", "{mlp}", "--random", "--backends", "nope"], "unknown backend 'nope'"),
        (
            ["run", "{mlp}", "--random", "--precision", "bf16"],
            "precision 'bf16': no engine of the plan runs it (onnxruntime offers fp32)",
        ),
        (["convert", "{mlp}", "-o", "{mlp}"], "refusing to overwrite"),
        (["convert", "{mlp}", "-o", "{tmp}/o.onnx", "--opset", "3"], "out of range"),
        (
            ["convert", "{mlp}", "-o", "{tmp}/o.onnx", "--opset", "13"],
            "Adapter From Version 14 for Relu",
        ),
        (["convert", "{tmp}/x.npy", "-o", "{tmp}/o.onnx"], "cannot tell which framework"),
        (["convert", "{tmp}/nope.pt2", "-o", "{tmp}/o.onnx"], "model not found"),
        (
            ["convert", "{mlp}", "-o", "{tmp}/o.onnx", "--from", "caffe"],
            "unknown source format 'caffe'",
        ),
        (["convert", "{mlp}", "-o", "{tmp}/o.onnx", "--tolerance", "x"], "--tolerance takes"),
        (["convert", "{mlp}", "-o", "{tmp}/o.onnx", "--shape", "x=1x?"], "bad shape"),
        (
            ["convert", "{tmp}/broken_graph.onnx", "-o", "{tmp}/o.onnx"],
            "reads 'does_not_exist', which no node",
        ),
        (
            ["convert", "{tmp}/bad_attr.onnx", "-o", "{tmp}/o.onnx"],
            "fails ONNX's checker: Unrecognized attribute: bogus",
        ),
        (["bench", "{mlp}", "--shape", "x=1x2"], "dim 1 is fixed at 16"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    tmp_path: Path, mlp_path: Path, args: list[str], message: str
) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 16), np.float32))
    np.save(tmp_path / "x64.npy", np.zeros((1, 16)))
    (tmp_path / "corrupt.onnx").write_bytes(mlp_path.read_bytes()[:100])
    (tmp_path / "empty.onnx").write_bytes(b"")
    onnx.save(models.custom_ops(), tmp_path / "custom.onnx")
    broken = models.mlp()
    broken.graph.node[1].input[0] = "does_not_exist"
    onnx.save(broken, tmp_path / "broken_graph.onnx")
    bad_attr = models.mlp()
    bad_attr.graph.node[0].attribute.append(onnx.helper.make_attribute("bogus", 1))
    onnx.save(bad_attr, tmp_path / "bad_attr.onnx")
    argv = [a.format(mlp=mlp_path, tmp=tmp_path) for a in args]
    code, out, err = ferry(*argv)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "o.onnx").exists()


def test_run_help_says_what_precision_does() -> None:
    code, out, _ = ferry("run", "--help")
    assert code == 0 and "--precision" in out
    text = " ".join(out.split())
    assert "ONNX Runtime runs fp32 only" in text and "--backends openvino --precision bf16" in text


def _has_openvino() -> bool:
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    try:
        get_backend("openvino")
    except BackendUnavailableError:
        return False
    return True


@pytest.mark.openvino
@pytest.mark.skipif(not _has_openvino(), reason="OpenVINO is not installed")
def test_run_openvino_at_a_precision(tmp_path: Path, mlp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    import ferry as ferry_lib

    want = ferry_lib.load(mlp_path).run({"x": x})["y"]
    for precision in ("bf16", "fp32"):
        out_dir = tmp_path / precision
        code, out, err = ferry(
            "run", mlp_path, "--input", f"x={tmp_path / 'x.npy'}", "--backends", "openvino",
            "--precision", precision, "-o", out_dir,
        )  # fmt: skip
        assert code == 0, err
        assert "[3, 4]" in out
        got = np.load(out_dir / "y.npy")
        # bf16 keeps 8 bits of mantissa: a softmax's probabilities within a few hundredths.
        np.testing.assert_allclose(got, want, atol=3e-2 if precision == "bf16" else 1e-5)
    # The engine offers fp32, bf16 and fp16, not int8: one line that says so.
    code, out, err = ferry(
        "run", mlp_path, "--random", "--backends", "openvino", "--precision", "int8"
    )
    assert code == 2, (out, err)
    assert err.startswith("error: precision 'int8'") and err.count("\n") == 1, err
    assert "openvino offers fp32, bf16, fp16" in err and "Traceback" not in err


def test_convert_changes_opset_and_keeps_outputs(tmp_path: Path, mlp_path: Path) -> None:
    before = mlp_path.read_bytes()
    for opset in (15, 21):
        out = tmp_path / f"mlp{opset}.onnx"
        code, text, _ = ferry("convert", mlp_path, "-o", out, "--opset", opset)
        assert code == 0 and f"(opset {opset}, checked)" in text and "parity ok" in text
        converted = onnx.load(out)
        assert converted.opset_import[0].version == opset
        onnx.checker.check_model(converted, full_check=True)
        import ferry as ferry_lib

        x = np.ones((2, 16), np.float32)
        np.testing.assert_allclose(
            ferry_lib.load(out).run({"x": x})["y"],
            ferry_lib.load(mlp_path).run({"x": x})["y"],
            rtol=1e-6,
        )
    assert mlp_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "mlp15.onnx", "mlp21.onnx"]


def test_convert_keeps_external_data_and_control_flow(tmp_path: Path) -> None:
    src = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    code, _, _ = ferry("convert", src, "-o", tmp_path / "conv" / "ext15.onnx", "--opset", "15")
    assert code == 0
    assert (tmp_path / "conv" / "ext15.onnx.data").is_file()
    onnx.save(models.with_if(), tmp_path / "if.onnx")
    code, _, _ = ferry(
        "convert", tmp_path / "if.onnx", "-o", tmp_path / "if19.onnx", "--opset", "19"
    )
    assert code == 0
    import ferry as ferry_lib

    x = -np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(ferry_lib.load(tmp_path / "if19.onnx").run({"x": x})["y"], -x)


def test_real_entry_point_and_internal_errors(tmp_path: Path, mlp_path: Path) -> None:
    exe = Path(sys.executable).parent / "ferry"
    proc = subprocess.run([exe, "info", tmp_path / "nope.onnx"], capture_output=True, text=True)
    assert (
        proc.returncode == 2
        and proc.stderr == f"error: model file not found: {tmp_path / 'nope.onnx'}\n"
    )
    proc = subprocess.run([exe, "run", mlp_path, "--random"], capture_output=True, text=True)
    assert proc.returncode == 0 and "[1, 4]" in proc.stdout
    proc = subprocess.run(
        [exe, "--debug", "info", tmp_path / "nope.onnx"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_unwritable_output_is_a_user_error(tmp_path: Path, mlp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("I am a file, not a folder")
    code, _, err = ferry("convert", mlp_path, "-o", blocker / "out.onnx")
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err


def test_internal_errors_exit_1_without_traceback(
    monkeypatch: pytest.MonkeyPatch, mlp_path: Path
) -> None:
    from ferry import graph

    def broken(model: object, *args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(graph, "summarize", broken)
    code, _, err = ferry("info", mlp_path)
    assert code == 1
    assert (
        "internal error: RuntimeError: boom" in err and "--debug" in err and "Traceback" not in err
    )
