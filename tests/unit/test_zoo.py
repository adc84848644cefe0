"""Tests for the deterministic test model zoo (ferry.zoo)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

import torch

from ferry import zoo
from ferry.zoo import _models

pytestmark = pytest.mark.torch

NAMES = ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"]
DIGITS_MODELS = ["digits_cnn", "mlp"]


def _session(model: ir.Model) -> ort.InferenceSession:
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _runner(session: ort.InferenceSession) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(None, feeds)

    return run


def _op_histogram(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(
        node.op_type for node in ir.traversal.RecursiveGraphIterator(model.graph)
    )


def _initializer_bytes(model: ir.Model) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    result = {}
    for name, value in model.graph.initializers.items():
        assert value.const_value is not None
        array = value.const_value.numpy()
        result[name] = (str(array.dtype), array.shape, array.tobytes())
    return result


@pytest.fixture(scope="module")
def built() -> dict[str, ir.Model]:
    """Every zoo model with a dynamic batch, built once for the whole module."""
    return {name: zoo.build(name) for name in NAMES}


@pytest.fixture(scope="module")
def sessions(built: dict[str, ir.Model]) -> dict[str, ort.InferenceSession]:
    return {name: _session(model) for name, model in built.items()}


# --- API surface ----------------------------------------------------------------------------


def test_names() -> None:
    assert zoo.names() == NAMES


def test_import_does_not_import_torch_or_sklearn() -> None:
    code = (
        "import sys, ferry.zoo as z; z.names(); z.example_inputs('mobilenet_v2', 2);"
        "heavy = [m for m in ('torch', 'sklearn') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    src = str(Path(zoo.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_unknown_name_raises_key_error() -> None:
    with pytest.raises(KeyError, match="expected one of"):
        zoo.build("resnet9000")
    with pytest.raises(KeyError, match="expected one of"):
        zoo.example_inputs("resnet9000")


def test_build_rejects_old_opset() -> None:
    with pytest.raises(ValueError, match="opset"):
        zoo.build("mlp", opset=17)


# --- Exported graphs ------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_model_passes_onnx_checker(built: dict[str, ir.Model], name: str) -> None:
    model = built[name]
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    assert model.opset_imports[""] >= 18
    assert model.metadata_props["ferry.zoo.model"] == name


@pytest.mark.parametrize("name", NAMES)
def test_io_names_and_dynamic_batch(built: dict[str, ir.Model], name: str) -> None:
    spec = zoo.get_spec(name)
    model = built[name]
    [graph_input] = model.graph.inputs
    [graph_output] = model.graph.outputs
    assert graph_input.name == spec.input_name == "input"
    assert graph_output.name == spec.output_name
    assert graph_input.dtype == ir.DataType.FLOAT
    for value, per_sample in ((graph_input, spec.input_shape), (graph_output, spec.output_shape)):
        assert value.shape is not None
        batch_dim = value.shape[0]
        assert isinstance(batch_dim, ir.SymbolicDim)
        assert batch_dim.value == "batch"
        assert tuple(value.shape[1:]) == per_sample


@pytest.mark.parametrize("name", NAMES)
def test_initializers_are_numpy_backed(built: dict[str, ir.Model], name: str) -> None:
    # The returned model must not alias the torch module's parameters.
    for value in built[name].graph.initializers.values():
        assert type(value.const_value) is ir.Tensor


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", NAMES)
def test_ort_matches_torch(
    sessions: dict[str, ort.InferenceSession], name: str, batch: int
) -> None:
    feeds = zoo.example_inputs(name, batch)
    [ort_out] = sessions[name].run(None, feeds)
    module = _models.torch_module(name)
    with torch.no_grad():
        torch_out = module(torch.from_numpy(feeds["input"])).numpy()
    spec = zoo.get_spec(name)
    assert ort_out.shape == (batch, *spec.output_shape)
    np.testing.assert_allclose(ort_out, torch_out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_static_batch(built: dict[str, ir.Model], name: str) -> None:
    model = zoo.build(name, dynamic_batch=False)
    assert model.graph.inputs[0].shape is not None
    assert tuple(model.graph.inputs[0].shape) == (1, *zoo.get_spec(name).input_shape)
    assert model.graph.outputs[0].shape is not None
    assert model.graph.outputs[0].shape[0] == 1
    feeds = zoo.example_inputs(name, 1)
    [static_out] = _session(model).run(None, feeds)
    [dynamic_out] = _session(built[name]).run(None, feeds)
    np.testing.assert_allclose(static_out, dynamic_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic(built: dict[str, ir.Model], name: str) -> None:
    first, second = built[name], zoo.build(name)
    assert second is not first
    assert _initializer_bytes(second) == _initializer_bytes(first)
    assert [n.op_type for n in second.graph] == [n.op_type for n in first.graph]
    assert ir.to_proto(second).SerializeToString() == ir.to_proto(first).SerializeToString()


def test_torch_module_is_fresh_and_keeps_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = _models.torch_module("mobilenet_v2")
    b = _models.torch_module("mobilenet_v2")
    assert torch.equal(torch.rand(3), expected)
    assert a is not b
    assert not a.training
    for (key, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), key
        assert pa.data_ptr() != pb.data_ptr(), key


# --- Op content -----------------------------------------------------------------------------


def test_mobilenet_ops(built: dict[str, ir.Model]) -> None:
    model = built["mobilenet_v2"]
    ops = _op_histogram(model)
    depthwise = [
        node
        for node in model.graph
        if node.op_type == "Conv" and (attr := node.attributes.get("group")) and attr.as_int() > 1
    ]
    assert depthwise, "expected depthwise convolutions (group > 1)"
    assert ops["HardSwish"] > 0
    assert ops["Clip"] > 0  # ReLU6
    assert ops["Add"] > 0  # residual connections
    # The exporter folds eval-mode BatchNorm into the convolutions.
    assert ops["BatchNormalization"] == 0


def test_transformer_ops(built: dict[str, ir.Model]) -> None:
    ops = _op_histogram(built["transformer_block"])
    for op in ("Softmax", "MatMul", "LayerNormalization", "Add"):
        assert ops[op] > 0, op
    assert ops["Gelu"] + ops["Erf"] > 0
    assert ops["Shape"] == 0  # the fixed sequence length keeps every reshape constant


def test_transformer_opset18_decomposes_gelu_to_erf() -> None:
    model = zoo.build("transformer_block", opset=18)
    ops = _op_histogram(model)
    assert model.opset_imports[""] == 18
    assert ops["Erf"] == 1
    assert ops["Gelu"] == 0
    feeds = zoo.example_inputs("transformer_block", 2)
    [out] = _session(model).run(None, feeds)
    with torch.no_grad():
        expected = _models.torch_module("transformer_block")(torch.from_numpy(feeds["input"]))
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-4, atol=1e-4)


# --- Inputs and digits data -----------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_example_inputs(name: str) -> None:
    spec = zoo.get_spec(name)
    feeds = zoo.example_inputs(name, 3, seed=7)
    assert list(feeds) == [spec.input_name]
    array = feeds[spec.input_name]
    assert array.dtype == np.float32
    assert array.shape == (3, *spec.input_shape)
    assert array.flags.c_contiguous
    np.testing.assert_array_equal(array, zoo.example_inputs(name, 3, seed=7)[spec.input_name])
    assert not np.array_equal(array, zoo.example_inputs(name, 3, seed=8)[spec.input_name])
    if spec.digits:
        assert array.min() >= 0.0
        assert array.max() <= 1.0


def test_example_inputs_rejects_bad_batch() -> None:
    with pytest.raises(ValueError, match="batch"):
        zoo.example_inputs("mlp", 0)


def test_digits_data() -> None:
    x_train, y_train, x_test, y_test = zoo.digits_data()
    assert x_train.shape == (1437, 1, 8, 8)
    assert x_test.shape == (360, 1, 8, 8)
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int64
    assert y_train.shape == (1437,)
    assert y_test.shape == (360,)
    assert x_train.min() >= 0.0 and x_train.max() <= 1.0
    assert set(np.unique(y_test)) == set(range(10))
    # Fixed split, and callers get private copies.
    x_test[...] = -1.0
    again = zoo.digits_data()
    assert again[2].min() >= 0.0
    np.testing.assert_array_equal(again[3], y_test)


@pytest.mark.parametrize("name", DIGITS_MODELS)
def test_digits_accuracy(sessions: dict[str, ort.InferenceSession], name: str) -> None:
    accuracy = zoo.digits_accuracy(_runner(sessions[name]), name=name)
    assert accuracy >= 0.95


def test_digits_accuracy_output_forms_and_batching(
    sessions: dict[str, ort.InferenceSession],
) -> None:
    session = sessions["digits_cnn"]
    as_list = zoo.digits_accuracy(_runner(session))

    def as_dict(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"other": np.zeros(1), "logits": session.run(None, feeds)[0]}

    def as_array(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(None, feeds)[0]

    assert zoo.digits_accuracy(as_dict) == as_list
    assert zoo.digits_accuracy(as_array, batch_size=7) == as_list
    # A constant prediction scores the frequency of class 0 in the test split.
    constant = zoo.digits_accuracy(lambda feeds: [np.eye(10)[np.zeros(len(feeds["input"]), int)]])
    assert constant == pytest.approx(np.mean(zoo.digits_data()[3] == 0))


def test_digits_accuracy_static_batch_model() -> None:
    model = zoo.build("mlp", dynamic_batch=False)
    accuracy = zoo.digits_accuracy(_runner(_session(model)), name="mlp", batch_size=1)
    assert accuracy >= 0.95


def test_digits_accuracy_rejects_non_digits_model() -> None:
    with pytest.raises(ValueError, match="not a digits model"):
        zoo.digits_accuracy(lambda feeds: [], name="mobilenet_v2")


# --- save -----------------------------------------------------------------------------------


def test_save_writes_loadable_file(tmp_path: Path) -> None:
    directory = tmp_path / "nested" / "models"
    path = zoo.save("mlp", directory)
    assert path == directory / "mlp.onnx"
    # Saving again overwrites in place.
    assert zoo.save("mlp", directory, dynamic_batch=False) == path
    assert sorted(p.name for p in directory.iterdir()) == ["mlp.onnx"]
    onnx.checker.check_model(str(path), full_check=True)
    loaded = ir.load(path)
    assert loaded.graph.inputs[0].shape is not None
    assert tuple(loaded.graph.inputs[0].shape) == (1, 64)
    [out] = _session(loaded).run(None, zoo.example_inputs("mlp", 1))
    assert out.shape == (1, 10)


def test_save_cleans_up_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_save(model: ir.Model, path: object) -> None:
        Path(str(path)).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ir, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        zoo.save("mlp", tmp_path)
    assert list(tmp_path.iterdir()) == []
