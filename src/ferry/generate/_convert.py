"""A GGUF file, a Hugging Face checkpoint folder or an existing ONNX decoder folder (optimum,
ONNX Runtime GenAI) to a generative artifact folder: config and weights read and the decoder graph
built (an ONNX decoder taken as stored, its I/O renamed to ferry's), checked once, and written
with its tokenizer, chat template and generation defaults (``ferry convert model.gguf -o out/``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.errors import ConversionError, InvalidInputError, ModelLoadError

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.generate._config import DecoderConfig
    from ferry.generate._onnx_source import DecoderIO
    from ferry.generate._weights import DecoderWeights

__all__ = ["DECODER_PRECISIONS", "convert_decoder", "decoder_source_kind", "default_precision"]

#: Precisions ``convert_decoder`` builds (fp16/bf16: half weights, float32 compute and cache).
DECODER_PRECISIONS = ("int4", "int8", "fp32", "fp16", "bf16")
_GGUF_MAGIC = b"GGUF"
# The projections build_decoder multiplies (the rest, norms and the embedding, stay float).
_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}
# GGUF types of 5 bits and more map to int8, fewer to int4: the width nearest the file's.
_EIGHT_BIT = {"Q8_0", "Q8_1", "Q8_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K"}
# Tokens the built graph is checked on (any ids below the vocabulary size do).
_CHECK_IDS = (1, 2, 3, 5, 8, 13, 21, 34, 55)
_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights up to this size are handed to onnxruntime from memory (protobuf's limit is 2 GB).
_IN_MEMORY_LIMIT = 1_800_000_000


def decoder_source_kind(source: str | os.PathLike[str]) -> str | None:
    """ "gguf" for a GGUF file (its magic, or a ``.gguf`` name, so a corrupt one is reported as
    such); "onnx-genai" / "onnx-optimum" for an ONNX decoder folder (``onnx_decoder_kind``);
    "hf" for a folder whose ``config.json`` names a ``*ForCausalLM`` architecture (with
    safetensors, or with no model at all: refused then, saying so); else None."""
    from ferry.generate._onnx_source import onnx_decoder_kind

    path = Path(source)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf"
        try:
            with path.open("rb") as f:
                return "gguf" if f.read(4) == _GGUF_MAGIC else None
        except OSError:
            return None
    onnx_kind = onnx_decoder_kind(path)
    if onnx_kind is not None and not any(path.glob("*.safetensors")):
        return onnx_kind
    config = path / "config.json"
    if path.is_dir() and config.is_file():
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        archs = data.get("architectures") if isinstance(data, dict) else None
        if isinstance(archs, list) and any(
            isinstance(a, str) and a.endswith("ForCausalLM") for a in archs
        ):
            return "hf"
    return None


def default_precision(weights: DecoderWeights) -> str:
    """The precision that keeps a source's weights as they are: fp32 for float checkpoints; for a
    quantized GGUF the bit width of most of its projections (Q4_0/Q4_1/Q8_0 blocks then go into
    MatMulNBits as stored, with no second rounding)."""
    kinds = Counter(_storage_bits(weights[name].storage) for name in weights if _is_matrix(name))
    if not kinds or kinds.most_common(1)[0][0] == "fp32":
        return "fp32"
    return kinds.most_common(1)[0][0]


def convert_decoder(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    precision: str | None = None,
    flavour: str = "ort",
    accuracy_level: int | None = None,
    verify: bool = True,
) -> Path:
    """Build the generative artifact folder ``out_dir`` from a GGUF file or a Hugging Face folder.

    Args:
        source: A ``.gguf`` file; a folder with ``config.json`` (a ``*ForCausalLM``),
            ``*.safetensors`` and ``tokenizer.json`` (+ ``tokenizer_config.json``,
            ``generation_config.json``); or an ONNX decoder with past key/values: an optimum
            export (``model.onnx`` or ``decoder_model_merged.onnx``, ``config.json``) or an ONNX
            Runtime GenAI folder (``genai_config.json``), with ``tokenizer.json``. An ONNX
            decoder is taken as stored: ``precision``, ``flavour`` and ``accuracy_level`` are
            refused, and only its I/O names change (to the optimum ones ferry's loop feeds).
        out_dir: The folder to write (replaced whole, only once everything is built).
        precision: "int4", "int8" or "fp32" (dequantized). None: :func:`default_precision`, i.e.
            a Q4_1 GGUF stays int4 with its blocks as stored (the Q8_0 embedding, as output
            head, stays 8-bit): the weights llama.cpp multiplies, no second rounding, a float checkpoint stays fp32. K-quants and float weights asked
            for int4/int8 are rounded per block of 32; the error is in the report.
        flavour: "ort" (onnxruntime's contrib operators) or "standard" (plain ONNX).
        accuracy_level: MatMulNBits' accuracy_level for int4/int8 builds. None: 0, float
            activations times the stored blocks: exactly the GGUF's weights, so the int4 build
            follows the fp32 (dequantized) build (on the kit's SmolLM2: 378 of 442 greedy tokens
            before any divergence). 4 quantizes activations to int8 per block as llama.cpp's CPU
            dot products do (Q8_1 against Q4_1), faster, but further from the float model
            (219 of 442); the peers benchmark decides it against llama.cpp itself.
        verify: Run the built graph once before writing: a 9-token prompt must give finite
            logits of shape [1, 9, vocab], and the last token fed as one step on the first
            eight's key/value cache must give the same logits (cosine >= 0.999) -- a check that
            the graph runs and its cache path agrees with its prompt path, not a comparison
            with a reference framework (tests/real/test_generate_kit.py does that).

    Returns:
        The folder.

    Raises:
        ModelLoadError: The source is missing, corrupt or truncated; an ONNX graph that is not a
            decoder with past key/values (the message names the missing input or output).
        InvalidInputError: An unsupported architecture, precision or flavour; build options
            for an ONNX decoder; ``out_dir`` the source itself.
        ConversionError: The built graph fails its check (nothing is written).
    """
    from ferry.generate._artifact import write_decoder_artifact
    from ferry.generate._graph import FLAVOURS, build_decoder
    from ferry.generate._onnx_source import ONNX_KINDS

    path = Path(source)
    kind = decoder_source_kind(path)
    if kind is None:
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file or folder")
        raise InvalidInputError(
            f"{path} is neither a GGUF file, a Hugging Face folder whose config.json names a "
            "*ForCausalLM architecture, nor an ONNX decoder folder (optimum, ONNX Runtime GenAI)"
        )
    if Path(out_dir).exists() and Path(out_dir).resolve() == path.resolve():
        raise InvalidInputError(f"refusing to replace the source {path}; choose another output")
    if kind in ONNX_KINDS:
        return _convert_onnx(path, kind, out_dir, precision, flavour, accuracy_level, verify)
    if precision is not None and precision not in DECODER_PRECISIONS:
        raise InvalidInputError(
            f"precision {precision!r} is not one of {', '.join(DECODER_PRECISIONS)}"
        )
    if flavour not in FLAVOURS:
        raise InvalidInputError(f"flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
    config, weights, files = _from_gguf(path) if kind == "gguf" else _from_hf(path)
    chosen = precision or default_precision(weights)
    quantized = chosen in ("int4", "int8")
    level = (accuracy_level or 0) if quantized else 0
    model = build_decoder(config, weights, precision=chosen, flavour=flavour, accuracy_level=level)
    report: dict[str, Any] = {
        "parameters": parameter_count(weights),
        "source_types": dict(Counter(w.storage for w in weights.values())),
        "weights": weight_mix(weights, chosen),
        "flavour": flavour,
        "requantization": json.loads(model.metadata_props.get("ferry.requantization", "{}")),
        "source_kind": kind,
    }
    if quantized:
        report["accuracy_level"] = level
    if verify:
        report["verified"] = _check_runs(model, _io_of(config))
    return write_decoder_artifact(
        out_dir,
        model=model,
        config=config,
        tokenizer=files.tokenizer,
        template=files.template,
        generation_config=files.generation_config,
        report=report,
        source=str(path),
        precision=chosen,
    )


def parameter_count(weights: DecoderWeights) -> int:
    """Values in every weight (a tied output head counted once, with the embedding)."""
    return int(sum(int(np.prod(w.shape, dtype=np.int64)) for w in weights.values()))


def weight_mix(weights: DecoderWeights, precision: str) -> dict[str, int]:
    """How the graph stores the projections and the output head, counted: "int4 (Q4_1 as
    stored)", "int4 (rounded from Q6_K)", "fp32"..., as ``build_decoder`` decides."""
    mix: Counter[str] = Counter()
    names = [n for n in weights if _is_matrix(n)]
    names.append("lm_head" if "lm_head" in weights else "embed")
    for name in names:
        weight = weights[name]
        if precision in ("fp16", "bf16"):
            exact = weight.storage == {"fp16": "F16", "bf16": "BF16"}[precision]
            how = "as stored" if exact else f"rounded from {weight.storage}"
            mix[f"{precision} ({how})"] += 1
            continue
        if precision == "fp32" or weight.shape[-1] % 32:
            mix["fp32"] += 1
            continue
        blocks = weight.blocks() if weight.storage in ("Q4_0", "Q4_1", "Q8_0") else None
        if blocks is not None:
            mix[f"int{blocks.bits} ({weight.storage} as stored)"] += 1
        else:
            mix[f"{precision} (rounded from {weight.storage})"] += 1
    return dict(mix)


def _is_matrix(name: str) -> bool:
    return name.startswith("layers.") and name.rsplit(".", 1)[-1] in _MATRICES


def _storage_bits(storage: str) -> str:
    if storage.upper() in _FLOAT_TYPES:
        return "fp32"
    return "int8" if storage in _EIGHT_BIT else "int4"


def _from_gguf(path: Path) -> tuple[DecoderConfig, DecoderWeights, Any]:
    from ferry.formats import read_gguf
    from ferry.generate._artifact import decoder_files_from_gguf
    from ferry.generate._config import DecoderConfig
    from ferry.generate._weights import DecoderWeights

    gguf_file = read_gguf(path)
    config = DecoderConfig.from_gguf(gguf_file)
    weights = DecoderWeights.from_gguf(gguf_file, config)
    return config, weights, decoder_files_from_gguf(gguf_file.metadata, config)


def _from_hf(folder: Path) -> tuple[DecoderConfig, DecoderWeights, Any]:
    from ferry.formats import read_safetensors
    from ferry.generate._artifact import generation_config_for, load_decoder_files
    from ferry.generate._config import DecoderConfig
    from ferry.generate._weights import DecoderWeights

    try:
        config_json = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder / 'config.json'}: {e}") from None
    if not any(folder.glob("*.safetensors")) and not (folder / _SAFETENSORS_INDEX).is_file():
        raise ModelLoadError(
            f"{folder} holds no model: no *.safetensors (a Hugging Face checkpoint) and no "
            "model.onnx or decoder_model_merged.onnx (an optimum export)"
        )
    config = DecoderConfig.from_hf(config_json)
    weights = DecoderWeights.from_hf(read_safetensors(folder), config)
    files = load_decoder_files(folder)
    generation = generation_config_for(config)
    # The folder's own generation_config.json may stop on more ids (end of turn and of text).
    theirs = files.generation_config.get("eos_token_id")
    extra = [theirs] if isinstance(theirs, int) else list(theirs or [])
    generation["eos_token_id"] = list(
        dict.fromkeys([*generation["eos_token_id"], *(int(i) for i in extra)])
    )
    return config, weights, files._replace(generation_config=generation)


def _convert_onnx(
    path: Path,
    kind: str,
    out_dir: str | os.PathLike[str],
    precision: str | None,
    flavour: str,
    accuracy_level: int | None,
    verify: bool,
) -> Path:
    """``convert_decoder`` for an optimum or GenAI folder: the graph as stored, renamed,
    checked, written."""
    from ferry.generate._artifact import write_decoder_artifact
    from ferry.generate._onnx_source import read_onnx_decoder, refuse_options

    refuse_options(path, precision=precision, flavour=flavour, accuracy_level=accuracy_level)
    decoder = read_onnx_decoder(path, kind)
    report = dict(decoder.report)
    if verify:
        # A graph exported by others runs its own fp16/int8 kernels, whose prompt and step paths
        # may round differently; a wrong cache wiring (keys fed as values) is far below this.
        report["verified"] = _check_runs(
            decoder.model,
            decoder.io,
            stored=(decoder.model_file, decoder.source_io),
            min_cosine=0.99,
        )
    return write_decoder_artifact(
        out_dir,
        model=decoder.model,
        config=decoder.config,
        tokenizer=decoder.files.tokenizer,
        template=decoder.files.template,
        generation_config=decoder.files.generation_config,
        report=report,
        source=str(path),
        precision=decoder.precision,
    )


def _io_of(config: DecoderConfig) -> DecoderIO:
    """The I/O of a graph ``build_decoder`` made (the optimum names)."""
    from ferry.generate._onnx_source import DecoderIO

    return DecoderIO(
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
    )


def _check_runs(
    model: ir.Model,
    io: DecoderIO,
    *,
    stored: tuple[Path, DecoderIO] | None = None,
    min_cosine: float = 0.999,
) -> str:
    """Run the graph on a short prompt, then its last token as one cached step (see
    :func:`convert_decoder`'s ``verify``); returns what was checked.

    Args:
        model: the graph about to be written, I/O as ``io`` names it.
        io: its I/O.
        stored: the file the graph was read from and its I/O there: checked instead when the
            graph is too big to hand onnxruntime from memory (protobuf's 2 GB).
        min_cosine: the least agreement of the cached step with the prompt pass.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return "skipped: onnxruntime is not installed"
    import onnx_ir as ir

    size = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    target: str | bytes
    where = ""
    if size <= _IN_MEMORY_LIMIT:
        # Weights a source folder holds as external data come into memory: written from there.
        ir.external_data.load_to_model(model)
        target = ir.serde.serialize_model(model).SerializeToString()
    elif stored is not None:
        target, io = str(stored[0]), stored[1]
        where = f" (as stored in {stored[0].name})"
    else:
        return "skipped: the model is over protobuf's 2 GB in memory"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(target, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types are not importable stably
        raise ConversionError(f"the decoder does not load in onnxruntime: {e}") from e
    names = [o.name for o in session.get_outputs()]
    ids = np.array([[i % io.vocab_size for i in _CHECK_IDS]], dtype=np.int64)
    n = ids.shape[1]
    empty = np.zeros((1, io.num_kv_heads, 0, io.head_dim), np.dtype(io.past_dtype))

    def run(
        tokens: np.ndarray, start: int, past: list[np.ndarray] | None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        feeds: dict[str, np.ndarray] = {
            io.input_ids: tokens,
            io.attention_mask: np.ones((1, start + tokens.shape[1]), np.int64),
        }
        if io.position_ids:
            positions = np.arange(start, start + tokens.shape[1], dtype=np.int64)[None]
            feeds[io.position_ids] = positions
        if io.use_cache_branch:
            feeds["use_cache_branch"] = np.array([start > 0])
        pasts = io.pasts()
        feeds.update(zip(pasts, past or [empty] * len(pasts), strict=True))
        try:
            outputs = dict(zip(names, session.run(None, feeds), strict=True))
        except Exception as e:  # onnxruntime's own exception types are not importable stably
            raise ConversionError(f"the decoder fails to run in onnxruntime: {e}") from e
        logits = np.asarray(outputs[io.logits], dtype=np.float32)
        return logits, [outputs[p] for p in io.presents()]

    full = run(ids, 0, None)[0]
    if full.shape != (1, n, io.vocab_size) or not np.isfinite(full).all():
        raise ConversionError(
            f"the decoder gives logits of shape {list(full.shape)} "
            f"(expected [1, {n}, {io.vocab_size}]) or non-finite values"
        )
    prefix = run(ids[:, : n - 1], 0, None)[1]
    step = run(ids[:, n - 1 :], n - 1, prefix)[0][0, -1]
    last = full[0, -1]
    cosine = float(step @ last / (np.linalg.norm(step) * np.linalg.norm(last) or 1.0))
    if not np.isfinite(step).all() or cosine < min_cosine:
        raise ConversionError(
            f"the decoder's cached step disagrees with its prompt pass (cosine {cosine:.5f})"
        )
    return f"runs{where}: finite logits [1, {n}, {io.vocab_size}]; cached step cosine {cosine:.6f}"
