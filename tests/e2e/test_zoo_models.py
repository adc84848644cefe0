"""Real exported models through ferry: outputs equal raw ONNX Runtime's, CLI commands work on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import ferry
from ferry.cli.main import cli
from ferry.graph import load_model, save_model, summarize

torch = pytest.importorskip("torch")
from ferry import zoo  # noqa: E402  (first-party: imported, never skipped)

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo")
    for name in zoo.names():
        zoo.save(name, out)
    return out


@pytest.mark.parametrize("name", ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"])
@pytest.mark.parametrize("batch", [1, 4])
def test_outputs_equal_raw_onnxruntime(zoo_dir: Path, name: str, batch: int) -> None:
    path = zoo_dir / f"{name}.onnx"
    feeds = zoo.example_inputs(name, batch=batch)
    raw = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in raw.get_outputs()], raw.run(None, feeds)))
    session = ferry.load(path)
    assert session.inputs[0].shape[0] == "batch"
    got = session.run(feeds)
    assert got.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_digits_accuracy_through_ferry(zoo_dir: Path) -> None:
    session = ferry.load(zoo_dir / "digits_cnn.onnx", threads=1)
    assert zoo.digits_accuracy(session.run) >= 0.95


def test_summary_of_exported_models(zoo_dir: Path) -> None:
    mobilenet = summarize(load_model(zoo_dir / "mobilenet_v2.onnx"))
    assert mobilenet.op_counts["Conv"] > 10 and mobilenet.op_counts["HardSwish"] > 0
    assert mobilenet.flops > 1_000_000 and mobilenet.flops_unknown_nodes == 0
    block = summarize(load_model(zoo_dir / "transformer_block.onnx"))
    assert block.op_counts["MatMul"] == 8 and block.flops_unknown_nodes == 0
    assert block.inputs[0].shape == ("batch", 16, 64)


def test_exported_model_with_external_data(zoo_dir: Path, tmp_path: Path) -> None:
    path = save_model(
        load_model(zoo_dir / "mobilenet_v2.onnx"), tmp_path / "ext.onnx", external_data=True
    )
    assert (tmp_path / "ext.onnx.data").stat().st_size > 100_000
    feeds = zoo.example_inputs("mobilenet_v2", batch=2)
    np.testing.assert_array_equal(
        ferry.load(path).run(feeds)["logits"],
        ferry.load(zoo_dir / "mobilenet_v2.onnx").run(feeds)["logits"],
    )


class _Gate(torch.nn.Module):
    """Data-dependent control flow: torch.cond exports as an ONNX If node."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2.0, lambda t: t.neg(), (x,))


def test_exported_if_model_with_symbolic_batch(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.onnx.export(
        _Gate().eval(), (x,), dynamo=True, dynamic_shapes=({0: batch},), verbose=False
    )
    path = tmp_path / "gate.onnx"
    program.save(str(path))
    summary = summarize(load_model(path))
    assert summary.op_counts.get("If") == 1 and summary.has_subgraphs
    session = ferry.load(path)
    name = session.inputs[0].name
    ones = np.ones((5, 4), np.float32)
    np.testing.assert_array_equal(next(iter(session.run({name: ones}).values())), 2 * ones)
    np.testing.assert_array_equal(next(iter(session.run({name: -ones}).values())), ones)

    runner = CliRunner()
    for args in (
        ["info", path],
        ["run", path, "--random", "--shape", f"{name}=7x4"],
        ["convert", path, "-o", tmp_path / "gate21.onnx", "--opset", "21"],
    ):
        result = runner.invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    converted = ferry.load(tmp_path / "gate21.onnx")
    np.testing.assert_array_equal(next(iter(converted.run({name: -ones}).values())), ones)
