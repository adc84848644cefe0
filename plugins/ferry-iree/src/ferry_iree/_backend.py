"""The adapter: IREE on the CPU, as ferry's ``iree`` backend.

Before -> After::

    CompileSpec (a partition as an ONNX model)
        -> ONNX proto, graph renamed ``main`` (:mod:`ferry_iree._import`)
        -> MLIR, from IREE's ONNX importer, in process
        -> vmfb, from ``iree-compile`` for llvm-cpu (:mod:`ferry_iree._compile`)
        -> :class:`~ferry_iree._partition.IreePartition` on the local-task runtime

What it takes: its op table (:mod:`ferry_iree._rules`) filters, then each distinct node is
compiled alone (``trial``) and IREE's own message is the reason a node is refused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends import (
    BackendBase,
    CompileSpec,
    DeviceInfo,
    OpRule,
    OptionSpec,
    trial_capability,
)
from ferry.errors import InvalidInputError, UnsupportedOpError
from ferry_iree._blob import Engine, unpack
from ferry_iree._compile import compile_mlir
from ferry_iree._devices import cpu_features, drivers
from ferry_iree._import import ENTRY, import_onnx, to_proto
from ferry_iree._partition import IreePartition
from ferry_iree._rules import rules
from ferry_iree._trials import TrialMemo, trial_key

__all__ = ["OPTIONS", "IreeBackend"]

#: The options an ``iree`` context takes besides ``threads`` (1: IREE's local-sync driver, in
#: the caller's thread; more: the local-task worker pool, which IREE sizes once per process).
OPTIONS: Mapping[str, OptionSpec] = MappingProxyType(
    {
        "target_cpu": OptionSpec(
            "target_cpu",
            str,
            "host",
            None,
            "the CPU IREE's llvm-cpu target compiles for: host (this machine's features), "
            "generic (any x86-64), or an LLVM CPU name (znver4, sapphirerapids...)",
        ),
    }
)


#: How far a trial compiles (see ``IreeBackend.trial``).
_TRIAL_PHASE = "flow"


class IreeBackend(BackendBase):
    """IREE (iree-base-compiler + iree-base-runtime): ONNX partitions compiled to llvm-cpu."""

    name = "iree"
    device = "cpu"
    #: fp32 only: the ONNX importer keeps the model's types, and no fp16/bf16 lowering of an
    #: fp32 model was measured here.
    precisions = ("fp32",)
    sdk = "iree.runtime"
    options = OPTIONS
    #: IREE's importer types every value as a ranked tensor: nothing of unknown rank may come.
    ranked_inputs = True
    #: Shape subgraphs (Shape -> Gather -> Concat -> Reshape) are folded or computed by IREE.
    computes_shapes = True
    #: Measured: a symbolic batch compiles to one module that runs at any batch.
    dynamic_shapes = True
    #: A vmfb takes seconds to build and loads in milliseconds: always worth storing.
    engine_cache = True

    def __init__(self) -> None:
        self._trials = TrialMemo(self.version)

    @property
    def install_hint(self) -> str:
        """The plugin's package, which brings IREE's compiler and runtime."""
        return "pip install ferry-iree  (from ferry's repository: pip install ./plugins/ferry-iree)"

    @property
    def version(self) -> str:
        """IREE's runtime and compiler versions (both decide what a vmfb is)."""
        try:
            runtime = importlib.metadata.version("iree-base-runtime")
            compiler = importlib.metadata.version("iree-base-compiler")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
        return runtime if runtime == compiler else f"{runtime}+compiler-{compiler}"

    def cache_fingerprint(self) -> str:
        """The host CPU's features: a vmfb built for ``target_cpu=host`` uses them."""
        return hashlib.sha256(" ".join(cpu_features()).encode()).hexdigest()[:16]

    def available(self) -> bool:
        """Whether IREE's runtime and compiler both import."""
        try:
            return all(
                importlib.util.find_spec(m) is not None for m in ("iree.compiler", "iree.runtime")
            )
        except ModuleNotFoundError:  # no ``iree`` package at all
            return False

    def devices(self) -> list[DeviceInfo]:
        """The host CPU, with IREE's drivers and the CPU features its llvm-cpu target uses."""
        found = drivers()
        cpu = [d for d in ("local-task", "local-sync") if d in found]
        if not cpu:
            return []
        properties = {
            "drivers": ", ".join(found),
            "cpu_features": " ".join(cpu_features()),
        }
        return [DeviceInfo("cpu", "cpu", MappingProxyType(properties))]

    def rules(self) -> Sequence[OpRule]:
        return rules()

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str]:
        """The op table as a prefilter, then each distinct node compiled alone by IREE."""
        return trial_capability(self, model, nodes)

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """The nodes IREE refuses when each is compiled alone (the trials ``capability`` runs),
        with IREE's reason: where ferry asks by rules (conformance, ``validate=True``), the
        engine vetoes what the table over-claims."""
        verdicts = trial_capability(self, model, nodes)
        return {name: str(why) for name, why in verdicts.items() if why is not True}

    def trial(self, model: ir.Model) -> None:
        """Import a one-node ``model`` and compile it as far as IREE's flow phase.

        Measured on the zoo's transformer block (18 distinct nodes, this 2-core machine busy):
        a full compile to a vmfb took 0.99 s per node, to flow 0.22-0.44 s, to input (the
        torch -> linalg conversion) 0.19 s. Flow is kept: it covers the conversion, where
        refusals come from (an ONNX op with no lowering), and dispatch formation, at under
        half a full compile's cost; llvm-cpu code generation is not tried.

        Raises:
            FerryError: IREE refused it; the message is IREE's reason.
        """
        proto = to_proto(model)
        key = trial_key(proto, _TRIAL_PHASE)
        known = self._trials.get(key)
        if known is None:
            try:
                compile_mlir(import_onnx(proto), "host", phase=_TRIAL_PHASE)
                known = ""
            except UnsupportedOpError as e:
                known = str(e)
            self._trials.put(key, known)
        if known:
            raise UnsupportedOpError(known)

    def compile(self, spec: CompileSpec) -> IreePartition:
        threads, target_cpu = _context_options(spec.options)
        proto = to_proto(spec.model, spec.source_path)
        weights = {t.name for t in proto.graph.initializer}
        inputs = tuple(v.name for v in proto.graph.input if v.name not in weights)
        outputs = tuple(v.name for v in proto.graph.output)
        dtypes = tuple(_dtype_str(v.type.tensor_type.elem_type) for v in proto.graph.output)
        try:
            vmfb = compile_mlir(import_onnx(proto), target_cpu)
        except UnsupportedOpError as e:
            raise _with_nodes(e, spec.model) from e
        return IreePartition(Engine(vmfb, ENTRY, inputs, outputs, dtypes), threads=threads)

    def load(self, blob: bytes, spec: CompileSpec) -> IreePartition:
        threads, _ = _context_options(spec.options)
        return IreePartition(unpack(blob), threads=threads)


def _context_options(options: Mapping[str, object]) -> tuple[int | None, str]:
    """``threads`` and ``target_cpu`` from a spec's options, checked.

    Raises:
        InvalidInputError: a value IREE cannot take.
    """
    threads = options.get("threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise InvalidInputError(f"iree: threads must be a positive integer, got {threads!r}")
    precision = options.get("precision")
    if precision not in (None, "fp32"):
        raise InvalidInputError(f"iree: precision {precision!r} is not offered; it runs fp32")
    target_cpu = options.get("target_cpu", "host")
    if not isinstance(target_cpu, str) or not target_cpu:
        raise InvalidInputError(
            f"iree: target_cpu must be a CPU name (host, generic, znver4...), got {target_cpu!r}"
        )
    return threads, target_cpu


def _dtype_str(elem_type: int) -> str:
    """The numpy dtype of an ONNX element type, as ``np.dtype.str``; empty when none is known."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).str if elem_type else ""
    except (KeyError, TypeError, ValueError):  # bfloat16, float8: no numpy dtype of its own
        return ""


def _with_nodes(error: UnsupportedOpError, model: ir.Model) -> UnsupportedOpError:
    """``error`` naming the partition's nodes of the op IREE refused, when it said which."""
    if not error.ops:
        return error
    op = error.ops[0][0]
    names = [node.name or "" for node in model.graph if node.op_type == op]
    if not names:
        return error
    shown = ", ".join(map(repr, names[:3])) + (" ..." if len(names) > 3 else "")
    return UnsupportedOpError(f"{error} (node {shown})", [(op, n) for n in names])
