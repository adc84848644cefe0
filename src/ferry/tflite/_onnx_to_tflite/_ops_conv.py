"""Spatial ops, which TFLite defines on NHWC: convolutions, pooling, resizing.

Before -> After (weights converted once, at export)::

    Conv(x, W[O,I,kh,kw], B)              ->  CONV_2D(x_nhwc, W[O,kh,kw,I], B)
    Conv(x, W[C*M,1,kh,kw], group=C)      ->  DEPTHWISE_CONV_2D(x_nhwc, W[1,kh,kw,C*M], B)
    Conv(x, W[O,I/G,kh,kw], group=G)      ->  CONV_2D(x_nhwc, W[O,kh,kw,I/G], B)   (grouped)
    Conv1D(x[N,C,W])                      ->  RESHAPE to [N,1,W,C], CONV_2D, RESHAPE
    ConvTranspose(x, W[I,O,kh,kw])        ->  TRANSPOSE_CONV(W[O,kh,kw,I]), STRIDED_SLICE (pads)
    MaxPool / AveragePool (pads)          ->  SAME / VALID, or PAD(V2) then VALID
    GlobalAveragePool                     ->  MEAN over H, W
    Resize (nearest / linear)             ->  RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._onnx_to_tflite._layout import axis_of
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS"]

Translator = Callable[[Lowering, ir.Node], None]

NHWC = (0, 2, 3, 1)
NWC = (0, 2, 1)
SAME, VALID = 0, 1


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Spatial:
    """A 1-D or 2-D spatial op seen as 2-D NHWC: 1-D inputs ``[N,C,W]`` become ``[N,1,W,C]``."""

    def __init__(self, cx: Lowering, x: ir.Value, out: ir.Value) -> None:
        self.cx = cx
        self.out = out
        shape = cx.shape(x)
        self.rank = len(shape)
        if self.rank == 4:
            n, c, h, w = shape
            self.input = cx.get(x, NHWC)
        elif self.rank == 3:
            n, c, w = shape
            h = 1
            flat = cx.get(x, NWC)
            self.input = cx.temp(f"{x.name}/2d", cx.ttype_of(flat), (n, 1, w, c), flat)
            cx.emit(
                "RESHAPE", [flat, cx.ints((n, 1, w, c))], [self.input], {"new_shape": [n, 1, w, c]}
            )
        else:
            raise Unsupported(f"{max(self.rank - 2, 0)}-D spatial input (1-D and 2-D are lowered)")
        self.nhwc = (n, h, w, c)
        out_shape = cx.shape(out)
        self.out_nhwc = (
            (out_shape[0], out_shape[2], out_shape[3], out_shape[1])
            if self.rank == 4
            else (out_shape[0], 1, out_shape[2], out_shape[1])
        )

    def attr2(self, values: Sequence[int] | None, default: int) -> tuple[int, int]:
        """A per-spatial-dim attribute as (h, w)."""
        if values is None:
            return (default, default)
        values = tuple(int(v) for v in values)
        return (default, values[0]) if self.rank == 3 else (values[0], values[1])

    def pads2(self, pads: Sequence[int] | None) -> tuple[tuple[int, int], tuple[int, int]]:
        """ONNX pads ``[b1, b2, e1, e2]`` as ((top, bottom), (left, right))."""
        if pads is None:
            return ((0, 0), (0, 0))
        pads = [int(p) for p in pads]
        if self.rank == 3:
            return ((0, 0), (pads[0], pads[1]))
        return ((pads[0], pads[2]), (pads[1], pads[3]))

    def destination(self, ttype: int | None = None) -> int:
        """The tensor the 2-D op writes."""
        if self.rank == 4:
            return self.cx.output(self.out, NHWC, ttype=ttype)
        kind = ttype if ttype is not None else self.cx.ttype(self.out)
        quant = self.cx.quant.get(self.out) if ttype is None else None
        self._flat = self.cx.b.tensor(
            f"{self.out.name}/2d", kind, self.out_nhwc, quant=quant[1] if quant else None
        )
        return self._flat

    def finish(self) -> None:
        """Back to 1-D, for 1-D ops."""
        if self.rank == 3:
            n, _, w, c = self.out_nhwc
            dest = self.cx.output(self.out, NWC)
            self.cx.b.tensors[dest].quant = self.cx.b.tensors[self._flat].quant
            self.cx.emit(
                "RESHAPE", [self._flat, self.cx.ints((n, w, c))], [dest], {"new_shape": [n, w, c]}
            )


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's SAME: the output is ceil(size / stride), any odd pad goes at the end."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _pads(
    node: ir.Node, sp: _Spatial, kernel: tuple[int, int], strides: tuple[int, int],
    dilations: tuple[int, int],
) -> list[tuple[int, int]]:  # fmt: skip
    """The explicit pads the node asks for, per spatial dim (auto_pad resolved)."""
    auto = _text(attr(node, "auto_pad", "NOTSET"))
    sizes = sp.nhwc[1:3]
    outs = sp.out_nhwc[1:3]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        result = []
        for size, out, k, s, d in zip(sizes, outs, kernel, strides, dilations):
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            small, large = total // 2, total - total // 2
            result.append((small, large) if auto == "SAME_UPPER" else (large, small))
        return result
    if auto == "VALID":
        return [(0, 0), (0, 0)]
    return list(sp.pads2(attr(node, "pads", None)))


def _padding(
    sp: _Spatial, pads: list[tuple[int, int]], kernel: tuple[int, int], strides: tuple[int, int],
    dilations: tuple[int, int],
) -> int | None:  # fmt: skip
    """TFLite's SAME or VALID when either gives exactly these pads and output size, else None."""
    sizes = sp.nhwc[1:3]
    outs = sp.out_nhwc[1:3]
    if all(p == (0, 0) for p in pads) and all(
        o == (n - (k - 1) * d - 1) // s + 1
        for n, o, k, s, d in zip(sizes, outs, kernel, strides, dilations)
    ):
        return VALID
    same = [_same_pads(n, k, s, d) for n, k, s, d in zip(sizes, kernel, strides, dilations)]
    if list(pads) == same and all(o == -(-n // s) for n, o, s in zip(sizes, outs, strides)):
        return SAME
    return None


def _explicit_pad(
    cx: Lowering, sp: _Spatial, source: int, pads: list[tuple[int, int]], value: float | None
) -> tuple[int, tuple[int, int, int, int]]:
    """PAD (or PADV2 with ``value``) before a VALID op; the padded tensor and its shape."""
    n, h, w, c = sp.nhwc
    (top, bottom), (left, right) = pads
    shape = (n, h + top + bottom, w + left + right, c)
    padded = cx.temp(f"{sp.out.name}/pad", cx.ttype_of(source), shape, source)
    paddings = cx.constant(
        np.asarray([[0, 0], [top, bottom], [left, right], [0, 0]], dtype=np.int32), "paddings"
    )
    if value is None or value == 0.0:
        cx.emit("PAD", [source, paddings], [padded])
    else:
        cx.emit("PADV2", [source, paddings, cx.fill(value, source, "pad_value")], [padded])
    return padded, shape


# --------------------------------------------------------------------------------- convolution


def _conv(cx: Lowering, node: ir.Node) -> None:
    x, w_value = node.inputs[0], node.inputs[1]
    if x is None or w_value is None:
        raise Unsupported("an input is missing")
    weights = cx.const(w_value)
    if weights is None:
        raise Unsupported(
            "the weights are computed at run time (TFLite convolutions take constant filters)"
        )
    out = node.outputs[0]
    sp = _Spatial(cx, x, out)
    if weights.ndim == 3:
        weights = weights[:, :, None, :]  # [O, I, k] -> [O, I, 1, k]
    o_ch, i_per_group, kh, kw = weights.shape
    group = int(attr(node, "group", 1))
    c_in = sp.nhwc[3]
    kernel = (kh, kw)
    strides = sp.attr2(attr(node, "strides", None), 1)
    dilations = sp.attr2(attr(node, "dilations", None), 1)
    bias_value = node.inputs[2] if len(node.inputs) > 2 else None
    bias = cx.const(bias_value) if bias_value is not None else None
    if bias_value is not None and bias is None:
        raise Unsupported("the bias is computed at run time")
    if bias is None:
        bias = np.zeros(o_ch, dtype=weights.dtype)
    pads = _pads(node, sp, kernel, strides, dilations)
    padding = _padding(sp, pads, kernel, strides, dilations)
    source = sp.input
    if padding is None:
        source, _ = _explicit_pad(cx, sp, source, pads, None)
        padding = VALID
    options = {
        "padding": padding,
        "stride_h": strides[0],
        "stride_w": strides[1],
        "dilation_h_factor": dilations[0],
        "dilation_w_factor": dilations[1],
        "fused_activation_function": 0,
    }
    dest = sp.destination()
    w_t, b_t = _filters(cx, node, weights, bias, group, c_in, source)
    if group > 1 and group == c_in and i_per_group == 1:
        depthwise = {**options, "depth_multiplier": o_ch // group}
        cx.emit("DEPTHWISE_CONV_2D", [source, w_t, b_t], [dest], depthwise)
    else:
        # Grouped convolutions too: CONV_2D reads the group count off the filter's input depth
        # (LiteRT's builtin, reference and XNNPACK kernels take it; op version 6).
        cx.emit("CONV_2D", [source, w_t, b_t], [dest], options)
    sp.finish()


def _filters(
    cx: Lowering, node: ir.Node, weights: np.ndarray, bias: np.ndarray, group: int, c_in: int,
    source: int,
) -> tuple[int, int]:  # fmt: skip
    """The filter and bias tensors of a convolution (OHWI, or 1HWO for depthwise)."""
    name = node.name or "conv"
    if group != 1 and group == c_in and weights.shape[1] == 1:
        w = weights.transpose(1, 2, 3, 0)
    else:
        w = weights.transpose(0, 2, 3, 1)
    w_t = cx.weight(
        np.ascontiguousarray(w),
        f"{name}/filter",
        node,
        axis=3 if w.shape[0] == 1 and group != 1 else 0,
        value=node.inputs[1],
    )
    b_t = cx.bias(bias, f"{name}/bias", node, source=source, weight=w_t)
    return w_t, b_t


def _conv_transpose(cx: Lowering, node: ir.Node) -> None:
    x, w_value = node.inputs[0], node.inputs[1]
    if x is None or w_value is None:
        raise Unsupported("an input is missing")
    weights = cx.const(w_value)
    if weights is None:
        raise Unsupported("the weights are computed at run time")
    if int(attr(node, "group", 1)) != 1:
        raise Unsupported("group > 1 (TFLite's TRANSPOSE_CONV is not grouped)")
    out = node.outputs[0]
    sp = _Spatial(cx, x, out)
    if weights.ndim == 3:
        weights = weights[:, :, None, :]
    _, c_out, kh, kw = weights.shape
    strides = sp.attr2(attr(node, "strides", None), 1)
    dilations = sp.attr2(attr(node, "dilations", None), 1)
    if dilations != (1, 1):
        raise Unsupported(f"dilations {dilations} (TFLite's TRANSPOSE_CONV has none)")
    n, h, w, _ = sp.nhwc
    full = (n, (h - 1) * strides[0] + kh, (w - 1) * strides[1] + kw, c_out)
    bias_value = node.inputs[2] if len(node.inputs) > 2 else None
    bias = cx.const(bias_value) if bias_value is not None else None
    if bias_value is not None and bias is None:
        raise Unsupported("the bias is computed at run time")
    if bias is None:
        bias = np.zeros(c_out, dtype=weights.dtype)
    _, oh, ow, _ = sp.out_nhwc
    auto = _text(attr(node, "auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        tops = []
        for size, o in ((full[1], oh), (full[2], ow)):
            total = max(size - o, 0)
            tops.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        top, left = tops
    else:
        (top, _), (left, _) = sp.pads2(attr(node, "pads", None))
    w_t = cx.weight(
        np.ascontiguousarray(weights.transpose(1, 2, 3, 0)), f"{node.name}/filter", node,
        value=w_value,
    )  # fmt: skip
    b_t = cx.bias(bias, f"{node.name}/bias", node, source=sp.input, weight=w_t)
    options = {
        "padding": VALID,
        "stride_h": strides[0],
        "stride_w": strides[1],
        "fused_activation_function": 0,
    }
    crop = (top, left) != (0, 0) or (oh, ow) != full[1:3]
    if oh > full[1] - top or ow > full[2] - left:
        raise Unsupported("output_padding beyond the kernel's reach")
    dest = sp.destination()
    if not crop:
        cx.emit(
            "TRANSPOSE_CONV", [cx.ints(full, "output_shape"), w_t, sp.input, b_t], [dest], options
        )
    else:
        whole = cx.temp(f"{out.name}/full", cx.ttype_of(dest), full, dest)
        cx.emit(
            "TRANSPOSE_CONV", [cx.ints(full, "output_shape"), w_t, sp.input, b_t], [whole], options
        )
        cut = [cx.ints([0, top, left, 0], "begin"), cx.ints([n, oh, ow, c_out], "size")]
        cx.emit("SLICE", [whole, *cut], [dest])
    sp.finish()


# ------------------------------------------------------------------------------------ pooling


def _pool(kind: str) -> Translator:
    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        if len([o for o in node.outputs if o.uses() or o.is_graph_output()]) > 1:
            raise Unsupported("the Indices output is used")
        out = node.outputs[0]
        sp = _Spatial(cx, x, out)
        kernel = sp.attr2(attr(node, "kernel_shape"), 1)
        strides = sp.attr2(attr(node, "strides", None), 1)
        dilations = sp.attr2(attr(node, "dilations", None), 1)
        if dilations != (1, 1):
            raise Unsupported(f"dilations {dilations}")
        pads = _pads(node, sp, kernel, strides, dilations)
        # The pads the output size needs at the end: ceil_mode reads past the declared pads, a
        # floor may leave some unread (VALID drops what no window reaches).
        needed = []
        for (before, _), size, o, k, s in zip(
            pads, sp.nhwc[1:3], sp.out_nhwc[1:3], kernel, strides
        ):
            after = max((o - 1) * s + k - size - before, 0)
            if (size + before + after - k) // s + 1 != o:
                raise Unsupported("pads that crop the input")
            needed.append((before, after))
        padding = _padding(sp, needed, kernel, strides, (1, 1))
        source = sp.input
        opcode = "MAX_POOL_2D" if kind == "max" else "AVERAGE_POOL_2D"
        options = {
            "padding": padding if padding is not None else VALID,
            "stride_h": strides[0],
            "stride_w": strides[1],
            "filter_height": kernel[0],
            "filter_width": kernel[1],
            "fused_activation_function": 0,
        }
        divisor = None
        if padding is None:
            lowest = float(np.finfo(np.float32).min)
            source, _ = _explicit_pad(cx, sp, source, needed, lowest if kind == "max" else 0.0)
            if kind == "avg":
                divisor = _avg_divisor(
                    sp, needed, kernel, strides, bool(attr(node, "count_include_pad", 0)), pads
                )
        elif (
            kind == "avg"
            and padding == SAME
            and attr(node, "count_include_pad", 0)
            and any(p != (0, 0) for p in needed)
        ):
            # SAME leaves the pads out of the average; ONNX counts them here.
            source, _ = _explicit_pad(cx, sp, source, needed, 0.0)
            options["padding"] = VALID
            divisor = _avg_divisor(sp, needed, kernel, strides, True, pads)
        if divisor is not None and cx.int8:
            raise Unsupported("an average over explicit pads, on integers")
        dest = sp.destination()
        if divisor is None:
            cx.emit(opcode, [source], [dest], options)
        else:
            pooled = cx.temp(f"{out.name}/sum", cx.ttype_of(dest), cx.b.tensors[dest].shape, dest)
            cx.emit(opcode, [source], [pooled], options)
            cx.emit(
                "MUL",
                [pooled, cx.constant(divisor, "avg_scale")],
                [dest],
                {"fused_activation_function": 0},
            )
        sp.finish()

    return lower


def _avg_divisor(
    sp: _Spatial, needed: list[tuple[int, int]], kernel: tuple[int, int], strides: tuple[int, int],
    count_pads: bool, declared: list[tuple[int, int]],
) -> np.ndarray | None:  # fmt: skip
    """The factor turning VALID averages over the zero-padded input into ONNX's: ONNX divides
    by the number of input elements in the window (``count_include_pad=0``) or of elements
    within the declared pads (``=1``), not by the window's size. None when that is the same."""
    _, oh, ow, _ = sp.out_nhwc
    h, w = sp.nhwc[1:3]
    factors = []
    for o, size, (before, _), (d_before, d_after), k, s in zip(
        (oh, ow), (h, w), needed, declared, kernel, strides
    ):
        start = np.arange(o) * s - before
        end = start + k
        if count_pads:
            low, high = -d_before, size + d_after
        else:
            low, high = 0, size
        counted = np.minimum(end, high) - np.maximum(start, low)
        factors.append(k / np.maximum(counted, 1))
    grid = np.outer(factors[0], factors[1]).astype(np.float32)
    if np.allclose(grid, 1.0):
        return None
    return grid[None, :, :, None]


def _global_pool(opcode: str) -> Translator:
    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        rank = cx.rank(x)
        perm = cx.perm(x)
        axes = sorted(axis_of(perm, a) for a in range(2, rank))
        ins = [cx.get(x), cx.ints(axes, "axes")]
        cx.emit(opcode, ins, [cx.output(node.outputs[0], perm)], {"keep_dims": True})

    return lower


def _lrn(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    size = int(attr(node, "size"))
    if size % 2 == 0:
        raise Unsupported(f"an even size ({size}): TFLite's window is centred")
    if cx.rank(x) != 4:
        raise Unsupported("only 4-D inputs")
    options = {
        "radius": (size - 1) // 2,
        "bias": float(attr(node, "bias", 1.0)),
        "alpha": float(attr(node, "alpha", 1e-4)) / size,
        "beta": float(attr(node, "beta", 0.75)),
    }
    cx.emit(
        "LOCAL_RESPONSE_NORMALIZATION",
        [cx.get(x, NHWC)],
        [cx.output(node.outputs[0], NHWC)],
        options,
    )


# ------------------------------------------------------------------------------------- resize


def _onnx_coordinates(mode: str, out: int, size: int, scale: float) -> np.ndarray:
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return x * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise Unsupported(f"coordinate_transformation_mode={mode!r}")


def _onnx_nearest(coords: np.ndarray, rule: str, size: int) -> np.ndarray:
    if rule == "floor":
        idx = np.floor(coords)
    elif rule == "ceil":
        idx = np.ceil(coords)
    elif rule == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif rule == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    else:
        raise Unsupported(f"nearest_mode={rule!r}")
    return np.clip(idx, 0, size - 1).astype(np.int64)


def _tflite_coordinates(out: int, size: int, align: bool, half: bool) -> np.ndarray:
    x = np.arange(out, dtype=np.float32)
    scale = np.float32((size - 1) / (out - 1)) if align and out > 1 else np.float32(size / out)
    if half:
        return (x + np.float32(0.5)) * scale
    return x * scale


def _tflite_nearest(out: int, size: int, align: bool, half: bool) -> np.ndarray:
    value = _tflite_coordinates(out, size, align, half)
    idx = np.floor(value + np.float32(0.5)) if align else np.floor(value)
    return np.clip(idx, 0, size - 1).astype(np.int64)


_CONFIGS = ((False, False), (False, True), (True, False))


def _resize(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    out = node.outputs[0]
    in_shape, out_shape = cx.shape(x), cx.shape(out)
    if len(in_shape) != 4 or in_shape[:2] != out_shape[:2]:
        raise Unsupported("resizing other than the two spatial dims of a 4-D tensor")
    if node.op_type == "Upsample":
        mode = _text(attr(node, "mode", "nearest"))
        coordinate, rule = "asymmetric", "floor"
        scales_v = node.inputs[1] if len(node.inputs) > 1 else None
        given = cx.const(scales_v)
        if scales_v is not None and given is None:
            raise Unsupported("the scales are computed at run time")
        scales = [
            float(s) for s in (given.reshape(-1) if given is not None else attr(node, "scales", ()))
        ]
    else:
        mode = _text(attr(node, "mode", "nearest"))
        coordinate = _text(attr(node, "coordinate_transformation_mode", "half_pixel"))
        rule = _text(attr(node, "nearest_mode", "round_prefer_floor"))
        if len(node.inputs) == 2:  # opset 10: (X, scales)
            scales_v = node.inputs[1]
        else:
            scales_v = node.inputs[2] if len(node.inputs) > 2 else None
        found = cx.const(scales_v) if scales_v is not None else None
        scales = [] if found is None else [float(s) for s in found.reshape(-1)]
        for name in ("antialias", "exclude_outside"):
            if attr(node, name, 0):
                raise Unsupported(f"{name}=1")
        if attr(node, "axes", None) is not None:
            raise Unsupported("the axes attribute")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"mode={mode!r} (TFLite resizes by nearest neighbour or bilinear)")
    maps = []
    for axis in (2, 3):
        size, o = in_shape[axis], out_shape[axis]
        scale = scales[axis] if len(scales) == 4 else o / size
        maps.append((size, o, scale))
    chosen = None
    for align, half in _CONFIGS:
        fits = True
        for size, o, scale in maps:
            want = _onnx_coordinates(coordinate, o, size, scale)
            if mode == "nearest":
                fits &= bool(
                    np.array_equal(
                        _onnx_nearest(want, rule, size), _tflite_nearest(o, size, align, half)
                    )
                )
            else:
                have = _tflite_coordinates(o, size, align, half) - (0.5 if half else 0.0)
                fits &= bool(
                    np.allclose(np.clip(want, 0, size - 1), np.clip(have, 0, size - 1), atol=1e-4)
                )
        if fits:
            chosen = (align, half)
            break
    if chosen is None:
        raise Unsupported(
            f"coordinate_transformation_mode={coordinate!r}"
            + (f" with nearest_mode={rule!r}" if mode == "nearest" else "")
            + " at these sizes: no TFLite resize (align_corners / half_pixel_centers) samples the same points"
        )
    opcode = "RESIZE_NEAREST_NEIGHBOR" if mode == "nearest" else "RESIZE_BILINEAR"
    options = {"align_corners": chosen[0], "half_pixel_centers": chosen[1]}
    size_t = cx.ints(out_shape[2:], "size")
    cx.emit(opcode, [cx.get(x, NHWC), size_t], [cx.output(out, NHWC)], options)


OPS: dict[str, Translator] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global_pool("MEAN"),
    "GlobalMaxPool": _global_pool("REDUCE_MAX"),
    "LRN": _lrn,
    "Resize": _resize,
    "Upsample": _resize,
}
