"""Adapters made up for the conformance kit's own tests (imported by name: keep it unique).

:class:`NumpyEngine` runs graphs of MatMul, Add, Gemm and Relu in numpy: a conforming adapter with an
engine cache (its blob is the model). Each other class gets one thing wrong, the way a vendor's
adapter might: :class:`WrongRelu` returns Relu's input (a claimed op computed wrongly),
:class:`Crashy` hands the input's buffer to its "device" as it is and breaks on an array that is
not C-contiguous (its own exception escapes), :class:`Unsafe` computes every call into one shared
output buffer (not thread safe), :class:`Refuses` claims no dynamic shapes and answers one batch
size only, :class:`Lies` claims dynamic shapes but answers every size with batch 1's rows, and
:class:`Aborts` kills its process on a batch of 7 (as a native engine's segfault would).

Register them with :func:`register` (a pytest ``monkeypatch``): they live in this process only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import numpy_helper

from ferry.backends import BackendBase, CompileSpec, OpRule
from ferry.errors import ExecutionError

_KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "MatMul": np.matmul,
    "Add": np.add,
    "Gemm": lambda a, b, c: a @ b + c,
    "Relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
}


def _plain(node: Any) -> bool | str:
    # The Gemm kernel knows no attribute (transA, alpha...): a node with one is not for it.
    return True if not node.attributes else f"{node.op_type} with attributes"


class NumpyPartition:
    """A model of MatMul, Add, Gemm and Relu nodes, evaluated in numpy in graph order."""

    def __init__(self, blob: bytes, kernels: dict[str, Callable[..., np.ndarray]]) -> None:
        self.blob = blob
        proto = onnx.load_from_string(blob)
        self.weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        self.nodes = [(n.op_type, list(n.input), list(n.output)) for n in proto.graph.node]
        self.outputs = [o.name for o in proto.graph.output]
        self.kernels = kernels

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = {**self.weights, **inputs}
        for op, ins, outs in self.nodes:
            values[outs[0]] = np.asarray(self.kernels[op](*(values[i] for i in ins)))
        return {name: values[name] for name in self.outputs}

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        found = self.compute(inputs)
        return {name: found[name] for name in (outputs or self.outputs)}

    def serialize(self) -> bytes:
        return self.blob


class NumpyEngine(BackendBase):
    """Claims MatMul, Add, Gemm and Relu (float32, no attributes) and computes them right."""

    name = "kit-numpy"
    device = "cpu"
    version = "1.0"
    sdk = "numpy"
    install_hint = "nothing to install"
    engine_cache = True
    kernels: ClassVar[dict[str, Callable[..., np.ndarray]]] = _KERNELS
    partition: ClassVar[type[NumpyPartition]] = NumpyPartition

    def available(self) -> bool:
        return True

    def rules(self) -> list[OpRule]:
        return [OpRule(op, dtypes=frozenset({"float32"}), check=_plain) for op in self.kernels]

    def compile(self, spec: CompileSpec) -> NumpyPartition:
        import onnx_ir as ir

        return self.partition(ir.to_proto(spec.model).SerializeToString(), dict(self.kernels))

    def load(self, blob: bytes, spec: CompileSpec) -> NumpyPartition:
        return self.partition(blob, dict(self.kernels))


class WrongRelu(NumpyEngine):
    """Claims Relu and returns its input."""

    name = "kit-wrong-relu"
    kernels: ClassVar[dict[str, Callable[..., np.ndarray]]] = {**_KERNELS, "Relu": lambda x: x}


class _DeviceBuffer(NumpyPartition):
    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        for array in inputs.values():
            memoryview(array).cast("B")  # a raw byte view to copy to the device: C order only
        return super().run(inputs, outputs)


class Crashy(NumpyEngine):
    """Breaks with its own TypeError on an input that is not C-contiguous."""

    name = "kit-crashy"
    partition: ClassVar[type[NumpyPartition]] = _DeviceBuffer


class _SharedBuffer(NumpyPartition):
    def __init__(self, blob: bytes, kernels: dict[str, Callable[..., np.ndarray]]) -> None:
        super().__init__(blob, kernels)
        self.scratch: dict[str, np.ndarray] = {}

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        self.scratch.update(self.compute(inputs))
        time.sleep(0.001)  # the device's latency: another call overwrites the scratch meanwhile
        return {name: self.scratch[name].copy() for name in (outputs or self.outputs)}


class Unsafe(NumpyEngine):
    """Computes every call into one output buffer shared by all callers."""

    name = "kit-unsafe"
    partition: ClassVar[type[NumpyPartition]] = _SharedBuffer


class _OneSize(NumpyPartition):
    def __init__(self, blob: bytes, kernels: dict[str, Callable[..., np.ndarray]]) -> None:
        super().__init__(blob, kernels)
        self.rows: int | None = None

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        rows = next(iter(inputs.values())).shape[0]
        self.rows = rows if self.rows is None else self.rows
        if rows != self.rows:
            raise ExecutionError(f"compiled for batch {self.rows}, got {rows}; load it again")
        return super().run(inputs, outputs)


class Refuses(NumpyEngine):
    """Claims no dynamic shapes; a partition answers the first batch size it sees, refuses others."""

    name = "kit-refuses"
    dynamic_shapes = False
    partition: ClassVar[type[NumpyPartition]] = _OneSize


class _FirstRows(NumpyPartition):
    def __init__(self, blob: bytes, kernels: dict[str, Callable[..., np.ndarray]]) -> None:
        super().__init__(blob, kernels)
        self.first: dict[str, np.ndarray] | None = None

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        found = self.compute(inputs)
        if self.first is None:
            self.first = found
        # The engine's shapes were fixed at the first call: later ones get its rows repeated.
        rows = next(iter(inputs.values())).shape[0]
        return {k: np.resize(v, (rows, *v.shape[1:])) for k, v in self.first.items()}


class Lies(NumpyEngine):
    """Claims dynamic shapes, and answers every later size with the first call's rows."""

    name = "kit-lies"
    partition: ClassVar[type[NumpyPartition]] = _FirstRows


class _AbortsAtSeven(NumpyPartition):
    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        if next(iter(inputs.values())).shape[0] == 7:
            os.abort()  # what a native engine's segfault does to the process
        return super().run(inputs, outputs)


class Aborts(NumpyEngine):
    """Kills its process on a batch of 7 rows."""

    name = "kit-aborts"
    partition: ClassVar[type[NumpyPartition]] = _AbortsAtSeven


ADAPTERS = (NumpyEngine, WrongRelu, Crashy, Unsafe, Refuses, Lies, Aborts)


def register(monkeypatch: Any, *classes: type[NumpyEngine]) -> None:
    """Make ``classes`` (default: all of them) known backends for the rest of the test."""
    import ferry.backends._registry as registry

    chosen = classes or ADAPTERS
    targets = {cls.name: f"{__name__}:{cls.__name__}" for cls in chosen}
    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, **targets})
    for cls in chosen:
        monkeypatch.delitem(registry._instances, cls.name, raising=False)
