"""Models and a model repository (Triton layout) for the ``ferry serve`` end-to-end tests.

Every model is built with ``onnx.helper``; ``ort_run`` runs one directly on ONNX Runtime (passing
bfloat16 through OrtValues, which ORT's numpy bridge cannot take) to give the reference outputs
the server's answers are compared against.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21

# KServe v2 datatype -> (ONNX element type, numpy dtype).
DATATYPES: dict[str, tuple[int, Any]] = {
    "BOOL": (TensorProto.BOOL, np.bool_),
    "UINT8": (TensorProto.UINT8, np.uint8),
    "UINT16": (TensorProto.UINT16, np.uint16),
    "UINT32": (TensorProto.UINT32, np.uint32),
    "UINT64": (TensorProto.UINT64, np.uint64),
    "INT8": (TensorProto.INT8, np.int8),
    "INT16": (TensorProto.INT16, np.int16),
    "INT32": (TensorProto.INT32, np.int32),
    "INT64": (TensorProto.INT64, np.int64),
    "FP16": (TensorProto.FLOAT16, np.float16),
    "FP32": (TensorProto.FLOAT, np.float32),
    "FP64": (TensorProto.DOUBLE, np.float64),
    "BYTES": (TensorProto.STRING, np.object_),
    "BF16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
}


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def dtype_model(datatype: str) -> onnx.ModelProto:
    """x[batch, 2, 3] -> y = Identity(x), and d = Cast(x, double) for every non-string type.

    The cast makes the model compute something that depends on how the server read the bytes
    (signedness, width, byte order), which an identity alone would hide.
    """
    elem, _ = DATATYPES[datatype]
    shape = ["batch", 2, 3]
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", elem, shape)]
    if datatype != "BYTES":
        nodes.append(helper.make_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE))
        outputs.append(helper.make_tensor_value_info("d", TensorProto.DOUBLE, shape))
    graph = helper.make_graph(
        nodes,
        f"dtype_{datatype.lower()}",
        [helper.make_tensor_value_info("x", elem, shape)],
        outputs,
    )
    return _model(graph)


def dtype_sample(datatype: str, batch: int = 2, seed: int = 0) -> np.ndarray:
    """A [batch, 2, 3] input of ``datatype`` that spans the type's range (extremes included)."""
    rng = np.random.default_rng(seed)
    n = batch * 6
    _, dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        words = ["ferry", "", "naïve", "日本語", "a b", "x" * 40, "tab\tq", '"quoted"']
        values = np.array([words[i % len(words)] + str(i) for i in range(n)], dtype=np.object_)
        return values.reshape(batch, 2, 3)
    if datatype == "BOOL":
        return (rng.integers(0, 2, n) == 1).reshape(batch, 2, 3)
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        values = (rng.standard_normal(n) * 100).astype(np.float32)
        values[0], values[1] = -0.0, 1.5  # exactly representable everywhere
        return values.astype(dtype).reshape(batch, 2, 3)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    values[0], values[1] = info.min, info.max
    return values.reshape(batch, 2, 3)


def two_outputs() -> onnx.ModelProto:
    """x[batch, 4] float -> sum = x + 1, prod = x * 2."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["sum"]),
            helper.make_node("Mul", ["x", "two"], ["prod"]),
        ],
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("prod", TensorProto.FLOAT, ["batch", 4]),
        ],
        [one, two],
    )
    return _model(graph)


def reshaper() -> onnx.ModelProto:
    """x[n] float, shape[2] int64 -> y = Reshape(x, shape): fails at run time on a wrong shape.

    ``shape`` has no symbolic leading dim, so the model is not batchable (max_batch_size 0).
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshaper",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
    )
    return _model(graph)


def rowwise(seed: int = 0) -> onnx.ModelProto:
    """x[batch, seq, 4] float -> y = tanh(x @ W) [batch, seq, 3]: rows are independent."""
    w = np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Tanh", ["h"], ["y"]),
        ],
        "rowwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 3])],
        [numpy_helper.from_array(w, "w")],
    )
    return _model(graph)


def add_const(value: float) -> onnx.ModelProto:
    """x[batch, 3] float -> y = x + value: versions of one model that answer distinguishably."""
    c = numpy_helper.from_array(np.array(value, np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        f"add_{value:g}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [c],
    )
    return _model(graph)


def fixed_shape() -> onnx.ModelProto:
    """x[2, 3] float -> y = -x: no symbolic dims at all (max_batch_size 0)."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])],
        "fixed_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return _model(graph)


# ---------------------------------------------------------------------------------------------
# Repository layout


def add_version(
    repo: Path, name: str, version: int, model: onnx.ModelProto | bytes, *, atomic: bool = True
) -> Path:
    """Write ``repo/name/version/model.onnx``.

    ``atomic``: build the version folder beside the repository and rename it in, so a polling
    server never sees a half-written version (as a careful deployment would do).
    """
    data = model if isinstance(model, bytes) else model.SerializeToString()
    target = repo / name / str(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not atomic:
        target.mkdir()
        (target / "model.onnx").write_bytes(data)
        return target
    staging = repo.parent / f".staging-{name}-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    (staging / "model.onnx").write_bytes(data)
    staging.rename(target)
    return target


def write_config(repo: Path, name: str, config: dict[str, Any]) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.json").write_text(json.dumps(config))


# The model built for each name in the main test repository (all version 1 unless noted).
ROWWISE_CONFIG = {
    "max_batch_size": 8,
    # Long enough that concurrent requests on a busy 2-core machine still meet in the queue.
    "dynamic_batching": {"max_queue_delay_microseconds": 20000, "preferred_batch_size": [4, 8]},
}


def build_main_repository(repo: Path) -> dict[str, onnx.ModelProto]:
    """The repository the main server serves; returns the models by name for reference runs."""
    models: dict[str, onnx.ModelProto] = {}
    for datatype in DATATYPES:
        models[f"dtype_{datatype.lower()}"] = dtype_model(datatype)
    models["two_outputs"] = two_outputs()
    models["reshaper"] = reshaper()
    models["rowwise"] = rowwise()
    models["fixed_shape"] = fixed_shape()
    for name, model in models.items():
        add_version(repo, name, 1, model)
    write_config(repo, "rowwise", ROWWISE_CONFIG)
    # versioned: v1 adds 1, v2 adds 2, v3 adds 3; the policy serves 1 and 3 only.
    for version in (1, 2, 3):
        add_version(repo, "versioned", version, add_const(version))
    write_config(repo, "versioned", {"version_policy": {"specific": {"versions": [1, 3]}}})
    # latest: two versions, no config: the default policy serves only the newest.
    for version in (1, 2):
        add_version(repo, "latest", version, add_const(10 * version))
    models["versioned"] = add_const(3)
    models["latest"] = add_const(20)
    return models


def build_precision_repository(repo: Path) -> dict[str, onnx.ModelProto]:
    """Models that ask for a precision in their config.json (OpenVINO runs the good one):

    - ``rowwise_bf16``: ``{"backends": ["openvino"], "precision": "bf16"}``;
    - ``rowwise_default``: no config (the server's engines and precision);
    - ``bad_precision``: ``{"precision": "bf61"}``, not a precision;
    - ``ort_int8``: ``{"precision": "int8"}`` on ONNX Runtime, which runs fp32 only.

    Returns the models that load, by name, for reference runs.
    """
    models = {"rowwise_bf16": rowwise(), "rowwise_default": rowwise()}
    for name, model in models.items():
        add_version(repo, name, 1, model)
    write_config(repo, "rowwise_bf16", {"backends": ["openvino"], "precision": "bf16"})
    add_version(repo, "bad_precision", 1, add_const(1))
    write_config(repo, "bad_precision", {"precision": "bf61"})
    add_version(repo, "ort_int8", 1, add_const(1))
    write_config(repo, "ort_int8", {"precision": "int8"})
    return models


# ---------------------------------------------------------------------------------------------
# Reference: ONNX Runtime run directly

_BF16 = np.dtype(ml_dtypes.bfloat16)


class Reference:
    """A model on a plain onnxruntime.InferenceSession: the answers the server must give."""

    def __init__(self, model: onnx.ModelProto) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.outputs = self.session.get_outputs()
        self.names = [o.name for o in self.outputs]
        self._exotic = any(o.type == "tensor(bfloat16)" for o in self.outputs) or any(
            i.type == "tensor(bfloat16)" for i in self.session.get_inputs()
        )

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._exotic:
            return dict(zip(self.names, self.session.run(self.names, feeds)))
        ort = self._ort
        values = {}
        for name, array in feeds.items():
            if array.dtype == _BF16:
                values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array).view(np.uint16), TensorProto.BFLOAT16
                )
            else:
                values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
        results = {}
        for out, value in zip(self.outputs, self.session.run_with_ort_values(self.names, values)):
            if out.type == "tensor(bfloat16)":
                raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
                results[out.name] = np.frombuffer(raw, _BF16).reshape(value.shape()).copy()
            else:
                results[out.name] = value.numpy()
        return results


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of ``model`` on ``feeds``, from a plain onnxruntime.InferenceSession."""
    return Reference(model)(feeds)
