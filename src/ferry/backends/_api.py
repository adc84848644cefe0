"""The adapter API every engine implements (in the spirit of Paddle Lite's NNAdapter).

A backend is a small object that says what it is and where it runs, whether it can run here, and
turns one partition of the graph into something executable. ``rules`` and ``validate`` (which ops it
takes) serve placement; ``compile`` and ``load`` serve the Session. Built-in adapters share their
boilerplate through :class:`~ferry.backends.BackendBase`; a vendor's may too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir

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

    Options a backend understands arrive in ``CompileSpec.options``: ``threads`` for all of them,
    ``precision`` (one of ``precisions``) for those that offer more than fp32.
    """

    name: str
    device: str
    #: Precisions it can run in, the first being its default (``("fp32", "fp16")``).
    precisions: tuple[str, ...]
    #: What to pip install when ``available()`` is False.
    install_hint: str

    def rules(self) -> Sequence[OpRule]:
        """The ops it runs, declaratively; the partitioner proposes nodes from these."""
        ...

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """Ask the engine itself which of ``nodes`` (names in ``model``) it rejects, with reasons.

        Engines that can tell (OpenVINO's ``query_model``, TensorRT's ONNX parser) veto what their
        rules over-claimed; others return ``{}``.

        An engine that can be asked about a whole model may also define ``capability(model,
        nodes) -> {node: True | reason}``: placement then takes its answer instead of the rules
        plus this veto (OpenVINO does). Optional flags placement reads: ``ranked_inputs`` (no
        input of unknown rank may come from another engine) and ``computes_shapes`` (shape
        subgraphs may go with their consumers onto it). ``simulated = True`` marks an adapter
        that only imitates hardware (the example NPU adapter): ``backends="auto"`` never
        considers it unless named.
        """
        ...

    @property
    def version(self) -> str:
        """The engine's version, part of the engine cache key."""
        ...

    def available(self) -> bool:
        """Whether the engine is installed and can run on this machine."""
        ...

    def compile(self, spec: CompileSpec) -> CompiledPartition:
        """Build the partition for this engine."""
        ...

    def load(self, blob: bytes, spec: CompileSpec) -> CompiledPartition:
        """Rebuild a partition from ``CompiledPartition.serialize()`` output."""
        ...
