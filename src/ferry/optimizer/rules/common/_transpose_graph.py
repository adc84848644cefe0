"""Permutations and graph facts for transpose sinking (``_transpose``): composing and inverting
permutations, the shapes they give, every graph and subgraph of a model, fresh value names, and
what a graph knows of a value (its constant, its static rank).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx_ir as ir

__all__ = ["Perm"]


Perm = tuple[int, ...]


def _is_identity(perm: Perm) -> bool:
    return all(i == v for i, v in enumerate(perm))


def _inverse(perm: Perm) -> Perm:
    inverse = [0] * len(perm)
    for i, v in enumerate(perm):
        inverse[v] = i
    return tuple(inverse)


def _compose(first: Perm, second: Perm) -> Perm:
    """``Transpose(Transpose(x, first), second) == Transpose(x, _compose(first, second))``."""
    return tuple(first[i] for i in second)


def _norm_axes(axes: Sequence[int], rank: int) -> list[int] | None:
    """Axes made non-negative, or None when one is out of range or repeated."""
    out = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in out) or len(set(out)) != len(out):
        return None
    return out


def _permuted_shape(shape: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The shape of ``new`` where ``old == Transpose(new, perm)`` and ``shape`` is old's."""
    if shape is None or len(shape) != len(perm):
        return None
    inverse = _inverse(perm)
    return ir.Shape([shape[inverse[j]] for j in range(len(perm))])


def _transposed_shape(shape: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The shape of ``Transpose(x, perm)`` where ``shape`` is x's."""
    if shape is None or len(shape) != len(perm):
        return None
    return ir.Shape([shape[i] for i in perm])


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and, depth first, every subgraph of its nodes."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from _graphs(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    yield from _graphs(sub)


class _Names:
    """Fresh value and node names, unique in the whole model (subgraphs see outer names)."""

    def __init__(self, graph: ir.Graph) -> None:
        self._taken: set[str] = set()
        self._counter = 0
        for g in _graphs(graph):
            for v in [*g.inputs, *g.outputs, *g.initializers.values()]:
                if v.name:
                    self._taken.add(v.name)
            for node in g:
                if node.name:
                    self._taken.add(node.name)
                self._taken.update(o.name for o in node.outputs if o.name)

    def fresh(self, hint: str) -> str:
        name = hint
        while name in self._taken:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._taken.add(name)
        return name


def _perm_attr(node: ir.Node, rank: int | None) -> Perm | None:
    """A Transpose's permutation; the default (reversed dims) needs the rank."""
    attr = node.attributes.get("perm")
    if attr is not None:
        perm = tuple(attr.as_ints())
        return perm if sorted(perm) == list(range(len(perm))) else None
    return None if rank is None else tuple(reversed(range(rank)))


def _set_input(node: ir.Node, index: int, value: ir.Value) -> None:
    if len(node.inputs) <= index:
        node.resize_inputs(index + 1)
    node.replace_input_with(index, value)


class _GraphInfo:
    """One graph being optimized: its opset, the model's names, and constants read once."""

    def __init__(self, graph: ir.Graph, opset: int, names: _Names) -> None:
        self.graph = graph
        self.opset = opset
        self.names = names
        self._arrays: dict[ir.Value, np.ndarray | None] = {}

    def array(self, value: ir.Value) -> np.ndarray | None:
        """The value's constant content, if it is a constant this pass can permute."""
        if value in self._arrays:
            return self._arrays[value]
        array: np.ndarray | None = None
        if not value.is_graph_input():
            try:
                tensor = ir.convenience.get_const_tensor(value)
                if tensor is not None:
                    array = tensor.numpy()
                    # A permuted copy must be writable back with the same element type.
                    if ir.DataType.from_numpy(array.dtype) != tensor.dtype:
                        array = None
            except (ValueError, TypeError, NotImplementedError):
                array = None
        self._arrays[value] = array
        return array

    def constant(self, array: np.ndarray, hint: str) -> ir.Value:
        """A new initializer holding ``array``."""
        name = self.names.fresh(hint)
        value = ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(value)
        return value

    def is_const(self, value: ir.Value) -> bool:
        return self.array(value) is not None

    def ints(self, value: ir.Value | None) -> list[int] | None:
        """A constant 0-D or 1-D integer input as a list."""
        if value is None:
            return None
        array = self.array(value)
        if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
            return None
        return [int(x) for x in array.reshape(-1)]

    def static_rank(self, value: ir.Value) -> int | None:
        if value.shape is not None:
            return len(value.shape)
        array = self.array(value)
        return None if array is None else array.ndim
