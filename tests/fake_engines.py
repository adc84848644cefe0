"""Engines made up for the bench's accuracy tests (imported by name: keep it unique).

Each computes the model once per input shape with ONNX Runtime and then answers from that cache,
so it is far faster than ONNX Runtime running :func:`heavy_model`: the fastest configuration is
known in advance, whatever the machine's noise. ``close`` answers a monotonic transform of the
truth (the argmax kept, the cosine similarity just under 1: within the default budget, outside
``cosine=1.0``); ``wrong`` answers its negation (outside any budget).

Register them with :func:`register` (a pytest ``monkeypatch``): they live in this process only,
so bench them with ``isolate=False`` (``--no-isolate``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ferry.backends import BackendBase, CompileSpec, OpRule

WIDTH = 512
LAYERS = 4


def heavy_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 512] -> (MatMul 512x512 -> Relu) x4 -> y: ~2 MFLOP a sample, far slower on ONNX
    Runtime than a cached answer."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out], name=f"relu{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "heavy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def close(y: np.ndarray) -> np.ndarray:
    """A monotonic map of the truth: same argmax everywhere, cosine similarity just under 1."""
    return ((1 + 1e-3) * y - 1e-3 * float(y.mean())).astype(y.dtype)


def wrong(y: np.ndarray) -> np.ndarray:
    return -y


class _Cached:
    def __init__(self, proto: onnx.ModelProto, transform: Callable[[np.ndarray], np.ndarray]):
        self.session = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.names = [o.name for o in self.session.get_outputs()]
        self.transform = transform
        self.cache: dict[Any, dict[str, np.ndarray]] = {}

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        key = tuple((name, value.shape) for name, value in sorted(inputs.items()))
        found = self.cache.get(key)
        if found is None:
            values = self.session.run(self.names, inputs)
            found = self.cache[key] = {
                n: self.transform(v) for n, v in zip(self.names, values, strict=True)
            }
        return {n: found[n] for n in (outputs or self.names)}

    def serialize(self) -> bytes:
        return b""


class FakeEngine(BackendBase):
    """Claims every standard op; answers from its cache, transformed."""

    device = "cpu"
    version = "1.0"
    precisions: tuple[str, ...] = ("fp32",)
    install_hint = "nothing to install"

    def __init__(self, name: str, transform: Callable[[np.ndarray], np.ndarray]) -> None:
        self.name = name
        self.transform = transform

    def available(self) -> bool:
        return True

    def rules(self) -> list[OpRule]:
        return [OpRule(s.name) for s in onnx.defs.get_all_schemas() if s.domain == ""]

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        return {}

    def compile(self, spec: CompileSpec) -> _Cached:
        return _Cached(ir.to_proto(spec.model), self.transform)

    def load(self, blob: bytes, spec: CompileSpec) -> _Cached:
        return self.compile(spec)


ENGINES = {"close": close, "wrong": wrong}


def register(monkeypatch: Any) -> None:
    """Make ``close`` and ``wrong`` known backends for the rest of the test."""
    import ferry.backends._registry as registry

    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, **dict.fromkeys(ENGINES, "-")})
    for name, transform in ENGINES.items():
        monkeypatch.setitem(registry._instances, name, FakeEngine(name, transform))
