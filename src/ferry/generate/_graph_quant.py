"""The decoder's projections: float MatMul, or onnxruntime's MatMulNBits fed with GGUF blocks as
they are stored (Q4_0, Q4_1, Q8_0: no second rounding) or with round-to-nearest blocks of 32.

MatMulNBits computes A @ dequant(B).T with, per row n and block j of 32 inputs,
dequant = scale[n, j] * (code - zero_point[n, j]). GGUF's Q4_0 is exactly that with zero point 8
and Q8_0 with zero point 128 (int8 codes stored +128); Q4_1's value d * q + m is
d * (q - (-m / d)): a float zero point, which MatMulNBits takes when the zero points have the
scales' type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.generate._graph_ops import MS_DOMAIN

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.generate._graph_ops import Builder

BLOCK = 32


class Quantizer:
    """Writes every projection of one build at one precision.

    Attributes:
        quantized: True for int4/int8 builds.
        errors: Per tensor the quantizer rounded itself, the max absolute error it added.
    """

    def __init__(self, b: Builder, precision: str) -> None:
        self.b = b
        self.precision = precision
        self.quantized = precision in ("int4", "int8")
        self.bits = 8 if precision == "int8" else 4
        self.errors: dict[str, float] = {}

    def linear(self, x: ir.Value, weight: Any, name: str) -> ir.Value:
        """x @ W.T for a weight stored (out, in)."""
        in_features = weight.shape[-1]
        # MatMulNBits wants whole blocks along K; an odd width stays float.
        if not self.quantized or in_features % BLOCK or not in_features:
            return self.b.op(
                "MatMul", [x, self.b.init(name, np.ascontiguousarray(weight.float().T))]
            )
        blocks = weight.blocks()
        if blocks is not None and blocks.bits in (4, 8):
            codes, scales, zeros = _from_blocks(blocks)
            bits = int(blocks.bits)
        else:
            w = weight.float()
            codes, scales, zeros = rtn(w, self.bits)
            restored = dequantize(codes, scales, zeros)
            self.errors[name] = float(np.max(np.abs(restored - w))) if w.size else 0.0
            bits = self.bits
        return self.matmul_nbits(x, codes, scales, zeros, bits, name)

    def matmul_nbits(
        self,
        x: ir.Value,
        codes: np.ndarray,
        scales: np.ndarray,
        zeros: np.ndarray,
        bits: int,
        name: str,
    ) -> ir.Value:
        """A com.microsoft MatMulNBits node from codes (N, K), scales and zero points (N, K/32).

        Integer zero points are packed as MatMulNBits stores them; float ones (Q4_1) go in as
        float32, one per block.
        """
        n, k = codes.shape
        packed = pack_codes(codes, bits)
        if np.issubdtype(zeros.dtype, np.integer):
            zero_input = pack_zero_points(zeros.astype(np.uint8), bits)
        else:
            zero_input = zeros.astype(np.float32).reshape(-1)
        b = self.b
        return b.op(
            "MatMulNBits",
            [
                x,
                b.init(name + ".qweight", packed),
                b.init(name + ".scales", scales.astype(np.float32).reshape(-1)),
                b.init(name + ".zero_points", zero_input),
            ],
            {"K": k, "N": n, "bits": bits, "block_size": BLOCK, "accuracy_level": 0},
            domain=MS_DOMAIN,
        )


def _from_blocks(blocks: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF blocks as (codes, scales, zero points); Q4_1's minimum becomes -m / d."""
    codes = np.asarray(blocks.values, dtype=np.uint8)
    scales = np.asarray(blocks.scales, dtype=np.float32)
    if blocks.mins is not None:
        mins = np.asarray(blocks.mins, dtype=np.float32)
        flat = scales == 0
        safe = np.where(flat, 1.0, scales)
        zeros = (-mins / safe).astype(np.float32)
        if flat.any():
            # d == 0: every value of the block is m. Codes 0, scale m, zero point -1 give
            # m * (0 + 1) = m exactly.
            codes = codes.copy()
            n, k = codes.shape
            codes.reshape(n, k // BLOCK, BLOCK)[flat] = 0
            scales = np.where(flat, mins, scales).astype(np.float32)
            zeros = np.where(flat, -1.0, zeros).astype(np.float32)
        return codes, scales, zeros
    if blocks.zero_points is None:
        zeros = np.full(scales.shape, 1 << (blocks.bits - 1), dtype=np.uint8)
    else:
        zeros = np.asarray(blocks.zero_points, dtype=np.uint8)
    return codes, scales, zeros


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
