"""The op table: what IREE's ONNX importer converts and its llvm-cpu target compiles.

It is the prefilter of placement: a node whose op is not here is never tried. Each node that
passes is then compiled alone by IREE (``IreeBackend.trial``), whose answer decides; the table
need not know every form an op takes, only which ops are worth trying. The ops are those
torch-mlir's ONNX-to-Torch conversions implement (IREE 3.13's importer), less what measured
badly here (see :data:`REFUSED`).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from ferry.backends import NodeCheck, OpRule, all_checks, attr, constant_array
from ferry.graph import dtype_name

__all__ = ["CHECKS", "CONST_INPUTS", "EXCHANGEABLE", "OPS", "REFUSED", "rules"]

#: Element types a partition's tensors may have: those IREE's Python API exchanges with numpy
#: and its llvm-cpu target computes (booleans travel as i8; no strings). Not float64: IREE
#: demotes it to float32 at import (``--iree-input-demote-f64-to-f32``), so a float64 input
#: does not fit the compiled signature (measured: ONNX's Mod and Einsum float64 cases).
#: Not float16 either: ONNX's attention fp16 case differs beyond its tolerance, and the plugin
#: offers fp32 only.
EXCHANGEABLE = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "bool"})

#: ONNX ops (default domain) with a conversion in IREE's importer, from opset 1.
_OPS_TEXT = (
    "Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization "
    "BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Concat "
    "Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace "
    "DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather "
    "GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual "
    "GroupNormalization HardSigmoid HardSwish Hardmax Identity "
    "InstanceNormalization IsInf IsNaN LRN LayerNormalization LeakyRelu Less LessOrEqual Log "
    "LogSoftmax MatMul MatMulInteger Max MaxPool Mean "
    "MeanVarianceNormalization Min Mish Mod Mul Neg Not OneHot Or PRelu Pad Pow QLinearConv "
    "QuantizeLinear Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu "
    "Reshape Resize Round ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh "
    "Size Slice Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tan Tanh "
    "ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor"
)
OPS = tuple(_OPS_TEXT.split())

#: Ops the importer claims that are left out, and why (measured with IREE 3.13.0 here):
#: compiled alone they crash iree-compile or are refused in the forms models use.
REFUSED = {
    "Unique": "iree-compile crashes (signal 11) on it",
    "LpNormalization": "a zero vector normalizes to NaN where ONNX gives 0 (ONNX's node case)",
    "GridSample": "wrong values with zeros padding and nearest mode (ONNX's node cases)",
    "QLinearMatMul": "wrong values on 3-D inputs (ONNX's node cases)",
    "SpaceToDepth": "wrong values in one of ONNX's node cases",
    "NonMaxSuppression": "iree-compile crashes (signal 11) on it",
    "STFT": "IREE cannot lower ONNX STFT",
    "Loop": "control flow with sequence state; left to the other engines",
    "If": "control flow; left to the other engines",
    "Scan": "control flow; left to the other engines",
}


#: Inputs that must be constants, per op: IREE's conversions read them while compiling
#: (measured on ONNX's node cases: a Reduce's axes, a Slice's starts/ends/axes/steps as graph
#: inputs fail to legalize; a Pad whose pads are computed, in the kit's open_nsfw, too).
CONST_INPUTS: dict[str, tuple[int, ...]] = {
    **{
        op: (1,)
        for op in [
            "ReduceL1",
            "ReduceL2",
            "ReduceLogSum",
            "ReduceLogSumExp",
            "ReduceMax",
            "ReduceMean",
            "ReduceMin",
            "ReduceProd",
            "ReduceSum",
            "ReduceSumSquare",
            "Pad",
        ]
    },
    "Slice": (1, 2, 3, 4),
}


def _outputs_exchangeable(node: ir.Node) -> bool | str:
    """Every output a type IREE returns as the model declares it (a Cast to float64 would come
    back as float32)."""
    for i, value in enumerate(node.outputs):
        if value is not None and value.dtype is not None:
            name = dtype_name(value.dtype)
            if name not in EXCHANGEABLE:
                return f"output {i} has dtype {name}; IREE runs {', '.join(sorted(EXCHANGEABLE))}"
    return True


def _refuse(attribute: str, values: tuple[object, ...], why: str) -> NodeCheck:
    """A check refusing a node whose ``attribute`` is one of ``values``, saying ``why``."""

    def check(node: ir.Node) -> bool | str:
        value = attr(node, attribute)
        if isinstance(value, bytes):
            value = value.decode()
        return f"{attribute}={value!r}: {why}" if value in values else True

    return check


def _reshape_allowzero(node: ir.Node) -> bool | str:
    """A Reshape with allowzero=1 is taken when its shape is a constant without 0 (then the
    flag changes nothing); ONNX's allowzero case, a 0 in the shape, crashes iree-compile."""
    if attr(node, "allowzero", 0) != 1:
        return True
    shape = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if shape is not None and 0 not in shape.tolist():
        return True
    return "allowzero=1 with a 0 or computed shape: crashes iree-compile (signal 8)"


#: Attribute values IREE computes wrongly or does not compile (ONNX's node cases, measured).
CHECKS: dict[str, NodeCheck] = {
    "AveragePool": _refuse("ceil_mode", (1,), "wrong values or no compile in ONNX's node cases"),
    "Gelu": _refuse("approximate", ("tanh",), "differs beyond tolerance in ONNX's node case"),
    "Resize": _refuse(
        "coordinate_transformation_mode",
        ("align_corners",),
        "downsampling gives wrong values in ONNX's node cases",
    ),
    "Reshape": _reshape_allowzero,
    "ConvTranspose": _refuse("group", tuple(range(2, 4097)), "grouped: IREE does not compile it"),
}


def rules() -> Sequence[OpRule]:
    """One rule per op in :data:`OPS`: each input's and output's type one IREE exchanges and
    computes, the inputs of :data:`CONST_INPUTS` constants, the checks of :data:`CHECKS`."""
    return [
        OpRule(
            op,
            dtypes=EXCHANGEABLE,
            const_inputs=CONST_INPUTS.get(op, ()),
            check=all_checks(_outputs_exchangeable, CHECKS.get(op)),
        )
        for op in OPS
    ]
