"""The base every adapter derives from, with each optional capability's default, and what
adapters share: their engine's version, availability and install hint, and how an engine is
handed a model.

An adapter names the module its engine's SDK is imported as (``sdk``) and the pip extra that
installs it; the version comes from the SDK's ``__version__``, availability from whether it
imports. Engines that can tell which nodes they reject override ``validate``; those that can be
asked about a whole model override ``capability``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import onnx_ir as ir

from ferry.backends._lifecycle import DeviceInfo, OptionSpec, device_kind, option_problem
from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.backends._api import Backend, CompiledPartition, CompileSpec
    from ferry.backends._kv import KVLayout, KVPool, KVRunner
    from ferry.backends._rules import OpRule

__all__ = [
    "COMMON_OPTIONS",
    "BackendBase",
    "check_options",
    "exchangeable",
    "model_source",
    "native_stderr_to_log",
    "require_base",
]

#: Options every backend takes: ``threads`` (intra-op threads) and ``precision`` (one of its
#: ``precisions``).
COMMON_OPTIONS = frozenset({"threads", "precision"})

#: Models whose weights pass this go to engines as a file: protobuf cannot hold 2 GiB.
INLINE_LIMIT = 1 << 30


@contextlib.contextmanager
def model_source(
    model: ir.Model, path: Path | None = None
) -> Iterator[tuple[bytes | None, Path | None]]:
    """What an engine reads ``model`` from, as ``(bytes, None)`` or ``(None, file)``.

    The file itself when ``path`` holds exactly ``model``; else the serialized model, with
    weights kept in external data files read in (they are relative to a folder the engine does
    not know); a model whose weights pass 1 GiB is written with external data to a temporary
    folder instead, removed when the block ends (so engines must have read it by then).
    """
    if path is not None:
        yield None, Path(path)
        return
    size = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if size <= INLINE_LIMIT:
        if any(
            isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
        ):
            model = ir.external_data.load_to_model(model.clone())
        yield ir.to_proto(model).SerializeToString(), None
        return
    with tempfile.TemporaryDirectory(prefix="ferry-model-") as tmp:
        file = Path(tmp) / "model.onnx"
        ir.save(model, file, external_data="model.onnx.data")
        yield None, file


class BackendBase:
    """The one base every adapter derives from: set ``name``, ``device``, ``precisions``, ``sdk``
    and ``extra``, and implement ``rules``, ``compile`` and ``load``.

    Every optional capability is a typed attribute or method here, with the default an engine
    that says nothing gets; placement, the runtime, the engine cache and the bench read them
    directly, never probing with ``getattr``. The registry (and ``place`` when handed backend
    objects) refuses an adapter that does not derive from this class, naming it: a third party's
    adapter subclasses it too (``examples/vendor_adapter``), overriding ``version``,
    ``available`` and ``install_hint`` when its engine is not a Python module ferry can import.

    Attributes:
        name: the name it is registered and chosen by (``"openvino"``).
        device: where it runs (``"cpu"``, ``"cuda"``, ``"npu"``); part of the engine cache key.
        precisions: the precisions it runs in, its default first.
        sdk: the module the engine's Python API is imported as (``"openvino"``).
        extra: the ferry extra that installs it (``"openvino"``); empty when the engine is one of
            ferry's own dependencies, in which case ``install_hint`` names the SDK's package.
        needs: what else the engine needs beyond the package (``"needs an NVIDIA GPU"``).
        option_keys: the options it takes besides ``threads`` and ``precision``; any other is
            refused (:func:`check_options`). None takes any.
        options: the options its context takes, each with its type, default and choices
            (:class:`OptionSpec`, by name); when declared, its keys are the keys taken (instead
            of ``option_keys``) and :func:`check_options` checks each value too.
        dynamic_shapes: a partition with symbolic dims compiles once and runs at every size
            (the conformance kit checks the claim); False for an engine that needs static shapes.
        ranked_inputs: the engine cannot take an input of unknown rank (placement then keeps
            such tensors from crossing into it).
        computes_shapes: shape subgraphs (``Shape -> Gather -> Concat -> Reshape``) may go with
            their consumers onto it, as it computes them itself; else they stay on the fallback.
        simulated: it only imitates hardware: ``backends="auto"`` never considers it unless named.
        engine_cache: whether compiled partitions are worth storing: False for an engine that
            builds from the model every time (nothing is hashed), True to always store, None
            (the default) to find out from the first ``serialize()`` (empty: nothing to store).
        op_domains: the operator domains it runs besides ONNX's own (ONNX Runtime:
            ``com.microsoft``...); a model using another domain is not for it.
    """

    name: str
    device: str = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    sdk: str
    extra: str = ""
    needs: str = ""
    #: Options it takes besides :data:`COMMON_OPTIONS`; None takes any.
    option_keys: frozenset[str] | None = frozenset()
    options: Mapping[str, OptionSpec] = MappingProxyType({})
    dynamic_shapes: bool = True
    ranked_inputs: bool = False
    computes_shapes: bool = False
    simulated: bool = False
    engine_cache: bool | None = None
    op_domains: frozenset[str] = frozenset()

    @property
    def install_hint(self) -> str:
        """What to run when ``available()`` is False."""
        hint = f"pip install 'ferry[{self.extra}]'" if self.extra else f"pip install {self.sdk}"
        return f"{hint}  ({self.needs})" if self.needs else hint

    @property
    def version(self) -> str:
        """The engine's version (part of the engine cache key)."""
        return str(importlib.import_module(self.sdk).__version__)

    def cache_fingerprint(self) -> str:
        """Nothing beyond ``version``: an engine built for one GPU model says which here."""
        return ""

    def runs_in(self, precision: str) -> str:
        """The precision the engine computes in on this machine when asked for ``precision``
        (a hint it may not follow where the hardware lacks it); by default the one asked."""
        return precision

    def available(self) -> bool:
        """Whether the engine's SDK imports here."""
        try:
            importlib.import_module(self.sdk)
        except ImportError:
            return False
        return True

    def devices(self) -> list[DeviceInfo]:
        """The devices it can run on here: by default one, named ``device``, when ``available()``
        (none otherwise); an engine that can list its devices and their properties says so."""
        if not self.available():
            return []
        return [DeviceInfo(self.device, device_kind(self.device), MappingProxyType({}))]

    def rules(self) -> Sequence[OpRule]:
        """No rules published: placement gives it no node, conformance skips it.

        Raises:
            NotImplementedError: always, until an adapter declares its ops.
        """
        raise NotImplementedError(f"{self.name} publishes no op rules")

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str] | None:
        """None: the engine cannot be asked about a whole model; its rules and veto answer."""
        return None

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """No veto: the rule table is this engine's whole answer."""
        return {}

    def trial(self, model: ir.Model) -> None:
        """Import and compile ``model`` (one node, typed inputs) on the engine, or raise an
        exception whose message says why it cannot (:func:`~ferry.backends.trial_capability`
        asks this per node).

        Raises:
            NotImplementedError: always, here: the engine cannot be asked this way.
        """
        raise NotImplementedError(f"{self.name} cannot be asked by trial")

    def kv_runner(self, compiled: CompiledPartition, layout: KVLayout) -> KVRunner | None:
        """None: a decoder on this engine gets its presents fed back as pasts through numpy
        (:class:`~ferry.backends._kv.CopyingKVRunner`); an engine that can keep the cache
        itself returns a runner that does."""
        return None

    def kv_pool(self, compiled: CompiledPartition, layout: KVLayout, rows: int) -> KVPool | None:
        """None: continuous batching steps one :meth:`kv_runner` per sequence
        (:class:`~ferry.backends._kv.PerRowKVPool`); an engine that can decode many sequences'
        caches as one batch returns a pool that does."""
        return None

    def compile(self, spec: CompileSpec) -> CompiledPartition:
        """Build the partition for this engine; every adapter implements it."""
        raise NotImplementedError(f"{self.name} does not implement compile()")

    def load(self, blob: bytes, spec: CompileSpec) -> CompiledPartition:
        """Rebuild a partition from its ``serialize()`` output; every adapter implements it."""
        raise NotImplementedError(f"{self.name} does not implement load()")


def require_base(backend: object, origin: str) -> BackendBase:
    """``backend`` itself, when it derives from :class:`BackendBase`.

    Raises:
        InvalidInputError: it does not; the message names its class and ``origin`` (where it came
            from: ``"backend 'acme' (ferry_acme:Acme)"``).
    """
    if isinstance(backend, BackendBase):
        return backend
    cls = type(backend)
    raise InvalidInputError(
        f"{origin}: {cls.__module__}.{cls.__qualname__} does not derive from "
        "ferry.backends.BackendBase; adapters subclass it, which gives every optional "
        "capability its default"
    )


def check_options(backend: Backend, options: Mapping[str, object]) -> None:
    """Refuse options ``backend`` does not take, naming the ones it does, a value its
    ``options`` spec refuses (type or choice), and a precision it does not offer. A backend that
    declares ``options`` takes their keys; else its ``option_keys``, where None takes any.

    Raises:
        InvalidInputError: an unknown option key, a value of the wrong type or not among the
            choices, or a precision not in ``backend.precisions``.
    """
    name = backend.name
    specs = backend.options
    keys = frozenset(specs) if specs else backend.option_keys
    if keys is not None:
        known = COMMON_OPTIONS | set(keys)
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidInputError(
                f"{name}: unknown option {', '.join(map(repr, unknown))}; it takes "
                f"{', '.join(sorted(known))}"
            )
    for key, value in options.items():
        spec = specs.get(key)
        problem = None if spec is None else option_problem(spec, value)
        if problem is not None:
            raise InvalidInputError(f"{name}: option {key!r} {problem}")
    precision = options.get("precision")
    offered = tuple(backend.precisions)
    if precision is not None and offered and precision not in offered:
        raise InvalidInputError(
            f"{name}: precision {precision!r} is not offered; choose one of {', '.join(offered)}"
        )


@contextlib.contextmanager
def native_stderr_to_log(log: logging.Logger) -> Iterator[None]:
    """Send what native code writes to stderr meanwhile to ``log`` at DEBUG.

    LiteRT's C++ logger prints ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` on the
    process's stderr when it first prepares a model, and TensorFlow's prints oneDNN notices when
    it is imported, whatever ``TF_CPP_MIN_LOG_LEVEL`` says; on a user's terminal they would stand
    next to ferry's own output. It swaps the process's stderr (file descriptor 2) while it lasts,
    as conversions are one-off jobs, not served requests.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr (closed, or not a file descriptor)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    log.debug("native: %s", line)


def exchangeable(types: frozenset[str], cannot: str) -> Callable[[ir.Node], bool | str]:
    """A rule check: every input and output of the node a tensor whose element type is one of
    ``types``; else why not, ending ``"..., which {cannot}"`` (e.g. "OpenVINO does not compute
    exactly")."""
    from ferry.graph import dtype_name

    def check(node: ir.Node) -> bool | str:
        for kind, values in (("input", node.inputs), ("output", node.outputs)):
            for i, value in enumerate(values):
                if value is None:
                    continue
                if not isinstance(value.type, (ir.TensorType, type(None))):
                    return f"{kind} {i} is a {value.type}, not a tensor"
                if value.dtype is not None and dtype_name(value.dtype) not in types:
                    return f"{kind} {i} has dtype {dtype_name(value.dtype)}, which {cannot}"
        return True

    return check
