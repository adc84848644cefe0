"""An engine that segfaults on demand, for the isolation tests (imported by name: keep it unique).

``crashy`` runs a model with ONNX Runtime, except that an input holding :data:`CRASH_VALUE` makes
it kill its own process with SIGSEGV, as a bug in an engine's native code would. Serve it only
isolated (``--isolate``): in-process it takes the test run down. Register it with
:func:`register` (a pytest ``monkeypatch``); workers learn it from the registry's target.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from ferry.backends import BackendBase, CompileSpec, OpRule

NAME = "crashy"
#: An input element equal to this crashes the engine's process.
CRASH_VALUE = -777.0


class _Runner:
    def __init__(self, proto: onnx.ModelProto) -> None:
        self.session = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.names = [o.name for o in self.session.get_outputs()]

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        if any(np.any(v == CRASH_VALUE) for v in inputs.values() if v.dtype.kind == "f"):
            os.kill(os.getpid(), signal.SIGSEGV)
        values = self.session.run(self.names, inputs)
        found = dict(zip(self.names, values, strict=True))
        return {n: found[n] for n in (outputs or self.names)}

    def serialize(self) -> bytes:
        return b""


class CrashEngine(BackendBase):
    """Claims every standard op; runs them with ONNX Runtime unless told to crash."""

    name = NAME
    device = "cpu"
    version = "1.0"
    precisions: tuple[str, ...] = ("fp32",)
    install_hint = "nothing to install"

    def available(self) -> bool:
        return True

    def rules(self) -> list[OpRule]:
        return [OpRule(s.name) for s in onnx.defs.get_all_schemas() if s.domain == ""]

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        return {}

    def compile(self, spec: CompileSpec) -> _Runner:
        return _Runner(ir.to_proto(spec.model))

    def load(self, blob: bytes, spec: CompileSpec) -> _Runner:
        return self.compile(spec)


def register(monkeypatch: Any) -> None:
    """Make ``crashy`` a known backend (here, and in worker processes spawned meanwhile)."""
    import ferry.backends._registry as registry

    monkeypatch.setitem(registry._BUILTIN, NAME, f"{__name__}:CrashEngine")
