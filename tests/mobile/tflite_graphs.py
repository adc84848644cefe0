"""Small ONNX graphs built in code for the TFLite export's tests, and a way to check one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ferry.mobile import TFLiteExport, export_tflite
from ferry.tflite import read_tflite

RNG = np.random.default_rng(7)


def weights(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, Sequence[int | str]],
    outputs: Sequence[str],
    inits: dict[str, np.ndarray] | None = None,
    *,
    opset: int = 17,
    input_types: dict[str, int] | None = None,
) -> onnx.ModelProto:
    """A model of ``nodes``; float inputs of the given shapes, outputs typed by inference."""
    types = input_types or {}
    graph = helper.make_graph(
        list(nodes),
        "case",
        [
            helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), s)
            for n, s in inputs.items()
        ],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(proto)
    found = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    for out in proto.graph.output:
        out.type.CopyFrom(found[out.name].type)
    onnx.checker.check_model(proto)
    return proto


def export(proto: onnx.ModelProto, tmp: Path, **options: Any) -> TFLiteExport:
    """Export ``proto`` (verified in LiteRT, XNNPACK and reference kernels, against ONNX
    Runtime) and check the file reads back."""
    out = tmp / "model.tflite"
    result = export_tflite(proto, out, **options)
    assert out.is_file()
    read_tflite(out.read_bytes(), str(out))
    return result


def opcodes(result: TFLiteExport) -> list[str]:
    path = result.path
    model = read_tflite(path.read_bytes(), str(path))
    return [op.opcode for op in model.subgraphs[0].operators]


def body_transposes(result: TFLiteExport) -> list[str]:
    """The TRANSPOSEs the report lists, but those at a model input or output (ONNX's NCHW)."""
    return [
        t for t in result.report.transposes if "model input" not in t and "model output" not in t
    ]
