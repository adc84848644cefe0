"""The ONNX ops an :class:`~ferry.optimizer.distill._onnx_to_torch.OnnxModule` evaluates, in torch.

Each op is ``fn(inputs, attrs, opset) -> outputs`` on torch tensors, differentiable where ONNX's
op is, following ONNX's semantics for the attributes and opsets ``_unsupported_reason`` admits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
import torch.nn.functional as F

__all__ = ["MULTI_OUTPUT", "OPS", "TORCH_DTYPES", "Attrs", "OpFn", "Tensor", "as_tensor", "split"]

Tensor = torch.Tensor
Attrs = dict[str, Any]
OpFn = Callable[[list[Tensor | None], Attrs, int], Sequence[Tensor]]

TORCH_DTYPES: dict[ir.DataType, torch.dtype] = {
    ir.DataType.FLOAT: torch.float32,
    # The module computes in float32: half types train badly and torch's CPU kernels lack many.
    ir.DataType.FLOAT16: torch.float32,
    ir.DataType.BFLOAT16: torch.float32,
    ir.DataType.DOUBLE: torch.float64,
    ir.DataType.INT64: torch.int64,
    ir.DataType.INT32: torch.int32,
    ir.DataType.INT16: torch.int16,
    ir.DataType.INT8: torch.int8,
    ir.DataType.UINT8: torch.uint8,
    ir.DataType.BOOL: torch.bool,
}


# ----------------------------------------------------------------------------------------------
# helpers


def _ints(t: Tensor | None) -> list[int]:
    return [] if t is None else [int(v) for v in t.reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _reverse_pads(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """ONNX ``[b1, b2, e1, e2]`` order -> ``F.pad``'s last-axis-first ``[b2, e2, b1, e1]``."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        out += [int(b), int(e)]
    return out


def _same_pads(
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    mode: str,
) -> tuple[list[int], list[int]]:
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        if mode == "SAME_UPPER":
            begin.append(small)
            end.append(total - small)
        else:
            begin.append(total - small)
            end.append(small)
    return begin, end


def _window_pads(
    x: Tensor, a: Attrs, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Begin and end pads of a Conv or pool, ``auto_pad`` resolved at the input's shape."""
    n = len(kernel)
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(list(x.shape[2:]), kernel, strides, dilations, auto)
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = list(a.get("pads", [0] * (2 * n)))
    return pads[:n], pads[n:]


def as_tensor(array: np.ndarray) -> Tensor:
    if array.dtype in (np.float16,) or array.dtype.name == "bfloat16":
        array = array.astype(np.float32)
    return torch.from_numpy(np.array(array, copy=True))


# ----------------------------------------------------------------------------------------------
# ops: fn(inputs, attrs, opset) -> outputs


def _conv(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, weight, bias = x[0], x[1], x[2] if len(x) > 2 else None
    assert data is not None and weight is not None
    n = weight.ndim - 2
    kernel = list(a.get("kernel_shape", weight.shape[2:]))
    strides = list(a.get("strides", [1] * n))
    dilations = list(a.get("dilations", [1] * n))
    begin, end = _window_pads(data, a, kernel, strides, dilations)
    padding: list[int] | int = begin
    if begin != end:
        data = F.pad(data, _reverse_pads(begin, end))
        padding = 0
    conv = (F.conv1d, F.conv2d, F.conv3d)[n - 1]
    return [conv(data, weight, bias, strides, padding, dilations, int(a.get("group", 1)))]


def _conv_transpose(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, weight, bias = x[0], x[1], x[2] if len(x) > 2 else None
    assert data is not None and weight is not None
    n = weight.ndim - 2
    kernel = list(a.get("kernel_shape", weight.shape[2:]))
    strides = list(a.get("strides", [1] * n))
    dilations = list(a.get("dilations", [1] * n))
    out_pad = list(a.get("output_padding", [0] * n))
    groups = int(a.get("group", 1))
    if "output_shape" in a:
        shape = list(a["output_shape"])[-n:]
        begin, end = [], []
        for i in range(n):
            total = (
                strides[i] * (data.shape[2 + i] - 1)
                + out_pad[i]
                + (kernel[i] - 1) * dilations[i]
                + 1
                - shape[i]
            )
            small = total // 2
            if a.get("auto_pad", "NOTSET") == "SAME_UPPER":
                begin.append(small)
                end.append(total - small)
            else:
                begin.append(total - small)
                end.append(small)
    elif a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            total = max(
                0,
                strides[i] * (data.shape[2 + i] - 1)
                + out_pad[i]
                + (kernel[i] - 1) * dilations[i]
                + 1
                - data.shape[2 + i] * strides[i],
            )
            small = total // 2
            if a["auto_pad"] == "SAME_UPPER":
                begin.append(small)
                end.append(total - small)
            else:
                begin.append(total - small)
                end.append(small)
    else:
        pads = list(a.get("pads", [0] * (2 * n)))
        begin, end = pads[:n], pads[n:]
    conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[n - 1]
    full = conv(data, weight, bias, strides, 0, out_pad, groups, dilations)
    # Negative padding crops: the ONNX pads are taken off the full output.
    return [F.pad(full, [-p for p in _reverse_pads(begin, end)])]


def _batch_norm(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, scale, bias, mean, var = x[:5]
    assert data is not None and mean is not None and var is not None
    out = F.batch_norm(
        data, mean, var, scale, bias, training=False, eps=float(a.get("epsilon", 1e-5))
    )
    return [out]


def _instance_norm(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, scale, bias = x[:3]
    assert data is not None
    return [F.instance_norm(data, weight=scale, bias=bias, eps=float(a.get("epsilon", 1e-5)))]


def _layer_norm(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, scale = x[0], x[1]
    bias = x[2] if len(x) > 2 else None
    assert data is not None and scale is not None
    axis = _axis(int(a.get("axis", -1)), data.ndim)
    dims = list(range(axis, data.ndim))
    mean = data.mean(dim=dims, keepdim=True)
    var = ((data - mean) ** 2).mean(dim=dims, keepdim=True)
    out = (data - mean) / torch.sqrt(var + float(a.get("epsilon", 1e-5))) * scale
    return [out + bias if bias is not None else out]


def _clip(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    if opset < 11:
        low, high = a.get("min"), a.get("max")
    else:
        low = float(x[1]) if len(x) > 1 and x[1] is not None else None
        high = float(x[2]) if len(x) > 2 and x[2] is not None else None
    return [torch.clamp(data, min=low, max=high)]


def _unary(fn: Callable[[Tensor], Tensor]) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
        assert x[0] is not None
        return [fn(x[0])]

    return op


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
        assert x[0] is not None and x[1] is not None
        return [fn(x[0], x[1])]

    return op


def _variadic(fn: Callable[[Tensor, Tensor], Tensor], mean: bool = False) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
        items = [t for t in x if t is not None]
        out = items[0]
        for t in items[1:]:
            out = fn(out, t)
        return [out / len(items) if mean else out]

    return op


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.is_floating_point() or b.is_floating_point():
        return a / b
    # ONNX integer division truncates (C semantics), as in shape arithmetic.
    return torch.div(a, b, rounding_mode="trunc")


def _hard_sigmoid(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    alpha, beta = float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))
    return [torch.clamp(x[0] * alpha + beta, 0.0, 1.0)]


def _leaky_relu(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [F.leaky_relu(x[0], float(a.get("alpha", 0.01)))]


def _elu(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [F.elu(x[0], float(a.get("alpha", 1.0)))]


def _prelu(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, slope = x[0], x[1]
    assert data is not None and slope is not None
    return [torch.where(data < 0, data * slope, data)]


def _gelu(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [F.gelu(x[0], approximate=a.get("approximate", "none"))]


def _softmax_like(fn: Callable[..., Tensor]) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
        data = x[0]
        assert data is not None
        if opset >= 13:
            return [fn(data, dim=int(a.get("axis", -1)))]
        # Before opset 13 the input is coerced to 2-D at ``axis`` and normalized over the rest.
        axis = _axis(int(a.get("axis", 1)), data.ndim)
        flat = data.reshape(math.prod(data.shape[:axis]), -1)
        return [fn(flat, dim=-1).reshape(data.shape)]

    return op


def _matmul(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None and x[1] is not None
    return [torch.matmul(x[0], x[1])]


def _gemm(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    left, right = x[0], x[1]
    bias = x[2] if len(x) > 2 else None
    assert left is not None and right is not None
    if a.get("transA", 0):
        left = left.t()
    if a.get("transB", 0):
        right = right.t()
    out = torch.matmul(left, right) * float(a.get("alpha", 1.0))
    if bias is not None:
        out = out + bias * float(a.get("beta", 1.0))
    return [out]


def _flatten(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    axis = _axis(int(a.get("axis", 1)), data.ndim)
    return [data.reshape(math.prod(data.shape[:axis]), math.prod(data.shape[axis:]))]


def _reshape(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    shape = _ints(x[1]) if opset >= 5 else list(a.get("shape", []))
    if not a.get("allowzero", 0):
        shape = [data.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [data.reshape(shape)]


def _transpose(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    perm = list(a.get("perm", reversed(range(data.ndim))))
    return [data.permute(perm)]


def _concat(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    items = [t for t in x if t is not None]
    dtype = items[0].dtype
    return [torch.cat([t.to(dtype) for t in items], dim=int(a["axis"]))]


def split(x: list[Tensor | None], a: Attrs, opset: int, outputs: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    axis = int(a.get("axis", 0))
    sizes = _ints(x[1]) if opset >= 13 and len(x) > 1 else list(a.get("split", []))
    if not sizes:
        size = data.shape[axis]
        step = -(-size // outputs)
        sizes = [min(step, size - i * step) for i in range(outputs)]
    return list(torch.split(data, sizes, dim=axis))


def _slice(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    if opset < 10:
        starts, ends = list(a["starts"]), list(a["ends"])
        axes = list(a.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(x[1]), _ints(x[2])
        axes = _ints(x[3]) if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = _ints(x[4]) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    out = data
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = _axis(axis, data.ndim)
        size = data.shape[axis]
        start = start + size if start < 0 else start
        end = end + size if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), size), min(max(end, 0), size)
            index = [slice(None)] * data.ndim
            index[axis] = slice(start, end, step)
            out = out[tuple(index)]
        else:
            start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
            picks = torch.tensor(list(range(start, end, step)), dtype=torch.int64)
            out = out.index_select(axis, picks)
    return [out]


def _squeeze(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    axes = _ints(x[1]) if opset >= 13 and len(x) > 1 else list(a.get("axes", []))
    if not axes:
        return [data.squeeze()]
    axes = sorted((_axis(v, data.ndim) for v in axes), reverse=True)
    for v in axes:
        data = data.squeeze(v)
    return [data]


def _unsqueeze(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    axes = _ints(x[1]) if opset >= 13 else list(a["axes"])
    rank = data.ndim + len(axes)
    for v in sorted(_axis(v, rank) for v in axes):
        data = data.unsqueeze(v)
    return [data]


def _global_pool(kind: str) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
        data = x[0]
        assert data is not None
        dims = list(range(2, data.ndim))
        if kind == "avg":
            return [data.mean(dim=dims, keepdim=True)]
        return [data.amax(dim=dims, keepdim=True)]

    return op


def _max_pool(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    kernel = list(a["kernel_shape"])
    n = len(kernel)
    strides = list(a.get("strides", [1] * n))
    dilations = list(a.get("dilations", [1] * n))
    begin, end = _window_pads(data, a, kernel, strides, dilations)
    padding: list[int] = begin
    if begin != end or any(2 * p > k for p, k in zip(begin, kernel, strict=True)):
        data = F.pad(data, _reverse_pads(begin, end), value=-math.inf)
        padding = [0] * n
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
    return [
        pool(
            data,
            kernel,
            strides,
            padding,
            dilations,
            ceil_mode=bool(a.get("ceil_mode", 0)),
        )
    ]


def _average_pool(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    kernel = list(a["kernel_shape"])
    n = len(kernel)
    strides = list(a.get("strides", [1] * n))
    begin, end = _window_pads(data, a, kernel, strides, [1] * n)
    include = bool(a.get("count_include_pad", 0))
    ceil = bool(a.get("ceil_mode", 0))
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
    if begin == end and all(2 * p <= k for p, k in zip(begin, kernel, strict=True)):
        return [pool(data, kernel, strides, begin, ceil, include)]
    pads = _reverse_pads(begin, end)
    total = pool(F.pad(data, pads), kernel, strides, 0, ceil, True)
    if include:
        return [total]
    ones = torch.ones((1, 1, *data.shape[2:]), dtype=data.dtype)
    share = pool(F.pad(ones, pads), kernel, strides, 0, ceil, True)
    return [total / share]


def _pad(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    if opset < 11:
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
        axes = list(range(data.ndim))
    else:
        pads = _ints(x[1])
        value = float(x[2]) if len(x) > 2 and x[2] is not None and x[2].numel() else 0.0
        axes = _ints(x[3]) if len(x) > 3 and x[3] is not None else list(range(data.ndim))
    k = len(axes)
    begin, end = [0] * data.ndim, [0] * data.ndim
    for i, axis in enumerate(axes):
        axis = _axis(axis, data.ndim)
        begin[axis], end[axis] = pads[i], pads[k + i]
    mode = a.get("mode", "constant")
    # F.pad only pads the trailing axes for non-constant modes: trim the untouched leading ones.
    first = next((i for i in range(data.ndim) if begin[i] or end[i]), data.ndim)
    if mode != "constant":
        first = min(first, data.ndim - 1)
    torch_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
    flat = _reverse_pads(begin[first:], end[first:])
    if torch_mode == "constant":
        return [F.pad(data, flat, value=value)]
    return [F.pad(data, flat, mode=torch_mode)]


def _resize_coordinates(mode: str, out: int, size: int, scale: float) -> np.ndarray:
    d = np.arange(out, dtype=np.float64)
    if mode == "asymmetric":
        return d / scale
    if mode == "align_corners":
        return d * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "pytorch_half_pixel":
        return (d + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "half_pixel_symmetric":
        adjustment = out / (scale * size)
        center = size / 2
        offset = center * (1 - adjustment)
        return offset + (d + 0.5) / scale - 0.5
    return (d + 0.5) / scale - 0.5  # half_pixel


def _nearest(coords: np.ndarray, mode: str, size: int) -> np.ndarray:
    if mode == "floor":
        picks = np.floor(coords)
    elif mode == "ceil":
        picks = np.ceil(coords)
    elif mode == "round_prefer_ceil":
        picks = np.floor(coords + 0.5)
    else:  # round_prefer_floor
        picks = np.ceil(coords - 0.5)
    return np.clip(picks, 0, size - 1).astype(np.int64)


def _resize(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    if opset < 11:  # Resize-10 / Upsample: (X, scales), asymmetric coordinates
        scales = [float(v) for v in x[1].reshape(-1).tolist()] if x[1] is not None else []
        sizes: list[int] = []
        coordinate = "asymmetric"
        nearest_mode = "floor"
    else:
        scales_t = x[2] if len(x) > 2 else None
        sizes_t = x[3] if len(x) > 3 else None
        scales = (
            [float(v) for v in scales_t.reshape(-1).tolist()]
            if scales_t is not None and scales_t.numel()
            else []
        )
        sizes = _ints(sizes_t) if sizes_t is not None and sizes_t.numel() else []
        coordinate = a.get("coordinate_transformation_mode", "half_pixel")
        nearest_mode = a.get("nearest_mode", "round_prefer_floor")
    axes = [_axis(v, data.ndim) for v in a.get("axes", range(data.ndim))]
    mode = a.get("mode", "nearest")
    out = data
    for i, axis in enumerate(axes):
        size = data.shape[axis]
        if sizes:
            new, scale = sizes[i], sizes[i] / size
        else:
            scale = scales[i]
            new = math.floor(size * scale)
        if new == size and scale == 1.0:
            continue
        coords = _resize_coordinates(coordinate, new, size, scale)
        if mode == "nearest":
            picks = torch.from_numpy(_nearest(coords, nearest_mode, size))
            out = out.index_select(axis, picks)
            continue
        coords = np.clip(coords, 0, size - 1)
        low = np.floor(coords).astype(np.int64)
        high = np.minimum(low + 1, size - 1)
        weight_shape = [1] * data.ndim
        weight_shape[axis] = new
        w = torch.from_numpy((coords - low).astype(np.float32)).reshape(weight_shape).to(out.dtype)
        out = (
            out.index_select(axis, torch.from_numpy(low)) * (1 - w)
            + out.index_select(axis, torch.from_numpy(high)) * w
        )
    return [out]


def _shape(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    dims = list(data.shape)
    start, end = int(a.get("start", 0)), a.get("end")
    return [torch.tensor(dims[start : None if end is None else int(end)], dtype=torch.int64)]


def _size(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [torch.tensor(x[0].numel(), dtype=torch.int64)]


def _gather(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data, indices = x[0], x[1]
    assert data is not None and indices is not None
    axis = _axis(int(a.get("axis", 0)), data.ndim)
    size = data.shape[axis]
    flat = indices.reshape(-1).to(torch.int64)
    flat = torch.where(flat < 0, flat + size, flat)
    picked = data.index_select(axis, flat)
    return [picked.reshape([*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]])]


def _cast(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [x[0].to(TORCH_DTYPES[ir.DataType(int(a["to"]))])]


def _constant_of_shape(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    value = a.get("value")
    fill = torch.zeros((), dtype=torch.float32) if value is None else as_tensor(value.numpy())
    return [torch.full(tuple(_ints(x[0])), fill.reshape(()).item(), dtype=fill.dtype)]


def _expand(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    data = x[0]
    assert data is not None
    shape = _ints(x[1])
    # ONNX Expand broadcasts both ways (a 1 in the shape keeps the data's dim).
    ones = torch.ones(shape, dtype=data.dtype)
    return [data * ones if data.dtype != torch.bool else data & ones.bool()]


def _tile(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [x[0].repeat(_ints(x[1]))]


def _range(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    start, limit, delta = x[0], x[1], x[2]
    assert start is not None and limit is not None and delta is not None
    return [torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)]


def _where(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    cond, left, right = x[0], x[1], x[2]
    assert cond is not None and left is not None and right is not None
    return [torch.where(cond, left, right)]


def _reduce(kind: str) -> OpFn:
    def op(x: list[Tensor | None], a: Attrs, opset: int) -> Sequence[Tensor]:
        data = x[0]
        assert data is not None
        uses_input = opset >= 18 or (kind == "sum" and opset >= 13)
        axes = _ints(x[1]) if uses_input and len(x) > 1 else list(a.get("axes", []))
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [data]
            axes = list(range(data.ndim))
        dims = [_axis(v, data.ndim) for v in axes]
        if kind == "mean":
            return [data.mean(dim=dims, keepdim=keep)]
        if kind == "sum":
            return [data.sum(dim=dims, keepdim=keep)]
        if kind == "max":
            return [data.amax(dim=dims, keepdim=keep)]
        return [data.amin(dim=dims, keepdim=keep)]

    return op


def _identity(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [x[0]]


def _dropout(x: list[Tensor | None], a: Attrs, _: int) -> Sequence[Tensor]:
    assert x[0] is not None
    return [x[0], torch.ones_like(x[0], dtype=torch.bool)]


OPS: dict[str, OpFn] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "LayerNormalization": _layer_norm,
    "Relu": _unary(torch.relu),
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "HardSwish": _unary(F.hardswish),
    "HardSigmoid": _hard_sigmoid,
    "LeakyRelu": _leaky_relu,
    "PRelu": _prelu,
    "Elu": _elu,
    "Gelu": _gelu,
    "Softplus": _unary(F.softplus),
    "Erf": _unary(torch.erf),
    "Exp": _unary(torch.exp),
    "Log": _unary(torch.log),
    "Sqrt": _unary(torch.sqrt),
    "Neg": _unary(torch.neg),
    "Abs": _unary(torch.abs),
    "Reciprocal": _unary(torch.reciprocal),
    "Floor": _unary(torch.floor),
    "Ceil": _unary(torch.ceil),
    "Not": _unary(torch.logical_not),
    "Clip": _clip,
    "Softmax": _softmax_like(torch.softmax),
    "LogSoftmax": _softmax_like(torch.log_softmax),
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _binary(_div),
    "Pow": _binary(torch.pow),
    "Equal": _binary(torch.eq),
    "Less": _binary(torch.lt),
    "Greater": _binary(torch.gt),
    "And": _binary(torch.logical_and),
    "Or": _binary(torch.logical_or),
    "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Sum": _variadic(torch.add),
    "Mean": _variadic(torch.add, mean=True),
    "Where": _where,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Concat": _concat,
    "Slice": _slice,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "GlobalAveragePool": _global_pool("avg"),
    "GlobalMaxPool": _global_pool("max"),
    "AveragePool": _average_pool,
    "MaxPool": _max_pool,
    "Pad": _pad,
    "Resize": _resize,
    "Upsample": lambda x, a, opset: _resize(x, a, 10),
    "Identity": _identity,
    "Dropout": _dropout,
    "Shape": _shape,
    "Size": _size,
    "Gather": _gather,
    "Cast": _cast,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "ReduceMean": _reduce("mean"),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
}
#: Ops with more outputs than one whose count decides the result.
MULTI_OUTPUT = {"Split"}
