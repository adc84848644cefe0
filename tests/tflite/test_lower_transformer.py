"""Transformer encoders lowered to TFLite: a BERT-like layer built here (token and position
embeddings gathered by int64 ids, LayerNormalization fused or written out, the attention's
projections as FULLY_CONNECTED, its heads split by Reshape/Transpose and multiplied by
BATCH_MATMUL or an Einsum, the mask added, Softmax on the last axis, GELU as Erf or as the op,
mean pooling), exported with no sizes given (its ``[batch, seq]`` inputs are found by
``ferry.runtime.found_inputs``) and verified in LiteRT (XNNPACK and the reference kernels)
against ONNX Runtime by ``export_tflite``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tflite_graphs import export, model, opcodes, weights

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")

N = helper.make_node
VOCAB, POSITIONS, HIDDEN, HEADS = 50, 16, 16, 2
HEAD = HIDDEN // HEADS


def _i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _layer_norm(x: str, out: str, *, decomposed: bool) -> list[onnx.NodeProto]:
    if not decomposed:
        return [N("LayerNormalization", [x, "ln_g", "ln_b"], [out], axis=-1, epsilon=1e-12)]
    p = f"{out}_"
    return [
        N("ReduceMean", [x, "last"], [p + "mean"]),
        N("Sub", [x, p + "mean"], [p + "centred"]),
        N("Pow", [p + "centred", "two"], [p + "sq"]),
        N("ReduceMean", [p + "sq", "last"], [p + "var"]),
        N("Add", [p + "var", "eps"], [p + "var_eps"]),
        N("Sqrt", [p + "var_eps"], [p + "std"]),
        N("Div", [p + "centred", p + "std"], [p + "normed"]),
        N("Mul", [p + "normed", "ln_g"], [p + "scaled"]),
        N("Add", [p + "scaled", "ln_b"], [out]),
    ]


def _gelu(x: str, out: str, *, as_op: bool) -> list[onnx.NodeProto]:
    if as_op:
        return [N("Gelu", [x], [out])]
    return [
        N("Div", [x, "sqrt2"], [out + "_d"]),
        N("Erf", [out + "_d"], [out + "_e"]),
        N("Add", [out + "_e", "one"], [out + "_p"]),
        N("Mul", [x, out + "_p"], [out + "_m"]),
        N("Mul", [out + "_m", "half"], [out]),
    ]


def _heads(x: str, out: str, perm: list[int]) -> list[onnx.NodeProto]:
    return [
        N("Reshape", [x, "heads_shape"], [out + "_r"]),
        N("Transpose", [out + "_r"], [out], perm=perm),
    ]


def _encoder(*, decomposed_ln: bool, gelu_op: bool, einsum: bool) -> onnx.ModelProto:
    """One BERT layer on ``input_ids`` and ``attention_mask`` ``[batch, seq]`` (int64), mean
    pooled over the mask: outputs the token states and the sentence embedding."""
    nodes = [
        N("Gather", ["word_emb", "input_ids"], ["tok"]),
        N("Shape", ["input_ids"], ["ids_shape"]),
        N("Gather", ["ids_shape", "one_i"], ["seq"], axis=0),
        N("Unsqueeze", ["seq", "zero_i"], ["seq1"]),
        N("Slice", ["position_ids", "zero_1d", "seq1", "one_1d"], ["pos_ids"]),
        N("Gather", ["pos_emb", "pos_ids"], ["pos"]),
        N("Add", ["tok", "pos"], ["emb"]),
        *_layer_norm("emb", "h0", decomposed=decomposed_ln),
        N("MatMul", ["h0", "wq"], ["q"]),
        N("MatMul", ["h0", "wk"], ["k"]),
        N("MatMul", ["h0", "wv"], ["v"]),
        *_heads("q", "qh", [0, 2, 1, 3]),  # [b, h, s, d]
        *_heads("v", "vh", [0, 2, 1, 3]),
    ]
    if einsum:
        nodes += [
            *_heads("k", "kh", [0, 2, 1, 3]),
            N("Einsum", ["qh", "kh"], ["scores"], equation="bhqd,bhkd->bhqk"),
        ]
    else:
        nodes += [*_heads("k", "kh", [0, 2, 3, 1]), N("MatMul", ["qh", "kh"], ["scores"])]
    nodes += [
        N("Div", ["scores", "sqrt_d"], ["scaled"]),
        # The mask as BERT adds it: (1 - mask) * float32's lowest, [b, 1, 1, s].
        N("Unsqueeze", ["attention_mask", "axes12"], ["mask4"]),
        N("Cast", ["mask4"], ["maskf"], to=TensorProto.FLOAT),
        N("Sub", ["one", "maskf"], ["inverted"]),
        N("Mul", ["inverted", "lowest"], ["bias"]),
        N("Add", ["scaled", "bias"], ["masked"]),
        N("Softmax", ["masked"], ["probs"], axis=-1),
        N("MatMul", ["probs", "vh"], ["ctx"]),
        N("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ctx_t", "merge_shape"], ["ctx_m"]),
        N("MatMul", ["ctx_m", "wo"], ["attn"]),
        N("Add", ["attn", "h0"], ["res"]),
        *_layer_norm("res", "h1", decomposed=decomposed_ln),
        N("MatMul", ["h1", "w_in"], ["ff_in"]),
        N("Add", ["ff_in", "b_in"], ["ff_b"]),
        *_gelu("ff_b", "ff_act", as_op=gelu_op),
        N("MatMul", ["ff_act", "w_out"], ["ff_out"]),
        N("Add", ["ff_out", "h1"], ["tokens"]),
        # Mean pooling over the mask, as sentence-transformers exports it.
        N("Unsqueeze", ["attention_mask", "last"], ["mask3"]),
        N("Cast", ["mask3"], ["mask3f"], to=TensorProto.FLOAT),
        N("Mul", ["tokens", "mask3f"], ["kept"]),
        N("ReduceSum", ["kept", "one_1d"], ["summed"], keepdims=0),
        N("ReduceSum", ["mask3f", "one_1d"], ["count"], keepdims=0),
        N("Clip", ["count", "tiny"], ["count_c"]),
        N("Div", ["summed", "count_c"], ["sentence"]),
    ]
    inits = {
        "word_emb": weights(VOCAB, HIDDEN),
        "pos_emb": weights(POSITIONS, HIDDEN),
        "position_ids": np.arange(POSITIONS, dtype=np.int64)[None],
        "ln_g": 1 + weights(HIDDEN, scale=0.1),
        "ln_b": weights(HIDDEN, scale=0.1),
        **{w: weights(HIDDEN, HIDDEN, scale=0.3) for w in ("wq", "wk", "wv", "wo")},
        "w_in": weights(HIDDEN, 4 * HIDDEN, scale=0.3),
        "b_in": weights(4 * HIDDEN, scale=0.1),
        "w_out": weights(4 * HIDDEN, HIDDEN, scale=0.2),
        "heads_shape": _i64(0, 0, HEADS, HEAD),  # 0: the input's own size (batch, seq)
        "merge_shape": _i64(0, 0, HIDDEN),
        "zero_i": _i64(0),
        "one_i": np.asarray(1, dtype=np.int64),
        "zero_1d": _i64(1),  # Slice on axis 1 of [1, positions]: from 0
        "one_1d": _i64(1),
        "axes12": _i64(1, 2),
        "last": _i64(-1),
        **{
            name: np.asarray(value, dtype=np.float32)
            for name, value in {
                "two": 2.0,
                "eps": 1e-12,
                "one": 1.0,
                "half": 0.5,
                "sqrt2": np.sqrt(2.0),
                "sqrt_d": np.sqrt(HEAD),
                "lowest": np.finfo(np.float32).min,
                "tiny": 1e-9,
            }.items()
        },
    }
    inits["zero_1d"] = _i64(0)
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in ("input_ids", "attention_mask")
        ],
        [
            helper.make_tensor_value_info(
                "tokens", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]
            ),
            helper.make_tensor_value_info("sentence", TensorProto.FLOAT, ["batch", HIDDEN]),
        ],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    proto.ir_version = 9
    onnx.checker.check_model(proto)
    return proto


@pytest.mark.parametrize(
    ("decomposed_ln", "gelu_op", "einsum"),
    [(False, False, False), (True, True, True)],
    ids=["fused-ln_erf-gelu_matmul", "decomposed-ln_gelu-op_einsum"],
)
def test_bert_layer_exports_with_no_sizes_given(
    tmp_path: Path, decomposed_ln: bool, gelu_op: bool, einsum: bool
) -> None:
    result = export(_encoder(decomposed_ln=decomposed_ln, gelu_op=gelu_op, einsum=einsum), tmp_path)
    report = result.report
    assert report.passed and len(report.verification) == 2
    ops = set(opcodes(result))
    assert {"GATHER", "FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX", "GELU"} <= ops, ops
    assert {"MEAN", "RSQRT"} <= ops or {"MEAN", "SQRT"} <= ops, ops  # LayerNorm as plain ops
    # The sizes were found (no --shape), the ids kept within the tables they index.
    assert any(note.startswith("inputs found") for note in report.notes), report.notes
    assert set(report.fixed_shapes) == {"input_ids", "attention_mask"}


def test_padded_tokens_masked_by_float32_lowest(tmp_path: Path) -> None:
    """Padding (mask 0) adds float32's lowest to the scores: finite on every kernel set."""
    rng = np.random.default_rng(3)
    samples = []
    for length in (5, 9):
        ids = rng.integers(1, VOCAB, (1, 12), dtype=np.int64)
        mask = (np.arange(12) < length).astype(np.int64)[None]
        samples.append({"input_ids": ids * mask, "attention_mask": mask})
    proto = _encoder(decomposed_ln=False, gelu_op=False, einsum=False)
    assert export(proto, tmp_path, samples=samples).report.passed


def test_learned_query_times_computed_keys(tmp_path: Path) -> None:
    """A constant first operand with leading 1s (a decoder's learned query, ``[1, 1, K]``)
    keeps its rank: BATCH_MATMUL takes no 1-D operand."""
    nodes = [
        N("MatMul", ["x", "w"], ["keys"]),  # [1, S, K]
        N("Transpose", ["keys"], ["keys_t"], perm=[0, 2, 1]),  # [1, K, S]
        N("MatMul", ["query", "keys_t"], ["y"]),  # [1, 1, S]
    ]
    inits = {"w": weights(HIDDEN, HIDDEN), "query": weights(1, 1, HIDDEN)}
    result = export(model(nodes, {"x": [1, 12, HIDDEN]}, ["y"], inits), tmp_path)
    assert "BATCH_MATMUL" in opcodes(result)


def test_not_a_number_guard(tmp_path: Path) -> None:
    """``Where(IsNaN(p), 0, p)`` and IsInf, as attention blocks guard fully masked rows."""
    nodes = [
        N("IsNaN", ["x"], ["nan"]),
        N("Where", ["nan", "zero", "x"], ["clean"]),
        N("IsInf", ["clean"], ["inf"]),
        N("IsInf", ["x"], ["pos_inf"], detect_negative=0),
        N("Where", ["inf", "zero", "clean"], ["y"]),
    ]
    x = np.random.default_rng(2).standard_normal((2, 3, 6)).astype(np.float32)
    x[0, 1, 2], x[1, 0, 3], x[1, 2, 5], x[0, 0, 0] = np.nan, np.inf, -np.inf, np.nan
    zero = {"zero": np.zeros((), np.float32)}
    proto = model(nodes, {"x": [2, 3, 6]}, ["y", "nan", "pos_inf"], zero)
    ops = opcodes(export(proto, tmp_path, samples={"x": x}))
    assert "NOT_EQUAL" in ops and "EQUAL" in ops


def test_a_quantized_encoder_exports_as_int8(tmp_path: Path) -> None:
    """The BERT layer quantized statically (QDQ, by ONNX Runtime's quantizer) exports as int8
    with nothing asked: its sizes folded where the optimizer does not run, the GELU written
    from its Erf in float between a DEQUANTIZE and a QUANTIZE, within the int8 budget."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    source = tmp_path / "float.onnx"
    onnx.save(_encoder(decomposed_ln=False, gelu_op=False, einsum=False), source)
    rng = np.random.default_rng(4)

    class Calibration(quantization.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.feeds = iter(
                {
                    "input_ids": rng.integers(1, VOCAB, (1, 12), dtype=np.int64),
                    "attention_mask": np.ones((1, 12), dtype=np.int64),
                }
                for _ in range(6)
            )

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    qdq = tmp_path / "qdq.onnx"
    quantization.quantize_static(
        str(source),
        str(qdq),
        Calibration(),
        quant_format=quantization.QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],  # the GELU's output quantized, its inside not
        activation_type=quantization.QuantType.QInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    result = export(onnx.load(qdq), tmp_path)
    assert result.report.precision == "int8" and result.report.passed
    assert {"QUANTIZE", "GELU"} <= set(opcodes(result))
