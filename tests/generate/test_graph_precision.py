"""fp16/bf16 decoders (half weights, float32 compute) and the standard flavour's int4/int8
(blocked DequantizeLinear -> MatMul, the form OpenVINO keeps compressed), on tiny configs."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from test_graph_decoder import (
    CONFIGS,
    IDS,
    FakeWeight,
    FakeWeights,
    Runner,
    make_weights,
    reference,
)
from test_graph_quant import as_blocks, cosine, logits_of, openvino_logits, ops

from ferry.generate._graph import build_decoder

HALF = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def rounded(weights: FakeWeights, precision: str) -> FakeWeights:
    """What a half build stores: every matrix (and the embedding) rounded once, norms as they
    are."""
    out = FakeWeights()
    for name, weight in weights.items():
        array = weight.float()
        half = array.astype(HALF[precision]).astype(np.float32) if array.ndim == 2 else array
        out[name] = FakeWeight(half)
    return out


# -- fp16 / bf16 ----------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["standard", "ort"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_bias", "gemma2"])
def test_half_build_computes_its_rounded_weights(name: str, precision: str, flavour: str) -> None:
    """The graph multiplies exactly the half-rounded weights in float32 (so the only change from
    fp32 is one rounding of each weight), and stays close to the fp32 model."""
    cfg = CONFIGS[name]
    weights = make_weights(cfg)
    model = build_decoder(cfg, weights, precision=precision, flavour=flavour)
    got = logits_of(model, cfg)
    np.testing.assert_allclose(
        got, reference(cfg, rounded(weights, precision), IDS), atol=1e-4, rtol=1e-4
    )
    # random 2-layer models, measured: fp16 >= 0.999999, bf16 >= 0.9999
    want = reference(cfg, weights, IDS)
    assert cosine(got, want) >= (0.99999 if precision == "fp16" else 0.999)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_build_stores_half_weights_and_keeps_float32_io(precision: str) -> None:
    cfg = CONFIGS["qwen2_bias"]  # tied: the head reads the embedding's one half table
    weights = make_weights(cfg)
    # a half source's own values: taken exactly
    source = FakeWeights(
        {
            n: FakeWeight(w.float().astype(HALF[precision]).astype(np.float32))
            for n, w in weights.items()
        }
    )
    model = build_decoder(cfg, source, precision=precision, flavour="ort")
    inits = model.graph.initializers
    want_type = ir.DataType.FLOAT16 if precision == "fp16" else ir.DataType.BFLOAT16
    for name in ("embed", "layers.0.qkv", "layers.1.down"):
        tensor = inits[name].const_value
        assert tensor is not None and tensor.dtype == want_type, name
    np.testing.assert_array_equal(
        inits["embed"].const_value.numpy().astype(np.float32), source["embed"].float()
    )
    assert "lm_head" not in inits
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    pasts = [v for v in proto.graph.input if v.name.startswith("past_key_values.")]
    float_io = [*pasts, *proto.graph.output]
    assert all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in float_io)
    assert model.metadata_props["ferry.precision"] == precision
    # every half initializer is a float32 one of the fp32 build at half the bytes
    full = build_decoder(cfg, weights, flavour="ort").graph.initializers
    halves = {n: v.const_value for n, v in inits.items() if v.const_value.dtype == want_type}
    assert len(halves) == 1 + 4 * cfg.num_layers  # embed (and tied head), qkv, o, gate_up, down
    assert all(2 * t.nbytes == full[n].const_value.nbytes for n, t in halves.items())


@pytest.mark.parametrize("flavour", ["standard", "ort"])
def test_half_build_steps_through_its_past(flavour: str) -> None:
    cfg = CONFIGS["llama_gqa"]
    run = Runner(build_decoder(cfg, make_weights(cfg), precision="fp16", flavour=flavour), cfg)
    full = run.prompt(IDS)
    logits, past = run(IDS[None, :6], np.ones((1, 6)), np.arange(6)[None], run.empty_past(1))
    steps = [logits[0]]
    for t in range(6, len(IDS)):
        logits, past = run(IDS[None, t : t + 1], np.ones((1, t + 1)), np.array([[t]]), past)
        assert past[0].dtype == np.float32
        steps.append(logits[0])
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_build_runs_on_openvino(precision: str, tmp_path: Any) -> None:
    cfg = CONFIGS["gemma2"]
    weights = make_weights(cfg)
    model = build_decoder(cfg, weights, precision=precision, flavour="standard")
    got = openvino_logits(model, cfg, tmp_path)
    want = reference(cfg, rounded(weights, precision), IDS)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


# -- the standard flavour's int4 / int8 -----------------------------------------------------


def dequantize_linears(model: ir.Model) -> dict[str, ir.Node]:
    return {n.inputs[0].name: n for n in model.graph if n.op_type == "DequantizeLinear"}


@pytest.mark.parametrize(
    ("kind", "precision"),
    [("Q4_0", "int4"), ("Q4_1", "int4"), ("Q8_0", "int8"), (None, "int4"), (None, "int8")],
)
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_bias"])
def test_standard_quantized_is_plain_onnx_and_equals_the_ort_flavour(
    name: str, kind: str | None, precision: str
) -> None:
    """Blocked DequantizeLinear -> MatMul, no contrib operator; the same values as the ort
    flavour's MatMulNBits (GGUF blocks as stored, or the same round-to-nearest blocks)."""
    cfg = CONFIGS[name]
    weights = make_weights(cfg)
    if kind is not None:
        weights = as_blocks(weights, kind)
    standard = build_decoder(cfg, weights, precision=precision, flavour="standard")
    assert "MatMulNBits" not in ops(standard)
    assert set(standard.opset_imports) == {""}
    assert len(dequantize_linears(standard)) == 4 * cfg.num_layers + 1
    onnx.checker.check_model(ir.serde.serialize_model(standard), full_check=True)
    ort_flavour = build_decoder(cfg, weights, precision=precision, flavour="ort")
    if kind == "Q8_0" or precision == "int8":
        # the ort flavour's 8-bit MatMulNBits multiplies int8 activations: close, not equal
        want = logits_of(build_decoder(cfg, weights if kind else _rtn_floats(weights, 8)), cfg)
        np.testing.assert_allclose(logits_of(standard, cfg), want, rtol=1e-4, atol=1e-4)
        assert cosine(logits_of(ort_flavour, cfg), want) >= 0.999
        return
    np.testing.assert_allclose(
        logits_of(standard, cfg), logits_of(ort_flavour, cfg), rtol=1e-4, atol=1e-4
    )


def _rtn_floats(weights: FakeWeights, bits: int) -> FakeWeights:
    from ferry.generate._graph_quant import dequantize, rtn

    out = FakeWeights()
    for name, weight in weights.items():
        array = weight.float()
        out[name] = FakeWeight(
            dequantize(*rtn(array, bits)) if array.ndim == 2 and name != "embed" else array
        )
    if "lm_head" not in weights:  # tied: the head is rounded, the gathered table is not
        out["lm_head"] = FakeWeight(dequantize(*rtn(weights["embed"].float(), bits)))
    return out


@pytest.mark.parametrize(
    ("kind", "code_type"),
    [("Q4_0", ir.DataType.INT4), ("Q8_0", ir.DataType.INT8), ("Q4_1", ir.DataType.INT4)],
)
def test_standard_quantized_keeps_the_gguf_blocks_exactly(
    kind: str, code_type: ir.DataType
) -> None:
    cfg = CONFIGS["llama_gqa"]
    weights = as_blocks(make_weights(cfg), kind)
    precision = "int8" if kind == "Q8_0" else "int4"
    model = build_decoder(cfg, weights, precision=precision, flavour="standard")
    node = dequantize_linears(model)["layers.0.o.qweight"]
    assert node.attributes["axis"].as_int() == 0 and node.attributes["block_size"].as_int() == 32
    codes, scales = (v.const_value for v in node.inputs[:2])
    assert codes is not None and scales is not None and codes.dtype == code_type
    blocks = weights["layers.0.o"].blocks()
    # Q4_1's codes read around the midpoint too (d q + m = d (q - 8) + (m + 8 d)).
    middle = 1 << (blocks.bits - 1)
    np.testing.assert_array_equal(
        codes.numpy().astype(np.int16).T, blocks.values.astype(np.int16) - middle
    )
    np.testing.assert_array_equal(scales.numpy().T, blocks.scales)
    assert len(node.inputs) == 2  # symmetric: no zero point stored
    if kind == "Q4_1":
        np.testing.assert_array_equal(
            model.graph.initializers["layers.0.o.mins"].const_value.numpy().T,
            blocks.mins + np.float32(8) * blocks.scales,
        )


@pytest.mark.parametrize(
    ("kind", "precision"),
    [("Q4_1", "int4"), ("Q4_0", "int4"), ("Q8_0", "int8"), (None, "int4"), (None, "int8")],
)
def test_standard_quantized_runs_on_openvino(
    kind: str | None, precision: str, tmp_path: Any
) -> None:
    cfg = CONFIGS["llama_gqa"]
    weights = make_weights(cfg)
    if kind is not None:
        weights = as_blocks(weights, kind)
    model = build_decoder(cfg, weights, precision=precision, flavour="standard")
    got = openvino_logits(model, cfg, tmp_path)
    np.testing.assert_allclose(got, logits_of(model, cfg), rtol=1e-4, atol=1e-4)
    if kind is not None:
        want = logits_of(build_decoder(cfg, weights), cfg)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- through convert_decoder ----------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_convert_keeps_an_f16_gguf_exactly(precision: str, tmp_path: Any) -> None:
    """An F16 GGUF converted at fp16 stores exactly its values (bf16: rounded once from them),
    and the artifact passes convert_decoder's own cached-step check."""
    from test_convert import tiny_gguf

    from ferry.formats import read_gguf
    from ferry.generate._convert import convert_decoder

    path, _, _ = tiny_gguf(tmp_path / "tiny.F16.gguf", matrix_type="F16")
    folder = convert_decoder(path, tmp_path / precision, precision=precision)
    model = ir.load(folder / "model.onnx")
    down = model.graph.initializers["layers.0.down"].const_value
    assert down is not None
    assert down.dtype == (ir.DataType.FLOAT16 if precision == "fp16" else ir.DataType.BFLOAT16)
    source = read_gguf(path).tensors["blk.0.ffn_down.weight"]
    assert source.ggml_type == "F16"
    want = source.dequantize().T.astype(HALF[precision]).astype(np.float32)
    np.testing.assert_array_equal(down.numpy().astype(np.float32), want)
    if precision == "fp16":
        np.testing.assert_array_equal(want, source.dequantize().T)
    section = json.loads((folder / "ferry.json").read_text())["generative"]
    assert section["precision"] == precision
    assert section["verified"].startswith("runs")
