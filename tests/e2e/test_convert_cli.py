"""``ferry convert`` from the command line, one light source format each (the heavy ones: converters/)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import ferry
from ferry.cli.main import cli

TFLITE_DATA = Path(__file__).parent.parent / "data" / "tflite"


def convert(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["convert", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_tflite_file(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    out = tmp_path / "conv.onnx"
    code, stdout, err = convert(
        TFLITE_DATA / "mobilenet_int8.tflite", "-o", out, "--report", tmp_path / "r.json"
    )
    assert code == 0, err
    assert "with the tflite converter" in stdout and "parity ok" in stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["converter"] == "tflite" and report["parity"]["passed"]
    model = onnx.load(out)
    assert any(n.op_type == "DequantizeLinear" for n in model.graph.node)


def test_sklearn_joblib_needs_trust(tmp_path: Path) -> None:
    pytest.importorskip("skl2onnx")
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_iris(return_X_y=True)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    src = tmp_path / "pipe.pkl"
    src.write_bytes(pickle.dumps(pipe))
    code, _, err = convert(src, "-o", tmp_path / "pipe.onnx")
    assert code == 2 and "--trust-pickle" in err and not (tmp_path / "pipe.onnx").exists()
    code, stdout, err = convert(src, "-o", tmp_path / "pipe.onnx", "--trust-pickle")
    assert code == 0, err and "parity ok" in stdout
    session = ferry.load(tmp_path / "pipe.onnx")
    out = session.run({session.inputs[0].name: x[:5].astype(np.float32)})
    np.testing.assert_array_equal(out["label"], pipe.predict(x[:5]))


def test_pytorch_pt2(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
    ).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    src = tmp_path / "mlp.pt2"
    torch.export.save(program, src)
    before = src.read_bytes()
    code, _, err = convert(src, "-o", tmp_path / "mlp.onnx")
    assert code == 2 and "--trust-pickle" in err
    code, stdout, err = convert(
        src, "-o", tmp_path / "mlp.onnx", "--trust-pickle", "--shape", "input=batch,4"
    )
    assert code == 0, err
    assert "with the pytorch converter" in stdout and "parity ok" in stdout
    assert src.read_bytes() == before
    session = ferry.load(tmp_path / "mlp.onnx")
    assert session.inputs[0].shape == ("batch", 4)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run({"input": x})["output"], expected, rtol=1e-5, atol=1e-6)
