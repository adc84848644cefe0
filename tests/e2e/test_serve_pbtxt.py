"""``ferry serve`` on a Triton model repository as Triton's documentation writes it (``config.pbtxt``),
driven by Triton's own HTTP client.

The configs are those of Triton's quickstart (``densenet_onnx``) and model configuration guide
(a batched model with dynamic batching, two CPU instances and a version policy), with small models
of the same names and signatures; beside them, models whose configs ask for what ferry refuses
(they are UNAVAILABLE, the reason naming the field) or ignores (a warning names the field).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
httpclient = pytest.importorskip("tritonclient.http")

import serve_models as sm  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from ferry.serving import ServerThread, create_app  # noqa: E402

# Triton's quickstart: docs/examples/model_repository/densenet_onnx/config.pbtxt, as written.
DENSENET_CONFIG = """\
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""

# The model configuration guide's settings (max_batch_size 16 rather than 8, ferry's default,
# so that the test tells the config's from the default).
BATCHED_CONFIG = """\
name: "batched_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
version_policy: { latest: { num_versions: 2 } }
"""

# Only name and platform: Triton's ONNX Runtime backend completes the rest from the model.
AUTO_CONFIG = 'name: "auto_onnx"\nplatform: "onnxruntime_onnx"\n'

# Hints that leave the answers unchanged: each is a warning naming the field.
WARNED_CONFIG = """\
name: "warned_onnx"
backend: "onnxruntime"
max_batch_size: 4
model_warmup [
  {
    name: "sample"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
optimization { graph: { level: 1 } }
parameters { key: "execution_mode" value: { string_value: "0" } }
parameters { key: "ferry_backends" value: { string_value: "onnxruntime" } }
parameters { key: "ferry_precision" value: { string_value: "fp32" } }
"""

# Configs ferry refuses, by model name, and what the reason must mention.
REFUSED: dict[str, tuple[str, str]] = {
    "sequence_onnx": (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'sequence_batching { control_input [ { name: "START" } ] }\n',
        "control_input",
    ),
    "gpu_onnx": (
        'platform: "onnxruntime_onnx"\ninstance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n',
        "KIND_GPU",
    ),
    "trt_onnx": ('platform: "tensorrt_plan"\n', "tensorrt_plan"),
    "python_onnx": ('backend: "python"\n', "backend 'python'"),
    "accelerated_onnx": (
        'platform: "onnxruntime_onnx"\noptimization { execution_accelerators {\n'
        '  gpu_execution_accelerator : [ { name : "tensorrt" } ] } }\n',
        "execution_accelerators",
    ),
    "misnamed_onnx": ('name: "another_name"\nplatform: "onnxruntime_onnx"\n', "another_name"),
    "wrong_dims_onnx": (
        BATCHED_CONFIG.replace('"batched_onnx"', '"wrong_dims_onnx"').replace("[ 16 ]", "[ 15 ]"),
        "dims [15]",
    ),
    "wrong_type_onnx": (
        BATCHED_CONFIG.replace('"batched_onnx"', '"wrong_type_onnx"').replace(
            "data_type: TYPE_FP32\n    dims: [ 16 ]", "data_type: TYPE_INT32\n    dims: [ 16 ]"
        ),
        "TYPE_INT32",
    ),
    "unknown_field_onnx": ('platform: "onnxruntime_onnx"\nnot_a_field: 3\n', "not_a_field"),
}


def densenet_like(seed: int = 0) -> onnx.ModelProto:
    """data_0[1, 3, 224, 224] -> GlobalAveragePool -> 1x1 Conv to 1000 -> fc6_1[1, 1000, 1, 1]:
    the quickstart's densenet signature, on a model small enough to build here."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((1000, 3, 1, 1)).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "w", "b"], ["fc6_1"]),
        ],
        "densenet_like",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return sm._model(graph)


def densenet_reference(x: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((1000, 3, 1, 1)).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    return np.asarray(w[:, :, 0, 0] @ x.mean(axis=(1, 2)) + b, np.float32)


def dense(k: float) -> onnx.ModelProto:
    """INPUT0[batch, 16] -> OUTPUT0 = INPUT0 @ W + k [batch, 4]: versions differ by k."""
    w = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "w"], ["h"]),
            helper.make_node("Add", ["h", "k"], ["OUTPUT0"]),
        ],
        "dense",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(k, np.float32), "k")],
    )
    return sm._model(graph)


def dense_reference(x: np.ndarray, k: float) -> np.ndarray:
    w = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
    return np.asarray(x @ w + np.float32(k), np.float32)


def write_pbtxt(repo: Path, name: str, text: str) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(text)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[str]]]:
    repo = tmp_path_factory.mktemp("pbtxt") / "models"
    sm.add_version(repo, "densenet_onnx", 1, densenet_like())
    write_pbtxt(repo, "densenet_onnx", DENSENET_CONFIG)
    (repo / "densenet_onnx" / "densenet_labels.txt").write_text("tench\ngoldfish\n")
    for version in (1, 2, 3):
        sm.add_version(repo, "batched_onnx", version, dense(version))
    write_pbtxt(repo, "batched_onnx", BATCHED_CONFIG)
    sm.add_version(repo, "auto_onnx", 1, dense(0))
    write_pbtxt(repo, "auto_onnx", AUTO_CONFIG)
    sm.add_version(repo, "warned_onnx", 1, dense(0))
    write_pbtxt(repo, "warned_onnx", WARNED_CONFIG)
    for name, (text, _) in REFUSED.items():
        sm.add_version(repo, name, 1, dense(0))
        write_pbtxt(repo, name, text)
    sm.add_version(repo, "two_configs", 1, dense(0))
    write_pbtxt(repo, "two_configs", 'platform: "onnxruntime_onnx"\n')
    sm.write_config(repo, "two_configs", {})
    records = _Records()
    logger = logging.getLogger("ferry")
    logger.addHandler(records)
    try:
        with ServerThread(create_app(repo), host="127.0.0.1", port=0) as server:
            yield server, records.messages
    finally:
        logger.removeHandler(records)


@pytest.fixture
def client(triton_repo: tuple[Any, list[str]]) -> Iterator[Any]:
    c = httpclient.InferenceServerClient(triton_repo[0].url.removeprefix("http://"))
    yield c
    c.close()


def _infer(client: Any, model: str, name: str, x: np.ndarray, version: str = "") -> Any:
    tensor = httpclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return client.infer(model, [tensor], model_version=version)


def test_quickstart_densenet_config_with_reshape(client: Any) -> None:
    assert client.is_model_ready("densenet_onnx")
    config = client.get_model_config("densenet_onnx")
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 0
    assert "dynamic_batching" not in config
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("data_0", [3, 224, 224])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("fc6_1", [1000])]
    meta = client.get_model_metadata("densenet_onnx")
    assert meta["inputs"] == [{"name": "data_0", "datatype": "FP32", "shape": [3, 224, 224]}]
    assert meta["outputs"] == [{"name": "fc6_1", "datatype": "FP32", "shape": [1000]}]
    # As the quickstart's client sends it: [3, 224, 224], reshaped to the model's [1, 3, 224, 224];
    # the answer comes back in the declared dims, [1000].
    x = np.random.default_rng(1).standard_normal((3, 224, 224)).astype(np.float32)
    got = _infer(client, "densenet_onnx", "data_0", x).as_numpy("fc6_1")
    assert got.shape == (1000,)
    np.testing.assert_allclose(got, densenet_reference(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(InferenceServerException) as error:  # the model's shape is not the API's
        _infer(client, "densenet_onnx", "data_0", x[None])
    assert int(error.value.status()) == 400 and "[3, 224, 224]" in error.value.message()


def test_batched_config_is_honoured(client: Any) -> None:
    config = client.get_model_config("batched_onnx")
    assert config["max_batch_size"] == 16
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert config["instance_group"][0]["count"] == 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["version_policy"] == {"latest": {"num_versions": 2}}
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT0", [16])]
    # version_policy latest 2: versions 2 and 3 serve, 1 does not.
    assert client.get_model_metadata("batched_onnx")["versions"] == ["2", "3"]
    assert client.is_model_ready("batched_onnx", "2") and client.is_model_ready("batched_onnx", "3")
    assert not client.is_model_ready("batched_onnx", "1")
    x = np.random.default_rng(2).standard_normal((16, 16)).astype(np.float32)
    for version, k in (("2", 2), ("3", 3), ("", 3)):
        got = _infer(client, "batched_onnx", "INPUT0", x[:3], version).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, dense_reference(x[:3], k), rtol=1e-5, atol=1e-5)
    got = _infer(client, "batched_onnx", "INPUT0", x).as_numpy("OUTPUT0")  # at the limit
    np.testing.assert_allclose(got, dense_reference(x, 3), rtol=1e-5, atol=1e-5)
    big = np.zeros((17, 16), np.float32)
    with pytest.raises(InferenceServerException) as error:
        _infer(client, "batched_onnx", "INPUT0", big)
    assert int(error.value.status()) == 400 and "16" in error.value.message()
    with pytest.raises(InferenceServerException) as error:  # the declared dims: 16 per row
        _infer(client, "batched_onnx", "INPUT0", np.zeros((2, 15), np.float32))
    assert int(error.value.status()) == 400


def test_autocompleted_like_tritons_backend(client: Any) -> None:
    config = client.get_model_config("auto_onnx")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config


def test_parameters_and_warned_fields(client: Any, triton_repo: tuple[Any, list[str]]) -> None:
    assert client.is_model_ready("warned_onnx")
    config = client.get_model_config("warned_onnx")
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config  # max_batch_size > 1 and no tensors: Triton completes it
    assert config["parameters"]["ferry_backends"] == {"string_value": "onnxruntime"}
    assert config["parameters"]["ferry_precision"] == {"string_value": "fp32"}
    logged = "\n".join(triton_repo[1])
    for field in ("model_warmup", "optimization", "'execution_mode'", "label_filename"):
        assert field in logged, (field, logged)


def test_refused_fields_make_the_model_unavailable(client: Any) -> None:
    index = {e["name"]: e for e in client.get_model_repository_index()}
    for name, (_, words) in REFUSED.items():
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        assert words in entry["reason"], (words, entry)
        assert not client.is_model_ready(name)
    both = index["two_configs"]
    assert both["state"] == "UNAVAILABLE"
    assert "config.json" in both["reason"] and "config.pbtxt" in both["reason"]
    # Strict readiness: models that should load do not, so the server is not ready; it is live,
    # and the others serve.
    assert client.is_server_live() and not client.is_server_ready()
    assert client.is_model_ready("densenet_onnx") and client.is_model_ready("batched_onnx")


def test_openvino_backend_field(tmp_path: Path) -> None:
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    try:
        get_backend("openvino")
    except BackendUnavailableError:
        pytest.skip("OpenVINO is not installed")
    repo = tmp_path / "models"
    sm.add_version(repo, "dense", 1, dense(1))
    write_pbtxt(repo, "dense", 'name: "dense"\nbackend: "openvino"\nmax_batch_size: 4\n')
    with ServerThread(create_app(repo), host="127.0.0.1", port=0) as server:
        c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            config = c.get_model_config("dense")
            assert config["backend"] == "openvino" and config["max_batch_size"] == 4
            assert config["parameters"]["ferry_backends"] == {"string_value": "openvino"}
            x = np.ones((2, 16), np.float32)
            got = _infer(c, "dense", "INPUT0", x).as_numpy("OUTPUT0")
            np.testing.assert_allclose(got, dense_reference(x, 1), rtol=1e-4, atol=1e-4)
        finally:
            c.close()
