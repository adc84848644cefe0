"""What ``ferry info`` and ``ferry convert`` say about a decoder: a GGUF file or a generative
artifact folder, summarized as one plain dict (architecture, parameters, quantization mix,
context, vocabulary, special tokens, chat template)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import ModelLoadError

__all__ = ["describe_decoder"]


def describe_decoder(source: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarize a ``.gguf`` file or a generative artifact folder (``ferry convert``'s output).

    Returns:
        A JSON-ready dict: ``path``, ``kind`` ("gguf" | "artifact"), ``architecture``,
        ``layers``, ``parameters``, ``quantization`` (weight count by storage type: GGUF types for
        a file; for a folder, how its graph stores the projections), ``precision`` (folders),
        ``context_length``, ``vocab_size``, ``special_tokens`` (bos/eos/pad by text),
        ``chat_template`` (its source, or None) and, for folders, ``files`` with their sizes.

    Raises:
        ModelLoadError: The file or folder cannot be read.
    """
    path = Path(source)
    if path.is_dir():
        return _artifact(path)
    return _gguf(path)


def _gguf(path: Path) -> dict[str, Any]:
    from ferry.formats import read_gguf

    gguf_file = read_gguf(path)
    meta = gguf_file.metadata
    arch = gguf_file.architecture
    tokens = meta.get("tokenizer.ggml.tokens")
    tokens = tokens if isinstance(tokens, list) else []

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return str(tokens[index]) if isinstance(index, int) and 0 <= index < len(tokens) else None

    template = meta.get("tokenizer.chat_template")
    return {
        "path": str(path),
        "kind": "gguf",
        "architecture": arch,
        "layers": meta.get(f"{arch}.block_count"),
        "parameters": int(
            sum(int(np.prod(t.shape, dtype=np.int64)) for t in gguf_file.tensors.values())
        ),
        "quantization": dict(Counter(t.ggml_type for t in gguf_file.tensors.values())),
        "context_length": meta.get(f"{arch}.context_length"),
        "vocab_size": len(tokens) or meta.get(f"{arch}.vocab_size"),
        "special_tokens": {"bos": token("bos"), "eos": token("eos"), "pad": token("padding")},
        "chat_template": template if isinstance(template, str) else None,
        "file_bytes": path.stat().st_size,
    }


def _artifact(folder: Path) -> dict[str, Any]:
    from ferry.generate._artifact import (
        GENERATION_CONFIG,
        TOKENIZER_CONFIG,
        read_generative_manifest,
    )

    manifest = read_generative_manifest(folder)
    if manifest is None:
        raise ModelLoadError(f"{folder}: no ferry.json with a generative section")
    tokenizer_config = _json(folder / TOKENIZER_CONFIG)
    generation = _json(folder / GENERATION_CONFIG)

    def special(name: str) -> str | None:
        value = tokenizer_config.get(f"{name}_token")
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    template = tokenizer_config.get("chat_template")
    return {
        "path": str(folder),
        "kind": "artifact",
        "architecture": manifest.get("architecture"),
        "layers": manifest.get("num_layers"),
        "parameters": manifest.get("parameters"),
        "quantization": manifest.get("weights") or {},
        "precision": manifest.get("precision"),
        "source": manifest.get("source"),
        "context_length": generation.get("max_length") or manifest.get("context_length"),
        "vocab_size": manifest.get("vocab_size"),
        "special_tokens": {"bos": special("bos"), "eos": special("eos"), "pad": special("pad")},
        "chat_template": template if isinstance(template, str) else None,
        "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()},
    }


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    return data if isinstance(data, dict) else {}
