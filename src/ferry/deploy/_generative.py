"""What the deploy targets (Ray Serve, KServe) read of a generative artifact before it is served:
its context length and KV cache size per token from its manifest, without loading the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ferry.errors import InvalidInputError

__all__ = ["check_model_len", "context_length", "generative_section", "kv_bytes_per_token"]

#: Bytes of a KV cache element when the manifest says no precision that halves it.
_FP32_BYTES = 4
_HALF_PRECISIONS = ("fp16", "bf16")


def generative_section(folder: Path) -> dict[str, Any] | None:
    """The ``generative`` section of ``folder``'s ``ferry.json``; None when the folder is not a
    generative artifact (or its model carries the section in its metadata only)."""
    import json

    from ferry.generate import is_generative_artifact

    if not is_generative_artifact(folder):
        return None
    try:
        section = json.loads((folder / "ferry.json").read_text(encoding="utf-8"))["generative"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return section if isinstance(section, dict) else {}


def context_length(section: dict[str, Any]) -> int | None:
    """The model's context in tokens, as its manifest says (None: not said)."""
    value = section.get("context_length")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def kv_bytes_per_token(section: dict[str, Any]) -> int | None:
    """A token's KV cache bytes across layers (keys and values), None when the manifest lacks
    the sizes. fp32 elements unless the artifact is fp16/bf16: the cache is kept in the
    activations' type, which int4/int8 weights do not change."""
    try:
        layers, heads = int(section["num_layers"]), int(section["num_kv_heads"])
        dim = int(
            section.get("head_dim") or int(section["hidden_size"]) // int(section["num_heads"])
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    size = 2 if section.get("precision") in _HALF_PRECISIONS else _FP32_BYTES
    return 2 * layers * heads * dim * size


def check_model_len(name: str, max_model_len: int | None, context: int | None) -> None:
    """Refuse a ``max_model_len`` over the model's context before anything deploys (rather than
    each replica or pod failing to load).

    Raises:
        InvalidInputError: naming the model, its context and the flag's largest value.
    """
    if max_model_len is not None and context is not None and max_model_len > context:
        raise InvalidInputError(
            f"max_model_len={max_model_len} is over model {name!r}'s context ({context} "
            f"tokens): give --max-model-len {context} or less"
        )
