"""ONNX Runtime: the default backend, and the fallback for everything other engines do not take.

Its rule table is measured, not written: ``_onnxruntime_ops`` records, per op and opset range, the
element types ONNX Runtime's CPU kernels take (from its kernel registry) and the function ops it
inlines (loaded for real), capped at the highest opset it loads; ``ferry.conformance``'s generator
explains how and regenerates it (``python -m ferry.conformance rules onnxruntime``). ``com.microsoft`` ops with a CPU kernel are accepted permissively.

It runs on the CPU unless told otherwise: with onnxruntime-gpu installed, the ``device`` option
(``"cpu"``, ``"cuda"``) or the ``providers`` option (ONNX Runtime's execution provider names, with
optional provider options, e.g. ``[("CUDAExecutionProvider", {"device_id": 1})]``) picks where.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends import _onnxruntime_ops
from ferry.backends._api import CompiledPartition, CompileSpec
from ferry.backends._base import BackendBase, model_source
from ferry.backends._kv import KVLayout
from ferry.backends._lifecycle import DeviceInfo
from ferry.backends._onnxruntime_kv import OrtKVRunner
from ferry.backends._onnxruntime_kv_pool import OrtKVPool
from ferry.backends._rules import OpRule, RuleTable, all_checks, subgraphs_supported
from ferry.errors import (
    BackendUnavailableError,
    ExecutionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import dtype_name

__all__ = [
    "ORT_SILENT",
    "OnnxRuntimeBackend",
    "OnnxRuntimePartition",
    "ort_error_message",
    "select_providers",
    "unknown_ops",
]

logger = logging.getLogger(__name__)

# Domains whose ops ONNX Runtime's CPU provider implements (besides the ONNX ones checked via onnx.defs).
_ORT_DOMAINS = {
    "com.microsoft",
    "com.microsoft.nchwc",
    "com.ms.internal.nhwc",
    "ai.onnx.preview.training",
}

_CPU = "CPUExecutionProvider"
#: ORT's log severity that prints nothing but fatal errors (0 verbose .. 4 fatal): ORT logs to
#: stderr past the caller's logging, and every error also comes back as an exception.
ORT_SILENT = 4

#: ORT's type strings of the element types numpy lacks -> (ONNX type, ml_dtypes dtype, bits).
#: ORT packs the 4- and 2-bit ones (low bits first); ml_dtypes keeps one element per byte.
_EXOTIC: dict[str, tuple[int, np.dtype[Any], int]] = {
    f"tensor({t.name.lower()})": (t.value, np.dtype(t.numpy()), bits)
    for t, bits in (
        (ir.DataType.BFLOAT16, 16),
        (ir.DataType.FLOAT8E4M3FN, 8),
        (ir.DataType.FLOAT8E4M3FNUZ, 8),
        (ir.DataType.FLOAT8E5M2, 8),
        (ir.DataType.FLOAT8E5M2FNUZ, 8),
        (ir.DataType.FLOAT8E8M0, 8),
        (ir.DataType.INT4, 4),
        (ir.DataType.UINT4, 4),
        (ir.DataType.FLOAT4E2M1, 4),
        (ir.DataType.INT2, 2),
        (ir.DataType.UINT2, 2),
    )
}
#: ferry's device names -> the execution providers that run them, best first.
DEVICE_PROVIDERS: dict[str, tuple[str, ...]] = {
    "cpu": (_CPU,),
    "cuda": ("CUDAExecutionProvider", _CPU),
}
#: Short provider names accepted in the ``providers`` option.
_PROVIDER_ALIASES = {
    "cpu": _CPU,
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
_GPU_HINT = (
    "install onnxruntime-gpu in place of onnxruntime (pip uninstall onnxruntime && "
    "pip install onnxruntime-gpu) on a machine with an NVIDIA GPU"
)


class OnnxRuntimeBackend(BackendBase):
    """ONNX Runtime, on the CPU by default (see the module docstring for GPUs).

    It needs no veto (``validate``): its rules are measured on this ONNX Runtime.
    """

    name = "onnxruntime"
    device = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    sdk = "onnxruntime"
    option_keys = frozenset({"device", "providers"})
    #: It builds its session from the model every time: nothing to store in the engine cache.
    engine_cache = False
    op_domains = frozenset(_ORT_DOMAINS)

    def rules(self) -> Sequence[OpRule]:
        return rules()

    def devices(self) -> list[DeviceInfo]:
        """The CPU, with the execution providers this build has; and the GPU (``device="cuda"``)
        when it has CUDA's."""
        if not self.available():
            return []
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
        found = [DeviceInfo("cpu", "cpu", {"providers": ", ".join(providers)})]
        gpu = [p for p in providers if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
        if gpu:
            found.append(DeviceInfo("cuda", "gpu", {"providers": ", ".join(gpu)}))
        return found

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        return OnnxRuntimePartition(spec)

    def kv_runner(self, compiled: CompiledPartition, layout: KVLayout) -> OrtKVRunner | None:
        """I/O binding: the cache stays in ONNX Runtime, in place where the graph allows it."""
        if not isinstance(compiled, OnnxRuntimePartition) or compiled._exotic_in:
            return None
        return OrtKVRunner(compiled.session, layout, ort_error_message)

    def kv_pool(self, compiled: CompiledPartition, layout: KVLayout, rows: int) -> OrtKVPool | None:
        """One pool of caches decoded as one batch, where the graph shares past and present."""
        if not isinstance(compiled, OnnxRuntimePartition) or compiled._exotic_in:
            return None
        if not layout.in_place:
            return None
        return OrtKVPool(compiled.session, layout, rows, ort_error_message)

    def load(self, blob: bytes, spec: CompileSpec) -> OnnxRuntimePartition:
        # ORT compiles in-process from the model itself; there is nothing extra to cache.
        return OnnxRuntimePartition(spec)


@functools.cache
def rules() -> tuple[OpRule, ...]:
    """ONNX Runtime's CPU op rules, from the measured data in ``_onnxruntime_ops``."""
    import onnxruntime

    if onnxruntime.__version__ != _onnxruntime_ops.ORT_VERSION:
        logger.info(
            "onnxruntime %s is installed; its op table was measured on %s (regenerate it with "
            "python -m ferry.conformance rules onnxruntime)",
            onnxruntime.__version__,
            _onnxruntime_ops.ORT_VERSION,
        )
    found = [
        OpRule(
            op_type=op,
            domain=domain,
            since=since,
            until=until,
            dtypes=_dtypes(inputs),
            check=_checks(op, _dtypes(outputs)),
        )
        for domain, op, since, until, inputs, outputs in _onnxruntime_ops.OPS
    ]
    found += [OpRule(op_type=op, domain=domain) for domain, op in _onnxruntime_ops.CONTRIB_OPS]
    return tuple(found)


@functools.cache
def _table() -> RuleTable:
    return RuleTable(rules())


_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
# ONNX Runtime's CPU RNN kernels refuse layout=1 (batch-major) when the session is created.
_RNNS = frozenset({"GRU", "LSTM", "RNN"})


def _bodies_supported(node: ir.Node) -> bool | str:
    return subgraphs_supported(node, _table())


def _rnn_layout(node: ir.Node) -> bool | str:
    layout = node.attributes.get("layout")
    if layout is not None and not layout.is_ref() and layout.value != 0:
        return "layout=1 (batch-major) is not supported by ONNX Runtime's CPU kernels"
    return True


def _per_tensor_weight_zero_point(node: ir.Node) -> bool | str:
    # ORT's ConvInteger checks this when it runs, not when the session is created.
    zero_point = node.inputs[3] if len(node.inputs) > 3 else None
    shape = zero_point.shape if zero_point is not None else None
    if shape is not None and any(d != 1 for d in shape):
        return "per-channel w_zero_point is not supported by ONNX Runtime's CPU kernel"
    return True


def _checks(op: str, outputs: Any) -> Callable[[ir.Node], bool | str] | None:
    """The checks beyond input types: output types, subgraph bodies, RNN layout."""
    checks: list[Callable[[ir.Node], bool | str]] = []
    if outputs:
        checks.append(functools.partial(_output_types, outputs))
    if op in _CONTROL_FLOW:
        checks.append(_bodies_supported)
    if op in _RNNS:
        checks.append(_rnn_layout)
    if op == "ConvInteger":
        checks.append(_per_tensor_weight_zero_point)
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else all_checks(*checks)


def _output_types(allowed: Mapping[int, frozenset[str]], node: ir.Node) -> bool | str:
    """Refuse a node whose output type (when known) no kernel produces: Cast to float4..."""
    for index, names in allowed.items():
        if index < len(node.outputs):
            dtype = node.outputs[index].dtype
            if dtype is not None and dtype_name(dtype) not in names:
                return f"output {index} has dtype {dtype_name(dtype)}; supported: {', '.join(sorted(names))}"
    return True


def _dtypes(data: Any) -> frozenset[str] | dict[int, frozenset[str]] | None:
    """The data module's compact form -> OpRule.dtypes."""
    if data is None:
        return None
    if data and isinstance(data[0], str):
        return frozenset(data)
    return {int(index): frozenset(names) for index, names in data}


def select_providers(
    options: Mapping[str, Any], available: Sequence[str]
) -> list[str | tuple[str, dict[str, Any]]]:
    """ONNX Runtime execution providers for ferry's options, the CPU always last as the fallback.

    Args:
        options: the partition's options; ``providers`` (names or ``(name, provider_options)``
            pairs; ``cpu``/``cuda``/``tensorrt`` are short for ONNX Runtime's names) or ``device``
            (``"cpu"``, the default, or ``"cuda"``), not both.
        available: what ``onnxruntime.get_available_providers()`` says.

    Raises:
        InvalidInputError: both options given, an unknown device, or a malformed provider entry.
        BackendUnavailableError: a provider this onnxruntime build does not have.
    """
    providers = options.get("providers")
    device = options.get("device")
    if providers is not None and device is not None:
        raise InvalidInputError(
            "onnxruntime: give either the 'providers' or the 'device' option, not both"
        )
    chosen: list[str | tuple[str, dict[str, Any]]] = []
    if providers is not None:
        if isinstance(providers, str) or _is_pair(providers):
            providers = [providers]
        for entry in providers:
            chosen.append(_provider_entry(entry))
    else:
        name = str(device or "cpu").lower()
        if name not in DEVICE_PROVIDERS:
            raise InvalidInputError(
                f"onnxruntime: unknown device {device!r}; choose one of "
                f"{', '.join(sorted(DEVICE_PROVIDERS))}"
            )
        chosen.extend(DEVICE_PROVIDERS[name])
    names = [p if isinstance(p, str) else p[0] for p in chosen]
    missing = [n for n in names if n not in available]
    if missing:
        raise BackendUnavailableError(
            f"onnxruntime: execution provider {', '.join(missing)} is not available in this "
            f"onnxruntime build (it has {', '.join(available)}); {_GPU_HINT}"
        )
    if _CPU not in names:
        chosen.append(_CPU)  # nodes the other providers do not take fall back to the CPU
    return chosen


def _is_pair(entry: Any) -> bool:
    """``(name, provider_options)``, as given or as JSON gives it back (a list)."""
    return (
        isinstance(entry, (tuple, list))
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], Mapping)
    )


def _provider_entry(entry: Any) -> str | tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return _PROVIDER_ALIASES.get(entry.lower(), entry)
    if _is_pair(entry):
        return (_PROVIDER_ALIASES.get(entry[0].lower(), entry[0]), dict(entry[1]))
    raise InvalidInputError(
        f"onnxruntime: a provider is a name or a (name, options) pair, got {entry!r}"
    )


def session_options(options: dict[str, Any] | Any) -> Any:
    """ORT SessionOptions for ferry's options (``threads``: intra-op thread count)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    threads = options.get("threads")
    if threads:
        so.intra_op_num_threads = int(threads)
        # Ops run one at a time in sequential mode, so inter-op threads would only idle.
        so.inter_op_num_threads = 1
    # ORT prints its warnings and errors (ANSI-coloured) straight to stderr, past the caller's
    # logging; every error also comes back as the exception ferry reports, so print nothing.
    so.log_severity_level = ORT_SILENT
    return so


class OnnxRuntimePartition:
    """A partition compiled into an ``onnxruntime.InferenceSession``."""

    def __init__(self, spec: CompileSpec) -> None:
        import onnxruntime as ort

        self.spec = spec
        precision = spec.options.get("precision")
        if precision not in (None, "fp32"):
            raise InvalidInputError(
                f"onnxruntime: precision {precision!r} is not supported; it runs the model's own "
                "types (fp32). Convert the model to change them"
            )
        so = session_options(spec.options)
        providers = select_providers(spec.options, ort.get_available_providers())
        try:
            with model_source(spec.model, spec.source_path) as (data, file):
                source = data if data is not None else str(file)
                self.session = ort.InferenceSession(source, so, providers=providers)
        except Exception as e:  # ORT raises its own exception types from C++; translate them all
            raise _load_error(spec.model, e) from e
        self.output_names = [o.name for o in self.session.get_outputs()]
        #: The execution providers the session actually uses, best first.
        self.providers: list[str] = list(self.session.get_providers())
        # Calling the C++ session directly skips the Python wrapper's per-call re-validation of
        # feeds, which ferry has already done (see benchmarks/overhead.py).
        self._run = getattr(self.session, "_sess", self.session).run
        # bfloat16 and float8 tensors: ORT's numpy bridge cannot take or give them (ferry holds
        # them as ml_dtypes arrays), so those sessions pass raw bytes through OrtValues.
        self._exotic_in = {
            i.name: _EXOTIC[i.type] for i in self.session.get_inputs() if i.type in _EXOTIC
        }
        self._exotic_out = {
            o.name: _EXOTIC[o.type] for o in self.session.get_outputs() if o.type in _EXOTIC
        }

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = self.output_names if outputs is None else outputs
        try:
            if self._exotic_in or self._exotic_out:
                return self._run_bytes(inputs, list(names))
            results = self._run(names, inputs, None)
        except Exception as e:
            raise ExecutionError(
                f"onnxruntime failed to run the model: {ort_error_message(e)}"
            ) from e
        return dict(zip(names, results))

    def _run_bytes(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Run through OrtValues, passing bfloat16/float8 tensors as their raw bytes."""
        import onnxruntime as ort

        feeds: dict[str, Any] = {}
        for name, array in inputs.items():
            exotic = self._exotic_in.get(name)
            if exotic is None:
                feeds[name] = ort.OrtValue.ortvalue_from_numpy(np.asarray(array, order="C"))
                continue
            elem_type, dtype, bits = exotic
            raw = np.asarray(array, dtype=dtype, order="C")
            if bits >= 8:
                carrier = raw.view(np.uint8 if bits == 8 else np.uint16)
            else:
                # ORT reads the packed bytes from the start of a buffer of the logical shape.
                carrier = np.zeros(raw.shape, np.uint8)
                packed = _pack(raw.view(np.uint8).reshape(-1), bits)
                carrier.reshape(-1)[: packed.size] = packed
            feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(carrier, elem_type)
        values = self.session.run_with_ort_values(names, feeds)
        results: dict[str, np.ndarray] = {}
        for name, value in zip(names, values):
            exotic = self._exotic_out.get(name)
            if exotic is None:
                results[name] = value.numpy()
                continue
            _, dtype, bits = exotic
            shape = tuple(value.shape())
            data = np.frombuffer(
                ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()), np.uint8
            )
            if bits < 8:
                data = _unpack(data, bits)[: int(np.prod(shape))]
            results[name] = data.view(dtype).reshape(shape).copy()
        return results

    def serialize(self) -> bytes:
        return b""


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """One element per byte -> ``8 // bits`` per byte, the first in the lowest bits."""
    per = 8 // bits
    padded = np.zeros(-(-values.size // per) * per, np.uint8)
    padded[: values.size] = values & ((1 << bits) - 1)
    lanes = padded.reshape(-1, per)
    packed = np.zeros(lanes.shape[0], np.uint8)
    for lane in range(per):
        packed |= lanes[:, lane] << (lane * bits)
    return packed


def _unpack(data: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of ``_pack`` (possibly with a padding element or more at the end)."""
    per = 8 // bits
    mask = (1 << bits) - 1
    lanes = [(data >> (lane * bits)) & mask for lane in range(per)]
    return np.stack(lanes, axis=1).reshape(-1).astype(np.uint8)


# "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ": ORT's error code, which says nothing to a user.
_ERROR_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# "/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(...) x was
# false. ": where in ORT's C++ a check failed, which says nothing to a user either.
_SOURCE_LOCATION = re.compile(r"/onnxruntime_src/\S+:\d+ [^(]*\(.*?\)(?: [^.]*? was false\.)? ?")


def ort_error_message(e: BaseException) -> str:
    """What ONNX Runtime said in ``e``, for a user: its first line, without the error-code prefix
    (``[ONNXRuntimeError] : 1 : FAIL : ``) and C++ source locations; the exception's type name
    when it says nothing."""
    text = _SOURCE_LOCATION.sub("", _ERROR_PREFIX.sub("", str(e).strip()))
    return text.splitlines()[0].strip() if text else type(e).__name__


def unknown_ops(model: ir.Model, domains: Collection[str] = _ORT_DOMAINS) -> list[tuple[str, str]]:
    """The nodes whose ops ONNX Runtime does not implement, as ``(op, node name)``.

    An op of the ONNX domains is unknown when ``onnx.defs`` lacks it; an op of another domain
    (named ``domain::Op``) when the domain is neither in ``domains`` (what ONNX Runtime implements
    beyond ONNX) nor one of the model's local functions. Unnamed nodes are ``"?"``.
    """
    unknown: list[tuple[str, str]] = []
    local = {f.domain for f in model.functions.values()}
    for node in model.graph.all_nodes():
        domain = node.domain or ""
        if domain in ("", "ai.onnx", "ai.onnx.ml"):
            if not onnx.defs.has(node.op_type, domain):
                unknown.append((node.op_type, node.name or "?"))
        elif domain not in domains and domain not in local:
            unknown.append((f"{domain}::{node.op_type}", node.name or "?"))
    return unknown


def _load_error(model: ir.Model, e: BaseException) -> Exception:
    """Explain why ORT refused a model: unsupported ops (all of them), or what it said."""
    unsupported = unknown_ops(model)
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
    return ModelLoadError(f"onnxruntime rejected the model: {ort_error_message(e)}")
