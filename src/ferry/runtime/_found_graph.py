"""What a model's graph says about its inputs: the range integer inputs index, each input's role
(ids, mask, token types, lengths, positions, scales), and the sizes its symbolic dims can take.

:func:`ferry.runtime.found_inputs` asks this module for candidates and keeps the first that runs;
nothing here runs the model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ferry.graph import constant
from ferry.runtime._specs import TensorSpec

__all__ = ["DimKey", "InputRole", "input_roles", "size_candidates", "strides"]

#: A symbolic dim: its name (shared by every input that uses it) or ``(input, axis)`` when unnamed.
DimKey = str | tuple[str, int]

#: Ops an integer input flows through unchanged as far as its values go (where it ends up
#: indexing decides its range).
_VALUE_PASS = frozenset(
    {
        "Cast", "CastLike", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand",
        "Transpose", "Slice", "Concat", "Tile", "Split", "Gather", "GatherElements", "GatherND",
        "Clip", "Max", "Min", "Abs", "Mod",
    }
)  # fmt: skip
#: Ops whose input at that position is a size or a count: an integer input read there is a length.
_SIZE_USE = {
    "Range": (0, 1, 2), "ConstantOfShape": (0,), "Expand": (1,), "Reshape": (1,), "Tile": (1,),
    "Slice": (1, 2, 3, 4), "TopK": (1,), "Resize": (3,), "Pad": (1,),
}  # fmt: skip
_COMPARE = frozenset({"Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"})
_ARITH = frozenset({"Mul", "Sub", "Add", "Div", "Where", "Not", "And", "Or", "ReduceSum"})
_WALK_LIMIT = 400


@dataclasses.dataclass(frozen=True)
class InputRole:
    """What an input is, as its graph and name say.

    Attributes:
        kind: ``"ids"`` (random in ``[0, high)``), ``"ones"`` (masks), ``"zeros"`` (token types,
            segments), ``"lengths"`` (the matching sequence dim), ``"positions"`` (arange),
            ``"scales"`` (fixed small positive values), ``"random"`` (standard normal floats,
            coin-flip bools).
        high: for ids, the exclusive upper bound found (table rows, one-hot depth).
        why: a few words for reports: ``"in [0, 2) (an embedding table of 2 rows)"``.
        values: for scales, the values.
    """

    kind: str
    high: int = 10
    why: str = ""
    values: tuple[float, ...] = ()


def input_roles(model: ir.Model, specs: Sequence[TensorSpec]) -> dict[str, InputRole]:
    """Each input's role, from how the graph uses it first and its name second."""
    values = {v.name: v for v in model.graph.inputs}
    roles = {}
    for spec in specs:
        value = values.get(spec.name)
        roles[spec.name] = _role(spec, value)
    return roles


def _role(spec: TensorSpec, value: ir.Value | None) -> InputRole:
    name = spec.name.lower()
    dtype = spec.dtype
    if dtype is None:
        return InputRole("random")
    if dtype.kind == "f":
        return _float_role(spec, name)
    if dtype.kind not in "iub":
        return InputRole("random")
    bound, uses = _walk_uses(value) if value is not None else (None, set())
    table = f" ({bound[1]})" if bound else ""
    if "mask" in name or (dtype.kind == "b" and "pad" in name):
        return InputRole("ones", why="ones (a mask: all valid)")
    if "token_type" in name or "segment" in name:
        return InputRole("zeros", why="zeros (token types)" + table)
    if "position" in name or name in {"pos_ids", "positions"}:
        high = bound[0] if bound else 1 << 30
        return InputRole("positions", high=high, why="arange (positions)")
    if re.search(r"(^|_)(len|lens|lengths?|seq_len)($|_)", name) or "length" in name:
        return InputRole("lengths", why="the sequence length")
    if dtype.kind == "b":
        return InputRole("random")
    if bound is not None:
        return InputRole("ids", high=bound[0], why=f"ids in [0, {bound[0]}){table}")
    if "quantized" in uses:
        return InputRole("ids", high=int(np.iinfo(dtype).max) + 1, why="quantized data")
    if uses == {"size"}:
        return InputRole("lengths", why="the sequence length (read as a size)")
    if uses and uses <= {"arith"}:
        return InputRole("ones", why="ones (read as weights: a mask)")
    return InputRole("ids", high=10, why="ids in [0, 10) (no table bounds them)")


def _float_role(spec: TensorSpec, name: str) -> InputRole:
    shape = spec.shape
    if shape is None or not all(isinstance(d, int) for d in shape) or len(shape) > 1:
        return InputRole("random")
    count = math.prod(d for d in shape if isinstance(d, int))
    if count > 8:
        return InputRole("random")
    # A few fixed floats beside the data are knobs (scales, thresholds, temperatures): random
    # signs would break them (a VITS voice's negative length scale), and one is the neutral
    # setting of a scale.
    return InputRole("scales", values=(1.0,) * count, why="ones (a knob)")


def _walk_uses(value: ir.Value) -> tuple[tuple[int, str] | None, set[str]]:
    """The smallest index bound the value reaches (rows, what) and the kinds of its other uses."""
    bound: tuple[int, str] | None = None
    uses: set[str] = set()
    seen: set[int] = set()
    todo = [value]
    while todo and len(seen) < _WALK_LIMIT:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for node, index in current.uses():
            found = _index_bound(node, index)
            if found is not None:
                if bound is None or found[0] < bound[0]:
                    bound = found
                continue
            op = node.op_type
            if op in {"DequantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv"}:
                uses.add("quantized")
            elif index in _SIZE_USE.get(op, ()):
                uses.add("size")
            elif op in _COMPARE:
                uses.add("compare")
            elif op in _VALUE_PASS:
                todo.extend(o for o in node.outputs if o is not None)
                continue
            elif op in _ARITH:
                uses.add("arith")
            else:
                uses.add("other")
    return bound, uses


def _index_bound(node: ir.Node, index: int) -> tuple[int, str] | None:
    """The exclusive bound on values read as indices at ``node``'s input ``index``, if fixed."""
    op = node.op_type
    if op == "OneHot" and index == 0:
        depth = constant(node.inputs[1]) if len(node.inputs) > 1 else None
        if depth is not None and depth.size == 1:
            return int(depth.reshape(-1)[0]), "a OneHot's depth"
        return None
    if op not in {"Gather", "GatherElements"} or index != 1:
        return None
    data = node.inputs[0]
    if data is None or data.shape is None:
        return None
    axis_attr = node.attributes.get("axis")
    axis = axis_attr.as_int() if axis_attr is not None else 0
    shape = data.shape
    if not -len(shape) <= axis < len(shape):
        return None
    rows = shape[axis]
    if not isinstance(rows, int) or rows <= 0:
        return None
    what = "rows of a table" if constant(data) is not None else "rows of a gathered tensor"
    return rows, f"{rows} {what}"


# ---------------------------------------------------------------------------------------------
# Sizes


def strides(model: ir.Model, name: str) -> tuple[int, ...]:
    """How much each spatial axis of input ``name`` is downsampled on its deepest path: the
    product of the strides of the Conv/Pool ops on the way (``(32, 4)`` for a text-line
    recognizer that keeps width; ``()`` when no Conv/Pool reads it)."""
    start = next((v for v in model.graph.inputs if v.name == name), None)
    if start is None:
        return ()
    best: dict[int, tuple[int, ...]] = {id(start): ()}
    for node in model.graph:  # topological order
        incoming = [best[id(v)] for v in node.inputs if v is not None and id(v) in best]
        if not incoming:
            continue
        factor = max(incoming, key=lambda f: (math.prod(f) if f else 0, len(f)))
        if node.op_type in {"Conv", "MaxPool", "AveragePool", "ConvInteger", "QLinearConv"}:
            attr = node.attributes.get("strides")
            step = tuple(attr.as_ints()) if attr is not None else ()
            if step:
                factor = tuple(a * b for a, b in zip(factor, step)) if factor else step
        for out in node.outputs:
            if out is not None:
                best[id(out)] = factor
    reached = [f for f in best.values() if f]
    if not reached:
        return ()
    return max(reached, key=lambda f: (math.prod(f), len(f)))


#: Sizes tried for a dim the graph says nothing about, cheap first; the lists are cut where a
#: probe runs. Images: square sides; text lines: (height, width); sequences: lengths.
_SQUARE = (224, 320, 128, 256, 640, 64, 96, 160, 416, 512)
_TEXT_LINE = ((48, 320), (32, 320), (32, 128), (48, 160), (64, 256), (48, 96))
_SEQUENCE = (32, 64, 128, 16, 100, 8)
_OTHER = (32, 64, 128, 16, 224, 8, 1)
_HINT_NAMES = {
    "height": "h", "h": "h", "img_h": "h", "width": "w", "w": "w", "img_w": "w",
    "image_width": "w", "image_height": "h",
}  # fmt: skip


def size_candidates(
    model: ir.Model,
    specs: Sequence[TensorSpec],
    fixed: Mapping[DimKey, int],
    *,
    limit: int = 16,
) -> tuple[list[dict[DimKey, int]], dict[DimKey, str]]:
    """Assignments of sizes to the open dims of ``specs`` to try in order, and why each dim got
    its first size (for reports). ``fixed`` holds sizes already known (given shapes, named dims
    they fix); a symbolic first dim (the batch) is 1."""
    known: dict[DimKey, int] = dict(fixed)
    options: dict[DimKey, list[int]] = {}
    reasons: dict[DimKey, str] = {}
    for spec in specs:
        if spec.shape is None:
            continue
        keys = [_key(spec, axis, d) for axis, d in enumerate(spec.shape)]
        open_axes = [a for a, k in enumerate(keys) if k is not None and k not in known]
        open_axes = [a for a in open_axes if keys[a] not in options]
        if not open_axes:
            continue
        for axis, key in _batch_axes(spec, keys, open_axes):
            options[key] = [1]
            reasons[key] = "batch 1"
            open_axes.remove(axis)
        if not open_axes:
            continue
        for axis, sizes, why in _axis_options(model, spec, open_axes, known):
            open_key = keys[axis]
            if open_key is not None:
                options[open_key] = sizes
                reasons[open_key] = why
    # Candidate i takes each dim's i-th option (its last when it has fewer): dims of one input
    # move together (a text line's height and width), and the count stays small.
    depth = min(limit, max((len(v) for v in options.values()), default=1))
    out = []
    for i in range(depth):
        choice = dict(known)
        choice.update({k: v[min(i, len(v) - 1)] for k, v in options.items()})
        if choice not in out:
            out.append(choice)
    return out, reasons


def _key(spec: TensorSpec, axis: int, dim: object) -> DimKey | None:
    if isinstance(dim, int):
        return None
    return dim if isinstance(dim, str) else (spec.name, axis)


def _batch_axes(
    spec: TensorSpec, keys: list[DimKey | None], open_axes: list[int]
) -> Iterator[tuple[int, DimKey]]:
    assert spec.shape is not None
    if 0 in open_axes and len(spec.shape) >= 2:
        key = keys[0]
        assert key is not None
        yield 0, key
    elif (
        0 in open_axes
        and len(spec.shape) == 1
        and spec.dtype is not None
        and spec.dtype.kind in "iu"
    ):
        # A rank-1 integer input ([batch] lengths): its dim is the batch.
        key = keys[0]
        assert key is not None
        yield 0, key


def _axis_options(
    model: ir.Model, spec: TensorSpec, axes: list[int], known: Mapping[DimKey, int]
) -> Iterator[tuple[int, list[int], str]]:
    """For each open axis of ``spec``: the sizes to try, in order, and why the first."""
    assert spec.shape is not None
    pinned = _reshape_pin(model, spec, axes)
    if pinned is not None:
        axis, size, why = pinned
        yield axis, [size], why
        axes = [a for a in axes if a != axis]
    rank = len(spec.shape)
    kind = spec.dtype.kind if spec.dtype is not None else "f"
    if kind == "f" and rank == 4:
        yield from _image_options(model, spec, axes)
        return
    for axis in axes:
        if kind in "iub":
            yield axis, list(_SEQUENCE), "a sequence"
        elif kind == "f" and rank == 3 and axis == 1 and isinstance(spec.shape[2], int):
            yield axis, [100, *_SEQUENCE], "frames"
        else:
            yield axis, list(_OTHER), "a common size"


#: Ops that keep their input's element count (a Reshape after them still pins it).
_SAME_COUNT = frozenset({"Cast", "Identity", "Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Transpose"})


def _reshape_pin(model: ir.Model, spec: TensorSpec, axes: list[int]) -> tuple[int, int, str] | None:
    """The size of the one open axis of ``spec`` (the batch taken as 1) that a Reshape of the
    input to a constant shape allows, with why; None when no such Reshape reads it."""
    value = next((v for v in model.graph.inputs if v.name == spec.name), None)
    if value is None or spec.shape is None or len(axes) != 1:
        return None
    todo, seen = [value], 0
    while todo and seen < 16:
        current = todo.pop()
        seen += 1
        for node, index in current.uses():
            if node.op_type in _SAME_COUNT and index == 0:
                todo.extend(o for o in node.outputs if o is not None)
                continue
            if node.op_type != "Reshape" or index != 0 or len(node.inputs) < 2:
                continue
            target = constant(node.inputs[1])
            if target is None or target.size == 0 or (target <= 0).any():
                continue
            known = math.prod(
                d if isinstance(d, int) else 1 for i, d in enumerate(spec.shape) if i != axes[0]
            )
            total = int(np.prod(target))
            if known and total % known == 0:
                size = total // known
                return (
                    axes[0],
                    size,
                    f"{size} from the Reshape {node.name or ''} to {target.tolist()}",
                )
    return None


def _image_options(
    model: ir.Model, spec: TensorSpec, axes: list[int]
) -> Iterator[tuple[int, list[int], str]]:
    """Sizes for the spatial axes of a 4-D float input (NCHW, or NHWC when the last dim is a
    small fixed channel count)."""
    assert spec.shape is not None
    shape = spec.shape
    nhwc = (
        isinstance(shape[3], int)
        and shape[3] in (1, 2, 3, 4)
        and not (isinstance(shape[1], int) and shape[1] in (1, 2, 3, 4))
    )
    h_axis, w_axis = (1, 2) if nhwc else (2, 3)
    step = strides(model, spec.name)
    sh, sw = (int(step[0]), int(step[1])) if len(step) >= 2 else (1, 1)
    # Past 64 a "stride" is a side branch's pooling more likely than the body's downsampling.
    multiple = min(max(sh, sw, 1), 64)
    names = {_HINT_NAMES.get(str(shape[a]).lower()) for a in (h_axis, w_axis)}
    text_line = sh > sw or names == {"w"} or (_fixed(shape[h_axis]) <= 64 and h_axis not in axes)
    squares = [(s, s) for s in _SQUARE]
    if text_line:
        pairs = list(_TEXT_LINE) + squares
        why = f"a text line (height downsampled {sh}x, width {sw}x)" if sh > sw else "a text line"
    elif len([a for a in axes if a in (h_axis, w_axis)]) == 1 and isinstance(
        shape[w_axis if h_axis in axes else h_axis], int
    ):
        # One side open, the other fixed: a square first, then lengths (spectrogram frames).
        other = shape[w_axis if h_axis in axes else h_axis]
        assert isinstance(other, int)
        sides = [other, *(s for s in (100, *_SQUARE) if s != other)]
        pairs = [(s, s) for s in sides]
        why = "one side fixed at " + str(other)
    else:
        pairs = squares + list(_TEXT_LINE)
        why = (
            f"a square image, a multiple of the stride {multiple}"
            if multiple > 1
            else "a common size"
        )
        pairs = [p for p in pairs if p[0] % multiple == 0] + [p for p in pairs if p[0] % multiple]
    hinted = _metadata_sides(model)
    if hinted is not None:
        pairs = [hinted, *(p for p in pairs if p != hinted)]
        why = f"{hinted[0]}x{hinted[1]} from the exporter's metadata"
    for axis in axes:
        if axis == h_axis:
            yield axis, [p[0] for p in pairs], why
        elif axis == w_axis:
            yield axis, [p[1] for p in pairs], why
        else:
            yield axis, [3, 1], "3 channels"


#: Metadata keys exporters write an image's size under (ultralytics ``imgsz``, others).
_SIZE_KEYS = ("imgsz", "image_size", "img_size", "input_size", "input_shape", "resolution")


def _metadata_sides(model: ir.Model) -> tuple[int, int] | None:
    """(height, width) from the model's metadata, when an exporter wrote them."""
    for key, text in (model.metadata_props or {}).items():
        if key.lower() not in _SIZE_KEYS:
            continue
        numbers = [int(n) for n in re.findall(r"\d+", str(text))]
        sides = [n for n in numbers if n >= 8]
        if len(sides) == 1:
            return sides[0], sides[0]
        if len(sides) >= 2:
            return sides[-2], sides[-1]
    return None


def _fixed(dim: object) -> int:
    """A fixed dim's size; a large number for an open one."""
    return dim if isinstance(dim, int) else 1 << 30


def scale_values(role: InputRole, shape: tuple[int, ...]) -> np.ndarray:
    """The values of a ``scales`` input at ``shape``."""
    values = np.array(role.values, dtype=np.float64)
    return np.resize(values, shape) if values.size else np.ones(shape)
