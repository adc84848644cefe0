"""The tensors a model holds: a value's constant, every tensor at any depth, the files they live in.

Weights may be initializers or Constant nodes (Paddle's exporter keeps every weight in Constant
nodes, PyTorch's in initializers): each helper here handles both, so that no caller need.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np
import onnx_ir as ir

from ferry.errors import ModelLoadError

__all__ = [
    "all_initializers",
    "all_nodes",
    "constant",
    "constant_tensor",
    "external_files",
    "tensors",
]

_ONNX_DOMAINS = ("", "ai.onnx")

#: A Constant node's list and scalar attributes, and the element type ONNX gives each.
_LITERALS: dict[str, type[np.generic]] = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}

#: A Windows drive (``C:``): absolute there, though not to a POSIX path parser.
_DRIVE = re.compile(r"^[A-Za-z]:")


def constant_tensor(
    value: ir.Value | None, *, input_defaults: bool = False
) -> ir.TensorProtocol | None:
    """The tensor ``value`` always holds: an initializer's, or a ``Constant`` node's; else None.

    A Constant node counts in any of its forms (``value``, ``value_float(s)``, ``value_int(s)``,
    ``value_string(s)``); a malformed one (not exactly one attribute and one output), a
    ``sparse_value`` and a reference to a function's attribute (set by each caller) do not: no
    one can rely on their value here.

    Args:
        value: the value (None gives None, so optional inputs need no test).
        input_defaults: also give the tensor of an initializer that is a graph input too. By
            default that is not a constant: the caller may feed another value at run time (a
            streaming model's state); a pass that reads such an input's default asks for it.

    Returns:
        The tensor (not copied; an external one is read only when its numbers are asked for).
    """
    if value is None:
        return None
    if value.is_graph_input() and not input_defaults:
        return None
    if value.const_value is not None:
        return value.const_value
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain not in _ONNX_DOMAINS:
        return None
    if len(node.attributes) != 1 or len(node.outputs) != 1:
        return None
    ((key, attr),) = node.attributes.items()
    if attr.is_ref():
        return None
    if key == "value":
        return attr.as_tensor()
    if key in _LITERALS:
        return ir.tensor(np.asarray(attr.value, dtype=_LITERALS[key]), name=value.name)
    if key in ("value_string", "value_strings"):
        return ir.StringTensor(np.asarray(attr.value, dtype=np.bytes_), name=value.name)
    return None


def constant(value: ir.Value | None, *, input_defaults: bool = False) -> np.ndarray | None:
    """The numbers ``value`` always holds, as an array; None when it is computed at run time.

    The rules are :func:`constant_tensor`'s (an initializer that is also a graph input is not a
    constant unless ``input_defaults``).
    """
    tensor = constant_tensor(value, input_defaults=input_defaults)
    return None if tensor is None else np.asarray(tensor.numpy())


def tensors(model: ir.Model, *, weights_only: bool = False) -> Iterator[ir.TensorProtocol]:
    """Every tensor ``model`` holds: initializers and tensor attributes (Constant nodes' values
    and any other), of the graph, its subgraphs at any depth and the model's functions.

    Args:
        model: the model.
        weights_only: only its weights: initializers and Constant nodes' ``value``, of the graph
            and its subgraphs (what ``summarize`` counts as parameters and ``save_model`` weighs
            against the 2 GiB protobuf limit), not a ConstantOfShape's fill value or a function's
            tensors.
    """
    for _, tensor in _owned_tensors(model, weights_only=weights_only):
        yield tensor


def external_files(model: ir.Model, *, inside: str | os.PathLike[str] | None = None) -> list[str]:
    """The external data files ``model``'s tensors live in (any tensor, any depth), each once.

    Args:
        model: the model.
        inside: the folder every external file must be a file of (the model's own folder, an
            uploaded folder): each location must then be a relative path without ``..`` that
            stays in it, links resolved, and the file must exist.

    Returns:
        Each file's location as the model names it (relative to the model's folder, with ``/``),
        sorted.

    Raises:
        ModelLoadError: with ``inside``, a location reaches outside the folder (absolute, a drive,
            ``..``, or a link out of it) or names a missing file; the message names the weight or
            node that keeps its tensor there.
    """
    root = None if inside is None else Path(inside)
    found: set[str] = set()
    for owner, tensor in _owned_tensors(model):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = os.fspath(tensor.location)
        if root is not None:
            _check_inside(owner, tensor, location, root)
        found.add(Path(location).as_posix())
    return sorted(found)


def _check_inside(owner: str, tensor: ir.ExternalTensor, location: str, root: Path) -> None:
    posix = PurePosixPath(location.replace("\\", "/"))
    file = Path(tensor.base_dir or root) / location
    if (
        posix.is_absolute()
        or ".." in posix.parts
        or _DRIVE.match(location)
        or not file.resolve().is_relative_to(root.resolve())
    ):
        raise ModelLoadError(
            f"the model keeps {owner} in external data file {location!r}, outside its folder"
        )
    if not file.is_file():
        raise ModelLoadError(
            f"the model keeps {owner} in external data file {location!r}, which is missing; "
            "copy it next to the model"
        )


def _owned_tensors(
    model: ir.Model, *, weights_only: bool = False
) -> Iterator[tuple[str, ir.TensorProtocol]]:
    """Each tensor of ``model`` (see :func:`tensors`) with what keeps it, for messages."""
    for value in all_initializers(model):
        if value.const_value is not None:
            yield f"weight {value.name!r}", value.const_value
    if weights_only:
        for node in model.graph.all_nodes():
            if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS:
                attr = node.attributes.get("value")
                if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
                    yield f"the tensor of node {node.name!r}", attr.as_tensor()
        return
    for node in all_nodes(model):
        for attr in node.attributes.values():
            if attr.is_ref() or attr.value is None:
                continue
            if attr.type == ir.AttributeType.TENSOR:
                yield f"the tensor of node {node.name!r}", attr.value
            elif attr.type == ir.AttributeType.TENSORS:
                yield from ((f"a tensor of node {node.name!r}", t) for t in attr.value)


def all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node: of the graph, of its subgraphs and of the model's functions."""
    yield from model.graph.all_nodes()
    for function in model.functions.values():
        yield from function.all_nodes()


def all_initializers(model: ir.Model) -> Iterator[ir.Value]:
    """Every initializer: of the graph and of its subgraphs at any depth."""
    for graph in (model.graph, *model.graph.subgraphs()):
        yield from graph.initializers.values()
