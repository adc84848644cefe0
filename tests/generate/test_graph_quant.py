"""The int4/int8 decoder: GGUF blocks mapped exactly onto MatMulNBits, RTN for the rest."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from test_graph_decoder import (
    CONFIGS,
    IDS,
    Blocks,
    FakeWeight,
    FakeWeights,
    Runner,
    make_weights,
    to_bytes,
)

from ferry.generate._config import DecoderConfig
from ferry.generate._graph import build_decoder
from ferry.generate._graph_quant import dequantize, pack_codes, pack_zero_points, rtn


def as_blocks(w: FakeWeights, kind: str, seed: int = 1) -> FakeWeights:
    """Every matrix replaced by random GGUF-style blocks of `kind` (Q4_0, Q4_1, Q8_0); float()
    gives exactly what the blocks hold."""
    rng = np.random.default_rng(seed)
    out = FakeWeights()
    for name, weight in w.items():
        if weight.array.ndim != 2:
            out[name] = weight
            continue
        n, k = weight.shape
        spread = float(np.abs(weight.array).max())
        if kind == "Q8_0":
            bits, codes = 8, rng.integers(0, 256, (n, k), dtype=np.uint8)
            scales = rng.uniform(0.2, 1.0, (n, k // 32)).astype(np.float32) * spread / 127
            zeros, mins = np.full((n, k // 32), 128, np.uint8), None
        else:
            bits, codes = 4, rng.integers(0, 16, (n, k), dtype=np.uint8)
            scales = rng.uniform(0.2, 1.0, (n, k // 32)).astype(np.float32) * spread / 8
            zeros, mins = (np.full((n, k // 32), 8, np.uint8), None)
            if kind == "Q4_1":
                zeros, mins = (
                    None,
                    (-8 * scales + rng.normal(0, 0.1, scales.shape) * spread).astype(np.float32),
                )
                scales[0, 0] = 0.0  # a constant block: d == 0, every value m
        blocks = Blocks(bits, codes, scales, zeros, mins)
        values = codes.reshape(n, k // 32, 32).astype(np.float32)
        if mins is not None:
            dense = scales[..., None] * values + mins[..., None]
        else:
            dense = scales[..., None] * (values - zeros[..., None].astype(np.float32))
        out[name] = FakeWeight(dense.reshape(n, k), blocks)
    return out


def ops(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def logits_of(model: ir.Model, cfg: DecoderConfig) -> np.ndarray:
    return Runner(model, cfg).prompt(IDS)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_bias"])
def test_int4_from_blocks_equals_fp32_of_the_same_values(name: str, kind: str) -> None:
    cfg = CONFIGS[name]
    weights = as_blocks(make_weights(cfg), kind)
    int4 = build_decoder(cfg, weights, precision="int4", flavour="ort")
    projections = 4 * cfg.num_layers + 1  # qkv, o, gate_up, down per layer, and the head
    assert ops(int4).count("MatMulNBits") == projections
    assert "ferry.requantization" not in int4.metadata_props
    np.testing.assert_allclose(
        logits_of(int4, cfg), logits_of(build_decoder(cfg, weights), cfg), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_bias", "qwen3_qknorm", "gemma2", "gemma3"])
def test_q4_1_rows_layout_batches_and_steps_as_the_float_graph(name: str) -> None:
    """Quantized ort builds run the layers on rows [tokens, features] (Q4_1's correction one
    Gemm); a left-padded batch and a step through its cache give the float graph's logits, with
    packed attention or without it (per-head norms), sliding windows and post-norms alike."""
    cfg = CONFIGS[name]
    weights = as_blocks(make_weights(cfg), "Q4_1")
    int4 = build_decoder(cfg, weights, precision="int4", flavour="ort")
    assert "Gemm" in ops(int4) and "MatMul" in ops(int4)
    runs = [Runner(m, cfg) for m in (int4, build_decoder(cfg, weights, flavour="ort"))]
    short = IDS[:6]
    pad = len(IDS) - len(short)
    ids = np.stack([IDS, np.concatenate([np.zeros(pad, np.int64), short])])
    mask = np.stack([np.ones(len(IDS)), np.concatenate([np.zeros(pad), np.ones(len(short))])])
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    got = []
    for run in runs:
        logits, past = run(ids, mask, pos, run.empty_past(2))
        step, _ = run(
            np.array([[7], [7]]), np.concatenate([mask, np.ones((2, 1))], 1), pos[:, -1:] + 1, past
        )
        got.append((logits[0], logits[1, pad:], step))
    for ours, want in zip(*got):
        np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4)


def test_int8_activations_stay_close() -> None:
    cfg = CONFIGS["llama_gqa"]
    weights = as_blocks(make_weights(cfg), "Q4_1")
    fast = build_decoder(cfg, weights, precision="int4", flavour="ort", accuracy_level=4)
    got, want = logits_of(fast, cfg), logits_of(build_decoder(cfg, weights), cfg)
    assert cosine(got, want) >= 0.999


def test_int8_from_q8_0_blocks_stays_close_to_fp32() -> None:
    """8-bit MatMulNBits runs with int8 activations (onnxruntime's only fast 8-bit kernel, as
    llama.cpp's q8_0 dot product), so close rather than equal."""
    cfg = CONFIGS["llama_gqa"]
    weights = as_blocks(make_weights(cfg), "Q8_0")
    int8 = build_decoder(cfg, weights, precision="int8", flavour="ort")
    assert ops(int8).count("MatMulNBits") == 4 * cfg.num_layers + 1
    got, want = logits_of(int8, cfg), logits_of(build_decoder(cfg, weights), cfg)
    assert cosine(got, want) >= 0.999
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("precision", ["int4", "int8"])
@pytest.mark.parametrize("name", ["llama_gqa", "gemma2", "qwen3_qknorm"])
def test_rtn_from_float_stays_close_and_reports_its_error(name: str, precision: str) -> None:
    cfg = CONFIGS[name]
    weights = make_weights(cfg)
    model = build_decoder(cfg, weights, precision=precision, flavour="ort")
    errors = json.loads(model.metadata_props["ferry.requantization"])
    assert set(errors) >= {"layers.0.q", "layers.1.down", "lm_head"}
    assert max(errors.values()) < (0.2 if precision == "int4" else 0.02)
    got, want = logits_of(model, cfg), logits_of(build_decoder(cfg, weights), cfg)
    # Measured on these random 2-layer models: int4 0.983-0.993, int8 >= 0.9998.
    assert cosine(got, want) >= (0.98 if precision == "int4" else 0.999)


def test_rtn_graph_computes_exactly_its_dequantized_weights() -> None:
    """Per-block zero points that differ (the RTN case) are packed where MatMulNBits reads them."""
    cfg = CONFIGS["llama_gqa"]
    weights = make_weights(cfg)
    precision, bits = "int4", 4
    rounded = FakeWeights()
    for name, weight in weights.items():
        array = weight.float()
        # the embedding's Gather stays float (this config's head is untied)
        matrix = array.ndim == 2 and name != "embed"
        rounded[name] = FakeWeight(dequantize(*rtn(array, bits)) if matrix else array)
    model = build_decoder(cfg, weights, precision=precision, flavour="ort")
    np.testing.assert_allclose(
        logits_of(model, cfg), logits_of(build_decoder(cfg, rounded), cfg), rtol=1e-4, atol=1e-4
    )


def test_rtn_round_trip_and_packing() -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (8, 64)).astype(np.float32)
    codes, scales, zeros = rtn(w, 4)
    assert codes.max() <= 15 and scales.shape == (8, 2)
    restored = dequantize(codes, scales, zeros)
    assert np.abs(restored - w).max() <= scales.max() / 2 + 1e-6
    packed = pack_codes(codes, 4)
    assert packed.shape == (8, 2, 16)
    assert (packed[..., 0] & 0xF == codes[:, 0::32]).all()
    assert (packed[..., 0] >> 4 == codes[:, 1::32]).all()
    zp = pack_zero_points(zeros[:, :1], 4)  # an odd count pads each row to a whole byte
    assert zp.shape == (8,) and (zp == zeros[:, 0]).all()


def test_unknown_precision_and_flavour_are_refused() -> None:
    from ferry.errors import InvalidInputError

    cfg = CONFIGS["llama_gqa"]
    with pytest.raises(InvalidInputError, match="precision"):
        build_decoder(cfg, make_weights(cfg), precision="int3")
    with pytest.raises(InvalidInputError, match="flavour"):
        build_decoder(cfg, make_weights(cfg), flavour="tensorrt")


@pytest.mark.parametrize("flavour", ["standard", "ort"])
def test_int4_runs_on_openvino(flavour: str, tmp_path: Any) -> None:
    """OpenVINO reads the standard flavour's DequantizeLinear and the ort flavour's MatMulNBits
    (and its other fused operators); without its dynamic activation quantization it computes the
    same values."""
    cfg = CONFIGS["llama_gqa"]
    weights = as_blocks(make_weights(cfg), "Q4_1")
    model = build_decoder(cfg, weights, precision="int4", flavour=flavour)
    got = openvino_logits(model, cfg, tmp_path)
    want = logits_of(build_decoder(cfg, weights), cfg)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_ort_flavour_gathers_the_embedding_from_its_blocks(kind: str) -> None:
    cfg = CONFIGS["qwen2_bias"]  # tied: the head reads the same blocks through MatMulNBits
    weights = as_blocks(make_weights(cfg), kind)
    precision = "int8" if kind == "Q8_0" else "int4"
    model = build_decoder(cfg, weights, precision=precision, flavour="ort")
    assert "GatherBlockQuantized" in ops(model) and "Gather" not in ops(model)
    assert "embed" not in {init for init in model.graph.initializers}
    standard = build_decoder(cfg, weights, precision=precision, flavour="standard")
    assert "Gather" in ops(standard)
    got, want = logits_of(model, cfg), logits_of(standard, cfg)
    if kind == "Q8_0":
        # the ort flavour's 8-bit MatMulNBits multiplies int8 activations; the standard
        # flavour's DequantizeLinear float ones
        assert cosine(got, want) >= 0.999
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def openvino_logits(model: ir.Model, cfg: DecoderConfig, tmp_path: Any) -> np.ndarray:
    """Prompt logits on OpenVINO at f32 with its dynamic activation quantization off."""
    ov = pytest.importorskip("openvino")
    path = tmp_path / "decoder.onnx"
    path.write_bytes(to_bytes(model))
    options = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    compiled = ov.Core().compile_model(str(path), "CPU", options)
    n = len(IDS)
    feeds: dict[str, np.ndarray] = {
        "input_ids": IDS[None],
        "attention_mask": np.ones((1, n), np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
    }
    empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
    for i in range(cfg.num_layers):
        feeds[f"past_key_values.{i}.key"] = feeds[f"past_key_values.{i}.value"] = empty
    return np.asarray(compiled(feeds)[compiled.output("logits")][0])
