"""The NCHW -> NHWC layout pass: permutation arithmetic, and whole blocks that keep NHWC inside.

A ResNet-like and a MobileNet-like block built in code export with no TRANSPOSE in their body:
the only ones left are at the NCHW input and output, and ``nhwc_io`` removes those too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from tflite_graphs import body_transposes, export, model, opcodes, weights

from ferry.tflite._onnx_to_tflite._layout import (
    after_reduce,
    after_transpose,
    channels_last,
    inverse,
    memory_order_kept,
    permute,
    reshape_perm,
    transpose_between,
)

N = helper.make_node
NHWC = (0, 2, 3, 1)


# ----------------------------------------------------------------------- permutation arithmetic


def test_transpose_between_moves_the_data_as_numpy_does() -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    for have, want in ((NHWC, (0, 1, 2, 3)), ((0, 1, 2, 3), NHWC), ((3, 1, 0, 2), (2, 0, 3, 1))):
        held = x.transpose(have)
        assert np.array_equal(held.transpose(transpose_between(have, want)), x.transpose(want))


def test_an_onnx_transpose_is_a_relabelling() -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    onnx_perm = (0, 3, 1, 2)
    y = x.transpose(onnx_perm)
    held = x.transpose(NHWC)  # the tensor holding x, NHWC
    q = after_transpose(NHWC, onnx_perm)
    assert np.array_equal(y.transpose(q), held)  # the same tensor holds y


def test_reduction_layouts() -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    held = x.transpose(NHWC)
    assert after_reduce(NHWC, [2, 3], keepdims=True) == NHWC
    q = after_reduce(NHWC, [1], keepdims=False)
    assert np.array_equal(x.sum(axis=1).transpose(q), held.sum(axis=3))
    assert inverse(channels_last(4)) == (0, 3, 1, 2)


@pytest.mark.parametrize(
    ("in_shape", "out_shape", "expected"),
    [
        ((1, 8, 1, 1), (1, 8), (0, 1)),  # flatten after a global pool: only size-1 axes move
        ((1, 255, 13, 13), (1, 3, 85, 13, 13), (0, 3, 4, 1, 2)),  # a detector's head
        ((1, 8, 4, 5), (1, 160), None),  # flattening the channels with the pixels: data moves
        ((1, 8, 4, 5), (1, 8, 20), (0, 2, 1)),  # merging H and W: NWC
        ((1, 8, 4, 5), (1, 2, 4, 4, 5), (0, 3, 4, 1, 2)),
    ],
)
def test_reshape_keeps_the_layout_when_the_bytes_allow(
    in_shape: tuple[int, ...], out_shape: tuple[int, ...], expected: tuple[int, ...] | None
) -> None:
    q = reshape_perm(in_shape, NHWC, out_shape)
    assert q == expected
    if q is not None:
        x = np.arange(int(np.prod(in_shape))).reshape(in_shape)
        held = x.transpose(NHWC)
        # RESHAPE of the held tensor to the permuted shape holds the ONNX result in layout q.
        assert np.array_equal(
            held.reshape(permute(out_shape, q)), x.reshape(out_shape).transpose(q)
        )


def test_memory_order_ignores_size_one_axes() -> None:
    assert memory_order_kept((1, 8, 1, 1), NHWC, (0, 1, 2, 3))
    assert not memory_order_kept((1, 8, 2, 1), NHWC, (0, 1, 2, 3))


# ----------------------------------------------------------------------------- whole blocks


def _resnet_block() -> object:
    c = 8
    inits = {
        "w0": weights(c, 3, 3, 3), "b0": weights(c),
        "w1": weights(c, c, 3, 3, scale=0.2), "w2": weights(c, c, 3, 3, scale=0.2),
        "wd": weights(2 * c, c, 1, 1), "w3": weights(2 * c, c, 3, 3, scale=0.2),
        "fc": weights(5, 2 * c), "fb": weights(5),
    }  # fmt: skip
    for k in ("1", "2", "3"):
        n = c if k != "3" else 2 * c
        inits |= {
            f"s{k}": weights(n) + 1,
            f"o{k}": weights(n),
            f"m{k}": weights(n),
            f"v{k}": np.abs(weights(n)) + 0.5,
        }
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("Relu", ["c0"], ["r0"]),
        N("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        N("Conv", ["p0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["n1"]),
        N("Relu", ["n1"], ["r1"]),
        N("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c2", "s2", "o2", "m2", "v2"], ["n2"]),
        N("Add", ["n2", "p0"], ["a2"]),
        N("Relu", ["a2"], ["r2"]),
        N("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("BatchNormalization", ["c3", "s3", "o3", "m3", "v3"], ["n3"]),
        N("Conv", ["r2", "wd"], ["d3"], strides=[2, 2]),
        N("Add", ["n3", "d3"], ["a3"]),
        N("Relu", ["a3"], ["r3"]),
        N("GlobalAveragePool", ["r3"], ["g"]),
        N("Flatten", ["g"], ["f"]),
        N("Gemm", ["f", "fc", "fb"], ["y"], transB=1),
        N("Softmax", ["y"], ["prob"], axis=-1),
    ]
    return model(nodes, {"x": ["N", 3, 32, 32]}, ["prob"], inits)


def _mobilenet_block() -> object:
    c, e = 8, 16
    inits = {
        "w0": weights(c, 3, 3, 3), "we": weights(e, c, 1, 1), "wd": weights(e, 1, 3, 3),
        "wr": weights(4, e, 1, 1), "br": weights(4), "wx": weights(e, 4, 1, 1), "bx": weights(e),
        "wp": weights(c, e, 1, 1), "wh": weights(4, 2 * c, 1, 1),
        "scale": np.array([1, 1, 2, 2], dtype=np.float32),
    }  # fmt: skip
    nodes = [
        N("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        N("HardSwish", ["c0"], ["h0"]),
        N("Conv", ["h0", "we"], ["c1"]),
        N("Clip", ["c1", "lo", "hi"], ["r1"]),
        N("Conv", ["r1", "wd"], ["c2"], group=e, pads=[1, 1, 1, 1]),
        N("HardSwish", ["c2"], ["h2"]),
        # squeeze-and-excitation
        N("GlobalAveragePool", ["h2"], ["g"]),
        N("Conv", ["g", "wr", "br"], ["se1"]),
        N("Relu", ["se1"], ["se2"]),
        N("Conv", ["se2", "wx", "bx"], ["se3"]),
        N("HardSigmoid", ["se3"], ["se4"], alpha=1 / 6, beta=0.5),
        N("Mul", ["h2", "se4"], ["h3"]),
        N("Conv", ["h3", "wp"], ["c4"]),
        N("Add", ["c4", "h0"], ["a4"]),
        N("Concat", ["a4", "h0"], ["cat"], axis=1),
        N("Resize", ["cat", "", "scale"], ["up"], mode="nearest"),
        N("Conv", ["up", "wh"], ["head"]),
        N("Sigmoid", ["head"], ["y"]),
    ]
    inits |= {"lo": np.float32(0), "hi": np.float32(6)}
    return model(nodes, {"x": [1, 3, 32, 32]}, ["y"], inits)


@pytest.mark.parametrize("build", [_resnet_block, _mobilenet_block], ids=["resnet", "mobilenet"])
def test_blocks_keep_nhwc_inside(build, tmp_path: Path) -> None:
    nchw = export(build(), tmp_path / "nchw", samples=None)
    assert body_transposes(nchw) == [], nchw.report.transposes
    # NCHW in (and, for the MobileNet block, a 4-D NCHW out): one transpose at each.
    assert 1 <= len(nchw.report.transposes) <= 2
    nhwc = export(build(), tmp_path / "nhwc", nhwc_io=True)
    assert "TRANSPOSE" not in opcodes(nhwc)
    assert nhwc.report.transposes == []
    four_d = [io for io in (*nhwc.report.inputs, *nhwc.report.outputs) if len(io.shape) == 4]
    assert four_d and all(io.layout == "NHWC" for io in four_d)


def test_resnet_block_folds_batchnorm_and_fuses_activations(tmp_path: Path) -> None:
    result = export(_resnet_block(), tmp_path)
    ops = opcodes(result)
    assert "MUL" not in ops and "RELU" not in ops  # BatchNorm folded, ReLUs fused
    assert result.report.fused_activations >= 3
    assert result.report.batch_fixed == ["x"]
    assert result.report.inputs[0].shape == (1, 3, 32, 32)
