"""A quantized model's web bundle is judged at its task where elementwise parity cannot hold.

Integer kernels round differently from one engine to the next: onnxruntime-web's dynamic int8
(the kit's CRNN) differs from ONNX Runtime's by a quantization step on most logits while every
argmax agrees. A float model keeps the elementwise contract: there a difference is a bug.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry.graph import load_model
from ferry.web import export_web
from ferry.web._export import _task_check


def _classifier() -> onnx.ModelProto:
    """x [N, 64] -> MatMul -> Softmax over 10 classes."""
    w = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
            helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        ],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def dynamic_int8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path_factory.mktemp("int8")
    onnx.save(_classifier(), folder / "float.onnx")
    quantize_dynamic(folder / "float.onnx", folder / "int8.onnx", weight_type=QuantType.QInt8)
    return folder / "int8.onnx"


def test_float_model_has_no_task_fallback() -> None:
    probs = {"probs": np.full((2, 10), 0.1, np.float32)}
    assert _task_check(load_model(_classifier()), probs, probs) is None


def test_quantized_model_judged_at_its_task(dynamic_int8: Path) -> None:
    rng = np.random.default_rng(1)
    want = {"probs": rng.dirichlet(np.ones(10), size=8).astype(np.float32)}
    # A quantization step off everywhere, every argmax the same: the task is intact.
    close = {"probs": want["probs"] * 1.01}
    check = _task_check(load_model(dynamic_int8), close, want)
    assert check is not None and check.verdict.passed
    assert "dynamic int8" in check.source and "top1" in check.judge
    swapped = {"probs": want["probs"][:, ::-1].copy()}
    check = _task_check(load_model(dynamic_int8), swapped, want)
    assert check is not None and not check.verdict.passed


@pytest.mark.usefixtures("npm")
def test_quantized_export_passes_in_node(dynamic_int8: Path, tmp_path: Path) -> None:
    result = export_web(dynamic_int8, tmp_path / "site")
    assert result.verification is not None
    assert result.verification.passed or (result.task is not None and result.task.verdict.passed)
