"""TensorRT on NVIDIA GPUs: ONNX partitions parsed by TensorRT's ONNX parser and built into engines.

Dependencies (the ``tensorrt`` extra): ``tensorrt`` 10.x (the Python API: builder, ONNX parser,
runtime) and ``cuda-python`` for device memory and streams (``cuda.bindings.runtime``, or
``cuda.cudart`` before cuda-python 12.6). cuda-python is the one CUDA dependency: torch is not used
even when it is installed, so a deployment needs neither torch nor a CUDA build of it.

What ``compile`` does with a partition:

1. Parse the lowered partition (``spec.source_path`` when given, else ``spec.model`` serialized;
   models over 1 GiB go through a temporary file with external data).
2. Configure the builder from the partition's options:

   - ``precision``: ``"fp32"`` (default; TF32 is turned off so that fp32 means fp32, pass
     ``tf32=True`` to allow it), ``"fp16"`` (the FP16 builder flag: TensorRT may run any layer in
     fp16; TensorRT 11 dropped the flag, so there the model must be converted to fp16 first), or
     ``"int8"``, which needs a QDQ model (explicit quantization: QuantizeLinear/DequantizeLinear
     pairs, e.g. from ferry's or onnxruntime's quantizer) and builds a strongly typed network.
     Implicit int8 (calibrating a float model inside TensorRT) is deprecated in TensorRT 10 and
     gone in 11; ferry does not offer it.
   - ``workspace``: the builder's workspace limit in bytes (default: TensorRT's, all free memory).
   - ``profile``: ``{"input": [min_shape, opt_shape, max_shape]}`` for inputs with dynamic dims.
     An input with only a dynamic first (batch) dim needs none: it gets batch 1 / 1 / 32
     (``max_batch`` changes the 32). Any other dynamic dim must be given a profile.
   - ``optimization_level``: the builder's optimization level (0..5, TensorRT's default 3).

3. ``build_serialized_network`` gives the engine bytes, which ``serialize()`` returns for the engine
   cache and ``load`` turns back into an engine.

Running: each call sets the input shapes (``set_input_shape``), copies the inputs to device
buffers, sets every I/O tensor's address, enqueues the engine (``execute_async_v3``) on a CUDA
stream and copies the outputs back. Buffers grow to the largest call seen and are reused.
Calls from several threads each borrow an execution context (with its own stream and buffers).

``validate`` asks TensorRT's ONNX parser (``supports_model_v2``) which of the proposed nodes it
cannot import, repeatedly, since the parser stops at the first node it fails on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import _tensorrt_rules
from ferry.backends._api import CompileSpec
from ferry.backends._base import BackendBase, model_source
from ferry.backends._cuda import (
    DeviceBuffer,
    compute_capability,
    cuda_call,
    cudart,
    device_problem,
)
from ferry.backends._lifecycle import DeviceInfo
from ferry.backends._rules import OpRule
from ferry.errors import (
    BackendUnavailableError,
    ExecutionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
)
from ferry.plan import cut

__all__ = [
    "DEFAULT_MAX_BATCH",
    "BuildOptions",
    "TensorRTBackend",
    "TensorRTPartition",
    "build_options",
    "profile_shapes",
]

logger = logging.getLogger(__name__)

#: Largest batch the default optimization profile allows for an input with a dynamic first dim.
DEFAULT_MAX_BATCH = 32
# validate() asks the parser again after each node it names, this many times at most.
_VALIDATE_ROUNDS = 32
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})

Shape = tuple[int, ...]

# --- the SDKs, imported lazily ---------------------------------------------------------------


def _trt() -> Any:
    import tensorrt

    return tensorrt


@functools.cache
def unavailable_reason() -> str | None:
    """Why TensorRT cannot run here (None when it can): no tensorrt, no cuda-python, no GPU."""
    try:
        trt = _trt()
    except Exception as e:  # ImportError, or OSError when its shared libraries are missing
        return f"tensorrt is not importable ({type(e).__name__}: {e})"
    del trt
    return device_problem()


_trt_logger: Any = None
_logger_lock = threading.Lock()
# Builds and parser checks share the process's one TensorRT logger; they take turns.
_build_lock = threading.Lock()


def _logger() -> Any:
    """The process's one TensorRT logger: forwards to ``logging`` and keeps the last errors.

    TensorRT keeps one logger per process (a builder or runtime given another one warns and uses
    the first), so every builder, parser and runtime here shares this one.
    """
    global _trt_logger
    with _logger_lock:
        if _trt_logger is None:
            trt = _trt()
            severity = trt.ILogger.Severity

            class _Logger(trt.ILogger):  # type: ignore[name-defined]
                def __init__(self) -> None:
                    trt.ILogger.__init__(self)
                    self.errors: list[str] = []

                def log(self, level: Any, msg: str) -> None:
                    if level in (severity.INTERNAL_ERROR, severity.ERROR):
                        self.errors.append(msg)
                        del self.errors[:-20]
                        logger.warning("tensorrt: %s", msg)
                    elif level == severity.WARNING:
                        logger.info("tensorrt: %s", msg)
                    else:
                        logger.debug("tensorrt: %s", msg)

            _trt_logger = _Logger()
        return _trt_logger


# --- options ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What ``compile`` reads from a partition's options (see the module docstring)."""

    precision: str = "fp32"
    workspace: int | None = None
    profile: Mapping[str, tuple[Shape, Shape, Shape]] = dataclasses.field(default_factory=dict)
    max_batch: int = DEFAULT_MAX_BATCH
    tf32: bool = False
    optimization_level: int | None = None


def build_options(options: Mapping[str, Any]) -> BuildOptions:
    """Check and normalize TensorRT's options; others (``threads``) are ignored.

    Raises:
        InvalidInputError: an option has the wrong type or value.
    """
    precision = str(options.get("precision") or "fp32").lower()
    if precision not in TensorRTBackend.precisions:
        raise InvalidInputError(
            f"tensorrt: precision {precision!r} is not supported; "
            f"choose one of {', '.join(TensorRTBackend.precisions)}"
        )
    workspace = options.get("workspace")
    if workspace is not None and (not _is_int(workspace) or workspace <= 0):
        raise InvalidInputError(
            f"tensorrt: workspace must be a positive byte count, got {workspace!r}"
        )
    max_batch = options.get("max_batch", DEFAULT_MAX_BATCH)
    if not _is_int(max_batch) or max_batch < 1:
        raise InvalidInputError(
            f"tensorrt: max_batch must be a positive integer, got {max_batch!r}"
        )
    level = options.get("optimization_level")
    if level is not None and (not _is_int(level) or not 0 <= level <= 5):
        raise InvalidInputError(f"tensorrt: optimization_level must be 0..5, got {level!r}")
    raw_profile = options.get("profile") or {}
    if not isinstance(raw_profile, Mapping):
        raise InvalidInputError(
            "tensorrt: profile must map input names to [min_shape, opt_shape, max_shape]"
        )
    profile: dict[str, tuple[Shape, Shape, Shape]] = {}
    for name, shapes in raw_profile.items():
        profile[str(name)] = _profile_entry(str(name), shapes)
    return BuildOptions(
        precision=precision,
        workspace=None if workspace is None else int(workspace),
        profile=profile,
        max_batch=int(max_batch),
        tf32=bool(options.get("tf32", False)),
        optimization_level=None if level is None else int(level),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _profile_entry(name: str, shapes: Any) -> tuple[Shape, Shape, Shape]:
    usage = f"tensorrt: profile[{name!r}] must be [min_shape, opt_shape, max_shape]"
    if not isinstance(shapes, (list, tuple)) or len(shapes) != 3:
        raise InvalidInputError(f"{usage}, got {shapes!r}")
    parsed: list[Shape] = []
    for shape in shapes:
        if not isinstance(shape, (list, tuple)) or not all(_is_int(d) and d >= 0 for d in shape):
            raise InvalidInputError(f"{usage} of non-negative ints, got {shapes!r}")
        parsed.append(tuple(int(d) for d in shape))
    lo, opt, hi = parsed
    if not len(lo) == len(opt) == len(hi):
        raise InvalidInputError(f"{usage} of one rank, got {shapes!r}")
    if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
        raise InvalidInputError(f"{usage} with min <= opt <= max in every dim, got {shapes!r}")
    return lo, opt, hi


def profile_shapes(
    name: str, shape: Sequence[int], options: BuildOptions
) -> tuple[Shape, Shape, Shape] | None:
    """The min/opt/max shapes of the optimization profile for a network input.

    Args:
        name: the input's name.
        shape: its shape as TensorRT's network has it, ``-1`` for dynamic dims.
        options: the build options (``profile``, ``max_batch``).

    Returns:
        None for a static input without a profile entry; else the entry, checked against
        ``shape``, or the default for a dynamic first dim: ``(1, ...)``, ``(1, ...)``,
        ``(max_batch, ...)``.

    Raises:
        InvalidInputError: the entry does not fit ``shape``, or a dim other than the first is
            dynamic and no entry names the input.
    """
    dims = tuple(int(d) for d in shape)
    given = options.profile.get(name)
    if given is not None:
        for which, s in zip(("min", "opt", "max"), given):
            if len(s) != len(dims) or any(d >= 0 and d != v for d, v in zip(dims, s)):
                raise InvalidInputError(
                    f"tensorrt: profile[{name!r}] {which} shape {list(s)} does not fit the input's "
                    f"shape {_show(dims)} (rank and static dims must match)"
                )
        return given
    dynamic = [i for i, d in enumerate(dims) if d < 0]
    if not dynamic:
        return None
    if dynamic != [0]:
        raise InvalidInputError(
            f"tensorrt: input {name!r} has dynamic dims at {dynamic} (shape {_show(dims)}); only a "
            "dynamic batch (first) dim gets a default range. Give the partition option "
            f"profile={{{name!r}: [min_shape, opt_shape, max_shape]}}"
        )
    rest = dims[1:]
    return (1, *rest), (1, *rest), (options.max_batch, *rest)


def _show(dims: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in dims) + "]"


# --- the backend ----------------------------------------------------------------------------


class TensorRTBackend(BackendBase):
    """TensorRT on the current CUDA device."""

    name = "tensorrt"
    device = "cuda"
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    sdk = "tensorrt"
    extra = "tensorrt"
    needs = "needs an NVIDIA GPU"
    option_keys = frozenset({"workspace", "max_batch", "profile", "tf32", "optimization_level"})
    #: Its network inputs need a rank: no tensor of unknown rank may come to it from elsewhere.
    ranked_inputs = True

    @property
    def version(self) -> str:
        """TensorRT's version, plus the GPU's compute capability when there is one.

        Engines are specific to both, so both belong in the engine cache key: ``10.16.1.11+sm89``.
        """
        try:
            version = str(_trt().__version__)
        except Exception:
            return "not installed"
        cc = compute_capability()
        return f"{version}+sm{cc}" if cc else version

    def available(self) -> bool:
        return unavailable_reason() is None

    def unavailable_reason(self) -> str | None:
        """Why ``available()`` is False, in words (None when it is True)."""
        return unavailable_reason()

    def devices(self) -> list[DeviceInfo]:
        """Each CUDA device, with the GPU's name, compute capability and memory."""
        if not self.available():
            return []
        rt = cudart()
        found = []
        for index in range(int(cuda_call(rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))):
            props = cuda_call(rt.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
            name = props.name
            if isinstance(name, bytes):  # a C char array: NUL-padded
                name = name.split(b"\0")[0].decode("utf-8", "replace")
            properties = {
                "name": str(name),
                "compute_capability": f"{props.major}.{props.minor}",
                "memory": f"{int(props.totalGlobalMem) >> 20} MiB",
            }
            found.append(DeviceInfo(f"cuda:{index}", "gpu", properties))
        return found

    def rules(self) -> Sequence[OpRule]:
        return _tensorrt_rules.rules()

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """Which of ``nodes`` TensorRT's ONNX parser rejects, with its reasons.

        Algorithm: cut ``nodes`` out of ``model`` as a standalone model, ask the parser
        (``supports_model_v2``) and reject the node each parser error names, plus nodes left out
        of every supported subgraph (they read a value the parser refused); the parser stops at
        its first failing node, so repeat on what is left until it takes all of it. Without
        tensorrt, or without a GPU to create a builder on, there is no parser to ask: ``{}``.
        """
        if not nodes:
            return {}
        try:
            trt = _trt()
            with _build_lock:
                builder = trt.Builder(_logger())
        except Exception as e:  # no tensorrt, or no GPU to create a builder on
            logger.info("tensorrt: no ONNX parser to ask here (%s); trusting the rules", e)
            return {}
        rejected: dict[str, str] = {}
        remaining = list(dict.fromkeys(nodes))
        for _ in range(_VALIDATE_ROUNDS):
            if not remaining:
                break
            try:
                found = _parser_rejects(trt, builder, model, remaining)
            except Exception as e:  # cutting or parsing failed: keep what is known, say why
                logger.warning("tensorrt: validate could not ask the parser (%s)", e)
                break
            new = {n: r for n, r in found.items() if n in remaining}
            if not new:
                break
            rejected.update(new)
            remaining = [n for n in remaining if n not in new]
        return rejected

    def compile(self, spec: CompileSpec) -> TensorRTPartition:
        options = build_options(spec.options)
        _require(self)
        if options.precision == "int8":
            _check_qdq(spec.model)
        engine = _build_engine(spec, options)
        return TensorRTPartition(engine, spec, options.precision)

    def load(self, blob: bytes, spec: CompileSpec) -> TensorRTPartition:
        options = build_options(spec.options)
        _require(self)
        return TensorRTPartition(blob, spec, options.precision)


def _require(backend: TensorRTBackend) -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(
            f"backend 'tensorrt' cannot run here: {reason}; {backend.install_hint}"
        )


def _check_qdq(model: ir.Model) -> None:
    if not any(n.op_type in _QDQ_OPS for n in model.graph.all_nodes()):
        raise FerryError(
            "tensorrt: precision 'int8' needs a quantized (QDQ) model: QuantizeLinear/"
            "DequantizeLinear pairs around the layers to run in int8 (explicit quantization). "
            "This partition has none; quantize the model first, or use 'fp16'. Calibrating inside "
            "TensorRT (implicit quantization) is deprecated in TensorRT 10 and not offered"
        )


# --- parsing and building -------------------------------------------------------------------


@contextlib.contextmanager
def _onnx_bytes(model: ir.Model, source_path: Path | None) -> Iterator[tuple[bytes, str | None]]:
    """The model as bytes, with the path the parser resolves external data against."""
    with model_source(model, source_path) as (data, file):
        if data is not None:
            yield data, None
        else:
            assert file is not None  # model_source gives one or the other
            yield file.read_bytes(), str(file)


def _parser_errors(parser: Any) -> list[Any]:
    return [parser.get_error(i) for i in range(parser.num_errors)]


def _describe_error(error: Any) -> str:
    desc = str(error.desc()).strip()
    try:
        op, name = error.node_operator(), error.node_name()
    except AttributeError:  # TensorRT < 10.1: no node names in errors
        op = name = ""
    where = f" (node {name!r}, {op})" if name or op else ""
    return f"{error.code()}: {desc}{where}"


def _build_engine(spec: CompileSpec, options: BuildOptions) -> bytes:
    trt = _trt()
    log = _logger()
    where = _where(spec)
    with _build_lock, _onnx_bytes(spec.model, spec.source_path) as (data, path):
        log.errors.clear()
        builder = trt.Builder(log)
        flags = 0
        if options.precision == "int8":
            # Explicit quantization: the Q/DQ nodes decide what runs in int8, nothing else does.
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, log)
        if not parser.parse(data, path):
            errors = _parser_errors(parser)
            listing = "; ".join(_describe_error(e) for e in errors[:5]) or "no details given"
            raise ModelLoadError(
                f"tensorrt: the ONNX parser rejected {where}: {listing}. "
                "Keep those nodes off TensorRT (the partitioner's validate step does this)"
            )
        config = builder.create_builder_config()
        _configure(trt, config, options)
        profile = _profile(trt, builder, network, options)
        if profile is not None:
            config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            detail = "; ".join(log.errors[-3:]) or "see the tensorrt log"
            raise ModelLoadError(f"tensorrt: building the engine for {where} failed: {detail}")
        logger.debug(
            "tensorrt: built %s (%d bytes, %s)", where, serialized.nbytes, options.precision
        )
        return bytes(serialized)


def _configure(trt: Any, config: Any, options: BuildOptions) -> None:
    if options.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace)
    tf32 = getattr(trt.BuilderFlag, "TF32", None)
    if tf32 is not None and not options.tf32:
        # TensorRT runs fp32 convolutions and matmuls in TF32 by default on Ampere and newer:
        # 10 mantissa bits. "fp32" should mean fp32.
        config.clear_flag(tf32)
    if options.precision == "fp16":
        fp16 = getattr(trt.BuilderFlag, "FP16", None)
        if fp16 is None:
            raise FerryError(
                f"tensorrt {trt.__version__} builds strongly typed networks only (no FP16 builder "
                "flag): convert the model to float16 before compiling it, or install "
                "tensorrt<11 for precision 'fp16'"
            )
        config.set_flag(fp16)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level


def _profile(trt: Any, builder: Any, network: Any, options: BuildOptions) -> Any:
    """One optimization profile covering every input with dynamic dims (None when none has)."""
    profile = None
    known = set()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        known.add(tensor.name)
        shapes = profile_shapes(tensor.name, tuple(tensor.shape), options)
        if shapes is None:
            continue
        if tensor.is_shape_tensor:
            raise FerryError(
                f"tensorrt: input {tensor.name!r} is a shape tensor (its values set shapes); "
                "ferry's TensorRT runner feeds data tensors only. Keep the shape computation "
                "on ONNX Runtime"
            )
        if profile is None:
            profile = builder.create_optimization_profile()
        profile.set_shape(tensor.name, *shapes)
    unknown = sorted(set(options.profile) - known)
    if unknown:
        raise InvalidInputError(
            f"tensorrt: profile names {unknown}, which are not inputs of the partition "
            f"(its inputs: {sorted(known)})"
        )
    del trt
    return profile


def _where(spec: CompileSpec) -> str:
    nodes = spec.partition.nodes
    first = f" starting at node {nodes[0]!r}" if nodes else ""
    return f"the partition of {len(nodes)} node(s){first}"


def _parser_rejects(trt: Any, builder: Any, model: ir.Model, names: list[str]) -> dict[str, str]:
    """One parser pass over ``names`` cut out of ``model``: the nodes it rejects, with reasons."""
    sub, order = _submodel(model, names)
    log = _logger()
    with _build_lock, _onnx_bytes(sub, None) as (data, path):
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, log)
        if parser.supports_model_v2(data, path):
            return {}
        covered: set[int] = set()
        for i in range(parser.num_subgraphs):
            covered.update(int(n) for n in parser.get_subgraph_nodes(i))
        errors: dict[int, str] = {}
        for error in _parser_errors(parser):
            errors.setdefault(int(error.node()), _describe_error(error))
    reasons: dict[str, str] = {}
    for index, name in enumerate(order):
        if index in errors:
            reasons[name] = f"TensorRT's ONNX parser rejects it: {errors[index]}"
        elif index not in covered:
            reasons[name] = (
                "TensorRT's ONNX parser cannot take it: it reads a value the parser rejected"
            )
    if not reasons and -1 in errors:
        # A graph-level error names no node; without a culprit every node is suspect.
        reasons = dict.fromkeys(names, f"TensorRT's ONNX parser rejects the subgraph: {errors[-1]}")
    return reasons


def _submodel(model: ir.Model, names: Sequence[str]) -> tuple[ir.Model, list[str]]:
    """``names`` of ``model`` as a standalone model, and its node names in graph order."""
    sub = cut(model, names)
    return sub, [n.name or "" for n in sub.graph]


# --- running --------------------------------------------------------------------------------


class _Runner:
    """One execution context with its own stream and device buffers (used by one call at a time)."""

    def __init__(self, engine: Any) -> None:
        self.context = engine.create_execution_context()
        if self.context is None:
            raise ModelLoadError("tensorrt: could not create an execution context (out of memory?)")
        self.stream = cuda_call(cudart().cudaStreamCreate(), "cudaStreamCreate")
        self.buffers: dict[str, DeviceBuffer] = {}

    def buffer(self, name: str, nbytes: int) -> int:
        return self.buffers.setdefault(name, DeviceBuffer()).reserve(nbytes)

    def close(self) -> None:
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers.clear()
        if self.stream is not None:
            with contextlib.suppress(Exception):
                cudart().cudaStreamDestroy(self.stream)
            self.stream = None


class TensorRTPartition:
    """A partition built into a TensorRT engine, run on the current CUDA device."""

    def __init__(self, engine_bytes: bytes, spec: CompileSpec, precision: str = "fp32") -> None:
        trt = _trt()
        self.spec = spec
        #: The precision the engine was built for (``fp16`` lets TensorRT choose per layer).
        self.precision = precision
        self._blob = bytes(engine_bytes)
        self._runtime = trt.Runtime(_logger())
        self._engine = self._runtime.deserialize_cuda_engine(self._blob)
        if self._engine is None:
            raise ModelLoadError(
                "tensorrt: could not load the engine; it was built by another TensorRT version or "
                "for another GPU. Delete it from the engine cache to rebuild it"
            )
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        self._dtypes = {n: _numpy_dtype(trt, engine.get_tensor_dtype(n)) for n in names}
        self._free: list[_Runner] = [_Runner(engine)]
        self._runners: list[_Runner] = list(self._free)
        self._lock = threading.Lock()

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        wanted = self.output_names if outputs is None else list(outputs)
        unknown = [n for n in wanted if n not in self._dtypes or n in self.input_names]
        if unknown:
            raise InvalidInputError(
                f"tensorrt: unknown output {unknown}; the engine gives {self.output_names}"
            )
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise InvalidInputError(
                f"tensorrt: missing input {missing}; the engine takes {self.input_names}"
            )
        runner = self._borrow()
        try:
            return self._run(runner, inputs, wanted)
        finally:
            with self._lock:
                self._free.append(runner)

    def _borrow(self) -> _Runner:
        with self._lock:
            if self._free:
                return self._free.pop()
        runner = _Runner(self._engine)  # another thread holds each existing one
        with self._lock:
            self._runners.append(runner)
        return runner

    def _run(
        self, runner: _Runner, inputs: dict[str, np.ndarray], wanted: list[str]
    ) -> dict[str, np.ndarray]:
        rt = cudart()
        context, stream = runner.context, runner.stream
        h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        staged: list[np.ndarray] = []  # host arrays stay alive until the stream is synchronized
        for name in self.input_names:
            array = np.asarray(inputs[name], dtype=self._dtypes[name], order="C")
            if not context.set_input_shape(name, array.shape):
                raise InvalidInputError(self._shape_error(name, array.shape))
            ptr = runner.buffer(name, array.nbytes)
            if array.nbytes:
                cuda_call(
                    rt.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes, h2d, stream),
                    f"copying input {name!r} to the device",
                )
            context.set_tensor_address(name, ptr)
            staged.append(array)
        results: dict[str, np.ndarray] = {}
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise ExecutionError(
                    f"tensorrt: output {name!r} has a data-dependent shape {list(shape)}, which "
                    "ferry's TensorRT runner cannot size before running; keep its node on ONNX "
                    "Runtime"
                )
            host = np.empty(shape, dtype=self._dtypes[name])
            context.set_tensor_address(name, runner.buffer(name, host.nbytes))
            results[name] = host
        if not context.execute_async_v3(int(stream)):
            raise ExecutionError(f"tensorrt: enqueueing the engine failed: {self._last_errors()}")
        for name in wanted:
            host = results[name]
            if host.nbytes:
                cuda_call(
                    rt.cudaMemcpyAsync(
                        host.ctypes.data, runner.buffers[name].ptr, host.nbytes, d2h, stream
                    ),
                    f"copying output {name!r} from the device",
                )
        cuda_call(rt.cudaStreamSynchronize(stream), "running the engine")
        del staged
        return {name: results[name] for name in wanted}

    def _shape_error(self, name: str, shape: Sequence[int]) -> str:
        try:
            lo, _, hi = self._engine.get_tensor_profile_shape(name, 0)
            allowed = f"between {list(lo)} and {list(hi)}"
        except Exception:  # a static input has no profile
            allowed = f"{list(self._engine.get_tensor_shape(name))}"
        return (
            f"tensorrt: input {name!r} has shape {list(shape)}; the engine takes shapes {allowed}. "
            "Compile with a wider profile (options 'profile' or 'max_batch')"
        )

    def _last_errors(self) -> str:
        return "; ".join(_logger().errors[-3:]) or "see the tensorrt log"

    def serialize(self) -> bytes:
        return self._blob

    def close(self) -> None:
        """Free the device buffers and streams now instead of when garbage collected."""
        with self._lock:
            for runner in self._runners:
                runner.close()
            self._runners.clear()
            self._free.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _numpy_dtype(trt: Any, trt_dtype: Any) -> np.dtype[Any]:
    try:
        return np.dtype(trt.nptype(trt_dtype))
    except TypeError:
        if trt_dtype == trt.bfloat16:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        raise ModelLoadError(
            f"tensorrt: engine I/O of type {trt_dtype} has no numpy type"
        ) from None
