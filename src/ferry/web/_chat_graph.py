"""A decoder graph as a chat page runs it best: MatMulNBits rewritten to standard blocked
DequantizeLinear -> Transpose -> MatMul over the very same bytes.

Why: onnxruntime-web's wasm build runs com.microsoft MatMulNBits, but has no block-quantized
matmul kernel for it: it dequantizes the whole weight at every call (SmolLM2-135M int4: 0.7
tokens/s in Node). A DequantizeLinear of a constant weight is folded once when the session is
created, when the page turns off ONNX Runtime's QDQ fusion (``session.disable_quant_qdq``, as
``chat.js`` does): float32 weights in memory and float32 MatMuls (28 tokens/s), the arithmetic of
the same graph dequantized in float32.

The rewrite keeps the weight file as it is: MatMulNBits' ``B`` (uint8 ``[N, K/bs, bs*bits/8]``,
4-bit codes low nibble first) is, byte for byte, a uint4 (or uint8) ``[N, K]`` tensor in ONNX's
packing, so the new initializer points at the same external-data range with another type and
shape; the float32 scales ``[N * K/bs]`` become ``[N, K/bs]`` the same way. Zero points
(MatMulNBits' default: the midpoint, 8 or 128) are new small initializers in the graph file.
Nodes it cannot express (float16 scales, ``g_idx``, bits other than 4 and 8, K not a multiple of
the block) are kept as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["dequantize_nbits"]

_MS = "com.microsoft"


def dequantize_nbits(model: onnx.ModelProto, base_dir: Path) -> tuple[int, int]:
    """Rewrite every MatMulNBits of ``model`` (in place) that the standard form expresses.

    Args:
        model: the graph, loaded without its external data.
        base_dir: where its external data files are (read only for packed zero points).

    Returns:
        ``(rewritten, kept)`` node counts.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    if not any(n.op_type == "MatMulNBits" and n.domain == _MS for n in graph.node):
        return 0, 0
    opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 0)
    nodes: list[onnx.NodeProto] = []
    rewritten = kept = 0
    superseded: set[str] = set()
    for node in graph.node:
        if node.op_type != "MatMulNBits" or node.domain != _MS:
            nodes.append(node)
            continue
        replaced = _rewrite(node, inits, base_dir) if opset >= 21 else None
        if replaced is None:
            nodes.append(node)
            kept += 1
            continue
        new_inits, new_nodes = replaced
        graph.initializer.extend(new_inits)
        nodes.extend(new_nodes)
        superseded.update(node.input[1:4])
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    # The packed weights' old names are unread now (their bytes live on under the new names),
    # unless another node reads them too.
    read = {i for n in graph.node for i in n.input} | {v.name for v in graph.input}
    unread = [t for t in graph.initializer if t.name in superseded and t.name not in read]
    for t in unread:
        graph.initializer.remove(t)
    return rewritten, kept


def _rewrite(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], base_dir: Path
) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = (
        attrs.get("K"),
        attrs.get("N"),
        attrs.get("bits", 4),
        attrs.get("block_size"),
    )
    inputs = list(node.input) + [""] * (6 - len(node.input))
    a, b, scales, zeros, g_idx, bias = inputs[:6]
    if (
        not isinstance(k, int)
        or not isinstance(n, int)
        or not isinstance(block, int)
        or bits not in (4, 8)
        or k % block
        or g_idx
        or b not in inits
        or scales not in inits
        or inits[scales].data_type != onnx.TensorProto.FLOAT
        or (zeros and zeros not in inits)
    ):
        return None
    blocks = k // block
    code_type = onnx.TensorProto.UINT4 if bits == 4 else onnx.TensorProto.UINT8
    prefix = (node.name or node.output[0]) + ".dq"
    weight = _retyped(inits[b], prefix + ".codes", code_type, [n, k])
    scale = _retyped(inits[scales], prefix + ".scales", onnx.TensorProto.FLOAT, [n, blocks])
    if zeros:
        packed = _array(inits[zeros], base_dir).reshape(n, -1)
        if bits == 4:
            unpacked = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)
            zp = unpacked[:, :blocks]
        else:
            zp = packed[:, :blocks]
    else:
        zp = np.full((n, blocks), 1 << (bits - 1), dtype=np.uint8)
    zero = _codes_tensor(zp, prefix + ".zero_points", bits)
    out = node.output[0]
    dq, wt = prefix + ".weight", prefix + ".weight_t"
    product = out if not bias else prefix + ".product"
    new_nodes = [
        helper.make_node(
            "DequantizeLinear",
            [weight.name, scale.name, zero.name],
            [dq],
            name=prefix,
            axis=1,
            block_size=block,
        ),
        helper.make_node("Transpose", [dq], [wt], name=prefix + ".t", perm=[1, 0]),
        helper.make_node("MatMul", [a, wt], [product], name=prefix + ".matmul"),
    ]
    if bias:
        new_nodes.append(helper.make_node("Add", [product, bias], [out], name=prefix + ".bias"))
    return [weight, scale, zero], new_nodes


def _retyped(
    tensor: onnx.TensorProto, name: str, data_type: int, dims: list[int]
) -> onnx.TensorProto:
    """The same bytes (inline or an external-data range) under another name, type and shape."""
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    out.name = name
    out.data_type = data_type
    del out.dims[:]
    out.dims.extend(dims)
    return out


def _array(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        onnx.external_data_helper.load_external_data_for_tensor(copy, str(base_dir))
        return numpy_helper.to_array(copy).astype(np.uint8)
    return numpy_helper.to_array(tensor).astype(np.uint8)


def _codes_tensor(values: np.ndarray, name: str, bits: int) -> onnx.TensorProto:
    if bits == 8:
        return numpy_helper.from_array(np.ascontiguousarray(values, dtype=np.uint8), name)
    return helper.make_tensor(
        name, onnx.TensorProto.UINT4, list(values.shape), values.astype(np.uint8).ravel().tolist()
    )
