"""Expand TFLite's sparse constants (the input of DENSIFY) into dense arrays.

TFLite stores a sparse tensor in a TACO-style format (``SparsityParameters`` in schema.fbs): the
dims are visited in ``traversal_order``; dims listed in ``block_map`` are also split into blocks,
whose inner dims come after the original ones; each visited dim is either DENSE (every index) or
SPARSE_CSR (``segments``/``indices`` list the present indices). The stored values are the
present elements in visiting order. This follows TFLite's own ``FormatConverter::SparseToDense``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ferry.converters._tflite.reader import Sparsity
from ferry.errors import ModelLoadError

__all__ = ["densify"]


def densify(values: np.ndarray, sparsity: Sparsity, shape: Sequence[int]) -> np.ndarray:
    """The dense array of ``shape`` that sparse ``values`` described by ``sparsity`` stand for.

    Raises:
        ModelLoadError: the sparsity description does not fit the shape or the values.
    """
    rank = len(shape)
    order = list(sparsity.traversal_order) or list(range(rank))
    block_map = list(sparsity.block_map)
    levels = sparsity.dims
    if len(order) != rank + len(block_map) or len(levels) != len(order):
        raise ModelLoadError(
            f"sparse tensor of shape {list(shape)}: traversal order {order}, block map "
            f"{block_map} and {len(levels)} dim descriptions do not fit together"
        )
    block_sizes = [levels[order.index(rank + k)].dense_size for k in range(len(block_map))]
    # Walk the levels breadth-first over all paths at once; expanding each path in place keeps
    # the depth-first order in which the values are stored.
    previous = np.zeros(1, dtype=np.int64)  # per path: its position in the level above
    columns: list[np.ndarray] = []  # per level: the index each path takes there
    for meta in levels:
        if meta.dense:
            size = meta.dense_size
            columns = [np.repeat(c, size) for c in columns]
            columns.append(np.tile(np.arange(size, dtype=np.int64), previous.size))
            previous = (previous[:, None] * size + np.arange(size)).reshape(-1)
            continue
        assert meta.segments is not None and meta.indices is not None
        if previous.size and int(previous.max()) + 1 >= meta.segments.size:
            raise ModelLoadError("a sparse tensor's segment array is too short")
        starts = meta.segments[previous]
        counts = meta.segments[previous + 1] - starts
        if np.any(counts < 0):
            raise ModelLoadError("a sparse tensor's segments are not ascending")
        total = int(counts.sum())
        first = np.cumsum(counts) - counts
        children = np.repeat(starts - first, counts) + np.arange(total, dtype=np.int64)
        if total and int(children.max()) >= meta.indices.size:
            raise ModelLoadError("a sparse tensor's index array is too short")
        columns = [np.repeat(c, counts) for c in columns]
        columns.append(meta.indices[children])
        previous = children
    count = previous.size
    if count > values.size:
        raise ModelLoadError(
            f"a sparse tensor lists {count} elements but stores {values.size} values"
        )
    original = [np.zeros(count, dtype=np.int64) for _ in range(rank)]
    for level in range(rank):
        original[order[level]] = columns[level]
    for level in range(rank, len(order)):
        block = order[level] - rank
        dim = block_map[block]
        original[dim] = original[dim] * block_sizes[block] + columns[level]
    flat = np.ravel_multi_index(tuple(original), tuple(shape)) if rank else np.zeros(1, np.int64)
    dense = np.zeros(int(np.prod(shape)) if shape else 1, dtype=values.dtype)
    dense[flat] = values[:count]
    return dense.reshape(tuple(shape))
