"""A decoder's weights under canonical names, from a GGUF file or a Hugging Face checkpoint.

The graph builder asks for ``layers.3.q`` and never learns whether it came from ``blk.3.attn_q.weight``
or ``model.layers.3.self_attn.q_proj.weight``, nor that phi3 stores q/k/v (and gate/up) fused. Each
:class:`Weight` stays lazy: its bytes are read when the builder asks for floats or quantized blocks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.errors import ModelLoadError

if TYPE_CHECKING:
    from ferry.formats import GGUFFile, QuantBlocks
    from ferry.generate._config import DecoderConfig

__all__ = ["DecoderWeights", "Weight"]

# GGUF per-layer tensor -> canonical suffix (shared by every supported architecture).
_GGUF_LAYER = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_output.weight": "o",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "post_attention_norm.weight": "post_attn_norm",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
    "post_ffw_norm.weight": "post_ffn_norm",
}
_GGUF_GLOBAL = {
    "token_embd.weight": "embed",
    "output_norm.weight": "final_norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}
# Hugging Face per-layer tensor (after "layers.N.") -> canonical suffix.
_HF_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffn_norm",
}
_LAYER_RE = re.compile(r"^(?:blk|layers)\.(\d+)\.(.+)$")


class Weight:
    """One canonical weight: a stored tensor, or a row range of a fused one.

    Attributes:
        shape: numpy order; matrices are (out_features, in_features).
        storage: How the source stores it ("Q4_1", "F32", "BF16", ...).
    """

    def __init__(self, source: Any, storage: str, rows: tuple[int, int] | None = None) -> None:
        self._source = source
        self.storage = storage
        self._rows = rows
        shape = tuple(int(d) for d in source.shape)
        self.shape: tuple[int, ...] = (rows[1] - rows[0], *shape[1:]) if rows else shape

    def __repr__(self) -> str:
        return f"Weight({self.storage}, {self.shape})"

    def float(self) -> np.ndarray:
        """The weight as float32 (dequantized for GGUF quant types)."""
        source = self._source
        if isinstance(source, np.ndarray):  # a plain array handed to from_hf
            full = source
        else:
            full = source.dequantize() if hasattr(source, "dequantize") else source.numpy()
        full = np.asarray(full, dtype=np.float32)
        return full[self._rows[0] : self._rows[1]] if self._rows else full

    def blocks(self) -> QuantBlocks | None:
        """The stored Q4_0 / Q4_1 / Q8_0 blocks, or None (other types, and every checkpoint)."""
        if not hasattr(self._source, "blocks"):
            return None
        blocks = self._source.blocks()
        if blocks is None or self._rows is None:
            return blocks
        from ferry.formats import QuantBlocks

        lo, hi = self._rows

        def cut(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[lo:hi]

        return QuantBlocks(
            blocks.bits,
            blocks.values[lo:hi],
            blocks.scales[lo:hi],
            cut(blocks.zero_points),
            cut(blocks.mins),
        )


class DecoderWeights(Mapping[str, Weight]):
    """Canonical name -> :class:`Weight` ("embed", "final_norm", "lm_head" unless tied, and per
    layer ``layers.{i}.`` attn_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm,
    post_attn_norm, ffn_norm, gate, up, down, post_ffn_norm, as the architecture has them)."""

    def __init__(self, weights: dict[str, Weight], unused: tuple[str, ...] = ()) -> None:
        self._weights = weights
        #: Source tensors no canonical name took (vision towers, unused rope tables...).
        self.unused = unused

    def __getitem__(self, name: str) -> Weight:
        return self._weights[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile, config: DecoderConfig) -> DecoderWeights:
        """Map a GGUF file's tensors to canonical names (q/k stay as stored; see
        ``config.rope_interleaved``).

        Raises:
            ModelLoadError: A tensor the config needs is missing or has the wrong shape.
        """
        out: dict[str, Weight] = {}
        unused: list[str] = []
        for name, tensor in gguf_file.tensors.items():
            canonical = _GGUF_GLOBAL.get(name)
            match = _LAYER_RE.match(name)
            if canonical is None and match:
                layer, rest = match.groups()
                if rest == "attn_qkv.weight":
                    out.update(_split_qkv(f"layers.{layer}", tensor, tensor.ggml_type, config))
                    continue
                if (
                    rest == "ffn_up.weight"
                    and config.architecture == "phi3"
                    and _fused_up(tensor, config)
                ):
                    out.update(_split_gate_up(f"layers.{layer}", tensor, tensor.ggml_type, config))
                    continue
                suffix = _GGUF_LAYER.get(rest)
                canonical = f"layers.{layer}.{suffix}" if suffix else None
            if canonical is None:
                unused.append(name)
            else:
                out[canonical] = Weight(tensor, tensor.ggml_type)
        return cls._checked(out, config, str(gguf_file.path), unused)

    @classmethod
    def from_hf(cls, tensors: Mapping[str, Any], config: DecoderConfig) -> DecoderWeights:
        """Map a Hugging Face checkpoint's tensors (from :func:`ferry.formats.read_safetensors`, or
        plain numpy arrays).

        Raises:
            ModelLoadError: A tensor the config needs is missing or has the wrong shape.
        """
        prefix = _hf_prefix(tensors)
        gemma = config.architecture in ("gemma2", "gemma3")
        out: dict[str, Weight] = {}
        unused: list[str] = []
        for name, tensor in tensors.items():
            storage = _storage(tensor)
            rest = name[len(prefix) :] if name.startswith(prefix) else None
            canonical = None
            if rest == "embed_tokens.weight":
                canonical = "embed"
            elif rest == "norm.weight":
                canonical = "final_norm"
            elif name.endswith("lm_head.weight"):
                canonical = "lm_head"
            elif rest is not None and (match := _LAYER_RE.match(rest)):
                layer, tail = match.groups()
                base = f"layers.{layer}"
                if tail == "self_attn.qkv_proj.weight":
                    out.update(_split_qkv(base, tensor, storage, config))
                    continue
                if tail == "mlp.gate_up_proj.weight":
                    out.update(_split_gate_up(base, tensor, storage, config))
                    continue
                if tail == "post_attention_layernorm.weight":
                    # gemma normalizes after attention and again before the MLP; llama has one norm.
                    suffix: str | None = "post_attn_norm" if gemma else "ffn_norm"
                else:
                    suffix = _HF_LAYER.get(tail)
                canonical = f"{base}.{suffix}" if suffix else None
            if canonical is None:
                unused.append(name)
            else:
                out[canonical] = Weight(tensor, storage)
        return cls._checked(out, config, "the checkpoint", unused)

    @classmethod
    def _checked(
        cls, out: dict[str, Weight], config: DecoderConfig, source: str, unused: list[str]
    ) -> DecoderWeights:
        if config.tie_word_embeddings:
            out.pop("lm_head", None)
        expected = _expected_shapes(config)
        missing = [name for name in expected if name not in out]
        if missing:
            shown = ", ".join(missing[:6]) + (
                f" (+{len(missing) - 6} more)" if len(missing) > 6 else ""
            )
            raise ModelLoadError(f"{source}: {config.architecture} weights missing: {shown}")
        for name, shape in expected.items():
            if out[name].shape != shape:
                raise ModelLoadError(
                    f"{source}: weight {name} has shape {list(out[name].shape)}, "
                    f"the config says {list(shape)}"
                )
        return cls(out, tuple(unused))


def _storage(tensor: Any) -> str:
    # LazyTensor names its safetensors dtype; a plain numpy array gets the same spelling.
    if isinstance(tensor, np.ndarray):
        return {"float32": "F32", "float16": "F16", "float64": "F64"}.get(
            tensor.dtype.name, tensor.dtype.name
        )
    return str(getattr(tensor, "dtype", "F32"))


def _hf_prefix(tensors: Mapping[str, Any]) -> str:
    # "model." for decoders; "model.language_model." / "language_model.model." for gemma3 multimodal.
    for name in tensors:
        if name.endswith("embed_tokens.weight"):
            return name[: -len("embed_tokens.weight")]
    raise ModelLoadError("the checkpoint has no embed_tokens.weight: not a decoder checkpoint")


def _fused_up(tensor: Any, config: DecoderConfig) -> bool:
    return int(tensor.shape[0]) == 2 * config.intermediate_size


def _split_qkv(base: str, tensor: Any, storage: str, config: DecoderConfig) -> dict[str, Weight]:
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    return {
        f"{base}.q": Weight(tensor, storage, (0, q)),
        f"{base}.k": Weight(tensor, storage, (q, q + kv)),
        f"{base}.v": Weight(tensor, storage, (q + kv, q + 2 * kv)),
    }


def _split_gate_up(
    base: str, tensor: Any, storage: str, config: DecoderConfig
) -> dict[str, Weight]:
    # Fused as [gate; up]: phi3's MLP chunks it in that order, and llama.cpp's fused SwiGLU too.
    ff = config.intermediate_size
    return {
        f"{base}.gate": Weight(tensor, storage, (0, ff)),
        f"{base}.up": Weight(tensor, storage, (ff, 2 * ff)),
    }


def _expected_shapes(config: DecoderConfig) -> dict[str, tuple[int, ...]]:
    hidden, hd, ff = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    gemma = config.architecture in ("gemma2", "gemma3")
    shapes: dict[str, tuple[int, ...]] = {
        "embed": (config.vocab_size, hidden),
        "final_norm": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (config.vocab_size, hidden)
    for i in range(config.num_layers):
        p = f"layers.{i}."
        layer: dict[str, tuple[int, ...]] = {
            "attn_norm": (hidden,),
            "q": (q, hidden),
            "k": (kv, hidden),
            "v": (kv, hidden),
            "o": (hidden, q),
            "ffn_norm": (hidden,),
            "gate": (ff, hidden),
            "up": (ff, hidden),
            "down": (hidden, ff),
        }
        if config.attention_bias:
            layer.update(q_bias=(q,), k_bias=(kv,), v_bias=(kv,))
        if config.qk_norm:
            layer.update(q_norm=(hd,), k_norm=(hd,))
        if gemma:
            layer.update(post_attn_norm=(hidden,), post_ffn_norm=(hidden,))
        shapes.update({p + k: v for k, v in layer.items()})
    return shapes
