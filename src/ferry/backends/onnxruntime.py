"""ONNX Runtime: the default backend, and the fallback for everything other engines do not take."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends.api import CompileSpec
from ferry.errors import ExecutionError, ModelLoadError, UnsupportedOpError

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimePartition"]

logger = logging.getLogger(__name__)

# Domains whose ops ONNX Runtime's CPU provider implements (besides the ONNX ones checked via onnx.defs).
_ORT_DOMAINS = {
    "com.microsoft",
    "com.microsoft.nchwc",
    "com.ms.internal.nhwc",
    "ai.onnx.preview.training",
}
# In-memory models above this size go to ONNX Runtime through a temporary file: protobuf's 2 GiB cap.
_INLINE_LIMIT = 1 << 30


class OnnxRuntimeBackend:
    """ONNX Runtime on the CPU."""

    name = "onnxruntime"
    device = "cpu"
    install_hint = "pip install onnxruntime"

    @property
    def version(self) -> str:
        import onnxruntime

        return str(onnxruntime.__version__)

    def available(self) -> bool:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return False
        return True

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        return OnnxRuntimePartition(spec)

    def load(self, blob: bytes, spec: CompileSpec) -> OnnxRuntimePartition:
        # ORT compiles in-process from the model itself; there is nothing extra to cache.
        return OnnxRuntimePartition(spec)


def session_options(options: dict[str, Any] | Any) -> Any:
    """ORT SessionOptions for ferry's options (``threads``: intra-op thread count)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    threads = options.get("threads")
    if threads:
        so.intra_op_num_threads = int(threads)
        # Ops run one at a time in sequential mode, so inter-op threads would only idle.
        so.inter_op_num_threads = 1
    so.log_severity_level = 3  # ORT's warnings go to stderr otherwise, past the user's logging
    return so


class OnnxRuntimePartition:
    """A partition compiled into an ``onnxruntime.InferenceSession``."""

    def __init__(self, spec: CompileSpec) -> None:
        import onnxruntime as ort

        self.spec = spec
        so = session_options(spec.options)
        providers = ["CPUExecutionProvider"]
        try:
            if spec.source_path is not None:
                self.session = ort.InferenceSession(str(spec.source_path), so, providers=providers)
            else:
                self.session = _session_from_model(spec.model, so, providers)
        except Exception as e:  # ORT raises its own exception types from C++; translate them all
            raise _load_error(spec.model, e) from e
        self.output_names = [o.name for o in self.session.get_outputs()]
        # Calling the C++ session directly skips the Python wrapper's per-call re-validation of
        # feeds, which ferry has already done (see benchmarks/overhead.py).
        self._run = getattr(self.session, "_sess", self.session).run

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = self.output_names if outputs is None else outputs
        try:
            results = self._run(names, inputs, None)
        except Exception as e:
            raise ExecutionError(f"onnxruntime failed to run the model: {_first_line(e)}") from e
        return dict(zip(names, results))

    def serialize(self) -> bytes:
        return b""


def _session_from_model(model: ir.Model, so: Any, providers: list[str]) -> Any:
    import onnxruntime as ort

    size = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if size <= _INLINE_LIMIT:
        proto = ir.to_proto(model)
        if _has_external(proto):
            # References to files relative to an unknown folder: read the bytes in.
            proto = ir.to_proto(ir.external_data.load_to_model(model.clone()))
        return ort.InferenceSession(proto.SerializeToString(), so, providers=providers)
    with tempfile.TemporaryDirectory(prefix="ferry-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        ir.save(model, path, external_data="model.onnx.data")
        return ort.InferenceSession(str(path), so, providers=providers)


def _has_external(proto: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    # ORT prefixes messages with "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : " and source paths.
    if "] : " in text:
        text = text.split(" : ", 3)[-1]
    return text.splitlines()[0] if text else type(e).__name__


def _load_error(model: ir.Model, e: BaseException) -> Exception:
    """Explain why ORT refused a model: unsupported ops (all of them), or what it said."""
    unsupported: list[tuple[str, str]] = []
    from ferry.graph import all_nodes

    for node in all_nodes(model):
        domain = node.domain or ""
        if domain in ("", "ai.onnx", "ai.onnx.ml"):
            if not onnx.defs.has(node.op_type, domain):
                unsupported.append((node.op_type, node.name or "?"))
        elif domain not in _ORT_DOMAINS and domain not in {
            f.domain for f in model.functions.values()
        }:
            unsupported.append((f"{domain}::{node.op_type}", node.name or "?"))
    if unsupported:
        counts: dict[str, list[str]] = {}
        for op, name in unsupported:
            counts.setdefault(op, []).append(name)
        listing = "; ".join(
            f"{op} x{len(names)} (e.g. node {names[0]!r})" for op, names in sorted(counts.items())
        )
        return UnsupportedOpError(
            f"onnxruntime cannot run {len(unsupported)} node(s) with unknown ops: {listing}. "
            "Register the custom op library, or convert those ops to standard ONNX",
            ops=unsupported,
        )
    return ModelLoadError(f"onnxruntime rejected the model: {_first_line(e)}")
