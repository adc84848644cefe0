"""The op table: what IREE's ONNX importer converts and its llvm-cpu target compiles.

It is the prefilter of placement: a node whose op is not here is never tried. Each node that
passes is then compiled alone by IREE (``IreeBackend.trial``), whose answer decides; the table
need not know every form an op takes, only which ops are worth trying. The ops are those
torch-mlir's ONNX-to-Torch conversions implement (IREE 3.13's importer), less what measured
badly here (see :data:`REFUSED`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ferry.backends import OpRule

__all__ = ["CONST_INPUTS", "EXCHANGEABLE", "OPS", "REFUSED", "rules"]

#: Element types a partition's tensors may have: those IREE's Python API exchanges with numpy
#: and its llvm-cpu target computes (booleans travel as i8; no strings). Not float64: IREE
#: demotes it to float32 at import (``--iree-input-demote-f64-to-f32``), so a float64 input
#: does not fit the compiled signature (measured: ONNX's Mod and Einsum float64 cases).
EXCHANGEABLE = frozenset({"float32", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"})

#: ONNX ops (default domain) with a conversion in IREE's importer, from opset 1.
_OPS_TEXT = (
    "Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization "
    "BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Concat "
    "Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace "
    "DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather "
    "GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual "
    "GridSample GroupNormalization HardSigmoid HardSwish Hardmax Identity "
    "InstanceNormalization IsInf IsNaN LRN LayerNormalization LeakyRelu Less LessOrEqual Log "
    "LogSoftmax MatMul MatMulInteger Max MaxPool Mean "
    "MeanVarianceNormalization Min Mish Mod Mul Neg Not OneHot Or PRelu Pad Pow QLinearConv "
    "QLinearMatMul QuantizeLinear Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu "
    "Reshape Resize Round ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh "
    "Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh "
    "ThresholdedRelu Tile TopK Transpose Trilu Unsqueeze Upsample Where Xor"
)
OPS = tuple(_OPS_TEXT.split())

#: Ops the importer claims that are left out, and why (measured with IREE 3.13.0 here):
#: compiled alone they crash iree-compile or are refused in the forms models use.
REFUSED = {
    "Unique": "iree-compile crashes (signal 11) on it",
    "LpNormalization": "a zero vector normalizes to NaN where ONNX gives 0 (ONNX's node case)",
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


def rules() -> Sequence[OpRule]:
    """One rule per op in :data:`OPS`, each input's type one IREE exchanges and computes, the
    inputs of :data:`CONST_INPUTS` constants."""
    return [OpRule(op, dtypes=EXCHANGEABLE, const_inputs=CONST_INPUTS.get(op, ())) for op in OPS]
