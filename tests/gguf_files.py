"""Tiny GGUF files and Hugging Face folders written in tests (with the ``gguf`` package's own writer),
and where the kit's real one lives."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

KIT_DIR = Path(os.environ.get("FERRY_KIT") or Path.home() / ".cache" / "ferry-kit")
KIT_GGUF = KIT_DIR / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# Offsets of the f16 scales inside one K-quant block (the rest is codes, any byte pattern valid).
_K_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def kit_gguf() -> Path:
    """The kit's SmolLM2 GGUF, or a pytest skip naming how to fetch it."""
    import pytest

    if not (KIT_DIR / "models" / ".done").is_file() or not KIT_GGUF.is_file():
        pytest.skip(f"the real-model kit is not fetched ({KIT_GGUF}); run scripts/fetch-kit.sh")
    return KIT_GGUF


def random_k_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random but valid K-quant bytes (finite f16 scales) for a (rows, cols) matrix: what Python
    cannot quantize, it can still store and dequantize."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in _K_SCALE_OFFSETS[type_name]:
        scale = np.asarray(rng.uniform(1e-3, 2e-2, size=blocks.shape[0]), dtype=np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // block * size)


def write_gguf(
    path: Path,
    arch: str,
    tensors: dict[str, np.ndarray | tuple[np.ndarray, str]],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """A GGUF file: ``tensors`` maps names to float arrays (stored F32) or ``(array, type)``: a float
    array quantized with ``gguf.quants.quantize``, or, for a K-quant, its raw block bytes."""
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    for key, value in (metadata or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    for name, spec in tensors.items():
        if isinstance(spec, tuple):
            data, type_name = spec
            qtype = gguf.GGMLQuantizationType[type_name]
            if data.dtype != np.uint8:
                data = gguf.quants.quantize(data.astype(np.float32), qtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(name, spec.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation (half-split -> adjacent pairs), per head."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_llama(
    seed: int = 0,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ff: int = 96,
    vocab: int = 80,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A random llama-family checkpoint: its config.json and its Hugging Face tensors."""
    rng = np.random.default_rng(seed)
    hd = hidden // heads

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    tensors = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": 1 + rand(hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": 1 + rand(hidden),
            p + "self_attn.q_proj.weight": rand(heads * hd, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * hd, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * hd, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * hd),
            p + "post_attention_layernorm.weight": 1 + rand(hidden),
            p + "mlp.gate_proj.weight": rand(ff, hidden),
            p + "mlp.up_proj.weight": rand(ff, hidden),
            p + "mlp.down_proj.weight": rand(hidden, ff),
        }
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": ff,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    return config, tensors


#: A Hugging Face llama layer's tensor -> its GGUF name (llama.cpp's converter).
HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensors_from_hf(
    config: dict[str, Any], tensors: dict[str, np.ndarray], matrix_type: str | None = None
) -> dict[str, np.ndarray | tuple[np.ndarray, str]]:
    """A llama checkpoint's tensors under their GGUF names, q/k permuted as llama.cpp's converter
    does, the projections stored as ``matrix_type`` (None: F32)."""
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, np.ndarray | tuple[np.ndarray, str]] = {
        "token_embd.weight": tensors["model.embed_tokens.weight"],
        "output_norm.weight": tensors["model.norm.weight"],
    }
    for i in range(config["num_hidden_layers"]):
        for hf, gg in HF_TO_GGUF.items():
            w = tensors[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                w = llama_permute(w, heads)
            elif gg == "attn_k":
                w = llama_permute(w, kv)
            matrix = "norm" not in gg
            out[f"blk.{i}.{gg}.weight"] = (w, matrix_type) if matrix and matrix_type else w
    return out


def llama_gguf_from_hf(path: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    """The GGUF llama.cpp's converter would write for this llama checkpoint (q/k permuted, F32)."""
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    out = gguf_tensors_from_hf(config, tensors)
    arch = "llama"
    metadata = {
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv,
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "tokenizer.ggml.bos_token_id": config["bos_token_id"],
        "tokenizer.ggml.eos_token_id": config["eos_token_id"],
        "tokenizer.ggml.padding_token_id": config["pad_token_id"],
    }
    return write_gguf(path, arch, out, metadata)


def write_hf_folder(folder: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Path:
    """config.json + model.safetensors (the safetensors package's numpy writer)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
