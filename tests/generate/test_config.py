"""DecoderConfig and DecoderWeights from GGUF metadata and Hugging Face config.json / safetensors:
the kit's SmolLM2, tiny checkpoints of every supported architecture, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry.errors import InvalidInputError, ModelLoadError
from ferry.formats import read_gguf, read_safetensors
from ferry.generate import SUPPORTED_ARCHITECTURES, DecoderConfig, DecoderWeights

pytest.importorskip("gguf")

from gguf_files import (
    kit_gguf,
    llama_gguf_from_hf,
    llama_permute,
    tiny_llama,
    write_gguf,
    write_hf_folder,
)

# SmolLM2-135M-Instruct's own config.json (the values that matter here).
SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000,
    "rope_scaling": None,
    "max_position_embeddings": 8192,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


def without_rope_layout(config: DecoderConfig) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k != "rope_interleaved"}


# --- the kit -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kit() -> Any:
    return read_gguf(kit_gguf())


def test_kit_smollm2_config(kit: Any) -> None:
    config = DecoderConfig.from_gguf(kit)
    assert config.architecture == "llama"
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        30,
        576,
        9,
        3,
    )
    assert (config.head_dim, config.intermediate_size, config.vocab_size) == (64, 1536, 49152)
    assert (
        config.rms_norm_eps == 1e-5
        and config.rope_theta == 100000.0
        and config.context_length == 8192
    )
    assert config.tie_word_embeddings and config.rope_interleaved
    assert config.eos_ids == (2,) and config.bos_id == 1 and config.pad_id == 2
    assert (
        config.query_scale == 0.125
        and config.activation == "silu"
        and config.embedding_scale == 1.0
    )
    assert (
        not (config.attention_bias or config.qk_norm or config.norm_plus_one)
        and config.sliding_window is None
    )
    # what SmolLM2's own config.json says, but for the permuted q/k layout of the GGUF
    assert without_rope_layout(DecoderConfig.from_hf(SMOLLM2_CONFIG)) == without_rope_layout(config)
    assert not DecoderConfig.from_hf(SMOLLM2_CONFIG).rope_interleaved
    assert DecoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_kit_smollm2_weights(kit: Any) -> None:
    config = DecoderConfig.from_gguf(kit)
    weights = DecoderWeights.from_gguf(kit, config)
    assert len(weights) == 272 and weights.unused == ()
    assert "lm_head" not in weights  # tied
    assert weights["embed"].shape == (49152, 576) and weights["embed"].storage == "Q8_0"
    assert weights["layers.29.q"].shape == (576, 576) and weights["layers.29.q"].storage == "Q4_1"
    assert weights["layers.0.k"].shape == (192, 576)
    assert weights["layers.0.down"].shape == (576, 1536)
    assert weights["layers.0.attn_norm"].storage == "F32"
    q = weights["layers.0.q"]
    np.testing.assert_array_equal(q.float(), kit.tensors["blk.0.attn_q.weight"].dequantize())
    assert q.blocks() is not None and weights["layers.0.attn_norm"].blocks() is None


# --- a Hugging Face folder and the GGUF llama.cpp would make of it ------------------------------


def test_hf_folder_and_its_gguf_agree(tmp_path: Path) -> None:
    hf_config, hf_tensors = tiny_llama()
    folder = write_hf_folder(tmp_path / "hf", hf_config, hf_tensors)
    gguf_file = read_gguf(llama_gguf_from_hf(tmp_path / "tiny.gguf", hf_config, hf_tensors))

    from_hf = DecoderConfig.from_hf(json.loads((folder / "config.json").read_text()))
    from_gguf = DecoderConfig.from_gguf(gguf_file)
    assert without_rope_layout(from_hf) == without_rope_layout(from_gguf)
    assert from_gguf.rope_interleaved and not from_hf.rope_interleaved

    hf_weights = DecoderWeights.from_hf(read_safetensors(folder), from_hf)
    gguf_weights = DecoderWeights.from_gguf(gguf_file, from_gguf)
    assert set(hf_weights) == set(gguf_weights)
    heads, kv = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    for name in hf_weights:
        ours = hf_weights[name].float()
        if name.endswith(".q"):
            ours = llama_permute(ours, heads)
        elif name.endswith(".k"):
            ours = llama_permute(ours, kv)
        np.testing.assert_array_equal(ours, gguf_weights[name].float(), err_msg=name)


def test_the_permutation_is_the_one_transformers_undoes() -> None:
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    processor = gguf_utils.LlamaTensorProcessor(
        config={"num_attention_heads": 6, "num_key_value_heads": 3}
    )
    permuted = llama_permute(w, 3)
    np.testing.assert_array_equal(processor._reverse_permute_weights(permuted, 6, 3), w)


# --- every architecture from config.json ---------------------------------------------------------


def base_config(model_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "vocab_size": 100,
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1024,
        "eos_token_id": [5, 7],
        "bos_token_id": 4,
        **extra,
    }


def test_qwen2_qwen3_mistral_from_hf() -> None:
    qwen2 = DecoderConfig.from_hf(
        base_config("qwen2", rope_theta=1e6, sliding_window=512, use_sliding_window=False)
    )
    assert qwen2.attention_bias and not qwen2.qk_norm and qwen2.sliding_window is None
    assert qwen2.rope_theta == 1e6 and qwen2.eos_ids == (5, 7) and not qwen2.tie_word_embeddings
    qwen3 = DecoderConfig.from_hf(base_config("qwen3", head_dim=32, attention_bias=False))
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.head_dim == 32
    assert qwen3.query_scale == pytest.approx(1 / math.sqrt(32))
    mistral = DecoderConfig.from_hf(base_config("mistral", sliding_window=256))
    assert (
        mistral.sliding_window == 256
        and all(mistral.sliding_pattern)
        and len(mistral.sliding_pattern) == 6
    )
    scaled = DecoderConfig.from_hf(
        base_config("llama", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    )
    assert scaled.rope_scaling == {"rope_type": "llama3", "factor": 8.0}


def test_gemma2_from_hf() -> None:
    config = DecoderConfig.from_hf(
        base_config(
            "gemma2",
            head_dim=32,
            query_pre_attn_scalar=144,
            sliding_window=128,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            hidden_activation="gelu_pytorch_tanh",
        )
    )
    assert config.norm_plus_one and config.activation == "gelu_tanh" and config.tie_word_embeddings
    assert config.embedding_scale == pytest.approx(8.0)
    assert config.sliding_window == 128 and config.sliding_pattern == (True, False) * 3
    assert (config.attn_softcap, config.final_softcap) == (50.0, 30.0)
    assert config.query_scale == pytest.approx(144**-0.5)


def test_gemma3_from_hf_text_and_multimodal() -> None:
    text = base_config(
        "gemma3_text",
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=64,
        rope_theta=1e6,
        rope_local_base_freq=10000.0,
        final_logit_softcapping=None,
    )
    config = DecoderConfig.from_hf(text)
    assert config.architecture == "gemma3" and config.qk_norm and config.norm_plus_one
    assert config.sliding_pattern == (True,) * 5 + (False,)
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 10000.0)
    assert config.final_softcap is None
    nested = {
        "model_type": "gemma3",
        "eos_token_id": [1, 106],
        "text_config": {**text, "model_type": "gemma3_text"},
    }
    assert DecoderConfig.from_hf(nested).to_dict() == {**config.to_dict(), "eos_ids": [1, 106]}
    # transformers 5 writes layer_types and per-layer-type rope_parameters
    v5 = {k: v for k, v in text.items() if k not in ("rope_theta", "rope_local_base_freq")}
    v5["layer_types"] = ["sliding_attention", "full_attention"] * 3
    v5["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    config5 = DecoderConfig.from_hf(v5)
    assert config5.sliding_pattern == (True, False) * 3
    assert config5.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config5.rope_local_theta == 10000.0


def test_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(
        InvalidInputError, match="'bert' is not supported; supported: llama, mistral"
    ) as info:
        DecoderConfig.from_hf(base_config("bert"))
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(info.value)
    path = write_gguf(
        tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": np.zeros((4, 8), np.float32)}
    )
    with pytest.raises(
        InvalidInputError,
        match=r"gpt2\.gguf: GGUF architecture 'gpt2' is not supported; supported:",
    ):
        DecoderConfig.from_gguf(read_gguf(path))


# --- other architectures' GGUF: qwen2 biases, phi3 fused tensors, gemma2 metadata ---------------


def gguf_metadata(arch: str, layers: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        f"{arch}.block_count": layers,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": 64,
        f"{arch}.feed_forward_length": 96,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.eot_token_id": 3,
        **{f"{arch}.{k}": v for k, v in extra.items()},
    }


def layer_tensors(layers: int, fused: bool = False, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    rng = np.random.default_rng(1)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    out: dict[str, Any] = {"token_embd.weight": rand(100, 64), "output_norm.weight": rand(64)}
    for i in range(layers):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": rand(64), p + "attn_output.weight": rand(64, 64)}
        out |= {p + "ffn_norm.weight": rand(64), p + "ffn_down.weight": (rand(64, 96), "Q8_0")}
        if fused:
            out |= {
                p + "attn_qkv.weight": (rand(64 + 32 + 32, 64), "Q8_0"),
                p + "ffn_up.weight": rand(192, 64),
            }
        else:
            out |= {p + "attn_q.weight": rand(64, 64), p + "attn_k.weight": rand(32, 64)}
            out |= {p + "attn_v.weight": rand(32, 64), p + "ffn_gate.weight": rand(96, 64)}
            out |= {p + "ffn_up.weight": rand(96, 64)}
        for name in extra:
            shape = {"attn_q.bias": (64,), "attn_k.bias": (32,), "attn_v.bias": (32,)}.get(
                name, (64,)
            )
            out[p + name] = rand(*shape)
    return out


def test_qwen2_gguf_biases_and_neox_rope(tmp_path: Path) -> None:
    tensors = layer_tensors(2, extra=("attn_q.bias", "attn_k.bias", "attn_v.bias"))
    tensors["output.weight"] = np.ones((100, 64), np.float32)
    gfile = read_gguf(write_gguf(tmp_path / "q.gguf", "qwen2", tensors, gguf_metadata("qwen2")))
    config = DecoderConfig.from_gguf(gfile)
    assert config.attention_bias and not config.rope_interleaved and not config.tie_word_embeddings
    assert config.eos_ids == (2, 3)
    weights = DecoderWeights.from_gguf(gfile, config)
    assert weights["layers.1.k_bias"].shape == (32,) and weights["lm_head"].shape == (100, 64)


def test_phi3_fused_tensors_split(tmp_path: Path) -> None:
    tensors = layer_tensors(2, fused=True)
    tensors["output.weight"] = np.ones((100, 64), np.float32)
    gfile = read_gguf(write_gguf(tmp_path / "phi.gguf", "phi3", tensors, gguf_metadata("phi3")))
    config = DecoderConfig.from_gguf(gfile)
    assert config.architecture == "phi3" and not config.rope_interleaved
    weights = DecoderWeights.from_gguf(gfile, config)
    qkv = gfile.tensors["blk.0.attn_qkv.weight"]
    full = qkv.dequantize()
    assert weights["layers.0.q"].shape == (64, 64) and weights["layers.0.v"].shape == (32, 64)
    np.testing.assert_array_equal(weights["layers.0.k"].float(), full[64:96])
    blocks = weights["layers.0.v"].blocks()
    assert blocks is not None and blocks.values.shape == (32, 64)
    np.testing.assert_array_equal(blocks.dequantize(), full[96:128])
    up = gfile.tensors["blk.1.ffn_up.weight"].dequantize()
    np.testing.assert_array_equal(weights["layers.1.gate"].float(), up[:96])
    np.testing.assert_array_equal(weights["layers.1.up"].float(), up[96:])

    # the Hugging Face checkpoint fuses the same way
    hf = {
        "model.embed_tokens.weight": np.zeros((100, 64), np.float32),
        "model.norm.weight": np.ones(64, np.float32),
    }
    hf["lm_head.weight"] = np.zeros((100, 64), np.float32)
    for i in range(2):
        p = f"model.layers.{i}."
        hf |= {
            p + "input_layernorm.weight": np.ones(64, np.float32),
            p + "post_attention_layernorm.weight": np.ones(64, np.float32),
        }
        hf |= {
            p + "self_attn.qkv_proj.weight": full,
            p + "self_attn.o_proj.weight": np.zeros((64, 64), np.float32),
        }
        hf |= {
            p + "mlp.gate_up_proj.weight": up,
            p + "mlp.down_proj.weight": np.zeros((64, 96), np.float32),
        }
    hf_config = DecoderConfig.from_hf(base_config("phi3", num_hidden_layers=2, vocab_size=100))
    hf_weights = DecoderWeights.from_hf(
        {k: np.asarray(v, np.float32) for k, v in hf.items()}, hf_config
    )
    np.testing.assert_array_equal(hf_weights["layers.0.k"].float(), full[64:96])
    np.testing.assert_array_equal(hf_weights["layers.1.up"].float(), up[96:])


def test_gemma2_gguf_metadata(tmp_path: Path) -> None:
    meta = gguf_metadata(
        "gemma2",
        layers=4,
        **{
            "attention.sliding_window": 128,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "attention.key_length": 16,
        },
    )
    tensors = layer_tensors(4, extra=("post_attention_norm.weight", "post_ffw_norm.weight"))
    gfile = read_gguf(write_gguf(tmp_path / "g.gguf", "gemma2", tensors, meta))
    config = DecoderConfig.from_gguf(gfile)
    assert config.sliding_window == 128 and config.sliding_pattern == (True, False, True, False)
    assert (config.attn_softcap, config.final_softcap) == (50.0, 30.0)
    assert config.activation == "gelu_tanh" and config.embedding_scale == pytest.approx(8.0)
    # llama.cpp's converter already stored gemma's norms as 1 + w
    assert not config.norm_plus_one and config.tie_word_embeddings and not config.rope_interleaved
    assert config.query_scale == pytest.approx(0.25)
    weights = DecoderWeights.from_gguf(gfile, config)
    assert "layers.3.post_attn_norm" in weights and "layers.3.post_ffn_norm" in weights


def test_gemma_hf_norm_names(tmp_path: Path) -> None:
    config = DecoderConfig.from_hf(
        base_config("gemma2", num_hidden_layers=1, head_dim=16, query_pre_attn_scalar=16)
    )
    z = np.zeros
    hf = {
        "model.embed_tokens.weight": z((100, 64), np.float32),
        "model.norm.weight": z(64, np.float32),
    }
    p = "model.layers.0."
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
        hf[p + name + ".weight"] = np.full(64, 1.0, np.float32)
    hf[p + "post_feedforward_layernorm.weight"] = np.full(64, 2.0, np.float32)
    for proj, shape in (("q", (64, 64)), ("k", (32, 64)), ("v", (32, 64)), ("o", (64, 64))):
        hf[f"{p}self_attn.{proj}_proj.weight"] = z(shape, np.float32)
    for proj, shape in (("gate", (96, 64)), ("up", (96, 64)), ("down", (64, 96))):
        hf[f"{p}mlp.{proj}_proj.weight"] = z(shape, np.float32)
    folder = write_hf_folder(tmp_path / "gemma", {}, hf)
    weights = DecoderWeights.from_hf(read_safetensors(folder), config)
    assert {"layers.0.post_attn_norm", "layers.0.ffn_norm", "layers.0.post_ffn_norm"} <= set(
        weights
    )
    assert weights["layers.0.post_ffn_norm"].float()[0] == 2.0


def test_missing_or_misshapen_weights_are_one_clear_error(tmp_path: Path) -> None:
    hf_config, hf_tensors = tiny_llama()
    config = DecoderConfig.from_hf(hf_config)
    del hf_tensors["model.layers.1.mlp.up_proj.weight"]
    folder = write_hf_folder(tmp_path / "a", hf_config, hf_tensors)
    with pytest.raises(ModelLoadError, match=r"llama weights missing: layers\.1\.up"):
        DecoderWeights.from_hf(read_safetensors(folder), config)
    narrower = DecoderConfig.from_hf({**hf_config, "intermediate_size": 64})
    _, full = tiny_llama()
    with pytest.raises(
        ModelLoadError,
        match=r"weight layers\.0\.gate has shape \[96, 64\], the config says \[64, 64\]",
    ):
        DecoderWeights.from_hf(full, narrower)
