"""The generative artifact folder: the decoder graph and the files that make it a chat model.

    model.onnx (+ model.onnx.data)  the decoder graph, weights as external data
    tokenizer.json                  the Hugging Face ``tokenizers`` tokenizer
    tokenizer_config.json           chat_template, bos/eos/pad tokens, add_bos_token
    generation_config.json          bos_token_id, eos_token_id (a list: end of text and of turn),
                                    pad_token_id, max_length (the context), greedy defaults
    ferry.json                      {"generative": {the DecoderConfig, source, precision, report}}

The file names and fields are Hugging Face's, so an optimum-exported decoder folder reads the
same way (its template may instead be in ``chat_template.jinja``). The folder is staged beside its destination and published with renames
(``ferry._folders``): a failed conversion leaves nothing half written where the user looks.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ferry._folders import publish_dir, staging_dir
from ferry.errors import ModelLoadError
from ferry.generate._template import ChatTemplate
from ferry.generate._tokenizer import build_tokenizer, special_token
from ferry.graph import atomic_path, save_model

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.generate._config import DecoderConfig

__all__ = [
    "CHAT_TEMPLATE_FILE",
    "GENERATION_CONFIG",
    "MANIFEST",
    "MODEL_FILE",
    "TOKENIZER_CONFIG",
    "TOKENIZER_FILE",
    "DecoderFiles",
    "decoder_files_from_gguf",
    "generation_config_for",
    "load_decoder_files",
    "read_generative_manifest",
    "tokenizer_config_for",
    "write_decoder_artifact",
]

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
MANIFEST = "ferry.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class DecoderFiles(NamedTuple):
    """What an artifact folder holds beside its graph (``load_decoder_files``)."""

    tokenizer: Any
    """A ``tokenizers.Tokenizer``."""
    template: ChatTemplate | None
    """The chat template, or None when the folder has none."""
    generation_config: dict[str, Any]
    """``generation_config.json``'s content ({} when a foreign folder has none)."""


def decoder_files_from_gguf(
    metadata: Mapping[str, Any], config: DecoderConfig | Mapping[str, Any]
) -> DecoderFiles:
    """The tokenizer, chat template and generation config a GGUF file's metadata describes.

    Args:
        metadata: ``read_gguf(path).metadata``.
        config: the decoder's config (its special ids and context).

    Raises:
        InvalidInputError: the vocabulary cannot be built or the template does not parse.
    """
    source = metadata.get("tokenizer.chat_template")
    template = None
    if isinstance(source, str) and source:
        template = ChatTemplate(
            source,
            bos_token=special_token(metadata, "bos"),
            eos_token=special_token(metadata, "eos"),
            pad_token=special_token(metadata, "padding"),
            unk_token=special_token(metadata, "unknown"),
        )
    return DecoderFiles(build_tokenizer(metadata), template, generation_config_for(config))


def generation_config_for(config: DecoderConfig | Mapping[str, Any]) -> dict[str, Any]:
    """``generation_config.json`` for a decoder: its special ids, every id that ends a turn as
    ``eos_token_id``, its context as ``max_length``, and greedy decoding."""
    data = _config_dict(config)
    out: dict[str, Any] = {}
    if data.get("bos_id") is not None:
        out["bos_token_id"] = int(data["bos_id"])
    out["eos_token_id"] = [int(i) for i in data.get("eos_ids") or ()]
    if data.get("pad_id") is not None:
        out["pad_token_id"] = int(data["pad_id"])
    if data.get("context_length"):
        out["max_length"] = int(data["context_length"])
    out["do_sample"] = False
    return out


def tokenizer_config_for(
    tokenizer: Any,
    template: ChatTemplate | None,
    generation_config: Mapping[str, Any],
) -> dict[str, Any]:
    """``tokenizer_config.json``: the chat template, the special tokens by text, and whether the
    tokenizer puts BOS before a plain prompt (what its post-processor does)."""

    def text(token_id: Any) -> str | None:
        return None if token_id is None else tokenizer.id_to_token(int(token_id))

    eos = generation_config.get("eos_token_id")
    first_eos = eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else None
    bos_id = generation_config.get("bos_token_id")
    added = tokenizer.encode("", add_special_tokens=True).ids
    out: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": (template.bos_token if template else None) or text(bos_id),
        "eos_token": (template.eos_token if template else None) or text(first_eos),
        "pad_token": text(generation_config.get("pad_token_id")),
        "add_bos_token": bool(added) and bos_id is not None and added[0] == bos_id,
        "model_max_length": generation_config.get("max_length"),
    }
    if template is not None:
        out["chat_template"] = template.source
    return out


def write_decoder_artifact(
    out_dir: str | os.PathLike[str],
    *,
    model: ir.Model,
    config: DecoderConfig | Mapping[str, Any],
    tokenizer: Any,
    template: ChatTemplate | None,
    generation_config: Mapping[str, Any],
    report: Mapping[str, Any] | None = None,
    source: str | None = None,
    precision: str | None = None,
) -> Path:
    """Write the artifact folder ``out_dir`` whole, replacing what was there only at the end.

    Args:
        out_dir: the folder to write.
        model: the decoder graph (its weights go to ``model.onnx.data``).
        config: its ``DecoderConfig`` (or the dict ``to_dict`` gives).
        tokenizer: the ``tokenizers.Tokenizer``.
        template: the chat template, or None for a model without one.
        generation_config: ``generation_config.json``'s content (``generation_config_for``).
        report: more for ferry.json's "generative" section (per-tensor requantization error...).
        source: the file or folder the model was built from.
        precision: the weights' precision ("fp32", "int4"...).

    Returns:
        The folder.

    Raises:
        InvalidInputError: nothing can be written beside ``out_dir``.
    """
    out = Path(out_dir)
    staging = staging_dir(out)
    try:
        save_model(model, staging / MODEL_FILE, external_data=True)
        with atomic_path(staging / TOKENIZER_FILE) as tmp:
            tokenizer.save(str(tmp))
        generative: dict[str, Any] = dict(_config_dict(config))
        if source is not None:
            generative["source"] = str(source)
        if precision is not None:
            generative["precision"] = precision
        generative.update(report or {})
        files = {
            TOKENIZER_CONFIG: tokenizer_config_for(tokenizer, template, generation_config),
            GENERATION_CONFIG: dict(generation_config),
            MANIFEST: {"generative": generative},
        }
        for name, content in files.items():
            with atomic_path(staging / name) as tmp:
                tmp.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", "utf-8")
        publish_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def read_generative_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """ferry.json's "generative" section, or None when the folder has none (a foreign folder).

    Raises:
        ModelLoadError: ferry.json exists but is not a JSON object.
    """
    data = _read_json(Path(folder) / MANIFEST, required=False)
    if data is None:
        return None
    section = data.get("generative")
    if section is not None and not isinstance(section, dict):
        raise ModelLoadError(f"{Path(folder) / MANIFEST}: its 'generative' is not an object")
    return section


def load_decoder_files(folder: str | os.PathLike[str]) -> DecoderFiles:
    """The tokenizer, chat template and generation config of an artifact folder.

    A folder ferry wrote (ferry.json has a "generative" section) must hold all three files; a
    foreign one (an optimum export) needs only ``tokenizer.json``.

    Raises:
        ModelLoadError: the folder is missing, or a file it needs is missing or corrupt; the
            message names the file.
    """
    base = Path(folder)
    if not base.is_dir():
        raise ModelLoadError(f"{base} is not an artifact folder")
    ours = read_generative_manifest(base) is not None
    tokenizer = _read_tokenizer(base / TOKENIZER_FILE)
    tokenizer_config = _read_json(base / TOKENIZER_CONFIG, required=ours) or {}
    generation_config = _read_json(base / GENERATION_CONFIG, required=ours) or {}
    if "chat_template" not in tokenizer_config and (base / CHAT_TEMPLATE_FILE).is_file():
        # Newer Hugging Face folders keep the template in a file of its own.
        try:
            jinja = (base / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"cannot read {base / CHAT_TEMPLATE_FILE}: {e}") from e
        tokenizer_config = {**tokenizer_config, "chat_template": jinja}
    template = _template(base / TOKENIZER_CONFIG, tokenizer_config)
    return DecoderFiles(tokenizer, template, generation_config)


def _config_dict(config: DecoderConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    return config.to_dict()


def _read_json(path: Path, *, required: bool) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise ModelLoadError(f"the artifact folder has no {path.name} ({path})") from None
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def _read_tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    if not path.is_file():
        raise ModelLoadError(f"the artifact folder has no {path.name} ({path})")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for any bad file
        raise ModelLoadError(f"{path} is not a tokenizer the tokenizers library reads: {e}") from e


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template(path: Path, tokenizer_config: Mapping[str, Any]) -> ChatTemplate | None:
    source = tokenizer_config.get("chat_template")
    if isinstance(source, list):
        # Several named templates (Hugging Face's form): the default one is the chat template.
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None:
        return None
    if not isinstance(source, str):
        raise ModelLoadError(f"{path}: chat_template is not a string")
    specials = {
        name: _token_text(tokenizer_config.get(name))
        for name in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    try:
        return ChatTemplate(
            source,
            bos_token=specials.pop("bos_token"),
            eos_token=specials.pop("eos_token"),
            **specials,
        )
    except Exception as e:
        raise ModelLoadError(f"{path}: {e}") from e
