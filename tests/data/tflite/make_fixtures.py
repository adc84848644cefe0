"""Write the ``.tflite`` fixtures in this folder with TensorFlow's own TFLite converter.

The fixtures are committed, so the test suite needs no TensorFlow: it only needs LiteRT
(``ai-edge-litert``) to run them as the reference. Regenerate them with::

    python -m venv /tmp/venv-tflite
    /tmp/venv-tflite/bin/pip install tensorflow-cpu==2.21.0 tf_keras==2.21.0
    /tmp/venv-tflite/bin/python tests/data/tflite/make_fixtures.py

Pass fixture names to regenerate only those. Each model is small (a few KB) and seeded per name,
and each exercises one family of TFLite ops so that a failing parity test points at the family at
fault. Each builder returns the converter and the builtin ops the model must contain; ``main``
checks the written file really holds them (TF's converter fuses and folds ops freely, so a model
written for one op can silently end up without it).
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

HERE = Path(__file__).resolve().parent
RNG = np.random.default_rng(0)  # reseeded per fixture in main()

keras = tf.keras
layers = tf.keras.layers


def _weights(*shape: int, scale: float = 0.5) -> tf.Tensor:
    return tf.constant(RNG.normal(0.0, scale, size=shape).astype(np.float32))


def _from_function(fn: Callable[..., object], *specs: tf.TensorSpec) -> tf.lite.TFLiteConverter:
    concrete = tf.function(fn, input_signature=list(specs)).get_concrete_function()
    return tf.lite.TFLiteConverter.from_concrete_functions([concrete])


def _representative(
    shapes: list[tuple[int, ...]], low: float = -1.0, high: float = 1.0
) -> Callable[[], Iterator[list[np.ndarray]]]:
    rng = np.random.default_rng(7)

    def gen() -> Iterator[list[np.ndarray]]:
        for _ in range(64):
            yield [rng.uniform(low, high, size=s).astype(np.float32) for s in shapes]

    return gen


def _init_keras(model: keras.Model) -> keras.Model:
    # Keras initialises biases to zero and BN to identity; random values make the tests bite.
    for w in model.weights:
        w.assign(RNG.normal(0.0, 0.3, size=w.shape).astype(np.float32))
    return model


# --------------------------------------------------------------------------------- float models


def conv() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Convolutions: SAME (asymmetric) and VALID padding, strides, dilation, groups, depthwise with
    a multiplier, transpose conv, fused activations."""
    inp = keras.Input((15, 16, 4), batch_size=1, name="image")
    a = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu6")(inp)
    b = layers.Conv2D(6, 5, strides=3, padding="valid", activation="tanh")(inp)
    c = layers.Conv2D(4, 3, dilation_rate=2, padding="same", activation="relu")(inp)
    d = layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu")(a)
    e = layers.DepthwiseConv2D(3, strides=2, padding="valid")(a)
    f = layers.Conv2D(8, 3, groups=2, padding="same")(c)
    g = layers.Conv2DTranspose(5, 3, strides=2, padding="same", activation="relu")(a)
    h = layers.Conv2DTranspose(3, 2, strides=2, padding="valid")(e)
    model = _init_keras(keras.Model(inp, [d, b, f, g, h]))
    return tf.lite.TFLiteConverter.from_keras_model(model), {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "TRANSPOSE_CONV",
    }


def conv_layout() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Ops between convolutions that the reader computes in NCHW to skip Transposes: PRELU,
    activations, PAD / MIRROR_PAD, arithmetic with per-channel and scalar constants,
    CONCATENATION on channels, reductions (some keep NHWC order, some do not), resize."""
    per_channel = _weights(8)
    lam = layers.Lambda
    inp = keras.Input((10, 12, 3), batch_size=1, name="x")
    a = layers.Conv2D(8, 3, padding="same")(inp)
    p = layers.PReLU(shared_axes=[1, 2])(a)
    q = lam(lambda t: tf.pad(t, [[0, 0], [1, 1], [2, 0], [0, 0]]))(p)
    r = lam(lambda t: tf.pad(t, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="REFLECT"))(p)
    b = layers.Conv2D(8, 1)(lam(lambda t: t * 0.5 + per_channel)(q))
    c = layers.Conv2D(8, 1)(r)
    d = layers.Concatenate()(
        [
            layers.LeakyReLU(0.1)(b),
            lam(lambda t: tf.math.squared_difference(t[0], t[1]))([b, c]),
        ]
    )
    e = layers.Conv2D(6, 3, strides=2, padding="same")(
        layers.ReLU(6.0)(layers.Add()([lam(lambda t: t[..., :8])(d), c]))
    )
    outs = [
        lam(lambda t: tf.reduce_mean(t, axis=[1, 2]))(e),
        lam(lambda t: tf.reduce_max(t, axis=1))(e),
        lam(lambda t: tf.reduce_sum(t, axis=3, keepdims=True))(e),
        layers.Resizing(9, 11)(e),
        layers.Activation("sigmoid")(d),
    ]
    model = _init_keras(keras.Model(inp, outs))
    return tf.lite.TFLiteConverter.from_keras_model(model), {
        "CONV_2D",
        "PRELU",
        "PAD",
        "MIRROR_PAD",
        "CONCATENATION",
        "MEAN",
        "RESIZE_BILINEAR",
    }


def pool_resize_pad() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Pooling (SAME/VALID), every resize coordinate mode, PAD, PADV2, MIRROR_PAD."""

    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        return [
            tf.nn.max_pool2d(x, 3, 2, "SAME"),
            tf.nn.avg_pool2d(x, 3, 2, "SAME"),
            tf.nn.avg_pool2d(x, 2, 2, "VALID"),
            tf.image.resize(x, (13, 9), method="bilinear"),  # half_pixel_centers
            tf.compat.v1.image.resize_bilinear(x, (13, 9), align_corners=True),
            tf.compat.v1.image.resize_bilinear(x, (13, 9)),  # asymmetric
            tf.image.resize(x, (14, 17), method="nearest"),  # half_pixel_centers
            tf.compat.v1.image.resize_nearest_neighbor(x, (14, 17), align_corners=True),
            tf.compat.v1.image.resize_nearest_neighbor(x, (4, 5)),  # asymmetric, downsample
            tf.pad(x, [[0, 0], [1, 2], [0, 3], [0, 0]]),
            tf.pad(x, [[0, 0], [2, 0], [1, 1], [0, 1]], constant_values=1.5),
            tf.pad(x, [[0, 0], [2, 1], [1, 2], [0, 0]], mode="REFLECT"),
            tf.pad(x, [[0, 0], [3, 0], [2, 1], [1, 1]], mode="SYMMETRIC"),
        ]

    spec = tf.TensorSpec((1, 7, 8, 3), tf.float32, name="x")
    return _from_function(fn, spec), {
        "MAX_POOL_2D",
        "AVERAGE_POOL_2D",
        "RESIZE_BILINEAR",
        "RESIZE_NEAREST_NEIGHBOR",
        "PAD",
        "PADV2",
        "MIRROR_PAD",
    }


def elementwise() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Binary and unary math with broadcasting, and the activation functions."""
    bias = _weights(6)

    def fn(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        pos = tf.abs(y) + 0.5
        return [
            x + y,
            x - bias,
            x * y,
            x / pos,
            tf.maximum(x, y),
            tf.minimum(x, bias),
            tf.math.squared_difference(x, y),
            tf.math.rsqrt(pos),
            tf.sqrt(pos),
            tf.exp(x),
            tf.math.log(pos),
            -tf.abs(x),
            tf.pow(pos, x),
            tf.square(x),
            tf.floor(x) + tf.math.ceil(y) + tf.round(x * 3.0),
            tf.sin(x) * tf.cos(y),
            tf.where(x > y, x, y * 2.0),
            tf.cast(x >= 0.0, tf.float32) + tf.cast(tf.equal(tf.sign(x), 1.0), tf.float32),
        ]

    return _from_function(
        fn,
        tf.TensorSpec((1, 4, 5, 6), tf.float32, name="x"),
        tf.TensorSpec((5, 1), tf.float32, name="y"),
    ), {"ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "RSQRT", "SQRT"}


def activations() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH, PRELU, LEAKY_RELU, ELU, GELU."""
    inp = keras.Input((6, 7, 5), batch_size=1, name="features")
    prelu = layers.PReLU(shared_axes=[1, 2])
    outs = [
        layers.ReLU()(inp),
        layers.ReLU(6.0)(inp),
        layers.Lambda(lambda t: tf.clip_by_value(t, -1.0, 1.0))(inp),
        layers.Activation("sigmoid")(inp),
        layers.Activation("tanh")(inp),
        layers.Lambda(lambda t: t * tf.nn.relu6(t + 3.0) / 6.0)(inp),
        layers.LeakyReLU(0.15)(inp),
        layers.ELU()(inp),
        # PRELU and GELU are only fused when their input has no other users.
        prelu(layers.Lambda(lambda t: t * 1.5)(inp)),
        layers.Activation("gelu")(layers.Lambda(lambda t: t - 0.25)(inp)),
        layers.Lambda(lambda t: keras.activations.gelu(t + 0.25, approximate=True))(inp),
    ]
    model = keras.Model(inp, outs)
    prelu.set_weights([RNG.uniform(0.05, 0.5, size=(1, 1, 5)).astype(np.float32)])
    return tf.lite.TFLiteConverter.from_keras_model(model), {
        "RELU",
        "RELU6",
        "RELU_N1_TO_1",
        "LOGISTIC",
        "TANH",
        "HARD_SWISH",
        "PRELU",
        "LEAKY_RELU",
        "ELU",
        "GELU",
    }


def shapes() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Layout and indexing ops: reshape, squeeze, expand_dims, concat, split, split_v,
    strided_slice (every mask), slice, gather, transpose, cast, tile, pack/unpack, reverse."""
    indices = tf.constant([3, 0, 2, 2], tf.int32)

    def fn(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        a, b = tf.split(x, 2, axis=2)
        c, d, e = tf.split(x, [1, -1, 2], axis=3)
        unpacked = tf.unstack(x[0], axis=0)
        return [
            tf.reshape(x, (-1, 6, 20)),
            tf.squeeze(y * 2.0, axis=1),
            tf.expand_dims(x, -1),
            tf.concat([a * 2.0, b], axis=-1),
            c + 1.0,
            d,
            e,
            x[:, 1:-1, ::2, 1:],
            x[0, ..., 2],
            x[:, tf.newaxis, 3:0:-1, -1],
            x[..., ::-2],
            tf.slice(x, [0, 1, 0, 2], [-1, 2, -1, 3]),
            tf.gather(x, indices, axis=3),
            tf.gather(x, [1, 0], axis=1),
            tf.transpose(x, (0, 3, 1, 2)),
            tf.cast(x * 4.0, tf.int32),
            tf.tile(x, (1, 2, 1, 3)),
            tf.stack([unpacked[2], unpacked[0]], axis=1),
            tf.reverse(x, axis=[2]),
        ]

    # Open dims keep SQUEEZE and EXPAND_DIMS from being folded into RESHAPE.
    return _from_function(
        fn,
        tf.TensorSpec((None, 3, 8, 5), tf.float32, name="x"),
        tf.TensorSpec((None, 1, None), tf.float32, name="y"),
    ), {
        "RESHAPE",
        "SQUEEZE",
        "EXPAND_DIMS",
        "CONCATENATION",
        "SPLIT",
        "SPLIT_V",
        "STRIDED_SLICE",
        "SLICE",
        "GATHER",
        "TRANSPOSE",
        "CAST",
    }


def reduce_matmul() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """MEAN, SUM, REDUCE_MAX/MIN, FULLY_CONNECTED (2-D and keep_num_dims), BATCH_MATMUL,
    SOFTMAX (with beta), LOG_SOFTMAX, ARG_MAX."""
    w = _weights(12, 7)
    w3 = _weights(7, 3)
    b3 = _weights(3)

    def fn(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        flat = tf.reshape(x, (2, 12))
        seq = tf.reshape(x, (2, 4, 3))
        return [
            tf.reduce_mean(x, axis=[1, 2], keepdims=True),
            tf.reduce_sum(x, axis=-1),
            tf.reduce_max(x, axis=1),
            tf.reduce_min(x, axis=[0, 3], keepdims=True),
            tf.nn.relu(tf.matmul(flat, w)),
            tf.matmul(tf.matmul(flat, w), w3) + b3,
            tf.matmul(seq, y, transpose_b=True),
            tf.nn.softmax(flat * 1.7),
            tf.nn.log_softmax(flat),
            tf.argmax(flat, axis=1, output_type=tf.int32),
        ]

    return _from_function(
        fn,
        tf.TensorSpec((2, 2, 2, 3), tf.float32, name="x"),
        tf.TensorSpec((2, 5, 3), tf.float32, name="y"),
    ), {
        "MEAN",
        "SUM",
        "REDUCE_MAX",
        "REDUCE_MIN",
        "FULLY_CONNECTED",
        "BATCH_MATMUL",
        "SOFTMAX",
        "LOG_SOFTMAX",
        "ARG_MAX",
    }


def misc() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """The less common ops: gather_nd, top_k, cumsum, where, fill, range, broadcast_to, integer
    and float floor division/modulo, logic, comparisons, l2 normalization, LRN, depth/space
    rearrangement, add_n, arg_min, reduce any/all/prod, embedding lookup."""
    table = _weights(10, 4)

    def fn(x: tf.Tensor, ids: tf.Tensor) -> list[tf.Tensor]:
        n = tf.shape(ids)[0]
        xi = tf.cast(x * 10.0, tf.int32)
        values, indices = tf.math.top_k(tf.reshape(x, (2, 48)), k=3)
        flags = x > 0.0
        return [
            tf.gather_nd(x, [[0, 1], [0, 3]]),
            values,
            indices,
            tf.math.cumsum(x, axis=2, exclusive=True, reverse=True),
            tf.where(flags[0, :, :, 0]),
            tf.fill(tf.stack([n, 2]), 3.5),
            tf.range(0, n * 2, 2),
            tf.broadcast_to(x[:, :1], (2, 4, 4, 3)),
            tf.math.floordiv(x, 0.3) + tf.math.floormod(x, 0.3),
            tf.math.floordiv(xi, 3) * 100 + tf.math.floormod(xi, 3),
            tf.logical_or(tf.logical_and(flags, x < 0.5), tf.logical_not(x <= -0.5)),
            tf.cast(tf.not_equal(xi, 2), tf.float32),
            tf.math.l2_normalize(x, axis=-1),
            tf.nn.local_response_normalization(x, depth_radius=1, bias=1.5, alpha=0.3, beta=0.6),
            tf.nn.depth_to_space(tf.tile(x, (1, 1, 1, 4)), 2),
            tf.nn.space_to_depth(x, 2),
            tf.math.add_n([x, x * 2.0, -x]),
            tf.argmin(x, axis=-1, output_type=tf.int32),
            tf.reduce_any(flags, axis=1),
            tf.reduce_all(flags, axis=[1, 2]),
            tf.reduce_prod(x, axis=3, keepdims=True),
            tf.nn.embedding_lookup(table, ids),
            tf.space_to_batch_nd(x, [2, 3], [[1, 1], [1, 1]]),
            tf.batch_to_space(tf.tile(x, (4, 1, 1, 1)), [2, 2], [[0, 1], [1, 0]]),
            tf.zeros_like(x) + tf.ones_like(x),
        ]

    return _from_function(
        fn,
        tf.TensorSpec((2, 4, 4, 3), tf.float32, name="x"),
        tf.TensorSpec((None,), tf.int32, name="ids"),
    ), {
        "GATHER_ND",
        "TOPK_V2",
        "CUMSUM",
        "WHERE",
        "FILL",
        "RANGE",
        "BROADCAST_TO",
        "FLOOR_DIV",
        "FLOOR_MOD",
        "LOGICAL_AND",
        "LOGICAL_OR",
        "NOT_EQUAL",
        "L2_NORMALIZATION",
        "LOCAL_RESPONSE_NORMALIZATION",
        "DEPTH_TO_SPACE",
        "SPACE_TO_DEPTH",
        "ADD_N",
        "ARG_MIN",
        "REDUCE_ANY",
        "REDUCE_PROD",
        "SPACE_TO_BATCH_ND",
        "BATCH_TO_SPACE_ND",
    }


def dense_3d() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Keras Dense on a sequence: FULLY_CONNECTED with keep_num_dims and a dynamic batch."""
    inp = keras.Input((5, 6), name="tokens")
    x = layers.Dense(8, activation="relu")(inp)
    x = layers.LayerNormalization()(x)
    x = layers.Dense(4)(x)
    model = _init_keras(keras.Model(inp, x))
    return tf.lite.TFLiteConverter.from_keras_model(model), {"FULLY_CONNECTED"}


def audio_1d() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """A keyword-spotting-style 1-D conv net on a waveform, with a dynamic batch dim."""
    inp = keras.Input((400, 1), name="waveform")
    x = layers.Conv1D(8, 9, strides=2, padding="same", activation="relu")(inp)
    x = layers.MaxPooling1D(3, strides=2, padding="same")(x)
    x = layers.Conv1D(12, 5, padding="valid", activation="relu")(x)
    x = layers.AveragePooling1D(2)(x)
    x = layers.SeparableConv1D(16, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(10)(x)
    x = layers.Softmax()(x)
    model = _init_keras(keras.Model(inp, x))
    return tf.lite.TFLiteConverter.from_keras_model(model), {"CONV_2D", "FULLY_CONNECTED"}


def lstm() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """A speech-command-style recurrent model: LSTMs fused into UNIDIRECTIONAL_SEQUENCE_LSTM,
    one returning sequences, one bidirectional, one returning its last output.

    Keras 3 LSTMs convert to WHILE loops; the fused op needs Keras 2 (``tf_keras``).
    """
    import tf_keras

    k = tf_keras
    inp = k.Input((12, 10), batch_size=1, name="features")
    x = k.layers.LSTM(16, return_sequences=True)(inp)
    x = k.layers.Bidirectional(k.layers.LSTM(8, return_sequences=True))(x)
    x = k.layers.LSTM(6)(x)
    x = k.layers.Dense(4)(x)
    # A fourth LSTM, on its own input, whose cell state can pass TFLite's cell clip (10): its
    # input and forget gates are held open and its cell gate follows the sign of the input, so
    # a long positive pulse charges the cell and a negative one drains it (the test feeds one).
    pulse = k.Input((24, 2), batch_size=1, name="pulse")
    saturating = k.layers.LSTM(3, return_sequences=True)
    y = saturating(pulse)
    model = k.Model([inp, pulse], [x, y])
    for w in model.weights:
        w.assign(RNG.normal(0.0, 0.3, size=w.shape).astype(np.float32))
    kernel, recurrent, bias = saturating.get_weights()
    kernel[:] = 0.0
    kernel[:, 6:9] = 10.0  # cell gate: tanh(10 * sum(x)) ~ sign of the input
    bias[:] = 0.0
    bias[:6] = 8.0  # input and forget gates ~1
    saturating.set_weights([kernel, recurrent * 0.0, bias])
    return tf.lite.TFLiteConverter.from_keras_model(model), {"UNIDIRECTIONAL_SEQUENCE_LSTM"}


def dynamic_spatial() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Open batch, height and width: SAME padding must become auto_pad, not fixed pads."""
    inp = keras.Input((None, None, 3), name="image")
    x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inp)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.MaxPooling2D(2, padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    model = _init_keras(keras.Model(inp, x))
    return tf.lite.TFLiteConverter.from_keras_model(model), {"CONV_2D", "MAX_POOL_2D", "MEAN"}


def _mobile_block_net(input_shape: tuple[int, int, int]) -> keras.Model:
    """A tiny MobileNetV2/V3-style classifier: conv, depthwise, residual add, hard-swish,
    concat, resize, pooling, dense, softmax."""
    inp = keras.Input(input_shape, batch_size=1, name="image")
    x = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu6")(inp)
    y = layers.DepthwiseConv2D(3, padding="same", activation="relu6")(x)
    y = layers.Conv2D(8, 1)(y)
    x = layers.Add()([x, y])
    z = layers.Conv2D(8, 3, padding="same")(x)
    z = layers.Activation("hard_swish")(z)
    x = layers.Concatenate()([x, z])
    x = layers.MaxPooling2D(2)(x)
    u = layers.Conv2DTranspose(4, 2, strides=2, padding="same", activation="relu")(x)
    u = layers.Resizing(8, 8, interpolation="bilinear")(u)
    x = layers.Conv2D(12, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(10)(x)
    x = layers.Softmax()(x)
    return _init_keras(keras.Model(inp, [x, u]))


def _quantized(
    model: keras.Model, io: tf.DType | None, shape: tuple[int, ...]
) -> tf.lite.TFLiteConverter:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = _representative([shape])
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if io is not None:
        conv.inference_input_type = io
        conv.inference_output_type = io
    return conv


def mobilenet_int8() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Full-integer quantization with int8 inputs and outputs (per-channel conv weights)."""
    shape = (1, 16, 16, 3)
    model = _mobile_block_net(shape[1:])
    return _quantized(model, tf.int8, shape), {"CONV_2D", "DEPTHWISE_CONV_2D", "ADD"}


def mobilenet_uint8_io() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Full-integer quantization with uint8 inputs and outputs (QUANTIZE uint8 <-> int8)."""
    shape = (1, 16, 16, 3)
    model = _mobile_block_net(shape[1:])
    return _quantized(model, tf.uint8, shape), {"QUANTIZE", "CONV_2D"}


def mobilenet_int8_float_io() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Full-integer quantization with float inputs and outputs (QUANTIZE/DEQUANTIZE at the ends)."""
    shape = (1, 16, 16, 3)
    model = _mobile_block_net(shape[1:])
    return _quantized(model, None, shape), {"QUANTIZE", "DEQUANTIZE", "CONV_2D"}


def ops_int8() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Int8 quantized versions of shape and math ops (per-tensor requantization paths)."""
    w = _weights(6, 4)

    def fn(x: tf.Tensor) -> list[tf.Tensor]:
        a = tf.nn.relu(x)
        b = tf.pad(x, [[0, 0], [1, 1], [0, 2], [0, 0]])
        c = tf.transpose(x, (0, 2, 1, 3))
        d = tf.reshape(x, (1, 5, 24))
        e = tf.reduce_mean(x, axis=[1, 2])
        f = tf.nn.avg_pool2d(x, 2, 2, "VALID")
        g = tf.concat([x[:, :2], x[:, 3:] * 0.5], axis=1)
        h = tf.matmul(tf.reshape(x, (20, 6)), w)
        i = tf.sigmoid(x) * tf.tanh(x)
        j = tf.image.resize(x, (8, 6), method="nearest")
        k = tf.maximum(x, -0.25) - tf.minimum(x, 0.25)
        return [a, b, c, d, e, f, g, h, i, j, k]

    conv = _from_function(fn, tf.TensorSpec((1, 5, 4, 6), tf.float32, name="x"))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = _representative([(1, 5, 4, 6)], -2.0, 2.0)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv, {"PAD", "TRANSPOSE", "RESHAPE", "MEAN", "CONCATENATION", "FULLY_CONNECTED"}


def dynamic_range() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Dynamic-range quantization: int8 weights, float activations (hybrid kernels)."""
    inp = keras.Input((12, 12, 3), batch_size=1, name="image")
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(inp)
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dense(10)(x)
    model = _init_keras(keras.Model(inp, x))
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    return conv, {"CONV_2D", "FULLY_CONNECTED"}


def float16() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Float16 weight quantization: fp16 constants behind DEQUANTIZE."""
    model = _mobile_block_net((16, 16, 3))
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    return conv, {"DEQUANTIZE", "CONV_2D"}


def sparse() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Pruned weights stored sparse: DENSIFY expands them (block-sparse and CSR formats)."""
    inp = keras.Input((8, 8, 16), batch_size=1, name="image")
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
    x = layers.Flatten()(x)
    x = layers.Dense(24)(x)
    model = _init_keras(keras.Model(inp, x))
    for w in model.weights:
        if len(w.shape) > 1:  # prune 80% of every kernel so the converter stores it sparse
            values = w.numpy()
            values[RNG.random(values.shape) < 0.8] = 0.0
            w.assign(values)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
    return conv, {"DENSIFY"}


def int16x8() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """16x8 quantization: int16 activations, int8 weights, int64 biases (opset 21 QDQ)."""
    inp = keras.Input((8, 8, 3), batch_size=1, name="image")
    x = layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(5)(x)
    model = _init_keras(keras.Model(inp, x))
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = _representative([(1, 8, 8, 3)])
    conv.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
    ]
    conv.inference_input_type = tf.int16
    conv.inference_output_type = tf.int16
    return conv, {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}


# ----------------------------------------------------------------------------- stateful models


class _Stream(tf.Module):
    """A streaming model in the style of microWakeWord: resource variables keep a window of past
    frames and a running total between calls."""

    def __init__(self) -> None:
        super().__init__()
        # Non-zero initial values: the CALL_ONCE init subgraph must be read, not assumed zero.
        self.window = tf.Variable(
            RNG.normal(0.0, 0.5, size=(1, 4, 3)).astype(np.float32), name="window"
        )
        self.total = tf.Variable(np.full((1, 3), 0.25, np.float32), name="total")
        self.w = _weights(3, 3)

    @tf.function(input_signature=[tf.TensorSpec((1, 2, 3), tf.float32, name="frames")])
    def __call__(self, frames: tf.Tensor) -> dict[str, tf.Tensor]:
        window = tf.concat([self.window[:, 2:], frames], axis=1)
        self.window.assign(window)
        self.total.assign(self.total * 0.5 + tf.matmul(tf.reduce_mean(window, axis=1), self.w))
        # Read again after the assignments: these reads see the new values.
        score = tf.tanh(self.total.read_value()) + tf.reduce_max(self.window, axis=1)
        return {"score": score}


def streaming() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Resource variables (streaming state): VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, and a
    CALL_ONCE init subgraph assigning their initial values."""
    module = _Stream()
    concrete = module.__call__.get_concrete_function()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([concrete], module)
    conv.experimental_enable_resource_variables = True
    return conv, {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"}


# ------------------------------------------------------------------------------ error fixtures


def unsupported() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """Ops the reader does not translate (more than one kind, one of them twice)."""

    def fn(x: tf.Tensor, ids: tf.Tensor) -> list[tf.Tensor]:
        s = tf.math.unsorted_segment_sum(x, ids, 3)
        t = tf.math.unsorted_segment_sum(x * 2.0, ids, 3)
        r = tf.raw_ops.Bucketize(input=x, boundaries=[0.0, 1.0])
        return [tf.nn.relu(s) + t, r]

    return _from_function(
        fn, tf.TensorSpec((4, 3), tf.float32, name="x"), tf.TensorSpec((4,), tf.int32, name="ids")
    ), {"UNSORTED_SEGMENT_SUM", "BUCKETIZE"}


def custom_op() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """A TF op with no builtin, kept as a custom op (allow_custom_ops)."""

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.math.erfc(tf.nn.relu(x))

    conv = _from_function(fn, tf.TensorSpec((2, 3), tf.float32, name="x"))
    conv.allow_custom_ops = True
    return conv, {"CUSTOM"}


def flex_op() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """A TF op run through the Flex delegate (SELECT_TF_OPS): a CUSTOM op named Flex*."""

    def fn(x: tf.Tensor) -> tf.Tensor:
        return tf.math.cumprod(x, axis=1) + 1.0

    conv = _from_function(fn, tf.TensorSpec((2, 3), tf.float32, name="x"))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    return conv, {"CUSTOM"}


def while_loop() -> tuple[tf.lite.TFLiteConverter, set[str]]:
    """A WHILE loop: control flow across three subgraphs."""

    def fn(x: tf.Tensor) -> tf.Tensor:
        i = tf.constant(0)
        _, y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0 + 1.0), [i, x])
        return y

    return _from_function(fn, tf.TensorSpec((2, 3), tf.float32, name="x")), {"WHILE"}


BUILDERS: dict[str, Callable[[], tuple[tf.lite.TFLiteConverter, set[str]]]] = {
    "conv": conv,
    "conv_layout": conv_layout,
    "pool_resize_pad": pool_resize_pad,
    "elementwise": elementwise,
    "activations": activations,
    "shapes": shapes,
    "reduce_matmul": reduce_matmul,
    "misc": misc,
    "dense_3d": dense_3d,
    "audio_1d": audio_1d,
    "lstm": lstm,
    "dynamic_spatial": dynamic_spatial,
    "mobilenet_int8": mobilenet_int8,
    "mobilenet_uint8_io": mobilenet_uint8_io,
    "mobilenet_int8_float_io": mobilenet_int8_float_io,
    "ops_int8": ops_int8,
    "dynamic_range": dynamic_range,
    "float16": float16,
    "sparse": sparse,
    "int16x8": int16x8,
    "streaming": streaming,
    "unsupported": unsupported,
    "while_loop": while_loop,
    "custom_op": custom_op,
    "flex_op": flex_op,
}


def _ops_in(data: bytes) -> set[str]:
    """Builtin op names in a flatbuffer, read with TensorFlow's own schema module."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(data, 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    return {
        names.get(
            max(
                model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode()
            ),
            "?",
        )
        for i in range(model.OperatorCodesLength())
    }


def main(argv: list[str]) -> int:
    wanted = argv or list(BUILDERS)
    global RNG
    for name in wanted:
        # Seed per model, so that regenerating one fixture leaves the others' weights alone.
        tf.keras.utils.set_random_seed(zlib.crc32(name.encode()) % (1 << 31))
        RNG = np.random.default_rng(zlib.crc32(name.encode()))
        converter, expected = BUILDERS[name]()
        data = converter.convert()
        found = _ops_in(data)
        missing = expected - found
        if missing:
            print(f"{name}: expected ops {sorted(missing)} not in the model ({sorted(found)})")
            return 1
        (HERE / f"{name}.tflite").write_bytes(data)
        print(f"{name}.tflite: {len(data)} bytes, ops {sorted(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
