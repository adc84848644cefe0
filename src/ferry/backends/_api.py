"""The adapter API every engine implements (in the spirit of Paddle Lite's NNAdapter).

A backend is a small object that says what it is and where it runs, whether it can run here, and
turns one partition of the graph into something executable. ``rules``, ``capability`` and
``validate`` (which ops it takes) serve placement; ``compile`` and ``load`` serve the Session. Every
adapter, built-in or a vendor's, derives from :class:`~ferry.backends.BackendBase`, which gives
each optional member its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.backends._kv import KVLayout, KVPool, KVRunner
    from ferry.backends._lifecycle import DeviceInfo, OptionSpec
    from ferry.backends._rules import OpRule
    from ferry.plan import Partition

__all__ = ["Backend", "CompileSpec", "CompiledPartition"]


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    """Everything a backend needs to compile one partition.

    Attributes:
        partition: what the plan says about it.
        model: the partition as a standalone model: its inputs and outputs are the partition's.
        source_path: a file that holds exactly ``model`` (with its external data beside it), when
            there is one; engines that read files should prefer it to re-serializing ``model``.
        options: session-wide options (``threads``) merged with the partition's own.
    """

    partition: Partition
    model: ir.Model
    source_path: Path | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class CompiledPartition(Protocol):
    """One partition, ready to run on its engine."""

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run on already-checked inputs; return the requested outputs (all when None) by name."""
        ...

    def serialize(self) -> bytes:
        """The compiled form, for the engine cache; ``Backend.load`` turns it back."""
        ...


@runtime_checkable
class Backend(Protocol):
    """An engine adapter. Instances are cheap; heavy SDK imports happen in ``compile``/``load``.

    The lifecycle, in order: ``devices()`` (what it finds here, with properties) -> ``options``
    (the context: validated by ``check_options``) -> ``capability`` (the ``rules()`` table as
    prefilter, then the engine: asked about the whole model, or node by node through ``trial``
    and ``trial_capability``) -> ``compile(spec)`` -> a ``CompiledPartition``, whose
    ``serialize()`` goes into the engine cache -> ``load(blob, spec)`` on a later run -> ``run``
    on named inputs, giving named outputs.

    Every adapter derives from :class:`~ferry.backends.BackendBase`, which gives each optional
    member below its default; the registry refuses one that does not. This Protocol is the
    whole contract, for type checking: nothing else is read from a backend.

    Options a backend understands arrive in ``CompileSpec.options``: ``threads`` for all of them,
    ``precision`` (one of ``precisions``) for those that offer more than fp32.
    """

    name: str
    device: str
    #: Precisions it can run in, the first being its default (``("fp32", "fp16")``).
    precisions: tuple[str, ...]
    #: The options it takes besides ``threads`` and ``precision``; None takes any.
    option_keys: frozenset[str] | None
    #: The options its context takes, typed, by name; when declared, their keys are the keys.
    options: Mapping[str, OptionSpec]
    #: A partition with symbolic dims compiles once and runs at every size.
    dynamic_shapes: bool
    #: No input of unknown rank may come to it from another engine.
    ranked_inputs: bool
    #: Shape subgraphs (``Shape -> Gather -> Concat -> Reshape``) may go with their consumers onto
    #: it: it computes them itself.
    computes_shapes: bool
    #: It only imitates hardware (the example NPU adapter): ``backends="auto"`` never considers
    #: it unless named.
    simulated: bool
    #: Whether its compiled partitions are worth storing in the engine cache: False when it
    #: builds from the model every time (ONNX Runtime), None when not known in advance (an
    #: empty ``serialize()`` then says so).
    engine_cache: bool | None
    #: The operator domains it runs besides ONNX's own (``com.microsoft`` for ONNX Runtime).
    op_domains: frozenset[str]

    @property
    def install_hint(self) -> str:
        """What to pip install when ``available()`` is False."""
        ...

    @property
    def version(self) -> str:
        """The engine's version, part of the engine cache key."""
        ...

    def cache_fingerprint(self) -> str:
        """What its engines depend on beyond ``version`` (GPU model, driver...), part of the
        engine cache key; empty when nothing."""
        ...

    def runs_in(self, precision: str) -> str:
        """The precision it computes in here when asked for ``precision`` (``auto`` does not
        time one that runs as another it offers)."""
        ...

    def available(self) -> bool:
        """Whether the engine is installed and can run on this machine."""
        ...

    def devices(self) -> list[DeviceInfo]:
        """The devices it can run on here, with what the engine says of each; [] when none."""
        ...

    def rules(self) -> Sequence[OpRule]:
        """The ops it runs, declaratively; the partitioner proposes nodes from these.

        Raises:
            NotImplementedError: it publishes no rules.
        """
        ...

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str] | None:
        """Ask the engine about the whole model: for each of ``nodes``, True or why not.

        None when the engine cannot be asked that way: placement then takes its ``rules``, less
        what ``validate`` vetoes. OpenVINO and LiteRT answer.
        """
        ...

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """Ask the engine itself which of ``nodes`` (names in ``model``) it rejects, with reasons.

        Engines that can tell (OpenVINO's ``query_model``, TensorRT's ONNX parser) veto what their
        rules over-claimed; others return ``{}``.
        """
        ...

    def trial(self, model: ir.Model) -> None:
        """Import and compile ``model`` (one node, typed inputs), or raise saying why not.

        Raises:
            NotImplementedError: the engine cannot be asked this way.
        """
        ...

    def kv_runner(self, compiled: CompiledPartition, layout: KVLayout) -> KVRunner | None:
        """A runner that keeps a decoder's key/value cache inside the engine for one sequence
        (``compiled`` is one of this engine's partitions); None when the engine cannot, and the
        token loop feeds presents back as pasts itself."""
        ...

    def kv_pool(self, compiled: CompiledPartition, layout: KVLayout, rows: int) -> KVPool | None:
        """The caches of up to ``rows`` sequences kept inside the engine and decoded as one
        batch (``compiled`` is one of this engine's partitions); None when it cannot."""
        ...

    def compile(self, spec: CompileSpec) -> CompiledPartition:
        """Build the partition for this engine."""
        ...

    def load(self, blob: bytes, spec: CompileSpec) -> CompiledPartition:
        """Rebuild a partition from ``CompiledPartition.serialize()`` output."""
        ...
