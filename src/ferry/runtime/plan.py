"""The Plan: which backend runs which nodes, as plain data.

A Plan is what the partitioner decides and what a Session executes. It is an ordered list of
partitions, each ``(backend, node names, input names, output names)``, in an order where every
partition's inputs are graph inputs or outputs of earlier partitions. It round-trips through JSON so
that it can be saved beside a model (``plan.json``), reviewed, edited and reloaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from ferry.errors import FerryError

__all__ = ["PLAN_FORMAT_VERSION", "Partition", "Plan"]

PLAN_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Partition:
    """A connected piece of the graph that one backend runs.

    Attributes:
        backend: the backend's registry name, e.g. ``"onnxruntime"``.
        nodes: names of the nodes, in topological order.
        inputs: names of the values it reads from outside (graph inputs or earlier partitions).
        outputs: names of the values it hands on (graph outputs or inputs of later partitions).
        options: backend options for this partition (precision, threads, ...).
    """

    backend: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Partition:
        return cls(
            backend=str(d["backend"]),
            nodes=tuple(d["nodes"]),
            inputs=tuple(d["inputs"]),
            outputs=tuple(d["outputs"]),
            options=dict(d.get("options", {})),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """An ordered list of partitions covering every node of a model once."""

    partitions: tuple[Partition, ...]
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]

    @classmethod
    def whole_graph(
        cls, model: ir.Model, backend: str = "onnxruntime", options: dict[str, Any] | None = None
    ) -> Plan:
        """The trivial plan: one backend runs every node. Nodes must be named (see NameFixPass)."""
        graph = model.graph
        inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
        outputs = tuple(v.name or "" for v in graph.outputs)
        nodes = tuple(node.name or "" for node in graph)
        if not all(nodes) or not all(inputs) or not all(outputs):
            raise ValueError("every node and value needs a name before a plan can refer to it")
        part = Partition(backend, nodes, inputs, outputs, dict(options or {}))
        return cls((part,), inputs, outputs)

    def with_options(self, options: Mapping[str, Mapping[str, Any]]) -> Plan:
        """This plan with ``options[backend]`` merged over each of that backend's partitions'."""
        parts = tuple(
            dataclasses.replace(p, options={**p.options, **options[p.backend]})
            if p.backend in options
            else p
            for p in self.partitions
        )
        return dataclasses.replace(self, partitions=parts)

    @property
    def backends(self) -> list[str]:
        """The backends the plan uses, in order of first use."""
        return list(dict.fromkeys(p.backend for p in self.partitions))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT_VERSION,
            "graph_inputs": list(self.graph_inputs),
            "graph_outputs": list(self.graph_outputs),
            "partitions": [p.to_dict() for p in self.partitions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        version = d.get("format")
        if version != PLAN_FORMAT_VERSION:
            raise FerryError(
                f"plan format {version!r} is not supported (this ferry reads format "
                f"{PLAN_FORMAT_VERSION}); re-create the plan with `ferry plan`"
            )
        try:
            return cls(
                partitions=tuple(Partition.from_dict(p) for p in d["partitions"]),
                graph_inputs=tuple(d["graph_inputs"]),
                graph_outputs=tuple(d["graph_outputs"]),
            )
        except (KeyError, TypeError) as e:
            raise FerryError(f"malformed plan: missing or wrong field {e}") from e

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FerryError(f"plan is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise FerryError("malformed plan: expected a JSON object")
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON, atomically."""
        from ferry.graph import atomic_path

        with atomic_path(path) as tmp:
            tmp.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise FerryError(f"cannot read plan {path}: {e.strerror}") from e
        return cls.from_json(text)
