"""Each ONNX op the TFLite export lowers, on a small graph built in code: the ``.tflite`` file runs
in LiteRT (XNNPACK and the reference kernels) and matches ONNX Runtime (``export_tflite``
verifies that, and fails otherwise); the TFLite ops it became are checked too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper
from tflite_graphs import body_transposes, export, model, opcodes, weights

from ferry.errors import UnsupportedOpError

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")

N = helper.make_node
X4 = {"x": [1, 4, 10, 12]}


def _positive(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).uniform(0.1, 3.0, shape).astype(np.float32)}


def _conv_then(op: str, **attrs: Any) -> tuple[list[Any], dict[str, np.ndarray]]:
    """A conv (so the tensor is NHWC) then ``op`` on its result."""
    return (
        [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N(op, ["c"], ["y"], **attrs)],
        {"w": weights(6, 4, 3, 3)},
    )


def _unary(op: str, **attrs: Any) -> Callable[[], Any]:
    def build() -> Any:
        nodes, inits = _conv_then(op, **attrs)
        return model(nodes, X4, ["y"], inits)

    return build


def _binary_const(op: str, const: np.ndarray) -> Callable[[], Any]:
    # A Relu between: the optimizer would fold the constant into the convolution otherwise.
    def build() -> Any:
        nodes = [N("Conv", ["x", "w"], ["c"]), N("Relu", ["c"], ["r"]), N(op, ["r", "k"], ["y"])]
        return model(nodes, X4, ["y"], {"w": weights(6, 4, 1, 1), "k": const})

    return build


# name -> (builder, samples or None, TFLite ops that must be there, ops that must not; TRANSPOSE
# there means none in the body: the NCHW input's and output's are the IO layout's)
CASES: dict[str, tuple[Callable[[], Any], dict[str, np.ndarray] | None, set[str], set[str]]] = {
    "conv_relu_fused": (_unary("Relu"), None, {"CONV_2D"}, {"RELU", "TRANSPOSE_CONV"}),
    "conv_clip6_fused": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                N("Clip", ["c", "lo", "hi"], ["y"]),
            ],
            X4,
            ["y"],
            {"w": weights(6, 4, 3, 3), "lo": np.float32(0), "hi": np.float32(6)},
        ),
        None,
        {"CONV_2D"},
        {"RELU6"},
    ),
    "conv_stride2_explicit_pad": (
        lambda: model(
            [N("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
            X4,
            ["y"],
            {"w": weights(6, 4, 3, 3), "b": weights(6)},
        ),
        None,
        {"PAD", "CONV_2D"},
        set(),
    ),
    "conv_dilated_same": (
        lambda: model(
            [N("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2], dilations=[2, 2])],
            X4,
            ["y"],
            {"w": weights(3, 4, 3, 3)},
        ),
        None,
        {"CONV_2D"},
        {"PAD"},
    ),
    "depthwise_multiplier2": (
        lambda: model(
            [N("Conv", ["x", "w", "b"], ["y"], group=4, pads=[1, 1, 1, 1])],
            X4,
            ["y"],
            {"w": weights(8, 1, 3, 3), "b": weights(8)},
        ),
        None,
        {"DEPTHWISE_CONV_2D"},
        {"CONV_2D"},
    ),
    "grouped_conv": (
        lambda: model(
            [N("Conv", ["x", "w"], ["y"], group=2, pads=[0, 1, 0, 1])],
            X4,
            ["y"],
            {"w": weights(6, 2, 3, 3)},
        ),
        None,
        {"CONV_2D"},
        {"SPLIT", "CONCATENATION"},
    ),
    "conv1d": (
        lambda: model(
            [N("Conv", ["x", "w", "b"], ["y"], pads=[2, 2], strides=[2])],
            {"x": [1, 3, 40]},
            ["y"],
            {"w": weights(5, 3, 5), "b": weights(5)},
        ),
        None,
        {"CONV_2D"},
        set(),
    ),
    "conv_transpose": (
        lambda: model(
            [N("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
            X4,
            ["y"],
            {"w": weights(4, 3, 4, 4), "b": weights(3)},
        ),
        None,
        {"TRANSPOSE_CONV"},
        set(),
    ),
    "maxpool_ceil_pads": (
        lambda: model(
            [
                N(
                    "MaxPool",
                    ["x"],
                    ["y"],
                    kernel_shape=[3, 3],
                    strides=[2, 2],
                    pads=[1, 1, 1, 1],
                    ceil_mode=1,
                )
            ],
            X4,
            ["y"],
        ),
        None,
        {"MAX_POOL_2D"},
        set(),
    ),
    "maxpool_same": (
        lambda: model(
            [N("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])],
            X4,
            ["y"],
        ),
        None,
        {"MAX_POOL_2D"},
        {"PAD", "PADV2"},
    ),
    "avgpool_exclude_pads": (
        lambda: model(
            [
                N(
                    "AveragePool",
                    ["x"],
                    ["y"],
                    kernel_shape=[3, 3],
                    strides=[2, 2],
                    pads=[1, 1, 1, 1],
                )
            ],
            X4,
            ["y"],
        ),
        None,
        {"AVERAGE_POOL_2D"},
        set(),
    ),
    "avgpool_include_pads": (
        lambda: model(
            [
                N(
                    "AveragePool",
                    ["x"],
                    ["y"],
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                    count_include_pad=1,
                )
            ],
            X4,
            ["y"],
        ),
        None,
        {"AVERAGE_POOL_2D"},
        set(),
    ),
    "global_pools": (
        lambda: model(
            [
                N("GlobalAveragePool", ["x"], ["a"]),
                N("GlobalMaxPool", ["x"], ["m"]),
                N("Add", ["a", "m"], ["y"]),
            ],
            X4,
            ["y"],
        ),
        None,
        {"MEAN", "REDUCE_MAX"},
        set(),
    ),
    "gemm_fc": (
        lambda: model(
            [N("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)],
            {"x": [2, 8]},
            ["y"],
            {"w": weights(5, 8), "b": weights(5)},
        ),
        None,
        {"FULLY_CONNECTED"},
        set(),
    ),
    "matmul_3d_fc_bias": (
        lambda: model(
            [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["y"])],
            {"x": [1, 6, 8]},
            ["y"],
            {"w": weights(8, 5), "b": weights(5)},
        ),
        None,
        {"FULLY_CONNECTED"},
        {"ADD"},
    ),
    "matmul_batch": (
        lambda: model(
            [N("Transpose", ["x"], ["t"], perm=[0, 2, 1]), N("MatMul", ["x", "t"], ["y"])],
            {"x": [2, 6, 8]},
            ["y"],
        ),
        None,
        {"BATCH_MATMUL"},
        set(),
    ),
    "einsum_grouped_linear": (
        lambda: model(
            [N("Einsum", ["x", "w"], ["y"], equation="btgi,gih->btgh")],
            {"x": [1, 5, 3, 4]},
            ["y"],
            {"w": weights(3, 4, 2)},
        ),
        None,
        {"BATCH_MATMUL"},
        set(),
    ),
    "add_channel_bias": (_binary_const("Add", weights(6, 1, 1)), None, {"ADD"}, {"TRANSPOSE"}),
    "sub_scalar": (_binary_const("Sub", np.float32(0.5)), None, {"SUB"}, set()),
    "mul_row": (_binary_const("Mul", weights(12)), None, {"MUL"}, set()),
    "div_const_is_mul": (_binary_const("Div", np.float32(4.0)), None, {"MUL"}, {"DIV"}),
    "pow_square": (_binary_const("Pow", np.float32(2.0)), None, {"SQUARE"}, {"POW"}),
    "pow_cube": (_binary_const("Pow", np.float32(3.0)), _positive((1, 4, 10, 12)), {"POW"}, set()),
    "max_min_sum": (
        lambda: model(
            [
                N("Relu", ["x"], ["r"]),
                N("Max", ["x", "r", "k"], ["a"]),
                N("Min", ["a", "x"], ["b"]),
                N("Sum", ["a", "b", "x"], ["y"]),
            ],
            X4,
            ["y"],
            {"k": np.float32(0.2)},
        ),
        None,
        {"MAXIMUM", "MINIMUM", "ADD"},
        set(),
    ),
    "div_two_tensors": (
        lambda: model([N("Exp", ["x"], ["e"]), N("Div", ["x", "e"], ["y"])], X4, ["y"]),
        None,
        {"DIV", "EXP"},
        set(),
    ),
    "sqrt_log_reciprocal": (
        lambda: model(
            [
                N("Sqrt", ["x"], ["s"]),
                N("Log", ["s"], ["l"]),
                N("Reciprocal", ["x"], ["r"]),
                N("Add", ["l", "r"], ["y"]),
            ],
            X4,
            ["y"],
        ),
        _positive((1, 4, 10, 12)),
        {"SQRT", "LOG", "DIV"},
        set(),
    ),
    "neg_abs_floor": (
        lambda: model(
            [N("Neg", ["x"], ["n"]), N("Abs", ["n"], ["a"]), N("Floor", ["a"], ["y"])], X4, ["y"]
        ),
        None,
        {"NEG", "ABS", "FLOOR"},
        set(),
    ),
    "sigmoid_tanh": (
        lambda: model([N("Sigmoid", ["x"], ["s"]), N("Tanh", ["s"], ["y"])], X4, ["y"]),
        None,
        {"LOGISTIC", "TANH"},
        set(),
    ),
    "clip_other_bounds": (
        lambda: model(
            [N("Clip", ["x", "lo", "hi"], ["y"])],
            X4,
            ["y"],
            {"lo": np.float32(-0.3), "hi": np.float32(0.7)},
        ),
        None,
        {"MAXIMUM", "MINIMUM"},
        set(),
    ),
    "clip_n1_1": (
        lambda: model(
            [N("Clip", ["x", "lo", "hi"], ["y"])],
            X4,
            ["y"],
            {"lo": np.float32(-1), "hi": np.float32(1)},
        ),
        None,
        {"RELU_N1_TO_1"},
        set(),
    ),
    "hard_swish": (_unary("HardSwish"), None, {"HARD_SWISH"}, set()),
    "hard_sigmoid": (_unary("HardSigmoid"), None, {"ADD", "MUL"}, set()),
    "hard_sigmoid_alpha": (_unary("HardSigmoid", alpha=0.3, beta=0.4), None, {"ADD", "MUL"}, set()),
    "leaky_relu": (_unary("LeakyRelu", alpha=0.1), None, {"LEAKY_RELU"}, set()),
    "prelu_channel": (
        lambda: model(
            [N("Conv", ["x", "w"], ["c"]), N("PRelu", ["c", "s"], ["y"])],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "s": np.abs(weights(6, 1, 1))},
        ),
        None,
        {"PRELU"},
        set(),
    ),
    "gelu": (
        lambda: model([N("Gelu", ["x"], ["y"])], X4, ["y"], opset=20),
        None,
        {"GELU"},
        set(),
    ),
    "erf_gelu_fused": (
        lambda: model(
            [
                N("Div", ["x", "sqrt2"], ["d"]),
                N("Erf", ["d"], ["e"]),
                N("Add", ["e", "one"], ["a"]),
                N("Mul", ["x", "a"], ["m"]),
                N("Mul", ["m", "half"], ["y"]),
            ],
            X4,
            ["y"],
            {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)},
        ),
        None,
        {"GELU"},
        {"EXP", "MUL"},
    ),
    "erf_alone": (
        lambda: model(
            [N("Mul", ["x", "k"], ["s"]), N("Erf", ["s"], ["y"])], X4, ["y"], {"k": np.float32(1.7)}
        ),
        None,
        {"EXP", "SIGN"},
        set(),
    ),
    "hard_swish_written_out": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("Add", ["c", "three"], ["a"]),
                N("Clip", ["a", "zero", "six"], ["r"]),
                N("Mul", ["c", "r"], ["m"]),
                N("Div", ["m", "six"], ["y"]),
            ],
            X4,
            ["y"],
            {
                "w": weights(6, 4, 1, 1),
                "three": np.float32(3),
                "zero": np.float32(0),
                "six": np.float32(6),
            },
            opset=13,
        ),
        None,
        {"HARD_SWISH"},
        {"ADD", "MUL", "RELU6"},
    ),
    "softplus_elu_selu": (
        lambda: model(
            [
                N("Softplus", ["x"], ["a"]),
                N("Elu", ["x"], ["b"], alpha=0.5),
                N("Selu", ["x"], ["c"]),
                N("Sum", ["a", "b", "c"], ["y"]),
            ],
            X4,
            ["y"],
        ),
        None,
        {"EXP", "LOG"},
        set(),
    ),
    "batchnorm_alone": (
        lambda: model(
            [N("Relu", ["x"], ["r"]), N("BatchNormalization", ["r", "s", "b", "m", "v"], ["y"])],
            X4,
            ["y"],
            {"s": weights(4), "b": weights(4), "m": weights(4), "v": np.abs(weights(4)) + 0.5},
        ),
        None,
        {"MUL", "ADD"},
        set(),
    ),
    "layer_norm": (
        lambda: model(
            [N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
            {"x": [1, 7, 16]},
            ["y"],
            {"s": weights(16), "b": weights(16)},
        ),
        None,
        {"MEAN", "SQUARED_DIFFERENCE", "RSQRT"},
        set(),
    ),
    "instance_norm": (
        lambda: model(
            [N("Conv", ["x", "w"], ["c"]), N("InstanceNormalization", ["c", "s", "b"], ["y"])],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "s": weights(6), "b": weights(6)},
        ),
        None,
        {"MEAN", "RSQRT"},
        {"TRANSPOSE_CONV"},
    ),
    "reductions_nhwc": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("ReduceMean", ["c"], ["a"], axes=[1], keepdims=0),
                N("ReduceMax", ["c"], ["b"], axes=[2, 3], keepdims=1),
                N("ReduceSum", ["c", "ax"], ["d"], keepdims=0),
                N("ReduceL2", ["c"], ["e"], axes=[1], keepdims=1),
                N("ReduceProd", ["c"], ["f"], axes=[3], keepdims=1),
            ],
            X4,
            ["a", "b", "d", "e", "f"],
            {"w": weights(6, 4, 1, 1, scale=0.3), "ax": np.array([1, 3], dtype=np.int64)},
            opset=13,
        ),
        None,
        {"MEAN", "REDUCE_MAX", "SUM", "SQRT", "REDUCE_PROD"},
        set(),
    ),
    "reshape_flatten_squeeze": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("GlobalAveragePool", ["c"], ["g"]),
                N("Flatten", ["g"], ["f"]),
                N("Unsqueeze", ["f", "ax"], ["u"]),
                N("Squeeze", ["u", "ax"], ["y"]),
            ],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "ax": np.array([2], dtype=np.int64)},
        ),
        None,
        {"MEAN"},
        {"TRANSPOSE"},
    ),
    "reshape_split_channels": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("Reshape", ["c", "s"], ["r"]),
                N("Transpose", ["r"], ["y"], perm=[0, 3, 4, 1, 2]),
            ],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "s": np.array([1, 2, 3, 10, 12], dtype=np.int64)},
        ),
        None,
        {"RESHAPE"},
        {"TRANSPOSE"},
    ),
    "reshape_flatten_spatial": (
        lambda: model(
            [N("Conv", ["x", "w"], ["c"]), N("Reshape", ["c", "s"], ["y"])],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "s": np.array([1, -1], dtype=np.int64)},
        ),
        None,
        {"TRANSPOSE", "RESHAPE"},
        set(),
    ),
    "concat_split": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("Concat", ["c", "x"], ["cat"], axis=1),
                N("Split", ["cat", "sizes"], ["a", "b"], axis=1),
                N("Split", ["a"], ["p", "q"], axis=1, num_outputs=2),
                N("Add", ["p", "q"], ["pq"]),
            ],
            X4,
            ["pq", "b"],
            {"w": weights(6, 4, 1, 1), "sizes": np.array([6, 4], dtype=np.int64)},
            opset=18,
        ),
        None,
        {"CONCATENATION", "SPLIT_V", "SPLIT"},
        set(),
    ),
    "slice_steps": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("Slice", ["c", "st", "en", "ax", "sp"], ["a"]),
                N("Slice", ["c", "st2", "en2", "ax2", "sp2"], ["b"]),
                N("Slice", ["c", "st3", "en2", "ax2", "sp2"], ["first_row"]),
            ],
            X4,
            ["a", "b", "first_row"],
            {
                "w": weights(6, 4, 1, 1),
                "st": np.array([1, 0], dtype=np.int64),
                "en": np.array([5, 100], dtype=np.int64),
                "ax": np.array([1, 3], dtype=np.int64),
                "sp": np.array([2, 3], dtype=np.int64),
                "st2": np.array([-1], dtype=np.int64),
                "en2": np.array([-100], dtype=np.int64),
                "ax2": np.array([2], dtype=np.int64),
                "sp2": np.array([-1], dtype=np.int64),
                "st3": np.array([-1000], dtype=np.int64),  # clamped to 0: row 0 alone
            },
        ),
        None,
        {"STRIDED_SLICE"},
        {"TRANSPOSE"},
    ),
    "pads_modes": (
        lambda: model(
            [
                N("Pad", ["x", "p"], ["a"], mode="constant"),
                N("Pad", ["x", "p", "v"], ["b"], mode="constant"),
                N("Pad", ["x", "p"], ["c"], mode="reflect"),
                N("Pad", ["x", "p1"], ["d"], mode="edge"),
            ],
            X4,
            ["a", "b", "c", "d"],
            {
                "p": np.array([0, 0, 1, 2, 0, 0, 2, 1], dtype=np.int64),
                "p1": np.array([0, 0, 1, 0, 0, 0, 0, 1], dtype=np.int64),
                "v": np.float32(1.5),
            },
        ),
        None,
        {"PAD", "PADV2", "MIRROR_PAD"},
        set(),
    ),
    "resize_nearest_asymmetric": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N(
                    "Resize",
                    ["c", "", "sc"],
                    ["y"],
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor",
                ),
            ],
            X4,
            ["y"],
            {"w": weights(6, 4, 1, 1), "sc": np.array([1, 1, 2, 2], dtype=np.float32)},
        ),
        None,
        {"RESIZE_NEAREST_NEIGHBOR"},
        {"TRANSPOSE"},
    ),
    "resize_bilinear_half_pixel": (
        lambda: model(
            [
                N(
                    "Resize",
                    ["x", "", "", "sz"],
                    ["y"],
                    mode="linear",
                    coordinate_transformation_mode="half_pixel",
                )
            ],
            X4,
            ["y"],
            {"sz": np.array([1, 4, 15, 30], dtype=np.int64)},
        ),
        None,
        {"RESIZE_BILINEAR"},
        set(),
    ),
    "resize_bilinear_align_corners": (
        lambda: model(
            [
                N(
                    "Resize",
                    ["x", "", "", "sz"],
                    ["y"],
                    mode="linear",
                    coordinate_transformation_mode="align_corners",
                )
            ],
            X4,
            ["y"],
            {"sz": np.array([1, 4, 19, 23], dtype=np.int64)},
        ),
        None,
        {"RESIZE_BILINEAR"},
        set(),
    ),
    "softmax_axes": (
        lambda: model(
            [N("Softmax", ["x"], ["a"], axis=1), N("LogSoftmax", ["x"], ["b"], axis=-1)],
            X4,
            ["a", "b"],
        ),
        None,
        {"SOFTMAX", "LOG_SOFTMAX"},
        set(),
    ),
    "softmax_opset11_flattens": (
        lambda: model([N("Softmax", ["x"], ["y"], axis=2)], X4, ["y"], opset=11),
        None,
        {"SOFTMAX", "RESHAPE"},
        set(),
    ),
    "cast_gather_where": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"]),
                N("Gather", ["c", "i"], ["g"], axis=1),
                N("Gather", ["c", "j"], ["h"], axis=1),
                N("Gather", ["c", "k"], ["cols"], axis=3),
                N("Greater", ["g", "zero"], ["m"]),
                N("Where", ["m", "g", "h"], ["y"]),
                N("Cast", ["m"], ["z"], to=TensorProto.INT32),
            ],
            X4,
            ["y", "z", "cols"],
            {
                "w": weights(6, 4, 1, 1),
                "i": np.array(2, dtype=np.int64),
                "j": np.array([-1], dtype=np.int64),
                "k": np.array([0, 3, 11], dtype=np.int64),
                "zero": np.float32(0),
            },
        ),
        None,
        {"SELECT_V2", "CAST", "GREATER"},
        set(),
    ),
    "gather_indices_dynamic": (
        lambda: model(
            [N("Gather", ["e", "ids"], ["y"], axis=0)],
            {"ids": [1, 5]},
            ["y"],
            {"e": weights(10, 4)},
            input_types={"ids": TensorProto.INT64},
        ),
        None,
        {"GATHER"},
        set(),
    ),
    "expand_tile": (
        lambda: model(
            [N("Expand", ["x", "s"], ["e"]), N("Tile", ["e", "r"], ["y"])],
            {"x": [1, 3, 1]},
            ["y"],
            {"s": np.array([2, 3, 4], dtype=np.int64), "r": np.array([1, 2, 1], dtype=np.int64)},
        ),
        None,
        {"BROADCAST_TO", "TILE"},
        set(),
    ),
    "argmax_topk": (
        lambda: model(
            [
                N("ArgMax", ["x"], ["a"], axis=1, keepdims=1),
                N("TopK", ["x", "k"], ["v", "i"], axis=-1),
            ],
            X4,
            ["a", "v", "i"],
            {"k": np.array([3], dtype=np.int64)},
        ),
        None,
        {"ARG_MAX", "TOPK_V2"},
        set(),
    ),
    "depth_space": (
        lambda: model(
            [
                N("SpaceToDepth", ["x"], ["s"], blocksize=2),
                N("DepthToSpace", ["s"], ["y"], blocksize=2, mode="DCR"),
            ],
            X4,
            ["y"],
        ),
        None,
        {"SPACE_TO_DEPTH", "DEPTH_TO_SPACE"},
        set(),
    ),
    "lstm_bidirectional": (
        lambda: model(
            [N("LSTM", ["x", "w", "r", "b"], ["y", "h"], hidden_size=5, direction="bidirectional")],
            {"x": [6, 1, 3]},
            ["y", "h"],
            {"w": weights(2, 20, 3), "r": weights(2, 20, 5), "b": weights(2, 40)},
        ),
        None,
        {"FULLY_CONNECTED", "LOGISTIC", "TANH", "PACK"},
        {"UNIDIRECTIONAL_SEQUENCE_LSTM"},
    ),
    # PyTorch's PixelShuffle exports DepthToSpace in CRD order; TFLite's kernel is DCR.
    "pixel_shuffle_crd": (
        lambda: model(
            [
                N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                N("DepthToSpace", ["c"], ["y"], blocksize=2, mode="CRD"),
            ],
            X4,
            ["y"],
            {"w": weights(8, 4, 3, 3)},
        ),
        None,
        {"DEPTH_TO_SPACE", "GATHER"},
        {"TRANSPOSE"},
    ),
    "space_to_depth_crd": (
        lambda: model(
            [N("SpaceToDepth", ["x"], ["y"], blocksize=2, mode="CRD")],
            X4,
            ["y"],
            opset=28,
        ),
        None,
        {"SPACE_TO_DEPTH", "GATHER"},
        set(),
    ),
    # Indices computed at run time may be negative (counted from the end): TFLite's GATHER
    # refuses those, so they are wrapped first.
    "gather_runtime_negative_indices": (
        lambda: model(
            [N("Gather", ["x", "i"], ["y"], axis=1)],
            {"x": [2, 5, 3], "i": [4]},
            ["y"],
            input_types={"i": TensorProto.INT64},
        ),
        {
            "x": np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32),
            "i": np.array([-1, 0, -5, 4], dtype=np.int64),
        },
        {"GATHER", "FLOOR_MOD"},
        set(),
    ),
    # Softplus far below zero: log(1 + u) keeps few of u's digits, the series keeps them all.
    "softplus_very_negative": (
        _unary("Softplus"),
        {"x": np.linspace(-30.0, 5.0, 480, dtype=np.float32).reshape(1, 4, 10, 12)},
        {"EXP", "LOG", "SELECT_V2"},
        set(),
    ),
    "pow_float_to_int_power": (
        lambda: model(
            [N("Pow", ["x", "k"], ["y"])],
            X4,
            ["y"],
            {"k": np.array([2, 3, 1, 0], dtype=np.int64).reshape(1, 4, 1, 1)},
        ),
        _positive((1, 4, 10, 12)),
        {"POW"},
        set(),
    ),
    "gru_initial_state": (
        lambda: model(
            [
                N(
                    "GRU",
                    ["x", "w", "r", "b", "", "h0"],
                    ["y", "h"],
                    hidden_size=4,
                    linear_before_reset=1,
                )
            ],
            {"x": [5, 1, 3], "h0": [1, 1, 4]},
            ["y", "h"],
            {"w": weights(1, 12, 3), "r": weights(1, 12, 4), "b": weights(1, 24)},
        ),
        None,
        {"FULLY_CONNECTED", "LOGISTIC", "TANH"},
        set(),
    ),
    "gru_reset_after_reverse": (
        lambda: model(
            [N("GRU", ["x", "w", "r", "b"], ["y"], hidden_size=4, direction="reverse")],
            {"x": [5, 2, 3]},
            ["y"],
            {"w": weights(1, 12, 3), "r": weights(1, 12, 4), "b": weights(1, 24)},
        ),
        None,
        {"FULLY_CONNECTED"},
        set(),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_onnx_runtime_in_litert(case: str, tmp_path: Path) -> None:
    build, samples, present, absent = CASES[case]
    result = export(build(), tmp_path, samples=samples)
    ops = set(opcodes(result))
    assert present <= ops, f"{case}: expected {sorted(present - ops)} among {sorted(ops)}"
    assert not (absent - {"TRANSPOSE"}) & ops, f"{case}: {sorted(absent & ops)} left"
    if "TRANSPOSE" in absent:
        assert body_transposes(result) == [], result.report.transposes
    kernels = [v.placement.kernels for v in result.report.verification]
    assert kernels == ["xnnpack", "reference"]
    assert all(v.passed for v in result.report.verification)


@pytest.mark.parametrize("op", ["Add", "Mul", "Greater"])
def test_plain_int8_arithmetic_is_refused_not_run(op: str, tmp_path: Path) -> None:
    # TFLite's int8 kernels rescale by each tensor's quantization parameters and abort the
    # process without them: wrapping 8-bit integer math must be refused, by name.
    proto = model(
        [N(op, ["a", "b"], ["y"], name="the_op")],
        {"a": [3, 4], "b": [3, 4]},
        ["y"],
        input_types={"a": TensorProto.INT8, "b": TensorProto.INT8},
    )
    with pytest.raises(UnsupportedOpError, match=r"the_op \(" + op + r"\).*int8 arithmetic"):
        export(proto, tmp_path)
