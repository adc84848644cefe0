"""TensorRT's ONNX op support as an OpRule table, following onnx-tensorrt's operator matrix.

Source: onnx-tensorrt ``docs/operators.md`` for TensorRT 10.15 ("supports operators in the inclusive
range of opset 9 to opset 24"). Every row of its support matrix marked ``Y`` is here with its
"Supported Types" (for the data inputs) and its "Restrictions" as ``const_inputs`` or a ``check``;
rows marked ``N`` are absent, so the table answers "X is not supported". On top of the matrix:

- **No FP64, no strings, no complex, no 16-bit or unsigned wide ints** anywhere, on any input or
  output: TensorRT has none of these types (the parser would clamp DOUBLE to FLOAT, changing
  results, so ferry does not let it).
- **INT64** is native in TensorRT 10 for the ops the matrix lists it for; INT8, INT4 and FP8 come
  only through QuantizeLinear/DequantizeLinear (explicit quantization); UINT8 only through Cast
  (network inputs and outputs).
- **Rank <= 8** (``nvinfer1::Dims::MAX_DIMS``) on every input and output.
- **If / Loop / Scan** are taken only when every node of their bodies is, with the matrix's
  limits (If branches of equal rank; a Loop with scan outputs needs a constant trip count).
- **Constant inputs** only where the matrix demands them: reduction axes, Squeeze/Unsqueeze
  axes, CumSum's axis, OneHot's depth, STFT's frame_step and window, Dropout's training_mode,
  Q/DQ zero points (which must also be 0). Reshape's shape, Resize's scales/sizes, Pad's pads,
  Slice's starts/ends and TopK's K may be computed at run time in TensorRT 10 (K < 3840 is
  checked when it is a constant).
- **NonZero and NonMaxSuppression** are refused although TensorRT has them: their output shapes
  depend on the data, and ferry's TensorRT runner sizes outputs before it executes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends._rules import (
    OpRule,
    RuleTable,
    all_checks,
    attr,
    constant_array,
    output_used,
    subgraphs_supported,
)
from ferry.graph import dtype_name, named_subgraphs

__all__ = ["MAX_OPSET", "MAX_RANK", "MIN_OPSET", "rules", "table"]

#: The default-domain opsets onnx-tensorrt 10.15 documents support for.
MIN_OPSET = 9
MAX_OPSET = 24
#: nvinfer1::Dims::MAX_DIMS.
MAX_RANK = 8

# The matrix's type columns, as ferry.graph.dtype_name spells them.
F = frozenset({"float32", "float16", "bfloat16"})
F32_16 = frozenset({"float32", "float16"})
I = frozenset({"int32", "int64"})  # noqa: E741 - the matrix's own shorthand, kept for readability
B = frozenset({"bool"})
FI = F | I
FIB = F | I | B
#: Quantized element types TensorRT takes as DequantizeLinear inputs (symmetric only).
QUANT = frozenset({"int8", "int4", "float8_e4m3fn", "float4_e2m1fn"})
#: Every element type TensorRT has; anything else on any edge is refused.
TRT_TYPES = FIB | QUANT | frozenset({"uint8"})

_NO_TYPE_HINT = {
    "float64": "TensorRT has no FP64; convert the model to float32",
    "string": "TensorRT has no string tensors",
    "complex64": "TensorRT has no complex tensors",
    "complex128": "TensorRT has no complex tensors",
}

Check = Callable[[ir.Node], bool | str]
DTypes = frozenset[str] | Mapping[int, frozenset[str]] | None


# --- checks shared by every rule --------------------------------------------------------------


def _edge_types(node: ir.Node) -> bool | str:
    """Refuse a node that reads or writes a type TensorRT lacks, or a tensor of rank > 8."""
    for kind, values in (("input", node.inputs), ("output", node.outputs)):
        for index, value in enumerate(values):
            if value is None:
                continue
            if value.dtype is not None:
                name = dtype_name(value.dtype)
                if name not in TRT_TYPES:
                    hint = _NO_TYPE_HINT.get(name, f"TensorRT has no {name} type")
                    return f"{kind} {index} ({value.name}) is {name}: {hint}"
            if value.shape is not None and len(value.shape) > MAX_RANK:
                return f"{kind} {index} ({value.name}) has rank {len(value.shape)} > {MAX_RANK}"
    return True


# --- per-op checks (the matrix's "Restrictions" column) ---------------------------------------


def _rank_in(index: int, ranks: Iterable[int], what: str) -> Check:
    allowed = tuple(ranks)

    def check(node: ir.Node) -> bool | str:
        value = node.inputs[index] if index < len(node.inputs) else None
        shape = value.shape if value is not None else None
        if shape is not None and len(shape) not in allowed:
            return f"{what} (input {index} has rank {len(shape)})"
        return True

    return check


def _attr_in(name: str, allowed: Iterable[object], default: object) -> Check:
    options = tuple(allowed)

    def check(node: ir.Node) -> bool | str:
        value = attr(node, name, default)
        if isinstance(value, bytes):
            value = value.decode()
        if value not in options:
            listed = ", ".join(repr(o) for o in options)
            return f"{name}={value!r} is not supported (supported: {listed})"
        return True

    return check


def _ones_or_absent(name: str) -> Check:
    def check(node: ir.Node) -> bool | str:
        value = attr(node, name)
        if value is not None and any(v != 1 for v in value):
            return f"{name}={list(value)} is not supported (must be empty or all ones)"
        return True

    return check


def _output_unused(index: int, what: str) -> Check:
    def check(node: ir.Node) -> bool | str:
        return f"{what} is not supported" if output_used(node, index) else True

    return check


def _input_absent(indices: Iterable[int], what: str) -> Check:
    wanted = tuple(indices)

    def check(node: ir.Node) -> bool | str:
        for i in wanted:
            if i < len(node.inputs) and node.inputs[i] is not None:
                return f"{what} is not supported"
        return True

    return check


def _zero_point_zero(index: int) -> Check:
    def check(node: ir.Node) -> bool | str:
        if index >= len(node.inputs) or node.inputs[index] is None:
            return True
        value = node.inputs[index]
        if value is not None and value.dtype is not None:
            name = dtype_name(value.dtype)
            if name == "uint8":
                return "uint8 (asymmetric) quantization is not supported; quantize to int8"
        data = constant_array(value)
        if data is None:
            return f"zero point (input {index}) must be a constant"
        if data.dtype.kind in "iub" and np.any(data.astype(np.int64) != 0):
            return "zero point must be 0 (TensorRT quantizes symmetrically)"
        if data.dtype.kind == "f" and np.any(data.astype(np.float32) != 0):
            return "zero point must be 0 (TensorRT quantizes symmetrically)"
        return True

    return check


def _control_flow(node: ir.Node) -> bool | str:
    return subgraphs_supported(node, table())


def _if_branches(node: ir.Node) -> bool | str:
    branches = dict(named_subgraphs(node))
    then, other = branches.get("then_branch"), branches.get("else_branch")
    if then is None or other is None:
        return True
    for a, b in zip(then.outputs, other.outputs):
        if a.shape is not None and b.shape is not None and len(a.shape) != len(b.shape):
            return f"If branches give outputs of different ranks ({a.name}, {b.name})"
        if a.name and a.name == b.name:
            return f"If branches must name their outputs differently ({a.name!r} in both)"
    return True


def _loop_limits(node: ir.Node) -> bool | str:
    carried = len(node.inputs) - 2
    has_scan_outputs = len(node.outputs) > carried
    trip = node.inputs[0] if node.inputs else None
    if has_scan_outputs and (trip is None or constant_array(trip) is None):
        return "a Loop with scan outputs needs a constant trip count (M)"
    body = dict(named_subgraphs(node)).get("body")
    if body is not None:
        # Body inputs: iteration, cond, carried...; outputs: cond, carried..., scan outputs...
        for x, y in zip(body.inputs[2:], body.outputs[1 : 1 + carried]):
            if (
                x.shape is not None
                and y.shape is not None
                and all(isinstance(d, int) for d in (*x.shape, *y.shape))
                and tuple(x.shape) != tuple(y.shape)
            ):
                return f"loop-carried value {x.name!r} changes shape across iterations"
    return True


def _bidirectional_same(per_direction: int) -> Check:
    def check(node: ir.Node) -> bool | str:
        if attr(node, "direction", "forward") not in ("bidirectional", b"bidirectional"):
            return True
        acts = attr(node, "activations")
        if acts and tuple(acts[:per_direction]) != tuple(acts[per_direction:]):
            return "bidirectional with different forward and reverse activations"
        return True

    return check


def _cast_target(node: ir.Node) -> bool | str:
    to = attr(node, "to")
    if to is None:
        return True
    name = dtype_name(ir.DataType(to))
    allowed = FI | B | frozenset({"uint8"})
    return True if name in allowed else f"Cast to {name} is not supported"


def _constant_value(node: ir.Node) -> bool | str:
    for name in ("sparse_value", "value_string", "value_strings"):
        if name in node.attributes:
            return f"attribute {name!r} is not supported"
    return True


def _constant_of_shape_value(node: ir.Node) -> bool | str:
    found = node.attributes.get("value")
    if found is None or found.is_ref():
        return True
    name = dtype_name(found.as_tensor().dtype)
    return True if name in FIB | QUANT else f"value of type {name} is not supported"


def _random_dtype(node: ir.Node) -> bool | str:
    name = dtype_name(ir.DataType(attr(node, "dtype", onnx.TensorProto.FLOAT)))
    return True if name in F else f"dtype {name} is not supported"


def _dropout_inference(node: ir.Node) -> bool | str:
    if len(node.inputs) < 3 or node.inputs[2] is None:
        return True
    training = constant_array(node.inputs[2])
    if training is None:
        return "training_mode (input 2) must be a constant False"
    return "training_mode=True is not supported" if bool(np.any(training)) else True


def _static_axis_dim(node: ir.Node) -> bool | str:
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return "the input's shape must be known (its axis dimension is a build-time constant)"
    axis = int(attr(node, "axis", -1))
    if not -len(shape) <= axis < len(shape):
        return f"axis {axis} is out of range for rank {len(shape)}"
    if not isinstance(shape[axis], int):
        return f"dimension {axis} of the input must be static"
    return True


def _static_input(node: ir.Node) -> bool | str:
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return "the input must have static dimensions"
    return True


def _resize_modes(node: ir.Node) -> bool | str:
    for check in (
        _attr_in("mode", ("nearest", "linear"), "nearest"),
        _attr_in(
            "coordinate_transformation_mode",
            (
                "half_pixel",
                "pytorch_half_pixel",
                "tf_half_pixel_for_nn",
                "asymmetric",
                "align_corners",
            ),
            "half_pixel",
        ),
        _attr_in(
            "nearest_mode",
            ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil"),
            "round_prefer_floor",
        ),
        _attr_in("keep_aspect_ratio_policy", ("stretch",), "stretch"),
        _attr_in("antialias", (0,), 0),
    ):
        verdict = check(node)
        if verdict is not True:
            return verdict
    axes = attr(node, "axes")
    scales = node.inputs[2] if len(node.inputs) > 2 else None
    data = node.inputs[0] if node.inputs else None
    if axes is not None and scales is not None and constant_array(scales) is None:
        rank = len(data.shape) if data is not None and data.shape is not None else None
        if rank is None or tuple(axes) != tuple(range(rank)):
            return "with scales as a tensor input, axes must be 0..rank-1"
    return True


def _topk_limits(node: ir.Node) -> bool | str:
    if int(attr(node, "sorted", 1)) != 1:
        return "sorted=0 is not supported"
    k = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if k is not None and k.size == 1 and int(k.reshape(-1)[0]) >= 3840:
        return f"K={int(k.reshape(-1)[0])} is not supported (must be < 3840)"
    return True


def _deform_conv(node: ir.Node) -> bool | str:
    pads = attr(node, "pads")
    if pads is not None:
        half = len(pads) // 2
        if tuple(pads[:half]) != tuple(pads[half:]):
            return "pads must be equal at the beginning and end of each axis"
    return True


def _stft_real(node: ir.Node) -> bool | str:
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if shape is not None and len(shape) > 0 and shape[-1] == 2:
        return "complex-valued signals are not supported"
    return True


def _attention_limits(node: ir.Node) -> bool | str:
    for i in (1, 2, 3):
        if output_used(node, i):
            return "the present_key/present_value/qk_matmul_output outputs are not supported"
    if int(attr(node, "qk_matmul_output_mode", 0)) != 0:
        return "qk_matmul_output_mode is not supported"
    if float(attr(node, "softcap", 0.0)) != 0.0:
        return "softcap is not supported"
    return True


def _data_dependent(node: ir.Node) -> bool | str:
    return (
        f"{node.op_type}'s output shape depends on the data; ferry's TensorRT runner sizes "
        "outputs before it runs, so this node stays on ONNX Runtime"
    )


# --- the table -------------------------------------------------------------------------------


@functools.cache
def _versions() -> dict[str, tuple[int, int | None]]:
    """Default-domain op -> (first opset defining it, opset that deprecated it or None)."""
    first: dict[str, int] = {}
    newest: dict[str, tuple[int, bool]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx") or schema.since_version > MAX_OPSET:
            continue
        name, since = schema.name, schema.since_version
        first[name] = min(first.get(name, since), since)
        if since >= newest.get(name, (0, False))[0]:
            newest[name] = (since, bool(schema.deprecated))
    return {name: (first[name], newest[name][0] if newest[name][1] else None) for name in first}


def _first_version(op: str) -> int:
    """The first opset in range that defines ``op`` (experimental ops ONNX dropped: MIN_OPSET)."""
    found = _versions().get(op)
    return max(MIN_OPSET, found[0]) if found is not None else MIN_OPSET


def _last_version(op: str) -> int:
    """MAX_OPSET, or the opset before the one that deprecated ``op`` (Upsample: 9)."""
    found = _versions().get(op)
    return found[1] - 1 if found is not None and found[1] is not None else MAX_OPSET


def _rule(
    op: str,
    dtypes: DTypes,
    *,
    const: tuple[int, ...] = (),
    check: Check | Iterable[Check] | None = None,
) -> OpRule:
    checks: list[Check] = [_edge_types]
    if callable(check):
        checks.append(check)
    elif check is not None:
        checks.extend(check)
    return OpRule(
        op_type=op,
        since=_first_version(op),
        until=_last_version(op),
        dtypes=dtypes,
        const_inputs=const,
        max_rank=MAX_RANK,
        check=all_checks(*checks),
    )


def _d(**by_index: frozenset[str]) -> dict[int, frozenset[str]]:
    """``_d(i0=F, i2=I)`` -> ``{0: F, 2: I}``: dtypes of the named inputs only."""
    return {int(k[1:]): v for k, v in by_index.items()}


def _ops(names: str) -> tuple[str, ...]:
    return tuple(names.split())


# Ops whose every input takes the same matrix types, and ops with restrictions on data input 0.
_FLOAT_OPS = _ops("""
    Acos Acosh Asin Asinh Atan Atanh BatchNormalization Ceil Celu Clip Conv ConvTranspose Cos Cosh
    Einsum Elu Erf Exp Floor Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool GroupNormalization
    HardSigmoid HardSwish ImageScaler InstanceNormalization IsInf LeakyRelu Log LogSoftmax LRN
    LpNormalization MatMul MeanVarianceNormalization ParametricSoftplus PRelu Reciprocal
    RMSNormalization Round ScaledTanh Scan Selu Sigmoid Sin Sinh Softmax Softplus Softsign Sqrt Tan
    Tanh ThresholdedRelu
""")
_FLOAT_INT_OPS = _ops("""
    Abs Add ArgMax ArgMin DepthToSpace Div Equal Greater GreaterOrEqual IsNaN Less LessOrEqual Max
    Min Mod Mul Neg Pow Range Relu Shrink Sign SpaceToDepth Sub Sum
""")
_BOOL_OPS = _ops("And Not Or Xor")
_ANY_OPS = _ops("Concat Flatten Identity")
_DATA_ANY_OPS = _ops("Expand Reshape ReverseSequence Shape Size Slice Split Tile Transpose Trilu")
_REDUCE_OPS = _ops("""
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
    ReduceSum ReduceSumSquare
""")
_RANDOM_OPS = _ops("RandomNormal RandomNormalLike RandomUniform RandomUniformLike")
_WINDOW_OPS = _ops("BlackmanWindow HammingWindow HannWindow")


def _build() -> list[OpRule]:
    pool_2d_3d = _rank_in(0, (4, 5), "2D or 3D pooling only")
    rules = [_rule(op, F) for op in _FLOAT_OPS]
    rules += [_rule(op, FI) for op in _FLOAT_INT_OPS]
    rules += [_rule(op, B) for op in _BOOL_OPS]
    rules += [_rule(op, FIB) for op in _ANY_OPS]
    rules += [_rule(op, _d(i0=FIB)) for op in _DATA_ANY_OPS]
    # Reductions: axes (input 1, from opset 13/18) must be an initializer.
    rules += [_rule(op, _d(i0=FI), const=(1,)) for op in _REDUCE_OPS]
    rules += [_rule(op, _d(i0=FIB), const=(1,)) for op in ("Squeeze", "Unsqueeze")]
    rules += [_rule(op, _d(i0=FIB, i1=I)) for op in ("Gather", "GatherElements", "GatherND")]
    rules += [_rule(op, None, check=_random_dtype) for op in _RANDOM_OPS]
    rules += [_rule(op, None) for op in _WINDOW_OPS]
    rules += [_rule(op, None, check=_data_dependent) for op in ("NonZero", "NonMaxSuppression")]
    rules += [
        _rule(
            "Attention",
            _d(i0=F, i1=F, i2=F, i3=F | B),
            check=(
                _input_absent((4, 5, 6), "past_key/past_value/nonpad_kv_seqlen inputs"),
                _rank_in(0, (4,), "Q must be 4D"),
                _rank_in(1, (4,), "K must be 4D"),
                _rank_in(2, (4,), "V must be 4D"),
                _rank_in(3, (4,), "attn_mask must be 4D"),
                _attention_limits,
            ),
        ),
        _rule("AveragePool", F, check=(pool_2d_3d, _ones_or_absent("dilations"))),
        _rule(
            "MaxPool",
            F,
            check=(
                pool_2d_3d,
                _ones_or_absent("dilations"),
                _output_unused(1, "the Indices output"),
            ),
        ),
        _rule("LpPool", F, check=_ones_or_absent("dilations")),
        _rule("Cast", _d(i0=FI | B | frozenset({"uint8"})), check=_cast_target),
        _rule("CastLike", _d(i0=FI | B | frozenset({"uint8"}), i1=FI | B | frozenset({"uint8"}))),
        _rule("Constant", None, check=_constant_value),
        _rule("ConstantOfShape", None, check=_constant_of_shape_value),
        _rule("CumSum", _d(i0=F), const=(1,)),
        _rule(
            "DeformConv",
            F32_16,
            check=(_rank_in(0, (3, 4), "1D or 2D spatial input only"), _deform_conv),
        ),
        _rule("DequantizeLinear", _d(i0=QUANT, i1=F), check=_zero_point_zero(2)),
        _rule("QuantizeLinear", _d(i0=F, i1=F), check=_zero_point_zero(2)),
        _rule("Dropout", _d(i0=F), check=_dropout_inference),
        _rule("EyeLike", _d(i0=FIB), check=_static_input),
        _rule("Gelu", FI),
        _rule("GridSample", _d(i0=F32_16, i1=F32_16), check=_rank_in(0, (4,), "4D input only")),
        _rule(
            "GRU",
            _d(i0=F, i1=F, i2=F, i3=F, i5=F),
            check=_bidirectional_same(2),
        ),
        _rule(
            "LSTM",
            _d(i0=F, i1=F, i2=F, i3=F, i5=F, i6=F, i7=F),
            check=(
                _bidirectional_same(3),
                _attr_in("input_forget", (0,), 0),
                _attr_in("layout", (0,), 0),
            ),
        ),
        _rule("RNN", _d(i0=F, i1=F, i2=F, i3=F, i5=F), check=_bidirectional_same(1)),
        _rule("Hardmax", F, check=_static_axis_dim),
        _rule("If", _d(i0=B), check=(_if_branches, _control_flow)),
        _rule("Loop", _d(i0=frozenset({"int64"}), i1=B), check=(_loop_limits, _control_flow)),
        _rule(
            "LayerNormalization",
            F,
            check=(_output_unused(1, "the Mean output"), _output_unused(2, "the InvStdDev output")),
        ),
        _rule("Mean", F | I | frozenset({"float8_e4m3fn"})),
        _rule("Mish", F32_16),
        _rule("OneHot", _d(i2=FIB), const=(1,)),
        _rule("Pad", _d(i0=FI)),
        _rule("Resize", _d(i0=F), check=_resize_modes),
        _rule("Upsample", _d(i0=F), check=_attr_in("mode", ("nearest", "linear"), "nearest")),
        _rule("RoiAlign", _d(i0=F32_16, i1=F32_16)),
        _rule("RotaryEmbedding", _d(i0=F, i1=F, i2=F, i3=frozenset({"int64"}))),
        _rule("STFT", _d(i0=frozenset({"float32"})), const=(1, 2), check=_stft_real),
        _rule("Scatter", _d(i0=FI, i1=I, i2=FI)),
        _rule("ScatterElements", _d(i0=FI, i1=I, i2=FI)),
        _rule(
            "ScatterND",
            _d(i0=FI, i1=I, i2=FI),
            check=_attr_in("reduction", ("none",), "none"),
        ),
        _rule(
            "TensorScatter",
            _d(i0=F | frozenset({"int32"}), i1=F | frozenset({"int32"})),
            check=(
                _rank_in(0, (4,), "past_cache must be 4D"),
                _rank_in(1, (4,), "update must be 4D"),
                _attr_in("axis", (-2,), -2),
            ),
        ),
        _rule("TopK", _d(i0=FI), check=_topk_limits),
        _rule("Where", _d(i0=B, i1=FIB, i2=FIB)),
    ]
    return rules


@functools.cache
def rules() -> tuple[OpRule, ...]:
    """TensorRT's op rules (built once; the onnx schema lookups take a moment)."""
    return tuple(_build())


@functools.cache
def table() -> RuleTable:
    """``rules()`` indexed for lookups."""
    return RuleTable(rules())
