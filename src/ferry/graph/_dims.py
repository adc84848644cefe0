"""Dims, shapes and element types as ferry reads them, whatever spelling an exporter chose."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["Dim", "dim", "dtype_name", "graph_inputs", "proto_dim", "shape_of"]

#: A dimension: a fixed size, a symbolic name (``"batch"``), or None when unknown.
Dim = int | str | None

#: Names exporters give a dim that has no identity of its own; like an empty name, they bind nothing.
_PLACEHOLDER_NAMES = frozenset({"none", "null", "unknown", "dynamic", "unk", "nan"})


def dim(d: int | str | ir.SymbolicDim | None) -> Dim:
    """One dim as ferry reads it: a fixed size, a name, or None when unknown.

    Exporters spell "any size" several ways, and none of them is a fixed size or a name that binds
    two dims together: a negative size (``dim_value: -1``), an empty name, and placeholder names
    such as ``?``, ``-1`` or ``None``. All of them are None here. A real name (``batch``,
    ``height``, ``unk__3``) is kept: the same name on two inputs or axes means the same size.
    """
    if isinstance(d, ir.SymbolicDim):
        d = d.value
    if d is None:
        return None
    if isinstance(d, int):
        return d if d >= 0 else None
    name = str(d).strip()
    if not any(c.isalnum() for c in name) or name.lstrip("+-").isdigit():
        return None
    return None if name.lower() in _PLACEHOLDER_NAMES else name


def shape_of(value: ir.Value) -> tuple[Dim, ...] | None:
    """The shape of ``value`` as ferry reads it (see :func:`dim`); None when the rank is unknown."""
    if value.shape is None:
        return None
    return tuple(dim(d) for d in value.shape)


def dtype_name(dtype: ir.DataType) -> str:
    """numpy's name for an ONNX element type (``float32``, ``int64``, ``bfloat16``), or ONNX's."""
    if dtype == ir.DataType.STRING:
        return "string"
    try:
        return str(np.dtype(dtype.numpy()).name)
    except (TypeError, ValueError):
        return dtype.name.lower()


def graph_inputs(model: ir.Model) -> list[ir.Value]:
    """Inputs the caller must feed: graph inputs that are not initializers (IR < 4 lists both)."""
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def proto_dim(d: Any) -> Dim:
    """A dim of a protobuf shape, read as :func:`dim` reads any other."""
    return dim(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
