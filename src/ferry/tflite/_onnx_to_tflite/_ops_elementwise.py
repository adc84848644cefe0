"""Elementwise math, activations and normalizations: they run in whatever layout their input has.

Before -> After (x held NHWC, constants written in x's layout)::

    Add(x, bias[C,1,1])        ->  ADD(x, bias[C])
    Clip(x, 0, 6)              ->  RELU6(x)            (fused into the op before it, later)
    HardSigmoid(x)             ->  ADD(x, 3, RELU6), MUL(1/6)
    LayerNormalization(x)      ->  MEAN, SQUARED_DIFFERENCE, MEAN, ADD eps, RSQRT, SUB, MUL...
    BatchNormalization(x)      ->  MUL(x, scale), ADD(shift)   (when not folded into a conv)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._onnx_to_tflite._layout import Perm, axis_of, identity, is_identity
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS", "binary", "shared_perm", "unary"]

Translator = Callable[[Lowering, ir.Node], None]

#: Ops whose options carry a fused activation (set by the fusion pass when a RELU follows).
FUSED = {"fused_activation_function": 0}


def shared_perm(cx: Lowering, values: Sequence[ir.Value | None], rank: int) -> Perm:
    """The layout an op over ``values`` runs in: the one most of its rank-``rank`` computed
    inputs are held in (ties go to a non-ONNX layout: it is where the convolutions are)."""
    perms = [cx.perm(v) for v in values if v is not None and cx.is_held(v) and cx.rank(v) == rank]
    if not perms:
        return identity(rank)
    counts = Counter(perms)
    return max(counts, key=lambda p: (counts[p], not is_identity(p)))


def binary(opcode: str, *, fused: bool = False) -> Translator:
    """A broadcasting binary op."""

    def lower(cx: Lowering, node: ir.Node) -> None:
        a, b = node.inputs[0], node.inputs[1]
        if a is None or b is None:
            raise Unsupported("an input is missing")
        out = node.outputs[0]
        rank = cx.rank(out)
        perm = shared_perm(cx, [a, b], rank)
        ins = [cx.get_broadcast(a, rank, perm), cx.get_broadcast(b, rank, perm)]
        _no_plain_8bit(cx, ins)
        cx.emit(opcode, ins, [cx.output(out, perm)], FUSED if fused else None)

    return lower


#: TFLite's tensor types for int8 and uint8.
_EIGHT_BIT = {9: "int8", 3: "uint8"}


def _no_plain_8bit(cx: Lowering, tensors: Sequence[int]) -> None:
    """Refuse 8-bit integer operands without quantization parameters: TFLite's int8/uint8
    arithmetic and comparison kernels are quantized kernels (they rescale by each tensor's scale
    and abort without one), so ONNX's plain wrapping 8-bit integer math has no kernel."""
    for index in tensors:
        tensor = cx.b.tensors[index]
        if tensor.type in _EIGHT_BIT and tensor.quant is None:
            raise Unsupported(
                f"{_EIGHT_BIT[tensor.type]} arithmetic without quantization parameters (TFLite's "
                "8-bit kernels are quantized ones)"
            )


def variadic(opcode: str) -> Translator:
    """Max/Min/Sum over any number of inputs: a chain of binary ops."""

    def lower(cx: Lowering, node: ir.Node) -> None:
        values = [v for v in node.inputs if v is not None]
        out = node.outputs[0]
        rank = cx.rank(out)
        perm = shared_perm(cx, values, rank)
        tensors = [cx.get_broadcast(v, rank, perm) for v in values]
        _no_plain_8bit(cx, tensors)
        if len(tensors) == 1:
            cx.alias(out, tensors[0], perm)
            return
        acc = tensors[0]
        for i, t in enumerate(tensors[1:], 1):
            last = i == len(tensors) - 1
            dest = cx.output(out, perm) if last else _like(cx, out, perm, f"/{i}")
            cx.emit(opcode, [acc, t], [dest], FUSED if opcode == "ADD" else None)
            acc = dest

    return lower


def _like(cx: Lowering, value: ir.Value, perm: Perm, suffix: str) -> int:
    """A helper tensor shaped like ``value`` held as ``perm``."""
    shape = cx.shape(value)
    return cx.temp(f"{value.name}{suffix}", cx.ttype(value), [shape[p] for p in perm])


def unary(opcode: str, options: Mapping[str, object] | None = None) -> Translator:
    """A one-input op computed in the input's layout."""

    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        perm = cx.perm(x)
        cx.emit(opcode, [cx.get(x)], [cx.output(node.outputs[0], perm)], options)

    return lower


def _scalar(cx: Lowering, value: float, like: ir.Value) -> int:
    return cx.constant(np.asarray(value, dtype=cx.dtype(like)), "scalar")


#: One op of a chain: its code, its inputs (None: the running tensor; a number: a scalar
#: constant) and its options.
Step = tuple[str, list[float | None], Mapping[str, object] | None]


def _then(cx: Lowering, node: ir.Node, steps: Sequence[Step]) -> None:
    """A chain of ops on the node's first input; the last step writes the node's output."""
    if cx.int8 and (len(steps) > 1 or any(a is not None for _, args, _ in steps for a in args)):
        raise Unsupported("a chain of ops with intermediate results, on integers")
    x = node.inputs[0]
    assert x is not None
    out = node.outputs[0]
    perm = cx.perm(x)
    acc = cx.get(x)
    for k, (opcode, args, options) in enumerate(steps):
        ins = [acc if a is None else _scalar(cx, a, x) for a in args]
        last = k == len(steps) - 1
        dest = cx.output(out, perm) if last else _like(cx, out, perm, f"/{opcode.lower()}")
        cx.emit(opcode, ins, [dest], options)
        acc = dest


# ------------------------------------------------------------------------------- activations


def _identity(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    const = cx.const(x)
    if const is not None:
        cx.folded[node.outputs[0]] = const
        return
    cx.alias(node.outputs[0], cx.get(x), cx.perm(x))


def _clip(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    if len(node.inputs) > 1 or ("min" not in node.attributes and "max" not in node.attributes):
        low_v = node.inputs[1] if len(node.inputs) > 1 else None
        high_v = node.inputs[2] if len(node.inputs) > 2 else None
        low = None if low_v is None else _scalar_const(cx, low_v, "Clip's min")
        high = None if high_v is None else _scalar_const(cx, high_v, "Clip's max")
    else:
        low, high = attr(node, "min"), attr(node, "max")
    if low is not None and math.isinf(low) and low < 0:
        low = None
    if high is not None and math.isinf(high) and high > 0:
        high = None
    is_float = cx.dtype(x).kind == "f"
    if is_float and low == 0 and high is None:
        _then(cx, node, [("RELU", [None], None)])
    elif is_float and low == 0 and high == 6:
        _then(cx, node, [("RELU6", [None], None)])
    elif is_float and low == -1 and high == 1:
        _then(cx, node, [("RELU_N1_TO_1", [None], None)])
    else:
        steps: list[Step] = []
        if low is not None:
            steps.append(("MAXIMUM", [None, low], None))
        if high is not None:
            steps.append(("MINIMUM", [None, high], None))
        if not steps:
            _identity(cx, node)
            return
        _then(cx, node, steps)


def _scalar_const(cx: Lowering, value: ir.Value, what: str) -> float:
    array = cx.const(value)
    if array is None or array.size != 1:
        raise Unsupported(f"{what} is not a constant scalar")
    return float(array.reshape(()))


def _hard_sigmoid(cx: Lowering, node: ir.Node) -> None:
    alpha, beta = float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))
    if cx.int8:
        from ferry.tflite._onnx_to_tflite._int8 import hard_sigmoid

        hard_sigmoid(cx, node, alpha, beta)
        return
    # max(0, min(1, a*x + b)) == relu6(6a*x + 6b) / 6: one op less than MINIMUM and MAXIMUM.
    steps: list[Step] = []
    if not math.isclose(alpha * 6, 1.0, rel_tol=1e-6):
        steps.append(("MUL", [None, alpha * 6], FUSED))
    steps.append(("ADD", [None, beta * 6], {"fused_activation_function": 3}))
    steps.append(("MUL", [None, 1 / 6], FUSED))
    _then(cx, node, steps)


def _leaky_relu(cx: Lowering, node: ir.Node) -> None:
    unary("LEAKY_RELU", {"alpha": float(attr(node, "alpha", 0.01))})(cx, node)


def _prelu(cx: Lowering, node: ir.Node) -> None:
    x, slope = node.inputs[0], node.inputs[1]
    if x is None or slope is None:
        raise Unsupported("an input is missing")
    out = node.outputs[0]
    rank = cx.rank(out)
    perm = cx.perm(x)
    cx.emit("PRELU", [cx.get(x), cx.get_broadcast(slope, rank, perm)], [cx.output(out, perm)])


def _elu(cx: Lowering, node: ir.Node) -> None:
    alpha = float(attr(node, "alpha", 1.0))
    if alpha == 1.0:
        unary("ELU")(cx, node)
        return
    _elu_like(cx, node, alpha, 1.0)


def _selu(cx: Lowering, node: ir.Node) -> None:
    _elu_like(
        cx, node, float(attr(node, "alpha", 1.67326319217681884765625)),
        float(attr(node, "gamma", 1.05070102214813232421875)),
    )  # fmt: skip


def _elu_like(cx: Lowering, node: ir.Node, alpha: float, gamma: float) -> None:
    """gamma * (max(x, 0) + alpha * (exp(min(x, 0)) - 1))."""
    x = node.inputs[0]
    assert x is not None
    out = node.outputs[0]
    perm = cx.perm(x)
    t = cx.get(x)

    def step(opcode: str, ins: list[int], suffix: str, last: bool = False) -> int:
        dest = cx.output(out, perm) if last else _like(cx, out, perm, suffix)
        cx.emit(opcode, ins, [dest])
        return dest

    pos = step("RELU", [t], "/pos")
    neg = step("MINIMUM", [t, _scalar(cx, 0.0, x)], "/neg")
    e = step("EXP", [neg], "/exp")
    em1 = step("SUB", [e, _scalar(cx, 1.0, x)], "/em1")
    scaled = step("MUL", [em1, _scalar(cx, alpha, x)], "/alpha")
    if gamma == 1.0:
        step("ADD", [pos, scaled], "", last=True)
        return
    total = step("ADD", [pos, scaled], "/sum")
    step("MUL", [total, _scalar(cx, gamma, x)], "", last=True)


def _gelu(cx: Lowering, node: ir.Node) -> None:
    approximate = attr(node, "approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    unary("GELU", {"approximate": approximate == "tanh"})(cx, node)


def _softplus(cx: Lowering, node: ir.Node) -> None:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow for large x. TFLite has no
    # LOG1P, and LOG(1 + u) loses u's digits once u is small (x = -10: 1 + 4.5e-5 keeps two of
    # them), so below u = 1e-3 the series u - u^2/2 + u^3/3 (error under u^4/4) is taken.
    x = node.inputs[0]
    assert x is not None
    out = node.outputs[0]
    perm = cx.perm(x)
    t = cx.get(x)
    counter = iter(range(100))

    def step(opcode: str, ins: list[int], last: bool = False, ttype: int | None = None) -> int:
        if last:
            dest = cx.output(out, perm)
        elif ttype is None:
            dest = _like(cx, out, perm, f"/softplus{next(counter)}")
        else:
            shape = cx.shape(out)
            dest = cx.temp(f"{out.name}/small", ttype, [shape[p] for p in perm])
        cx.emit(opcode, ins, [dest])
        return dest

    def scalar(v: float) -> int:
        return _scalar(cx, v, x)

    u = step("EXP", [step("NEG", [step("ABS", [t])])])
    log = step("LOG", [step("ADD", [u, scalar(1.0)])])
    # Horner: u * (1 + u * (-1/2 + u / 3))
    inner = step("ADD", [step("MUL", [u, scalar(1.0 / 3.0)]), scalar(-0.5)])
    series = step("MUL", [u, step("ADD", [step("MUL", [u, inner]), scalar(1.0)])])
    small = step("LESS", [u, scalar(1e-3)], ttype=6)  # BOOL
    log1p = step("SELECT_V2", [small, series, log])
    step("ADD", [step("RELU", [t]), log1p], last=True)


def _reciprocal(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    assert x is not None
    perm = cx.perm(x)
    one = _scalar(cx, 1.0, x)
    cx.emit("DIV", [one, cx.get(x)], [cx.output(node.outputs[0], perm)], FUSED)


def _pow(cx: Lowering, node: ir.Node) -> None:
    x, y = node.inputs[0], node.inputs[1]
    if x is None or y is None:
        raise Unsupported("an input is missing")
    if cx.dtype(x) != cx.dtype(y):
        _pow_mixed(cx, node, x, y)
        return
    if cx.dtype(x) not in (np.float32, np.int32):
        raise Unsupported(f"Pow on {cx.dtype(x)} (TFLite's POW computes float32 and int32)")
    exponent = cx.const(y)
    if exponent is not None and exponent.size == 1 and cx.dtype(x).kind == "f":
        e = float(exponent.reshape(()))
        if e == 1.0:
            _identity(cx, node)
            return
        if e == 2.0:
            _then(cx, node, [("SQUARE", [None], None)])
            return
        if e == 0.5:
            _then(cx, node, [("SQRT", [None], None)])
            return
        if e == -0.5:
            _then(cx, node, [("RSQRT", [None], None)])
            return
        if e == -1.0:
            _reciprocal(cx, node)
            return
    binary("POW")(cx, node)


def _pow_mixed(cx: Lowering, node: ir.Node, x: ir.Value, y: ir.Value) -> None:
    """ONNX lets the exponent's type differ from the base's (the result has the base's); TFLite's
    POW takes one type. A float base takes an integer exponent cast to it (exact below 2**24)."""
    if cx.dtype(x) != np.float32 or cx.dtype(y).kind not in "iu":
        raise Unsupported(
            f"Pow of {cx.dtype(x)} to a {cx.dtype(y)} power (TFLite's POW takes one type; only a "
            "float32 base with an integer exponent is converted)"
        )
    out = node.outputs[0]
    rank = cx.rank(out)
    perm = shared_perm(cx, [x, y], rank)
    held = cx.get_broadcast(y, rank, perm)
    tensor = cx.b.tensors[held]
    if cx.b.is_const(held) and tensor.data is not None:
        exponent = cx.constant(tensor.data.astype(np.float32), "exponent")
    else:
        exponent = cx.temp(f"{out.name}/exponent", 0, tensor.shape)  # FLOAT32
        cx.emit("CAST", [held], [exponent])
    ins = [cx.get_broadcast(x, rank, perm), exponent]
    cx.emit("POW", ins, [cx.output(out, perm)])


def _dropout(cx: Lowering, node: ir.Node) -> None:
    """Dropout at inference is the identity; its mask output and training mode are not."""
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        raise Unsupported("its mask output is used (inference computes no mask)")
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = cx.const(node.inputs[2])
        if training is None or bool(training.reshape(-1)[0]):
            raise Unsupported("training_mode is set or computed at run time (inference only)")
    _identity(cx, node)


def _div(cx: Lowering, node: ir.Node) -> None:
    x, y = node.inputs[0], node.inputs[1]
    if x is None or y is None:
        raise Unsupported("an input is missing")
    if cx.dtype(x).kind in "iu":
        raise Unsupported("integer Div (ONNX truncates toward zero; TFLite's FLOOR_DIV floors)")
    divisor = cx.const(y)
    if divisor is not None and cx.dtype(x).kind == "f" and np.all(divisor != 0):
        # x / c == x * (1/c) up to an ulp, and MUL is what every delegate fuses best.
        out = node.outputs[0]
        rank = cx.rank(out)
        perm = cx.perm(x) if cx.rank(x) == rank else shared_perm(cx, [x], rank)
        inv = (1.0 / divisor.astype(np.float64)).astype(divisor.dtype)
        shape = (1,) * (rank - inv.ndim) + inv.shape
        inv = inv.reshape(shape).transpose(perm)
        while inv.ndim > 1 and inv.shape[0] == 1:
            inv = inv[0]
        ins = [
            cx.get_broadcast(x, rank, perm),
            cx.constant(inv.reshape(()) if inv.size == 1 else inv, "recip"),
        ]
        cx.emit("MUL", ins, [cx.output(out, perm)], FUSED)
        return
    binary("DIV", fused=True)(cx, node)


def _sign(cx: Lowering, node: ir.Node) -> None:
    unary("SIGN")(cx, node)


# ------------------------------------------------------------------------------ normalization


def _channel_vector(cx: Lowering, value: ir.Value | None, rank: int, axis: int) -> np.ndarray:
    """A constant per-channel vector as a rank-``rank`` array along ONNX ``axis``."""
    array = cx.const(value) if value is not None else None
    if array is None:
        raise Unsupported("the normalization's parameters are computed at run time")
    shape = [1] * rank
    shape[axis] = -1
    return array.astype(np.float64).reshape(shape)


def _batch_norm(cx: Lowering, node: ir.Node) -> None:
    if attr(node, "training_mode", 0):
        raise Unsupported("training_mode=1 (inference only)")
    if len([o for o in node.outputs if o.uses()]) > 1:
        raise Unsupported("the running mean/variance outputs are used")
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    eps = float(attr(node, "epsilon", 1e-5))
    scale, bias, mean, var = (_channel_vector(cx, v, rank, 1) for v in node.inputs[1:5])
    mul = scale / np.sqrt(var + eps)
    add = bias - mean * mul
    _affine(cx, node, x, mul, add)


def _affine(cx: Lowering, node: ir.Node, x: ir.Value, mul: np.ndarray, add: np.ndarray) -> None:
    """``x * mul + add`` with ONNX-shaped constant arrays, in x's layout."""
    out = node.outputs[0]
    perm = cx.perm(x)
    dtype = cx.dtype(x)

    def squeezed(a: np.ndarray) -> np.ndarray:
        a = a.astype(dtype).transpose(perm)
        while a.ndim > 1 and a.shape[0] == 1:
            a = a[0]
        return a

    scaled = _like(cx, out, perm, "/scale")
    cx.emit("MUL", [cx.get(x), cx.constant(squeezed(mul), "bn_scale")], [scaled], FUSED)
    cx.emit("ADD", [scaled, cx.constant(squeezed(add), "bn_shift")], [cx.output(out, perm)], FUSED)


def _normalize(
    cx: Lowering, node: ir.Node, axes: Sequence[int], eps: float, scale: ir.Value | None,
    bias: ir.Value | None, per_channel: bool,
) -> None:  # fmt: skip
    """(x - mean) / sqrt(var + eps) over ONNX ``axes``, then * scale + bias."""
    x = node.inputs[0]
    assert x is not None
    out = node.outputs[0]
    rank = cx.rank(x)
    perm = cx.perm(x)
    shape = cx.shape(x)
    t_axes = sorted(axis_of(perm, a) for a in axes)
    reduced = [1 if p in axes else shape[p] for p in perm]
    ttype = cx.ttype(x)
    t = cx.get(x)
    keep = {"keep_dims": True}
    mean = cx.temp(f"{out.name}/mean", ttype, reduced)
    cx.emit("MEAN", [t, cx.ints(t_axes, "axes")], [mean], keep)
    sq = _like(cx, out, perm, "/sqdiff")
    cx.emit("SQUARED_DIFFERENCE", [t, mean], [sq])
    var = cx.temp(f"{out.name}/var", ttype, reduced)
    cx.emit("MEAN", [sq, cx.ints(t_axes, "axes")], [var], keep)
    shifted = cx.temp(f"{out.name}/var_eps", ttype, reduced)
    cx.emit("ADD", [var, _scalar(cx, eps, x)], [shifted], FUSED)
    inv = cx.temp(f"{out.name}/rstd", ttype, reduced)
    cx.emit("RSQRT", [shifted], [inv])
    centered = _like(cx, out, perm, "/centered")
    cx.emit("SUB", [t, mean], [centered], FUSED)
    has_scale = scale is not None
    has_bias = bias is not None
    normed = (
        cx.output(out, perm) if not (has_scale or has_bias) else _like(cx, out, perm, "/normed")
    )
    cx.emit("MUL", [centered, inv], [normed], FUSED)
    acc = normed
    for k, (value, opcode) in enumerate(((scale, "MUL"), (bias, "ADD"))):
        if value is None:
            continue
        last = k == 1 or not has_bias
        if per_channel:
            array = _channel_vector(cx, value, rank, 1).astype(cx.dtype(x))
            operand = cx.constant(_strip(array.transpose(perm)), value.name or "c")
        else:
            operand = cx.get_broadcast(value, rank, perm)
        dest = cx.output(out, perm) if last else _like(cx, out, perm, f"/{opcode.lower()}")
        cx.emit(opcode, [acc, operand], [dest], FUSED)
        acc = dest


def _strip(array: np.ndarray) -> np.ndarray:
    while array.ndim > 1 and array.shape[0] == 1:
        array = array[0]
    return array


def _layer_norm(cx: Lowering, node: ir.Node) -> None:
    if len([o for o in node.outputs if o.uses() or o.is_graph_output()]) > 1:
        raise Unsupported("the mean/inverse-deviation outputs are used")
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    axis = int(attr(node, "axis", -1)) % rank
    scale = node.inputs[1] if len(node.inputs) > 1 else None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    eps = float(attr(node, "epsilon", 1e-5))
    _normalize(cx, node, list(range(axis, rank)), eps, scale, bias, per_channel=False)


def _instance_norm(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    eps = float(attr(node, "epsilon", 1e-5))
    _normalize(
        cx, node, list(range(2, rank)), eps, node.inputs[1], node.inputs[2], per_channel=True
    )


def _const_scalar(cx: Lowering, value: ir.Value | None) -> float | None:
    array = cx.const(value) if value is not None else None
    return float(array.reshape(())) if array is not None and array.size == 1 else None


def _sole_user(value: ir.Value, op_type: str) -> ir.Node | None:
    users = [use.node for use in value.uses()]
    if len(users) != 1 or value.is_graph_output() or users[0].op_type != op_type:
        return None
    return users[0]


def _other_input(node: ir.Node, mine: ir.Value) -> ir.Value | None:
    ins = list(node.inputs)
    if len(ins) != 2 or mine not in ins:
        return None
    return ins[1] if ins[0] is mine else ins[0]


def _gelu_nodes(cx: Lowering, erf: ir.Node) -> tuple[ir.Value, list[ir.Node], ir.Value] | None:
    """``(x, nodes after the Erf, output)`` when ``erf`` is inside GELU written out:
    ``0.5 * x * (1 + erf(x / sqrt(2)))`` in the orders exporters write it."""
    scaled = erf.inputs[0]
    if scaled is None:
        return None
    pre = scaled.producer()
    if pre is None or pre.op_type not in ("Div", "Mul") or len(scaled.uses()) != 1:
        return None
    x = pre.inputs[0]
    factor = _const_scalar(cx, pre.inputs[1])
    if x is None or factor is None:
        return None
    if not math.isclose(factor if pre.op_type == "Div" else 1 / factor, math.sqrt(2), rel_tol=1e-4):
        return None
    add = _sole_user(erf.outputs[0], "Add")
    if add is None or _const_scalar(cx, _other_input(add, erf.outputs[0])) != 1.0:
        return None
    m1 = _sole_user(add.outputs[0], "Mul")
    if m1 is None:
        return None
    partner = _other_input(m1, add.outputs[0])
    if partner is x:  # x * (1 + erf) * 0.5
        m2 = _sole_user(m1.outputs[0], "Mul")
        if m2 is not None and _const_scalar(cx, _other_input(m2, m1.outputs[0])) == 0.5:
            return x, [add, m1, m2], m2.outputs[0]
        return None
    if _const_scalar(cx, partner) == 0.5:  # x * ((1 + erf) * 0.5)
        m2 = _sole_user(m1.outputs[0], "Mul")
        if m2 is not None and _other_input(m2, m1.outputs[0]) is x:
            return x, [add, m1, m2], m2.outputs[0]
        return None
    half = partner.producer() if partner is not None else None  # (0.5 * x) * (1 + erf)
    if (
        half is not None
        and half.op_type == "Mul"
        and x in half.inputs
        and _const_scalar(cx, _other_input(half, x)) == 0.5
    ):
        return x, [add, m1], m1.outputs[0]
    return None


# Abramowitz & Stegun 7.1.26: |error| < 1.5e-7 for erf.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(cx: Lowering, node: ir.Node) -> None:
    """GELU when the Erf is inside one; else erf itself to 1.5e-7 (Abramowitz & Stegun
    7.1.26), as TFLite has no Erf kernel."""
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    if cx.dtype(x) != np.float32:
        raise Unsupported(f"Erf of {cx.dtype(x)}")
    gelu = _gelu_nodes(cx, node)
    if gelu is not None:
        source, after, out = gelu
        perm = cx.perm(source)
        cx.emit("GELU", [cx.get(source)], [cx.output(out, perm)], {"approximate": False})
        cx.done.update(after)
        return
    out = node.outputs[0]
    perm = cx.perm(x)
    t_x = cx.get(x)
    names = iter(range(100))

    def step(opcode: str, ins: list[int], last: bool = False) -> int:
        dest = cx.output(out, perm) if last else _like(cx, out, perm, f"/erf{next(names)}")
        cx.emit(opcode, ins, [dest], FUSED if opcode in ("ADD", "SUB", "MUL", "DIV") else None)
        return dest

    def k(value: float) -> int:
        return _scalar(cx, value, x)

    a = step("ABS", [t_x])
    t = step("DIV", [k(1.0), step("ADD", [step("MUL", [a, k(_ERF_P)]), k(1.0)])])
    poly = step("MUL", [t, k(_ERF_A[4])])
    for coefficient in reversed(_ERF_A[:4]):
        poly = step("MUL", [step("ADD", [poly, k(coefficient)]), t])
    gauss = step("EXP", [step("NEG", [step("SQUARE", [t_x])])])
    magnitude = step("SUB", [k(1.0), step("MUL", [poly, gauss])])
    step("MUL", [magnitude, step("SIGN", [t_x])], last=True)


_CAST_TYPES = {"f", "i", "u", "b"}


def _cast(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    out = node.outputs[0]
    target = cx.dtype(out)
    if target == np.float64 or target.kind not in _CAST_TYPES:
        raise Unsupported(f"TFLite does not compute in {target}")
    if cx.dtype(x) == target:
        _identity(cx, node)
        return
    perm = cx.perm(x)
    cx.emit("CAST", [cx.get(x)], [cx.output(out, perm)])


OPS: dict[str, Translator] = {
    "Add": binary("ADD", fused=True),
    "Sub": binary("SUB", fused=True),
    "Mul": binary("MUL", fused=True),
    "Div": _div,
    "Pow": _pow,
    "Max": variadic("MAXIMUM"),
    "Min": variadic("MINIMUM"),
    "Sum": variadic("ADD"),
    "Equal": binary("EQUAL"),
    "Less": binary("LESS"),
    "LessOrEqual": binary("LESS_EQUAL"),
    "Greater": binary("GREATER"),
    "GreaterOrEqual": binary("GREATER_EQUAL"),
    "And": binary("LOGICAL_AND"),
    "Or": binary("LOGICAL_OR"),
    "Not": unary("LOGICAL_NOT"),
    "Sqrt": unary("SQRT"),
    "Exp": unary("EXP"),
    "Log": unary("LOG"),
    "Neg": unary("NEG"),
    "Abs": unary("ABS"),
    "Floor": unary("FLOOR"),
    "Ceil": unary("CEIL"),
    "Round": unary("ROUND"),
    "Sin": unary("SIN"),
    "Cos": unary("COS"),
    "Sign": _sign,
    "Reciprocal": _reciprocal,
    "Relu": unary("RELU"),
    "Sigmoid": unary("LOGISTIC"),
    "Tanh": unary("TANH"),
    "HardSwish": unary("HARD_SWISH"),
    "HardSigmoid": _hard_sigmoid,
    "LeakyRelu": _leaky_relu,
    "PRelu": _prelu,
    "Elu": _elu,
    "Selu": _selu,
    "Gelu": _gelu,
    "Softplus": _softplus,
    "Clip": _clip,
    "Erf": _erf,
    "Identity": _identity,
    "Dropout": _dropout,
    "Cast": _cast,
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
}
