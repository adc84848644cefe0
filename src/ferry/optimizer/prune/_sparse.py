"""Zeroing weights without changing shapes: unstructured magnitude pruning and 2:4 sparsity.

Neither makes a model faster on dense kernels: magnitude pruning makes the file smaller once
compressed; the 2:4 pattern (two zeros in every four consecutive input channels) is what
TensorRT's sparse tensor cores on Ampere and later run at up to twice the speed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ferry.graph import constant, load_model
from ferry.optimizer.prune._weights import is_op, weight_inputs, write

__all__ = ["check_2_4", "magnitude", "sparse_2_4"]


def _layers(model: ir.Model, exclude: frozenset[str]) -> Iterator[tuple[ir.Node, int, int]]:
    """``(node, weight input, input-channel axis)`` of each weight layer not excluded, each weight
    once (a weight two layers share is zeroed for both)."""
    seen: set[ir.Value] = set()
    for node in model.graph.all_nodes():
        if node.name in exclude:
            continue
        for index, axis in weight_inputs(node):
            value = node.inputs[index]
            if value is not None and value not in seen:
                seen.add(value)
                yield node, index, axis


#: A first layer holding less than this share of the layers' weights keeps them all.
FIRST_LAYER_SHARE = 0.05


def _first_layers(model: ir.Model, layers: list[tuple[ir.Node, int, int]]) -> dict[str, str]:
    """The layers that read a graph input (the first layers) and hold under
    :data:`FIRST_LAYER_SHARE` of the weights, each with the reason it keeps them.

    Measured on the digits CNN at sparsity 0.5: with its first conv's 144 weights (1.5% of the
    layers') zeroed too, 95.83% test accuracy; kept, 98.61% (the original's) at 51% non-zero
    instead of 50%. An MLP's first layer holds half its weights and is zeroed like the rest.
    """
    sizes = {id(node): constant(node.inputs[index]) for node, index, _ in layers}
    total = sum(w.size for w in sizes.values() if w is not None) or 1
    inputs = {v for v in model.graph.inputs if v.name not in model.graph.initializers}
    kept = {}
    for node, _, _ in layers:
        weight = sizes[id(node)]
        if weight is None or node.inputs[0] not in inputs:
            continue
        share = weight.size / total
        if share < FIRST_LAYER_SHARE:
            kept[node.name or node.op_type] = (
                f"the first layer (reads {node.inputs[0].name!r}), {weight.size} weights "
                f"({share:.1%} of them): zeroing it saves little and costs much accuracy"
            )
    return kept


def magnitude(
    model: ir.Model, sparsity: float, exclude: frozenset[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Zero the smallest ``sparsity`` of each layer weight, by absolute value, in place; a small
    first layer keeps its weights (:func:`_first_layers`).

    Before -> After (sparsity 0.5)::

        Conv W = [0.3, -0.1, 0.05, -0.8]  ->  Conv W = [0.3, 0, 0, -0.8]

    Returns:
        The names of the nodes whose weights were zeroed, and ``(node, reason)`` for the layers
        left dense.
    """
    done = []
    layers = list(_layers(model, exclude))
    first = _first_layers(model, layers)
    for node, index, _ in layers:
        if (node.name or node.op_type) in first:
            continue
        weight = constant(node.inputs[index])
        assert weight is not None
        count = round(weight.size * sparsity)
        if count == 0 or not np.issubdtype(weight.dtype, np.floating):
            continue
        flat = weight.reshape(-1).copy()
        # argpartition picks exactly `count` entries even among ties, so the sparsity is exact.
        flat[np.argpartition(np.abs(flat), count - 1)[:count]] = 0
        write(node, index, flat.reshape(weight.shape), shared_too=True)
        done.append(node.name or node.op_type)
    return done, list(first.items())


def _groups_of_four(weight: np.ndarray, axis: int) -> np.ndarray:
    """The weight with its input-channel axis last, split as ``[..., channels / 4, 4]``."""
    moved = np.moveaxis(weight, axis, -1)
    return moved.reshape(*moved.shape[:-1], moved.shape[-1] // 4, 4)


def _why_not_2_4(node: ir.Node, weight: np.ndarray, axis: int) -> str | None:
    if is_op(node, "Conv", "ConvTranspose") and node.attributes.get_int("group", 1) != 1:
        return f"{node.name} ({node.op_type}) is a grouped conv; sparse kernels take dense groups"
    if not np.issubdtype(weight.dtype, np.floating):
        return f"{node.name} ({node.op_type}) has {weight.dtype} weights"
    if weight.shape[axis] % 4:
        return (
            f"{node.name} ({node.op_type}) has {weight.shape[axis]} input channels, "
            "not a multiple of 4"
        )
    return None


def sparse_2_4(model: ir.Model, exclude: frozenset[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Zero the 2 smallest weights of every 4 consecutive input channels, in place.

    Before -> After (one output channel, 4 input channels)::

        W[o, 0:4] = [0.3, -0.1, 0.05, -0.8]  ->  [0.3, 0, 0, -0.8]

    Returns:
        The nodes changed, and ``(node, reason)`` for the weight layers left dense.
    """
    done, skipped = [], []
    for node, index, axis in _layers(model, exclude):
        weight = constant(node.inputs[index])
        assert weight is not None
        reason = _why_not_2_4(node, weight, axis)
        if reason is not None:
            skipped.append((node.name or node.op_type, reason))
            continue
        groups = _groups_of_four(weight, axis).copy()
        smallest = np.argsort(np.abs(groups), axis=-1, kind="stable")[..., :2]
        np.put_along_axis(groups, smallest, 0, axis=-1)
        moved_shape = np.moveaxis(weight, axis, -1).shape
        write(node, index, np.moveaxis(groups.reshape(moved_shape), -1, axis), shared_too=True)
        done.append(node.name or node.op_type)
    return done, skipped


def check_2_4(model: ir.Model | str | Path) -> list[str]:
    """Name every weight that breaks the 2:4 pattern on its input-channel axis.

    Checked: the constant weights of Conv and ConvTranspose (not grouped), Gemm and MatMul whose
    input-channel count is a multiple of 4 (other layers cannot follow the pattern and run dense
    on a sparse engine, so they are not breaches). A weight breaks the pattern when some 4
    consecutive input channels hold more than 2 non-zeros.

    Args:
        model: the model, or a path to one (not changed).

    Returns:
        ``"<weight> (read by <node>)"`` for each weight that breaks it; empty when none does.
    """
    model = load_model(model)
    broken = []
    for node, index, axis in _layers(model, frozenset()):
        weight = constant(node.inputs[index])
        assert weight is not None
        if _why_not_2_4(node, weight, axis) is not None:
            continue
        if (np.count_nonzero(_groups_of_four(weight, axis), axis=-1) > 2).any():
            value = node.inputs[index]
            broken.append(f"{value.name if value else '?'} (read by {node.name})")
    return broken
