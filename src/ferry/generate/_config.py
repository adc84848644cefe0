"""The decoder's hyper-parameters, one frozen record for every supported architecture.

A GGUF file's metadata and a Hugging Face ``config.json`` both reduce to a :class:`DecoderConfig`;
the graph builder reads only this record, so architecture quirks (gemma's ``1 + w`` norms, qwen2's
biases, phi3's fused projections) are decided once, here, and not re-derived downstream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.formats import GGUFFile

#: Architectures ferry builds, by their GGUF ``general.architecture`` / ``config.json`` names.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
# config.json model_type spellings that are one of the above.
_HF_ALIASES = {"gemma3_text": "gemma3", "smollm": "llama", "smollm2": "llama"}
# llama.cpp's converter permutes q/k rows only for these (LLAMA_ROPE_TYPE_NORM: adjacent pairs);
# qwen2/qwen3/gemma2/gemma3/phi3 are NEOX-rope archs and keep Hugging Face's half-split layout.
_GGUF_PERMUTED = frozenset({"llama", "mistral"})
_GEMMA = frozenset({"gemma2", "gemma3"})


__all__ = ["SUPPORTED_ARCHITECTURES", "DecoderConfig"]


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
        rope_local_theta: RoPE base of the sliding-window layers when it differs from
            ``rope_theta`` (gemma3: 10000 locally, 1e6 globally), else None.
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
    rope_local_theta: float | None = None

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

    @classmethod
    def from_gguf(cls, gguf_file: GGUFFile) -> DecoderConfig:
        """The config a GGUF file's metadata describe.

        Args:
            gguf_file: The file from :func:`ferry.formats.read_gguf`.

        Returns:
            The config; ``rope_interleaved`` is True for the llama-family files llama.cpp permutes.

        Raises:
            InvalidInputError: The architecture is not supported, or a required key is missing.
        """
        meta = gguf_file.metadata
        arch = _supported(gguf_file.architecture, f"{gguf_file.path}: GGUF architecture")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            # Some converters store per-layer arrays; a uniform one is the plain value.
            if isinstance(value, list) and value:
                if len(set(value)) != 1:
                    raise InvalidInputError(
                        f"{gguf_file.path}: {arch}.{key} varies per layer ({value[:4]}...)"
                    )
                value = value[0]
            return value

        def need(key: str) -> Any:
            value = get(key)
            if value is None:
                raise InvalidInputError(f"{gguf_file.path}: GGUF metadata lacks {arch}.{key}")
            return value

        hidden = int(need("embedding_length"))
        heads = int(need("attention.head_count"))
        layers = int(need("block_count"))
        head_dim = int(get("attention.key_length") or hidden // heads)
        embd = gguf_file.tensors.get("token_embd.weight")
        vocab = get("vocab_size") or (
            embd.shape[0] if embd is not None else len(meta.get("tokenizer.ggml.tokens", []))
        )
        rope_dims = get("rope.dimension_count")
        if rope_dims is not None and int(rope_dims) != head_dim:
            raise InvalidInputError(
                f"{gguf_file.path}: partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported"
            )
        scaling_type = get("rope.scaling.type")
        rope_scaling: dict[str, Any] | None = None
        if scaling_type and scaling_type != "none":
            rope_scaling = {
                "rope_type": scaling_type,
                "factor": float(get("rope.scaling.factor", 1.0)),
            }
            original = get("rope.scaling.original_context_length")
            if original:
                rope_scaling["original_max_position_embeddings"] = int(original)
        if "rope_freqs.weight" in gguf_file.tensors:
            # Llama 3.1+ files carry their scaled frequencies as a tensor (DecoderWeights' "rope_freqs").
            rope_scaling = {"rope_type": "freq_factors"}
        window = get("attention.sliding_window")
        eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
        gemma = arch in _GEMMA
        return cls(
            architecture=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(get("attention.head_count_kv") or heads),
            head_dim=head_dim,
            intermediate_size=int(need("feed_forward_length")),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_interleaved=arch in _GGUF_PERMUTED,
            rope_scaling=rope_scaling,
            context_length=int(get("context_length", 2048)),
            tie_word_embeddings="output.weight" not in gguf_file.tensors,
            attention_bias="blk.0.attn_q.bias" in gguf_file.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in gguf_file.tensors,
            # llama.cpp's converter stores gemma's norms as 1 + w already: the graph must not add 1.
            norm_plus_one=False,
            activation="gelu_tanh" if gemma else "silu",
            embedding_scale=math.sqrt(hidden) if gemma else 1.0,
            sliding_window=int(window) if window else None,
            sliding_pattern=_sliding_pattern(
                arch, layers, window, meta.get(f"{arch}.attention.sliding_window_pattern")
            ),
            attn_softcap=_float_or_none(get("attn_logit_softcapping")),
            final_softcap=_float_or_none(get("final_logit_softcapping")),
            query_scale=_gguf_query_scale(arch, layers, hidden, heads, head_dim),
            bos_id=_int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
            eos_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
            pad_id=_int_or_none(meta.get("tokenizer.ggml.padding_token_id")),
            rope_local_theta=float(get("rope.freq_base_swa", 10000.0))
            if arch == "gemma3"
            else None,
        )

    @classmethod
    def from_hf(cls, config_json: dict[str, Any]) -> DecoderConfig:
        """The config a Hugging Face ``config.json`` describes.

        Args:
            config_json: The parsed ``config.json`` (a multimodal gemma3's ``text_config`` is used).

        Returns:
            The config (``rope_interleaved`` False: checkpoints rotate halves).

        Raises:
            InvalidInputError: The model type is not supported, or a required key is missing.
        """
        model_type = str(config_json.get("model_type", ""))
        cfg = dict(config_json)
        if "text_config" in cfg and isinstance(cfg["text_config"], dict):
            # Gemma 3 4B+ nests its decoder under text_config; the top level's token ids win.
            outer = cfg
            cfg = {**cfg["text_config"]}
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                if outer.get(key) is not None:
                    cfg[key] = outer[key]
        arch = _supported(_HF_ALIASES.get(model_type, model_type), "config.json model_type")

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise InvalidInputError(f"config.json ({model_type}) lacks {key}")
            return cfg[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        layers = int(need("num_hidden_layers"))
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        if float(cfg.get("partial_rotary_factor") or 1.0) != 1.0:
            raise InvalidInputError(
                f"config.json ({model_type}): partial rotary embeddings are not supported"
            )
        gemma = arch in _GEMMA
        theta, local_theta, scaling = _hf_rope(cfg, arch)
        window = cfg.get("sliding_window")
        if arch in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            window = (
                None  # Qwen configs name a window they do not use unless use_sliding_window is set
            )
        if (
            arch == "mistral"
            and window is not None
            and int(window) >= int(cfg.get("max_position_embeddings", 0) or 0)
        ):
            window = None
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
        pre_scalar = cfg.get("query_pre_attn_scalar")
        return cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(need("intermediate_size")),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_interleaved=False,
            rope_scaling=scaling,
            context_length=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch in ("qwen3", "gemma3"),
            norm_plus_one=gemma,
            activation="gelu_tanh" if gemma else "silu",
            embedding_scale=math.sqrt(hidden) if gemma else 1.0,
            sliding_window=int(window) if window else None,
            sliding_pattern=_hf_sliding_pattern(cfg, arch, layers, window),
            attn_softcap=_float_or_none(cfg.get("attn_logit_softcapping")) if gemma else None,
            final_softcap=_float_or_none(cfg.get("final_logit_softcapping")) if gemma else None,
            query_scale=float(pre_scalar) ** -0.5
            if gemma and pre_scalar
            else 1.0 / math.sqrt(head_dim),
            bos_id=_int_or_none(cfg.get("bos_token_id")),
            eos_ids=eos_ids,
            pad_id=_int_or_none(cfg.get("pad_token_id")),
            rope_local_theta=local_theta,
        )


def _supported(name: str, what: str) -> str:
    if name not in SUPPORTED_ARCHITECTURES:
        raise InvalidInputError(
            f"{what} {name!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return name


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return float(value) if value else None


def _gguf_query_scale(arch: str, layers: int, hidden: int, heads: int, head_dim: int) -> float:
    # GGUF has no query_pre_attn_scalar: llama.cpp scales gemma 27B (46 / 62 layers) by
    # hidden / heads, every other model by head_dim, exactly as the checkpoints' scalars say.
    if (arch, layers) in (("gemma2", 46), ("gemma3", 62)):
        return 1.0 / math.sqrt(hidden / heads)
    return 1.0 / math.sqrt(head_dim)


def _sliding_pattern(arch: str, layers: int, window: Any, pattern: Any) -> tuple[bool, ...]:
    if not window:
        return ()
    if isinstance(pattern, list) and len(pattern) == layers:
        return tuple(bool(p) for p in pattern)
    if arch == "gemma2":
        return tuple(i % 2 == 0 for i in range(layers))  # even layers local, odd global
    if arch == "gemma3":
        period = int(pattern) if isinstance(pattern, int) and pattern > 0 else 6
        return tuple((i + 1) % period != 0 for i in range(layers))  # every period-th layer global
    return tuple(True for _ in range(layers))


def _hf_sliding_pattern(
    cfg: dict[str, Any], arch: str, layers: int, window: Any
) -> tuple[bool, ...]:
    if not window:
        return ()
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return tuple(t == "sliding_attention" for t in types)
    period = cfg.get("sliding_window_pattern")
    return _sliding_pattern(arch, layers, window, int(period) if period else None)


def _hf_rope(cfg: dict[str, Any], arch: str) -> tuple[float, float | None, dict[str, Any] | None]:
    """(theta, local theta, scaling) from ``rope_theta``/``rope_scaling`` or transformers 5's
    ``rope_parameters`` (flat, or per layer type for gemma3)."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        full = params.get("full_attention") or {}
        local = params.get("sliding_attention") or {}
    else:
        full, local = params, {}
    theta = float(full.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    local_theta: float | None = None
    if arch == "gemma3":
        local_theta = float(local.get("rope_theta") or cfg.get("rope_local_base_freq") or 10000.0)
    scaling = cfg.get("rope_scaling") or {k: v for k, v in full.items() if k != "rope_theta"}
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    return theta, local_theta, scaling
