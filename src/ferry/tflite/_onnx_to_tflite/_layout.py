"""Layouts as permutations: how a TFLite tensor holds the ONNX value it stands for.

ONNX is NCHW and TFLite's spatial ops are NHWC. Rather than wrapping every such op in Transposes,
each lowered value carries a *permutation* ``perm``: TFLite axis ``i`` holds ONNX axis
``perm[i]``, so ``tflite_array == onnx_array.transpose(perm)``. NCHW held as NHWC is
``(0, 2, 3, 1)``; the identity is ONNX's own layout. Ops that do not care about layout run in
whatever layout their input has with their axes remapped, an ONNX Transpose only relabels, and a
Reshape keeps the layout whenever the data's order in memory allows (:func:`reshape_perm`); a
TRANSPOSE is written only where an op needs a layout its input lacks.

Everything here is pure arithmetic on tuples: no graph, no numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "Perm",
    "after_reduce",
    "after_transpose",
    "axis_of",
    "channels_last",
    "identity",
    "inverse",
    "is_identity",
    "memory_order_kept",
    "permute",
    "reshape_perm",
    "transpose_between",
]

#: ``perm[i]`` is the ONNX axis that TFLite axis ``i`` holds.
Perm = tuple[int, ...]


def identity(rank: int) -> Perm:
    """ONNX's own layout for a tensor of ``rank`` dims."""
    return tuple(range(rank))


def is_identity(perm: Sequence[int]) -> bool:
    return all(i == p for i, p in enumerate(perm))


def channels_last(rank: int) -> Perm:
    """The channels-last layout of a channels-first tensor: NCHW -> NHWC, NCW -> NWC."""
    if rank < 3:
        return identity(rank)
    return (0, *range(2, rank), 1)


def inverse(perm: Sequence[int]) -> Perm:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def permute(values: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    """``values`` (one per ONNX axis) in TFLite's axis order."""
    return tuple(values[p] for p in perm)


def axis_of(perm: Sequence[int], onnx_axis: int) -> int:
    """The TFLite axis holding ONNX axis ``onnx_axis`` (already non-negative)."""
    return list(perm).index(onnx_axis)


def transpose_between(have: Sequence[int], want: Sequence[int]) -> Perm:
    """The TRANSPOSE permutation turning a tensor held as ``have`` into one held as ``want``.

    ``X.transpose(have).transpose(t) == X.transpose(want)`` needs ``have[t[i]] == want[i]``.
    """
    where = inverse(have)
    return tuple(where[w] for w in want)


def after_transpose(perm: Sequence[int], onnx_perm: Sequence[int]) -> Perm:
    """The layout of ``Transpose(x, onnx_perm)`` held in the same TFLite tensor as ``x``.

    With ``y = x.transpose(t)`` and the tensor ``x.transpose(p)``: ``y.transpose(q)`` is that same
    tensor when ``t[q[i]] == p[i]``, so an ONNX Transpose costs nothing.
    """
    back = inverse(onnx_perm)
    return tuple(back[p] for p in perm)


def after_reduce(perm: Sequence[int], axes: Sequence[int], keepdims: bool) -> Perm:
    """The layout of a reduction's result over ONNX ``axes`` of a value held as ``perm``."""
    if keepdims:
        return tuple(perm)
    gone = set(axes)
    kept = [p for p in perm if p not in gone]
    return tuple(p - sum(1 for a in gone if a < p) for p in kept)


def memory_order_kept(shape: Sequence[int], have: Sequence[int], want: Sequence[int]) -> bool:
    """Whether a value of ONNX ``shape`` held as ``have`` has the same bytes held as ``want``
    (only size-1 axes move), so a RESHAPE converts between them."""

    def order(perm: Sequence[int]) -> list[int]:
        return [p for p in perm if shape[p] != 1]

    return order(have) == order(want)


def reshape_perm(
    in_shape: Sequence[int], perm: Sequence[int], out_shape: Sequence[int]
) -> Perm | None:
    """The layout in which ``Reshape(x, out_shape)`` is a plain RESHAPE of ``x``'s tensor.

    ``x`` (ONNX ``in_shape``) is held as ``perm``. A reshape merges and splits groups of
    consecutive axes; it can run on the tensor as held when each group's axes lie next to each
    other, in order, in the tensor: the result then holds the groups in the tensor's order.
    Returns None when no layout works (the tensor must be transposed first).

    Examples: NHWC ``[1,C,1,1] -> [1,C]`` gives the identity (size-1 axes move freely);
    NHWC ``[1,255,13,13] -> [1,3,85,13,13]`` gives ``(0,3,4,1,2)``; NHWC ``[1,C,H,W] -> [1,CHW]``
    gives None.
    """
    if math.prod(in_shape) != math.prod(out_shape):
        return None
    ins = [a for a in range(len(in_shape)) if in_shape[a] != 1]
    outs = [a for a in range(len(out_shape)) if out_shape[a] != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        g_in, g_out = [ins[i]], [outs[j]]
        p_in, p_out = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while p_in != p_out:
            if p_in < p_out:
                if i >= len(ins):
                    return None
                g_in.append(ins[i])
                p_in *= in_shape[ins[i]]
                i += 1
            else:
                if j >= len(outs):
                    return None
                g_out.append(outs[j])
                p_out *= out_shape[outs[j]]
                j += 1
        groups.append((g_in, g_out))
    held = [p for p in perm if in_shape[p] != 1]
    position = {axis: k for k, axis in enumerate(held)}
    starts = []
    for g_in, _ in groups:
        where = [position[a] for a in g_in]
        if where != list(range(where[0], where[0] + len(where))):
            return None  # the group is split or reordered in memory
        starts.append(where[0])
    order = [a for _, g_out in sorted(zip(starts, (g for _, g in groups))) for a in g_out]
    # Size-1 output axes hold no data: each goes right after the axis before it, or first.
    for unit in (a for a in range(len(out_shape)) if out_shape[a] == 1):
        at = order.index(unit - 1) + 1 if unit - 1 in order else 0
        order.insert(at, unit)
    return tuple(order)
