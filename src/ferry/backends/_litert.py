"""LiteRT (TFLite's runtime) on the CPU: partitions lowered by ferry's own ONNX -> TFLite lowering.

Before -> After::

    partition (a standalone ONNX model, NCHW, symbolic batch)
        -> TFLiteModel at static sizes (:mod:`ferry.tflite`'s lowering, NHWC inside,
           ONNX's layout at the edges) -> ``.tflite`` bytes (:func:`ferry.tflite.write_tflite`)
        -> LiteRT ``Interpreter`` with its default delegate (XNNPACK) and ``num_threads``

What it takes. A node is taken when the lowering can lower it in the model at its real sizes
(``capability``: the whole model lowered once, every node that cannot be named with the
lowering's reason), and when every tensor it reads or writes has a type exchanged intact through
LiteRT's numpy interface and computed by TFLite's kernels (:data:`EXCHANGEABLE`). TFLite fixes
sizes when the model is built: an input's symbolic batch is lowered at 1, and a run at other
sizes lowers the partition again at those (kept per sizes, :data:`MAX_VARIANTS` at most); a
model whose inputs have symbolic dims other than the batch is refused by ``capability`` (every
value's size would be unknown when placing it).

Threads. A LiteRT interpreter is not thread-safe: each run borrows one from a free list and a
run that finds none free builds another from the same bytes (as OpenVINO's infer requests).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends._api import CompileSpec
from ferry.backends._base import BackendBase, exchangeable, native_stderr_to_log
from ferry.backends._lifecycle import DeviceInfo
from ferry.backends._rules import OpRule
from ferry.errors import (
    BackendUnavailableError,
    ExecutionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import graph_inputs, shape_of
from ferry.tflite import (
    TRANSLATORS,
    is_qdq,
    lower_prepared,
    node_problems,
    prepare_static,
    static_inputs,
    write_tflite,
)

__all__ = ["EXCHANGEABLE", "MAX_VARIANTS", "LiteRTBackend", "LiteRTPartition"]

logger = logging.getLogger(__name__)

#: Element types a LiteRT partition reads and writes: those its numpy interface exchanges intact
#: and TFLite's kernels compute. Not float16, float64 or int16: the lowering keeps activations in
#: float32 (fp16 is a storage format for weights in TFLite) and few TFLite kernels take those
#: types, so LiteRT would refuse the model when allocating it.
EXCHANGEABLE = frozenset({"float32", "int8", "uint8", "int32", "int64", "bool"})
#: How many input sizes a partition keeps a lowering for (a batch other than 1 is another).
MAX_VARIANTS = 8

# LiteRT's C++ logger prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." on the
# process's stderr the first time it prepares a model; the swap that sends it to the log is
# process-wide, so it is done once, under a lock.
_quiet_lock = threading.Lock()
_quieted = False


class LiteRTBackend(BackendBase):
    """LiteRT's interpreter with the XNNPACK delegate, on ferry's own ONNX -> TFLite lowering."""

    name = "litert"
    device = "cpu"
    #: fp32 only: the lowering's fp16 stores weights as float16 and XNNPACK dequantizes them at
    #: load, so it would compute in fp32 anyway, with rounded weights and no speed gained.
    precisions = ("fp32",)
    sdk = "ai_edge_litert"
    extra = "tflite"
    #: TFLite tensors have static sizes: nothing of unknown rank may come to it.
    ranked_inputs = True
    #: The lowering folds shape computations at static sizes (Shape -> Gather -> Concat ->
    #: Reshape): they go with their consumers.
    computes_shapes = True

    @property
    def version(self) -> str:
        """ai-edge-litert's version (part of the engine cache key)."""
        try:
            return importlib.metadata.version("ai-edge-litert")
        except importlib.metadata.PackageNotFoundError:
            return str(getattr(_sdk(), "__version__", "unknown"))

    def devices(self) -> list[DeviceInfo]:
        """The CPU, through the XNNPACK delegate, on the cores this process may use."""
        if not self.available():
            return []
        return [DeviceInfo("cpu", "cpu", {"delegate": "XNNPACK", "cores": str(_cores())})]

    def rules(self) -> Sequence[OpRule]:
        """The ops the lowering has a translator for, with the type check every node passes;
        ``capability`` asks the lowering itself at the model's sizes."""
        return _rules()

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str]:
        """Which of ``nodes`` the lowering takes, asked of it on the whole model at its sizes
        (a symbolic batch at 1), or why not.

        A node is refused for a tensor type LiteRT does not exchange, or with the lowering's
        reason (no TFLite op, an attribute it cannot express, a size it cannot know).
        """
        by_name = {node.name: node for node in model.graph}
        verdicts: dict[str, bool | str] = {name: _exchangeable(by_name[name]) for name in nodes}
        problems = _lowering_problems(model)
        for name in nodes:
            if verdicts[name] is True and name in problems:
                verdicts[name] = problems[name]
        return verdicts

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """Which of ``nodes`` the lowering refuses (where placement asks by rules, and in
        conformance runs), with its reasons."""
        problems = _lowering_problems(model)
        return {name: problems[name] for name in nodes if name in problems}

    def compile(self, spec: CompileSpec) -> LiteRTPartition:
        return LiteRTPartition(spec)

    def load(self, blob: bytes, spec: CompileSpec) -> LiteRTPartition:
        return LiteRTPartition(spec, blob)


class LiteRTPartition:
    """A partition lowered to TFLite and loaded in LiteRT's interpreter.

    Inputs and outputs keep the ONNX model's names, types and layout (NCHW stays NCHW: the
    lowering transposes inside). ``run`` may be called from several threads at once.
    """

    def __init__(self, spec: CompileSpec, blob: bytes | None = None) -> None:
        options = spec.options
        precision = options.get("precision")
        if precision not in (None, "fp32"):
            raise InvalidInputError(
                f"litert: precision {precision!r} is not supported; it runs fp32 (the "
                "lowering's fp16 only stores weights as float16, which XNNPACK computes in fp32)"
            )
        threads = options.get("threads")
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise InvalidInputError(f"litert: threads must be a positive integer, got {threads!r}")
        #: Interpreter threads: the ``threads`` option, else every core this process may use
        #: (LiteRT's own default is one thread).
        self.threads = int(threads) if threads is not None else _cores()
        self.spec = spec
        self.model = spec.model
        values = graph_inputs(self.model)
        self.input_names = [v.name or "" for v in values]
        self.output_names = [v.name or "" for v in self.model.graph.outputs]
        self._declared = {v.name or "": shape_of(v) for v in values}
        self._out_dtypes = {
            v.name or "": np.dtype(v.dtype.numpy())
            for v in self.model.graph.outputs
            if v.dtype is not None
        }
        self._precision = "int8" if is_qdq(self.model) else "fp32"
        self._lock = threading.Lock()
        self._engines: dict[tuple[tuple[int, ...], ...], _Engine] = {}
        #: The engine of the sizes the partition was built at (a symbolic batch at 1); None when
        #: an input has other symbolic dims (then each run's sizes are lowered on first use).
        self._default: _Engine | None = None
        if blob is not None:
            self._default = _Engine(
                bytes(blob), self.threads, self.input_names, self.output_names, self._out_dtypes
            )
            self._engines[self._key_of(self._default.shapes)] = self._default
            return
        try:
            fixed, _ = static_inputs(self.model, {})
        except InvalidInputError as e:
            logger.debug("litert: lowering at each run's sizes: %s", e)
            return
        self._default = self._build(fixed)

    # ------------------------------------------------------------------------------ running

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = self.output_names if outputs is None else outputs
        try:
            arrays = [inputs[n] for n in self.input_names]
        except KeyError:
            missing = [n for n in self.input_names if n not in inputs]
            raise InvalidInputError(
                f"litert: missing input(s) {', '.join(map(repr, missing))}"
            ) from None
        try:
            # The hot path: the sizes' tuples are the key (no per-dim conversion per call).
            engine = self._engines.get(tuple(a.shape for a in arrays))
        except AttributeError:  # not arrays: converted once, then looked up again
            arrays = [np.asarray(a) for a in arrays]
            engine = None
        if engine is None:
            engine = self._engine_for(dict(zip(self.input_names, (a.shape for a in arrays))))
        return engine.run(arrays, names)

    def serialize(self) -> bytes:
        """The ``.tflite`` file at the partition's default sizes (empty when it has none)."""
        return self._default.data if self._default is not None else b""

    @property
    def tflite(self) -> bytes:
        """The ``.tflite`` file at the default sizes (as :meth:`serialize`)."""
        return self.serialize()

    def _engine_for(self, shapes: Mapping[str, tuple[int, ...]]) -> _Engine:
        key = self._key_of(shapes)
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                self._check_sizes(shapes)
                engine = self._build({n: tuple(int(d) for d in s) for n, s in shapes.items()})
        return engine

    def _key_of(self, shapes: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(d) for d in shapes[n]) for n in self.input_names)

    def _check_sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Refuse sizes that contradict the partition's fixed dims, naming them."""
        for name, shape in shapes.items():
            declared = self._declared.get(name)
            if declared is None:
                continue
            fits = len(declared) == len(shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(declared, shape)
            )
            if not fits:
                words = [d if isinstance(d, int) else (d or "?") for d in declared]
                raise InvalidInputError(
                    f"litert: input {name!r} has shape {list(shape)}; the model takes {words}"
                )

    def _build(self, fixed: Mapping[str, tuple[int, ...]]) -> _Engine:
        """Lower the partition at ``fixed`` sizes and load it (kept for those sizes)."""
        data = lower_partition(self.model, fixed, self._precision)
        engine = _Engine(data, self.threads, self.input_names, self.output_names, self._out_dtypes)
        if len(self._engines) >= MAX_VARIANTS:
            oldest = next(k for k, e in self._engines.items() if e is not self._default)
            del self._engines[oldest]
        self._engines[self._key_of(engine.shapes)] = engine
        return engine


def lower_partition(
    model: ir.Model, fixed: Mapping[str, tuple[int, ...]], precision: str = "fp32"
) -> bytes:
    """``model`` as a ``.tflite`` file at the given input sizes, inputs and outputs in ONNX's
    layout.

    Raises:
        UnsupportedOpError: nodes the lowering cannot lower, each named with the reason.
        ModelLoadError: the lowering or the writer failed otherwise.
    """
    try:
        fixed, batch = static_inputs(model, fixed)
        work = prepare_static(model, fixed)
        lowered = lower_prepared(work, precision=precision, fixed=fixed, batch=batch)
        return write_tflite(lowered.model)
    except UnsupportedOpError as e:
        raise UnsupportedOpError(
            f"litert: {e}\nPlace them on another engine: backends='litert,onnxruntime' runs "
            "them on ONNX Runtime",
            e.ops,
        ) from e
    except FerryError as e:
        raise ModelLoadError(f"litert: the partition cannot be lowered to TFLite: {e}") from e


class _Engine:
    """One ``.tflite`` file and the interpreters running it (a free list, one per concurrent
    run)."""

    def __init__(
        self,
        data: bytes,
        threads: int,
        input_names: Sequence[str],
        output_names: Sequence[str],
        output_dtypes: Mapping[str, np.dtype[Any]] | None = None,
    ) -> None:
        self.data = data
        #: ONNX's element type of each output, where the file holds it in another width.
        self._dtypes = dict(output_dtypes or {})
        self.threads = threads
        self._free: list[Any] = []
        interpreter = self._new(quiet=True)
        details = interpreter.get_input_details()
        by_name = {d["name"]: d for d in details}
        missing = [n for n in input_names if n not in by_name]
        outs = {d["name"]: d["index"] for d in interpreter.get_output_details()}
        missing += [n for n in output_names if n not in outs]
        if missing:
            raise ModelLoadError(
                f"litert: the .tflite file has no tensor for {missing}; it has inputs "
                f"{sorted(by_name)} and outputs {sorted(outs)}"
            )
        self._inputs = {
            n: (
                by_name[n]["index"],
                np.dtype(by_name[n]["dtype"]),
                tuple(int(d) for d in by_name[n]["shape"]),
            )
            for n in input_names
        }
        #: The input sizes it was built at.
        self.shapes = {n: tuple(int(d) for d in by_name[n]["shape"]) for n in input_names}
        self._order = [(n, *self._inputs[n]) for n in input_names]
        self._outputs = outs
        # The outputs the file holds in another width than ONNX's (int32 for int64 ones):
        # converted after each run; the rest are handed back as LiteRT gives them.
        held = {d["name"]: np.dtype(d["dtype"]) for d in interpreter.get_output_details()}
        self._widened = [
            (n, dtype) for n, dtype in self._dtypes.items() if n in held and held[n] != dtype
        ]
        self._free.append(interpreter)

    def _new(self, quiet: bool = False) -> Any:
        """An interpreter with XNNPACK (LiteRT's default delegate), its tensors allocated."""
        interpreter_cls = _sdk().Interpreter
        try:
            with _native_stderr_quiet() if quiet else contextlib.nullcontext():
                interpreter = interpreter_cls(model_content=self.data, num_threads=self.threads)
                interpreter.allocate_tensors()
        except (RuntimeError, ValueError) as e:
            raise ModelLoadError(f"LiteRT refuses the lowered model: {_first_line(e)}") from e
        return interpreter

    def run(self, arrays: Sequence[np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
        """Run on ``arrays`` (in the partition's input order); the outputs ``names``."""
        feeds = []
        for (name, index, dtype, shape), array in zip(self._order, arrays):
            if array.dtype != dtype or array.shape != shape or not array.flags.c_contiguous:
                array = self._converted(name, array)
            feeds.append((index, array))
        try:
            interpreter = self._free.pop()
        except IndexError:  # every interpreter is busy in another thread
            interpreter = self._new()
        try:
            for index, array in feeds:
                interpreter.set_tensor(index, array)
            try:
                interpreter.invoke()
            except (RuntimeError, ValueError) as e:
                raise ExecutionError(f"LiteRT failed to run the model: {_first_line(e)}") from e
            try:
                # get_tensor hands back a copy the caller owns.
                results = {n: interpreter.get_tensor(self._outputs[n]) for n in names}
            except KeyError as e:
                raise ExecutionError(
                    f"litert: no output named {e.args[0]!r}; outputs are {sorted(self._outputs)}"
                ) from None
        finally:
            self._free.append(interpreter)
        for name, dtype in self._widened:
            if name in results:
                results[name] = results[name].astype(dtype)
        return results

    def _converted(self, name: str, array: np.ndarray) -> np.ndarray:
        """``array`` as the interpreter takes input ``name``, or a clear error."""
        _, dtype, shape = self._inputs[name]
        if array.dtype.kind != dtype.kind and not (array.dtype.kind in "iu" and dtype.kind in "iu"):
            raise InvalidInputError(
                f"litert: input {name!r} has dtype {array.dtype}; the model takes {dtype}"
            )
        if array.shape != shape:
            raise InvalidInputError(
                f"litert: input {name!r} has shape {list(array.shape)}; the model takes "
                f"{list(shape)}"
            )
        # The lowering may hold an integer input in another width than ONNX's (int32 indices
        # for int64 ones): values are converted, not reinterpreted. order="C" keeps a scalar
        # rank 0 (np.ascontiguousarray would make it [1]).
        return np.asarray(array, dtype=dtype, order="C")


# ---------------------------------------------------------------------------------------------
# Capability


def _lowering_problems(model: ir.Model) -> dict[str, str]:
    """The lowering's reason for each node of ``model`` it cannot lower, at the model's sizes
    (a symbolic batch at 1); every node, when the sizes themselves cannot be fixed."""
    try:
        fixed, _ = static_inputs(model, {})
    except InvalidInputError:
        open_dims = []
        for value in graph_inputs(model):
            shape = shape_of(value)
            if shape is None:
                open_dims.append(f"{value.name!r} (shape unknown)")
            elif not all(isinstance(d, int) for d in shape[1:]):
                words = [d if isinstance(d, int) else (d or "?") for d in shape]
                open_dims.append(f"{value.name!r} {words}")
        why = (
            f"TFLite needs static sizes, and input(s) {', '.join(open_dims)} have symbolic dims "
            "besides the batch; fix them (ferry optimize --fix-shapes) to place the model on litert"
        )
        return {node.name or "": why for node in model.graph}
    work = prepare_static(model, fixed)
    return node_problems(work, "int8" if is_qdq(model) else "fp32")


_exchangeable = exchangeable(frozenset(EXCHANGEABLE), "the TFLite lowering does not compute")


@functools.cache
def _rules() -> tuple[OpRule, ...]:
    return tuple(OpRule(op, check=_exchangeable) for op in sorted(TRANSLATORS))


# ---------------------------------------------------------------------------------------------
# LiteRT


def _sdk() -> Any:
    try:
        from ai_edge_litert import interpreter
    except ImportError as e:
        raise BackendUnavailableError(
            "the litert backend needs LiteRT: pip install 'ferry[tflite]'"
        ) from e
    return interpreter


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def _native_stderr_quiet() -> Iterator[None]:
    """The first time only: what LiteRT's C++ logger prints on stderr goes to the log (DEBUG)."""
    global _quieted
    with _quiet_lock:
        if _quieted:
            yield
            return
        try:
            with native_stderr_to_log(logger):
                yield
        finally:
            _quieted = True


def _first_line(e: BaseException) -> str:
    """The useful line of a LiteRT error: its messages carry the C++ source position first
    (``tensorflow/lite/kernels/reshape.cc:92 num_input_elements != ...``)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = (lines or [type(e).__name__])[0]
    return text[:500]
