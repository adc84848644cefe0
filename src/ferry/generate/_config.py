"""The decoder's hyper-parameters, one frozen record for every supported architecture.

A GGUF file's metadata and a Hugging Face ``config.json`` both reduce to a :class:`DecoderConfig`;
the graph builder reads only this record, so architecture quirks (gemma's ``1 + w`` norms, qwen2's
biases, phi3's fused projections) are decided once, here, and not re-derived downstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecoderConfig:
    """What the decoder graph needs to know about a model.

    Attributes:
        architecture: "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3" or "phi3".
        vocab_size: Rows of the embedding and of the output projection.
        hidden_size: Width of the residual stream.
        num_layers: Decoder blocks.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (grouped-query attention when fewer than ``num_heads``).
        head_dim: Width of one head.
        intermediate_size: Width of the gated feed-forward.
        rms_norm_eps: Epsilon of every RMSNorm.
        rope_theta: RoPE base frequency.
        rope_interleaved: True when q/k weights are laid out for rotating adjacent pairs
            (2i, 2i+1), as llama.cpp's converter permutes llama-family GGUFs; False for the
            half-split rotation Hugging Face checkpoints use.
        rope_scaling: The checkpoint's rope scaling record, or None.
        context_length: Longest sequence the model was trained for.
        tie_word_embeddings: The output projection reuses the embedding.
        attention_bias: q/k/v projections carry biases (qwen2).
        qk_norm: Per-head RMSNorm on queries and keys (qwen3, gemma3).
        norm_plus_one: RMSNorm multiplies by ``1 + w`` (gemma).
        activation: Gate activation, "silu" or "gelu_tanh".
        embedding_scale: Factor on the embedded tokens (gemma: sqrt(hidden_size)).
        sliding_window: Window of the local-attention layers, or None.
        sliding_pattern: Per layer, True where the layer uses the sliding window.
        attn_softcap: Attention-logit soft-capping, or None.
        final_softcap: Final-logit soft-capping, or None.
        query_scale: Factor on q·k (1/sqrt(head_dim) unless the model says otherwise).
        bos_id: Beginning-of-sequence token, or None.
        eos_ids: Tokens that end generation.
        pad_id: Padding token, or None.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    context_length: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    norm_plus_one: bool = False
    activation: str = "silu"
    embedding_scale: float = 1.0
    sliding_window: int | None = None
    sliding_pattern: tuple[bool, ...] = ()
    attn_softcap: float | None = None
    final_softcap: float | None = None
    query_scale: float = field(default=0.0)
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int | None = None

    def __post_init__(self) -> None:
        # 0.0 means "not given": the usual 1/sqrt(head_dim), so tiny test configs need not say it.
        if not self.query_scale:
            object.__setattr__(self, "query_scale", 1.0 / math.sqrt(self.head_dim))

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready values (tuples become lists)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecoderConfig:
        """Rebuild a record written by :meth:`to_dict` (unknown keys are ignored)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("sliding_pattern", "eos_ids"):
            if name in known and known[name] is not None:
                known[name] = tuple(known[name])
        return cls(**known)
