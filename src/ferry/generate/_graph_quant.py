"""The decoder's projections: float MatMul (fp32, or fp16/bf16 weights widened to float32 for the
product), onnxruntime's MatMulNBits (the "ort" flavour) or standard blocked DequantizeLinear ->
MatMul (the "standard" flavour, which OpenVINO keeps compressed), fed with GGUF blocks as they are
stored (Q4_0, Q4_1, Q8_0: no second rounding) or with round-to-nearest blocks of 32.

MatMulNBits computes A @ dequant(B).T with, per row n and block j of 32 inputs,
dequant = scale[n, j] * (code - zero_point[n, j]). GGUF's Q4_0 is exactly that with zero point 8
and Q8_0 with zero point 128 (int8 codes stored +128). Q4_1's value d * q + m would need the float
zero point -m / d, which onnxruntime 1.32 accepts but runs 20-40x slower than packed uint8 zero
points (measured: 3.0 ms against 0.14 ms for 576 x 1536, one thread). So Q4_1 is split the way
llama.cpp's own Q4_1 dot product splits it: A @ (d * q).T with zero point 0, plus the per-block
sums of A times the minimums, sum_j (sum_{k in j} A_k) * m[n, j]: exact, and one small MatMul
(the ort flavour's quantized builds run on rows [tokens, features], where that MatMul and the
Add are one Gemm taking the product as its C: measured 4% faster decode than MatMul + Add, and
the block sums a ReduceSum).
The standard flavour's DequantizeLinear splits Q4_1 the same way (its zero point is an integer
of the codes' type too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.generate._graph_ops import MS_DOMAIN

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.generate._graph_ops import Builder

BLOCK = 32
#: Fuse projections of one input into one node (switchable to measure the difference).
FUSE = True
#: The standard flavour's quantized projections as com.microsoft MatMulNBits instead of
#: DequantizeLinear (OpenVINO reads both; switchable to measure the difference).
STANDARD_NBITS = False


def half_dtype(precision: str) -> Any:
    """numpy dtype of an fp16/bf16 build's stored weights (None for the others)."""
    if precision == "fp16":
        return np.dtype(np.float16)
    if precision == "bf16":
        import ml_dtypes  # onnx_ir's own dependency

        return np.dtype(ml_dtypes.bfloat16)
    return None


@dataclass
class _Plan:
    """How one projection is stored: a float (in, out) matrix, or codes/scales/zero points
    (N, K), Q4_1's minimums, and the bit width."""

    float_t: np.ndarray | None = None
    codes: np.ndarray | None = None
    scales: np.ndarray | None = None
    zeros: np.ndarray | None = None
    mins: np.ndarray | None = None
    bits: int = 0

    @property
    def kind(self) -> tuple[bool, int, bool]:
        return (self.float_t is not None, self.bits, self.mins is not None)

    @property
    def out_features(self) -> int:
        if self.float_t is not None:
            return int(self.float_t.shape[1])
        assert self.codes is not None
        return int(self.codes.shape[0])

    @staticmethod
    def join(plans: Sequence[_Plan]) -> _Plan:
        """Plans of one kind stacked along the outputs."""
        first = plans[0]
        if first.float_t is not None:
            mats = [p.float_t for p in plans if p.float_t is not None]
            return _Plan(float_t=np.concatenate(mats, axis=1))

        def stack(field: str) -> np.ndarray | None:
            parts = [getattr(p, field) for p in plans]
            return None if parts[0] is None else np.concatenate(parts, axis=0)

        return _Plan(
            codes=stack("codes"),
            scales=stack("scales"),
            zeros=stack("zeros"),
            mins=stack("mins"),
            bits=first.bits,
        )


class Quantizer:
    """Writes every projection of one build at one precision.

    Args:
        b: The graph being written.
        precision: "fp32", "fp16", "bf16", "int8" or "int4". fp16/bf16 store the float
            matrices in half precision and widen them (Cast) to float32 for the product:
            activations and the key/value cache stay float32.
        accuracy_level: MatMulNBits' accuracy_level for 4-bit weights (0: float activations;
            4: int8 activations, faster, as llama.cpp quantizes activations for its dot
            products). 8-bit weights always take level 4.

    Attributes:
        quantized: True for int4/int8 builds.
        half: The stored dtype of fp16/bf16 builds' float matrices, else None.
        errors: Per tensor the quantizer rounded itself, the max absolute error it added.
    """

    def __init__(self, b: Builder, precision: str, accuracy_level: int = 0) -> None:
        self.b = b
        self.precision = precision
        self.quantized = precision in ("int4", "int8")
        self.half = half_dtype(precision)
        self.bits = 8 if precision == "int8" else 4
        self.accuracy_level = accuracy_level
        self.errors: dict[str, float] = {}
        # per input value, its block sums: q, k, v (and gate, up) share one
        self._block_sums: dict[int, tuple[ir.Value, ir.Value]] = {}
        #: The inputs are 2D [tokens, features] (the ort flavour's rows layout): Q4_1's
        #: minimum correction is then one Gemm that adds the product's own output as its C.
        self.rows = False

    def linear(self, x: ir.Value, weight: Any, name: str) -> ir.Value:
        """x @ W.T for a weight stored (out, in)."""
        return self.linears(x, [weight], name, [name])[0]

    def linears(
        self, x: ir.Value, weights: Sequence[Any], name: str, names: Sequence[str]
    ) -> list[ir.Value]:
        """Several projections of one input (q, k, v; gate, up) as one node and a Split when
        they are stored alike (one MatMul reads x once, and the graph has fewer nodes)."""
        plans = [self._plan(w, n) for w, n in zip(weights, names)]
        if FUSE and len(plans) > 1 and len({p.kind for p in plans}) == 1:
            joined = _Plan.join(plans)
            y = self._emit(x, joined, name)
            sizes = self.b.ints([p.out_features for p in plans])
            return list(self.b.ops("Split", [y, sizes], {"axis": -1}, num_outputs=len(plans)))
        return [self._emit(x, p, n) for p, n in zip(plans, names)]

    def joined(
        self, x: ir.Value, weights: Sequence[Any], name: str, names: Sequence[str]
    ) -> ir.Value | None:
        """The projections of one input as one node's output, concatenated along the last axis
        (q, k, v packed for GroupQueryAttention); None when they are not stored alike."""
        plans = [self._plan(w, n) for w, n in zip(weights, names)]
        if not FUSE or len({p.kind for p in plans}) != 1:
            return None
        return self._emit(x, _Plan.join(plans), name)

    def _plan(self, weight: Any, name: str) -> _Plan:
        in_features = weight.shape[-1]
        # MatMulNBits wants whole blocks along K; an odd width stays float.
        if not self.quantized or in_features % BLOCK or not in_features:
            return _Plan(float_t=self.stored(weight.float()).T)
        blocks = weight.blocks()
        if blocks is not None and blocks.bits in (4, 8):
            codes, scales, zeros, mins = _from_blocks(blocks)
            return _Plan(codes=codes, scales=scales, zeros=zeros, mins=mins, bits=int(blocks.bits))
        w = weight.float()
        codes, scales, zeros = rtn(w, self.bits)
        restored = dequantize(codes, scales, zeros)
        self.errors[name] = float(np.max(np.abs(restored - w))) if w.size else 0.0
        return _Plan(codes=codes, scales=scales, zeros=zeros, bits=self.bits)

    def _emit(self, x: ir.Value, plan: _Plan, name: str) -> ir.Value:
        b = self.b
        if plan.float_t is not None:
            return b.op("MatMul", [x, self.widened(b.init(name, plan.float_t))])
        assert plan.codes is not None and plan.scales is not None and plan.zeros is not None
        if b.fused or STANDARD_NBITS:
            y = self.matmul_nbits(x, plan.codes, plan.scales, plan.zeros, plan.bits, name)
        else:
            weight = dequantize_linear(b, plan.codes, plan.scales, plan.zeros, plan.bits, name)
            y = b.op("MatMul", [x, weight])
        if plan.mins is None:
            return y
        k = plan.codes.shape[1]
        sums, mins = self.block_sums(x, k), b.init(name + ".mins", plan.mins.T)
        if self.rows:
            # sums @ mins + y in one node (Gemm is 2D only): a third fewer correction nodes
            return b.op("Gemm", [sums, mins, y])
        return b.op("Add", [y, b.op("MatMul", [sums, mins])])

    def stored(self, array: np.ndarray) -> np.ndarray:
        """A float weight as this build stores it: float32, or rounded once to fp16/bf16 (an
        F16/BF16 source's own values come back exactly: float32 holds them all)."""
        return np.ascontiguousarray(
            array.astype(self.half if self.half is not None else np.float32)
        )

    def widened(self, value: ir.Value) -> ir.Value:
        """A stored weight as float32 for the product: a Cast after a half initializer, which
        onnxruntime and OpenVINO (2026.4) both fold once at load into a float32 constant: half
        the file, float32 speed and accuracy of every product (see docs/generating.md)."""
        if self.half is None:
            return value
        import onnx_ir as ir

        return self.b.op("Cast", [value], {"to": ir.DataType.FLOAT})

    def embedding(self, ids: ir.Value, weight: Any) -> ir.Value | None:
        """The token embedding as onnxruntime's GatherBlockQuantized when the source stores it
        in integer-zero-point blocks (Q8_0, Q4_0): a quarter of the float table's memory, the
        same values. None where it does not apply (the caller gathers floats)."""
        blocks = weight.blocks() if self.quantized and self.b.fused else None
        if blocks is None or blocks.mins is not None or blocks.bits not in (4, 8):
            return None
        codes, scales, zeros, _ = _from_blocks(blocks)
        rows = codes.shape[0]
        bits = int(blocks.bits)
        data = codes if bits == 8 else pack_codes(codes, 4).reshape(rows, -1)
        b = self.b
        return b.op(
            "GatherBlockQuantized",
            [
                b.init("embed.qweight", data),
                ids,
                b.init("embed.scales", scales),
                b.init("embed.zero_points", pack_zero_points(zeros, bits).reshape(rows, -1)),
            ],
            {"gather_axis": 0, "quantize_axis": 1, "block_size": BLOCK, "bits": bits},
            domain=MS_DOMAIN,
        )

    def block_sums(self, x: ir.Value, k: int) -> ir.Value:
        """x [..., K] summed over each block of 32 -> [..., K/32].

        On rows (the ort flavour's quantized builds) a Reshape to [rows, K/32, 32] and a
        ReduceSum: measured 3-5% faster decode on SmolLM2 int4-a4 (onnxruntime 1.32, 2 threads)
        than a MatMul with a 0/1 block indicator, which reads K x K/32 mostly-zero floats per
        call. Elsewhere the indicator MatMul (one node, any rank).
        """
        key = id(x)
        if key not in self._block_sums:
            b = self.b
            if self.rows:
                blocks = b.op("Reshape", [x, b.ints([-1, k // BLOCK, BLOCK])])
                sums = b.op("ReduceSum", [blocks, b.ints([-1])], {"keepdims": 0})
            else:
                indicator = np.kron(
                    np.eye(k // BLOCK, dtype=np.float32), np.ones((BLOCK, 1), np.float32)
                )
                sums = b.op("MatMul", [x, b.const(indicator)])
            self._block_sums[key] = (x, sums)  # x kept alive so its id is not reused
        return self._block_sums[key][1]

    def matmul_nbits(
        self,
        x: ir.Value,
        codes: np.ndarray,
        scales: np.ndarray,
        zeros: np.ndarray,
        bits: int,
        name: str,
    ) -> ir.Value:
        """A com.microsoft MatMulNBits node from codes (N, K), scales and uint8 zero points
        (N, K/32), packed as MatMulNBits stores them."""
        n, k = codes.shape
        b = self.b
        inputs = [
            x,
            b.init(name + ".qweight", pack_codes(codes, bits)),
            b.init(name + ".scales", scales.astype(np.float32).reshape(-1)),
        ]
        if not np.all(zeros == 1 << (bits - 1)):
            # Without zero points MatMulNBits reads every block around the midpoint, and its
            # symmetric kernels are the faster ones.
            inputs.append(
                b.init(name + ".zero_points", pack_zero_points(zeros.astype(np.uint8), bits))
            )
        return b.op(
            "MatMulNBits",
            inputs,
            {
                "K": k,
                "N": n,
                "bits": bits,
                "block_size": BLOCK,
                # onnxruntime 1.32 has an 8-bit kernel only for int8 activations: at level 0
                # it dequantizes per call (measured 178 ms against 1.7 ms for 576 x 49152).
                "accuracy_level": 4 if bits == 8 else self.accuracy_level,
            },
            domain=MS_DOMAIN,
        )


def dequantize_linear(
    b: Builder, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, bits: int, name: str
) -> ir.Value:
    """The (K, N) float weight as one standard DequantizeLinear (opset 21: blocks of 32 along
    axis 0) of codes (N, K), scales and zero points (N, K/32), ready for MatMul.

    A zero point that is the same 8 (4-bit) or 128 (8-bit) everywhere -- GGUF's Q4_0 and Q8_0 --
    becomes signed int4/int8 codes and no zero point: the symmetric form OpenVINO decompresses
    with one multiply. Others (round-to-nearest, Q4_1 with zero point 0) stay uint4/uint8 with
    their zero points.
    """
    import ml_dtypes  # onnx_ir's own dependency

    middle = 1 << (bits - 1)
    signed = bool((zeros == middle).all())
    if signed:
        code_type = ml_dtypes.int4 if bits == 4 else np.int8
        data = (codes.astype(np.int16) - middle).astype(np.int8)
    else:
        code_type = ml_dtypes.uint4 if bits == 4 else np.uint8
        data = codes
    inputs = [
        b.init(name + ".qweight", np.ascontiguousarray(data.T).astype(code_type)),
        b.init(name + ".scales", np.ascontiguousarray(scales.T).astype(np.float32)),
    ]
    if not signed and zeros.any():
        inputs.append(
            b.init(name + ".zero_points", np.ascontiguousarray(zeros.T).astype(code_type))
        )
    # axis 0 of the (K, N) weight MatMul reads: onnxruntime fuses exactly this form into
    # MatMulNBits, OpenVINO into its compressed FullyConnected
    return b.op("DequantizeLinear", inputs, {"axis": 0, "block_size": BLOCK})


def _from_blocks(blocks: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """GGUF blocks as (codes, scales, zero points, Q4_1's minimums or None)."""
    codes = np.asarray(blocks.values, dtype=np.uint8)
    scales = np.asarray(blocks.scales, dtype=np.float32)
    if blocks.mins is not None:
        # d * q + m = d * (q - 8) + (m + 8 d): the codes read around the midpoint, as Q4_0's,
        # so onnxruntime takes its symmetric kernels (no zero-point input), and the minimum
        # correction carries the 8 d.
        midpoint = 1 << (blocks.bits - 1)
        zeros = np.full(scales.shape, midpoint, dtype=np.uint8)
        mins = np.asarray(blocks.mins, dtype=np.float32) + np.float32(midpoint) * scales
        return codes, scales, zeros, mins
    if blocks.zero_points is None:
        zeros = np.full(scales.shape, 1 << (blocks.bits - 1), dtype=np.uint8)
    else:
        zeros = np.asarray(blocks.zero_points, dtype=np.uint8)
    return codes, scales, zeros, None


def rtn(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric round-to-nearest per block of 32 along the input axis.

    Returns:
        codes uint8 (N, K), scales float32 (N, K/32), zero points uint8 (N, K/32).
    """
    n, k = w.shape
    top = (1 << bits) - 1
    blocks = w.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    lo = np.minimum(blocks.min(axis=-1), 0.0)
    hi = np.maximum(blocks.max(axis=-1), 0.0)
    scale = (hi - lo) / top
    safe = np.where(scale == 0, 1.0, scale)
    zero = np.clip(np.round(-lo / safe), 0, top)
    codes = np.clip(np.round(blocks / safe[..., None]) + zero[..., None], 0, top)
    return codes.reshape(n, k).astype(np.uint8), scale.astype(np.float32), zero.astype(np.uint8)


def dequantize(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """scale * (code - zero point), per block of 32: the float weight MatMulNBits multiplies."""
    n, k = codes.shape
    blocks = codes.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    out = scales[..., None].astype(np.float32) * (blocks - zeros[..., None].astype(np.float32))
    return out.reshape(n, k)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(N, K) codes -> MatMulNBits' B, uint8 (N, K/32, 32*bits/8); 4-bit: low nibble first."""
    n, k = codes.shape
    if bits == 8:
        return codes.reshape(n, k // BLOCK, BLOCK).astype(np.uint8)
    pairs = codes.reshape(n, k // BLOCK, BLOCK // 2, 2).astype(np.uint8)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def pack_zero_points(zeros: np.ndarray, bits: int) -> np.ndarray:
    """(N, K/32) zero points -> uint8 [N * ceil(K/32 * bits / 8)], each row padded to a byte."""
    if bits == 8:
        return zeros.reshape(-1).astype(np.uint8)
    n, blocks = zeros.shape
    if blocks % 2:
        zeros = np.concatenate([zeros, np.zeros((n, 1), np.uint8)], axis=1)
    pairs = zeros.reshape(n, -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8).reshape(-1)
