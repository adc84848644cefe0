"""Triton's config.pbtxt: parsed with Triton's schema, mapped onto ferry's config, field by field."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _serving_models import add_const, write_model

pytest.importorskip("tritonclient")

from ferry.serving import ConfigError, InferRequest, ModelRepository, VersionPolicy, read_config
from ferry.serving._pbtxt import parse_pbtxt, triton_schema

BATCHED = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 2 } }
"""


def test_schema_is_tritons() -> None:
    schema = triton_schema()
    assert schema.module.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"


def test_schema_without_grpcio() -> None:
    """tritonclient.grpc needs grpcio to import; the schema it ships needs only protobuf."""
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "from ferry.serving._pbtxt import parse_pbtxt, triton_schema\n"
        "print(triton_schema().module.__name__, parse_pbtxt('max_batch_size: 3', 'm').max_batch_size)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ferry.serving._triton_model_config_pb2", "3"]


def test_batched_config_maps_onto_ferrys() -> None:
    config = parse_pbtxt(BATCHED, "m", source="m/config.pbtxt")
    assert config.max_batch_size == 8 and config.dynamic_batching is True
    assert config.preferred_batch_sizes == (4, 8) and config.max_queue_delay_us == 100
    assert config.instance_count == 2
    assert config.version_policy == VersionPolicy("latest", num_versions=2)
    assert [(t.name, t.data_type, t.dims, t.reshape) for t in config.inputs] == [
        ("x", "TYPE_FP32", (4,), None)
    ]
    assert config.backends is None and config.precision is None and not config.warnings


@pytest.mark.parametrize(
    ("text", "max_batch", "dynamic", "delay"),
    [
        # Inputs and outputs both declared: taken as written (Triton skips its autocomplete).
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]',
            0,
            None,
            100,
        ),
        # Nothing declared: derived from the model, as Triton's ONNX Runtime backend completes.
        ('platform: "onnxruntime_onnx"', None, None, 100),
        ("max_batch_size: 0", None, None, 100),
        # max_batch_size > 1 without dynamic_batching: the backend turns the batcher on.
        ("max_batch_size: 4", 4, True, 100),
        # dynamic_batching without a delay: Triton's default, 0.
        ("max_batch_size: 4 dynamic_batching { }", 4, True, 0),
    ],
)
def test_max_batch_size_as_triton_completes_it(
    text: str, max_batch: int | None, dynamic: bool | None, delay: int
) -> None:
    config = parse_pbtxt(text, "m")
    assert (config.max_batch_size, config.dynamic_batching) == (max_batch, dynamic)
    assert config.max_queue_delay_us == delay


def test_engines_from_backend_and_parameters() -> None:
    assert parse_pbtxt('backend: "onnxruntime"', "m").backends is None  # the server's
    assert parse_pbtxt('backend: "openvino"', "m").backends == ("openvino",)
    config = parse_pbtxt(
        'backend: "openvino" '
        'parameters { key: "ferry_backends" value: { string_value: "openvino, onnxruntime" } } '
        'parameters { key: "ferry_precision" value: { string_value: "bf16" } }',
        "m",
    )
    assert config.backends == ("openvino", "onnxruntime") and config.precision == "bf16"
    with pytest.raises(ConfigError, match="'precision' must be one of"):
        parse_pbtxt('parameters { key: "ferry_precision" value: { string_value: "f32" } }', "m")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('name: "other"', "'name' is 'other' but the model folder is 'm'"),
        ('platform: "tensorflow_savedmodel"', "platform 'tensorflow_savedmodel'"),
        ('platform: "ensemble" ensemble_scheduling { }', "ensemble_scheduling"),
        ('backend: "pytorch"', "backend 'pytorch'"),
        ('platform: "onnxruntime_onnx" backend: "openvino"', "disagree"),
        ('runtime: "model.py"', "runtime"),
        (
            'max_batch_size: 4 sequence_batching { control_input [ { name: "START" } ] }',
            "control_input",
        ),
        ("max_batch_size: 4 dynamic_batching { priority_levels: 2 }", "priority_levels"),
        (
            "max_batch_size: 4 dynamic_batching { priority_queue_policy { key: 1 value {} } }",
            "priority_queue_policy",
        ),
        ("instance_group [ { kind: KIND_GPU } ]", "KIND_GPU"),
        ("instance_group [ { kind: KIND_MODEL } ]", "KIND_MODEL"),
        ("instance_group [ { kind: KIND_CPU passive: true } ]", "passive"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]', "optional"),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true } ]',
            "allow_ragged_batch",
        ),
        ('input [ { name: "x" dims: [ 4 ] } ]', "data_type"),
        ('input [ { name: "x" data_type: TYPE_FP32 } ]', "needs dims"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]', "positive or -1"),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
            "same number of elements",
        ),
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "declared twice",
        ),
        ('batch_input [ { target_name: "b" } ]', "batch_input"),
        ("model_transaction_policy { decoupled: true }", "decoupled"),
        ('model_operations { op_library_filename: "libcustom.so" }', "model_operations"),
        (
            "optimization { execution_accelerators { cpu_execution_accelerator : "
            '[ { name : "openvino" } ] } }',
            "execution_accelerators",
        ),
        ('model_repository_agents { agents [ { name: "checksum" } ] }', "model_repository_agents"),
        ("version_policy: { latest: { } }", "num_versions"),
        ('default_model_filename: "../elsewhere.onnx"', "default_model_filename"),
        ("max_batch_size: -1", "max_batch_size"),
        ("not_a_field: 1", "not_a_field"),
        ("max_batch_size: ", "not a valid Triton model configuration"),
    ],
)
def test_refused_fields(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_pbtxt(text, "m", source="m/config.pbtxt")
    assert words in str(error.value) and "m/config.pbtxt" in str(error.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "l.txt" } ]',
            "label_filename",
        ),
        ('model_warmup [ { name: "w" batch_size: 1 } ]', "model_warmup"),
        ("response_cache { enable: true }", "response_cache"),
        ('metric_tags { key: "team" value: "a" }', "metric_tags"),
        ('cc_model_filenames { key: "7.5" value: "m75.onnx" }', "cc_model_filenames"),
        ("optimization { graph { level: 1 } }", "optimization"),
        ("max_batch_size: 4 dynamic_batching { preserve_ordering: true }", "preserve_ordering"),
        ("instance_group [ { count: 1 rate_limiter { priority: 1 } } ]", "rate_limiter"),
        ('parameters { key: "intra_op_thread_count" value: { string_value: "2" } }', "intra_op"),
    ],
)
def test_warned_fields(text: str, words: str) -> None:
    config = parse_pbtxt(text, "m")
    assert any(words in w for w in config.warnings), config.warnings


def test_harmless_fields_as_written() -> None:
    config = parse_pbtxt(
        'input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] } ] '
        'instance_group [ { name: "cpus" count: 0 kind: KIND_AUTO } ] '
        'default_model_filename: "net.onnx"',
        "m",
    )
    assert config.inputs[0].format == "FORMAT_NCHW" and config.inputs[0].dims == (3, -1, -1)
    assert config.instance_count == 1  # Triton: a count of 0 is 1
    assert config.model_filename == "net.onnx" and not config.warnings


def test_one_config_file_per_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "config.pbtxt").write_text("max_batch_size: 2")
    with pytest.raises(ConfigError, match=r"both .*config\.json and .*config\.pbtxt"):
        read_config(tmp_path, "m")
    (tmp_path / "config.json").unlink()
    config, text = read_config(tmp_path, "m")
    assert config.max_batch_size == 2 and text == "max_batch_size: 2"
    assert config.source == str(tmp_path / "config.pbtxt")


def _serve(repo: Path, name: str, x: np.ndarray) -> tuple[list[dict[str, str]], np.ndarray | str]:
    """Load ``repo``, run ``x`` through ``name``; the index and the output (or the error)."""

    async def main() -> tuple[list[dict[str, str]], np.ndarray | str]:
        repository = ModelRepository(repo, warmup=True)
        await repository.start()
        try:
            index = await repository.index()
            try:
                served = repository.get(name)
                request = InferRequest(None, {"x": x}, {"x": "FP32"}, None, False, {})
                feeds, batch = served.prepare(request)
                outcome = await served.infer(feeds, None, batch)
            except Exception as e:  # the test reads the message
                return index, str(e)
            return index, outcome.outputs["y"]
        finally:
            await repository.stop()

    return asyncio.run(main())


def test_reshape_with_a_batch_dim(repo: Path) -> None:
    """dims [2, 2] reshaped to the model's [4] after the batch dim, and the output back."""
    write_model(repo, "m", 1, add_const(1))
    (repo / "m" / "config.pbtxt").write_text(
        "max_batch_size: 4 "
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]'
    )
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    index, out = _serve(repo, "m", x)
    assert index[0]["state"] == "READY", index
    np.testing.assert_array_equal(out, x + 1)


def test_declared_tensors_reshape_and_dims(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1, batch=1))  # x[1, 4], as densenet's [1, 3, 224, 224]
    (repo / "m" / "config.pbtxt").write_text(
        "max_batch_size: 0 "
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape { shape: [ 1, 4 ] } } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 1, 4 ] } } ]'
    )
    index, out = _serve(repo, "m", np.arange(4, dtype=np.float32).reshape(2, 2))
    assert index[0]["state"] == "READY", index
    np.testing.assert_array_equal(out, [1, 2, 3, 4])
    _, error = _serve(repo, "m", np.zeros((1, 4), np.float32))
    assert isinstance(error, str) and "[2, 2]" in error


def test_declared_tensors_must_fit_the_model(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))
    (repo / "m" / "config.pbtxt").write_text(
        'max_batch_size: 4 input [ { name: "z" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    index, _ = _serve(repo, "m", np.zeros((1, 4), np.float32))
    assert (
        index[0]["state"] == "UNAVAILABLE" and "input 'z' is not in the model" in index[0]["reason"]
    )
    (repo / "m" / "config.pbtxt").write_text(
        'max_batch_size: 0 input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ] '
        'output [ { name: "y" data_type: TYPE_FP16 dims: [ -1, 4 ] } ]'
    )
    index, _ = _serve(repo, "m", np.zeros((1, 4), np.float32))
    assert "is TYPE_FP32 in the model, but the config says TYPE_FP16" in index[0]["reason"]


def test_default_model_filename(repo: Path) -> None:
    path = write_model(repo, "m", 1, add_const(5))
    path.rename(path.with_name("net.onnx"))
    write_model(repo, "m", 1, add_const(1))  # model.onnx beside it: not the one named
    (repo / "m" / "config.pbtxt").write_text('default_model_filename: "net.onnx"')
    index, out = _serve(repo, "m", np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(out, [[5, 5, 5, 5]])
    (repo / "m" / "config.pbtxt").write_text('default_model_filename: "missing.onnx"')
    index, _ = _serve(repo, "m", np.zeros((1, 4), np.float32))
    assert index[0]["state"] == "UNAVAILABLE" and "missing.onnx" in index[0]["reason"]
