"""TFLite -> ONNX translators: convolutions, fully connected and matmul, pooling, resizing, and
space/batch/depth rearrangements (NCHW-only ONNX ops take their input through ``b.to_nchw``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ferry.tflite._schema import TFLiteOperator, TFLiteTensor
from ferry.tflite._tflite_to_onnx._builder import NCHW, Builder
from ferry.tflite._tflite_to_onnx._ops import (
    _SAME,
    CUSTOM_TRANSLATORS,
    TRANSLATORS,
    Translator,
    _as_int64,
    _axes,
    _dilations,
    _fused,
    _out,
    _padding,
    _register,
    _spatial,
    _strides,
)
from ferry.tflite._unsupported import Unsupported

__all__: list[str] = []


# ------------------------------------------------------------------------------- convolution


@_register("CONV_2D")
def _conv_2d(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if w.rank != 4:
        raise Unsupported(f"filter rank {w.rank}, expected 4 (OHWI)")
    _, kh, kw, cin_per_group = w.shape
    channels = x.dims[3] if x.rank == 4 else None
    groups = channels // cin_per_group if channels and cin_per_group else 1
    strides, dilations = _strides(op), _dilations(op)
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "dilations": list(dilations),
        "group": groups,
        **_padding(b, op, x, (kh, kw), strides, dilations),
    }
    weight = b.weight(w.index, perm=NCHW)
    y = b.op1("Conv", [b.to_nchw(b.get(0)), weight, b.get_opt(2)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


@_register("DEPTHWISE_CONV_2D")
def _depthwise_conv_2d(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if w.rank != 4 or w.shape[0] != 1:
        raise Unsupported(f"filter shape {list(w.shape)}, expected [1, h, w, channels]")
    _, kh, kw, out_channels = w.shape
    channels = x.dims[3] if x.rank == 4 else None
    if channels is None:
        multiplier = int(op.options.get("depth_multiplier", 1) or 1)
        channels = out_channels // multiplier
    strides, dilations = _strides(op), _dilations(op)
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "dilations": list(dilations),
        "group": channels,
        **_padding(b, op, x, (kh, kw), strides, dilations),
    }
    # [1, h, w, C*M] -> [C*M, 1, h, w]: output channel c*M+m reads input channel c, which is
    # exactly ONNX's grouped convolution with one group per input channel.
    weight = b.weight(w.index, perm=(3, 0, 1, 2))
    y = b.op1("Conv", [b.to_nchw(b.get(0)), weight, b.get_opt(2)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


@_register("TRANSPOSE_CONV")
def _transpose_conv(b: Builder, op: TFLiteOperator) -> None:
    shape = b.constant(0)
    out_dims = (
        [int(v) for v in shape.reshape(-1)] if shape is not None else list(b.output_tensor().dims)
    )
    same = int(op.options.get("padding", _SAME)) == _SAME
    _deconv(b, op, x=2, w=1, bias=3, out_dims=out_dims, same=same, strides=_strides(op))


def _deconv(
    b: Builder,
    op: TFLiteOperator,
    *,
    x: int,
    w: int,
    bias: int,
    out_dims: Sequence[int | None],
    same: bool,
    strides: tuple[int, int],
) -> None:
    """A transposed convolution with TFLite's padding, which crops the full output: SAME
    centres the crop (the odd pixel cropped at the end), VALID crops at the end only."""
    wt, xt = b.need(w), b.need(x)
    if wt.rank != 4:
        raise Unsupported(f"weight rank {wt.rank}, expected 4 (OHWI)")
    _, kh, kw, _ = wt.shape
    in_h, in_w = _spatial(xt)
    if in_h is None or in_w is None or None in out_dims[1:3]:
        raise Unsupported("its spatial sizes must be static to place TFLite's padding exactly")
    pads_begin, pads_end, extra = [], [], []
    for size, kernel, stride, out in zip(
        (in_h, in_w), (kh, kw), strides, (int(out_dims[1] or 0), int(out_dims[2] or 0))
    ):
        crop = (size - 1) * stride + kernel - out
        begin = max(crop, 0) // 2 if same else 0
        end = crop - begin
        pads_begin.append(begin)
        pads_end.append(max(end, 0))
        extra.append(max(-end, 0))  # an output larger than the full one is zero-extended
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "pads": pads_begin + pads_end,
    }
    if any(extra):
        attrs["output_padding"] = extra
    # [out, h, w, in] -> [in, out, h, w], ONNX ConvTranspose's weight layout.
    weight = b.weight(wt.index, perm=(3, 0, 1, 2))
    y = b.op1("ConvTranspose", [b.to_nchw(b.get(x)), weight, b.get_opt(bias)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


def _convolution_2d_transpose_bias(b: Builder, op: TFLiteOperator) -> None:
    """MediaPipe's custom transposed convolution: (input, weights OHWI, bias); its options are
    TfLiteTransposeConvParams as raw int32s: padding (1 SAME, 2 VALID), stride_w, stride_h."""
    raw = op.custom_options or b""
    if len(raw) < 12:
        raise Unsupported("its custom options are not TfLiteTransposeConvParams")
    padding, stride_w, stride_h = (int(v) for v in np.frombuffer(raw[:12], dtype="<i4"))
    if padding not in (1, 2):
        raise Unsupported(f"padding code {padding}")
    out_dims = list(b.output_tensor().dims)
    _deconv(
        b, op, x=0, w=1, bias=2, out_dims=out_dims, same=padding == 1, strides=(stride_h, stride_w)
    )


CUSTOM_TRANSLATORS["Convolution2DTransposeBias"] = _convolution_2d_transpose_bias


@_register("FULLY_CONNECTED")
def _fully_connected(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if int(op.options.get("weights_format", 0)) != 0:
        raise Unsupported("shuffled weights (weights_format SHUFFLED4x16INT8)")
    if w.rank != 2:
        raise Unsupported(f"weight rank {w.rank}, expected 2")
    in_features = w.shape[1]
    value = b.get(0)
    out_rank = b.output_tensor().rank
    bias = b.get_opt(2)
    if out_rank == 2 or not op.options.get("keep_num_dims", False):
        if x.rank != 2:
            value = b.op1("Reshape", [value, b.ints([-1, in_features], "shape")], name="flatten")
        y = b.op1("Gemm", [value, b.weight(w.index), bias], {"transB": 1})
    else:
        y = b.op1("MatMul", [value, b.weight(w.index, perm=(1, 0))])
        if bias is not None:
            y = b.op1("Add", [y, bias])
    b.bind(_out(op), _fused(b, op, y))


@_register("BATCH_MATMUL")
def _batch_matmul(b: Builder, op: TFLiteOperator) -> None:
    operands = []
    for i, flag in ((0, "adj_x"), (1, "adj_y")):
        t = b.need(i)
        value = b.get(i)
        if op.options.get(flag, False):
            perm = [*range(t.rank - 2), t.rank - 1, t.rank - 2]
            value = (
                b.weight(t.index, perm=perm)
                if b.is_constant(t.index)
                else b.op1("Transpose", [value], {"perm": perm})
            )
        operands.append(value)
    b.bind(_out(op), b.op1("MatMul", operands))


# ---------------------------------------------------------------------------------- pooling


def _pool(onnx_op: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        x = b.need(0)
        kernel = (int(op.options["filter_height"]), int(op.options["filter_width"]))
        strides = _strides(op)
        attrs: dict[str, object] = {
            "kernel_shape": list(kernel),
            "strides": list(strides),
            **_padding(b, op, x, kernel, strides),
        }
        # TFLite averages over the valid pixels only: ONNX's count_include_pad=0 (the default).
        y = b.op1(onnx_op, [b.to_nchw(b.get(0))], attrs)
        b.bind_nchw(_out(op), _fused(b, op, y))

    return translate


TRANSLATORS["AVERAGE_POOL_2D"] = _pool("AveragePool")
TRANSLATORS["MAX_POOL_2D"] = _pool("MaxPool")


# ------------------------------------------------------------------------------- resizing


def _resize(mode: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        align = bool(op.options.get("align_corners", False))
        half = bool(op.options.get("half_pixel_centers", False))
        if align and half:
            raise Unsupported("align_corners and half_pixel_centers together")
        if align:
            transform = "align_corners"
        elif half:
            transform = "half_pixel"
        else:
            transform = "asymmetric"
        attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": transform}
        if mode == "nearest":
            # TFLite floors (asymmetric) or rounds half up (align_corners; half_pixel, where
            # round((out + 0.5) * scale - 0.5) == floor((out + 0.5) * scale)).
            attrs["nearest_mode"] = "floor" if transform == "asymmetric" else "round_prefer_ceil"
        # Sizes for all four NHWC dims rather than `axes=[1, 2]`: ONNX Runtime's layout
        # optimizer (ORT_ENABLE_ALL) breaks Resize nodes that have `axes` (seen with ORT 1.32).
        x = b.need(0)
        if x.rank != 4:
            raise Unsupported(f"input rank {x.rank}, expected 4 (NHWC)")
        batch, channels = x.dims[0], x.dims[3]
        hw = b.constant(1)
        twin = b.nchw_twin(b.get(0))
        if twin is not None and batch is not None and channels is not None and hw is not None:
            sizes = b.ints([batch, channels, *[int(v) for v in hw.reshape(-1)]], "sizes")
            b.bind_nchw(_out(op), b.op1("Resize", [twin, None, None, sizes], attrs))
            return
        if batch is not None and channels is not None and hw is not None:
            sizes = b.ints([batch, *[int(v) for v in hw.reshape(-1)], channels], "sizes")
        else:
            shape = b.op1("Shape", [b.get(0)])
            sizes = b.op1(
                "Concat",
                [
                    b.op1("Slice", [shape, b.ints([0], "starts"), b.ints([1], "ends")]),
                    _as_int64(b, 1),
                    b.op1("Slice", [shape, b.ints([3], "starts"), b.ints([4], "ends")]),
                ],
                {"axis": 0},
                name="sizes",
            )
        b.bind(_out(op), b.op1("Resize", [b.get(0), None, None, sizes], attrs))

    return translate


TRANSLATORS["RESIZE_BILINEAR"] = _resize("linear")
TRANSLATORS["RESIZE_NEAREST_NEIGHBOR"] = _resize("nearest")


@_register("SPACE_TO_BATCH_ND")
def _space_to_batch_nd(b: Builder, op: TFLiteOperator) -> None:
    """Pad the block dims, split each into (size / block, block), move the block offsets in
    front of the batch: [N, S.., C] -> [prod(block) * N, S / block.., C]."""
    x = b.need(0)
    block = _axes(b, 1, "block_shape")
    pads = np.asarray(b.static(2, "paddings"), dtype=np.int64).reshape(-1, 2)
    m = len(block)
    sizes = _static_dims(x, range(1, x.rank), "SPACE_TO_BATCH_ND")
    padded = [sizes[i] + int(pads[i].sum()) for i in range(m)]
    if any(p % k for p, k in zip(padded, block)):
        raise Unsupported("padded sizes that the block does not divide")
    rest = sizes[m:]
    value = b.get(0)
    if pads.any():
        full = np.zeros((x.rank, 2), dtype=np.int64)
        full[1 : m + 1] = pads
        value = b.op1("Pad", [value, b.ints(np.concatenate([full[:, 0], full[:, 1]]), "pads")])
    split = [-1]
    for p, k in zip(padded, block):
        split += [p // k, k]
    value = b.op1("Reshape", [value, b.ints(split + rest, "shape")])
    perm = [2 * i + 2 for i in range(m)] + [0] + [2 * i + 1 for i in range(m)]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    value = b.op1("Transpose", [value], {"perm": perm})
    out = [-1] + [p // k for p, k in zip(padded, block)] + rest
    b.bind(_out(op), b.op1("Reshape", [value, b.ints(out, "shape")]))


@_register("BATCH_TO_SPACE_ND")
def _batch_to_space_nd(b: Builder, op: TFLiteOperator) -> None:
    """The inverse of SPACE_TO_BATCH_ND, then crop: [prod(block) * N, S.., C] -> [N, S * block
    - crops.., C]."""
    x = b.need(0)
    block = _axes(b, 1, "block_shape")
    crops = np.asarray(b.static(2, "crops"), dtype=np.int64).reshape(-1, 2)
    m = len(block)
    sizes = _static_dims(x, range(1, x.rank), "BATCH_TO_SPACE_ND")
    rest = sizes[m:]
    value = b.op1("Reshape", [b.get(0), b.ints([*block, -1, *sizes], "shape")])
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    value = b.op1("Transpose", [value], {"perm": perm})
    full = [s * k for s, k in zip(sizes[:m], block)]
    value = b.op1("Reshape", [value, b.ints([-1, *full, *rest], "shape")])
    if crops.any():
        starts = [int(c) for c in crops[:, 0]]
        ends = [f - int(c) for f, c in zip(full, crops[:, 1])]
        value = b.op1(
            "Slice",
            [
                value,
                b.ints(starts, "starts"),
                b.ints(ends, "ends"),
                b.ints(range(1, m + 1), "axes"),
            ],
            name="crop",
        )
    b.bind(_out(op), value)


def _static_dims(t: TFLiteTensor, axes: range, what: str) -> list[int]:
    dims = [t.dims[a] for a in axes]
    if any(d is None for d in dims):
        raise Unsupported(f"{what} needs the non-batch dims of {t.name!r} static")
    return [int(d) for d in dims if d is not None]


@_register("DEPTH_TO_SPACE")
def _depth_to_space(b: Builder, op: TFLiteOperator) -> None:
    # TF's NHWC depth_to_space orders the depth as (block_y, block_x, channel): ONNX's DCR.
    block = int(op.options["block_size"])
    y = b.op1("DepthToSpace", [b.to_nchw(b.get(0))], {"blocksize": block, "mode": "DCR"})
    b.bind_nchw(_out(op), y)


@_register("SPACE_TO_DEPTH")
def _space_to_depth(b: Builder, op: TFLiteOperator) -> None:
    block = int(op.options["block_size"])
    y = b.op1("SpaceToDepth", [b.to_nchw(b.get(0))], {"blocksize": block})
    b.bind_nchw(_out(op), y)
