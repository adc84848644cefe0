"""An existing ONNX decoder with past key/values as a ``ferry convert`` source.

Two folder layouts are read:

- **optimum** (``optimum-cli export onnx --task text-generation-with-past``): ``model.onnx`` or
  ``decoder_model_merged.onnx`` (+ external data), the Hugging Face ``config.json``,
  ``generation_config.json``, ``tokenizer.json`` and ``tokenizer_config.json``. Inputs
  ``input_ids``, ``attention_mask``, ``position_ids`` (optional), ``past_key_values.{i}.key|value``
  (a merged model also ``use_cache_branch``); outputs ``logits``, ``present.{i}.key|value``.
- **ONNX Runtime GenAI** (its model builder): the graph, ``genai_config.json`` naming the graph's
  inputs and outputs by template (``"past_key_names": "past_key_values.%d.key"``...) with the
  sizes, special ids and context, and the tokenizer files.

The graph is taken as stored (no rebuild, no requantization): only its I/O is renamed to the
optimum names ferry's token loop feeds, a merged model's ``use_cache_branch`` is computed inside
the graph from the past's length, and the metadata the loop reads (``ferry.generative``,
``ferry.decoder_config``) is added.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ferry.errors import InvalidInputError, ModelLoadError

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.generate._artifact import DecoderFiles

__all__ = [
    "GENAI_CONFIG",
    "ONNX_KINDS",
    "DecoderIO",
    "OnnxDecoder",
    "onnx_decoder_kind",
    "read_onnx_decoder",
    "refuse_options",
]

#: ``decoder_source_kind``'s answers for the two ONNX layouts.
ONNX_KINDS = ("onnx-optimum", "onnx-genai")
GENAI_CONFIG = "genai_config.json"
_MODEL = "model.onnx"
_MERGED = "decoder_model_merged.onnx"
_SPLIT = ("decoder_model.onnx", "decoder_with_past_model.onnx")
_USE_CACHE = "use_cache_branch"
# The optimum names, which ferry's own graphs carry and its token loop feeds.
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_GPT2_NAMES = {
    "num_attention_heads": "n_head",
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
}
# config.json spellings of the context, in the order transformers' configs use them.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class DecoderIO:
    """A decoder graph's I/O: names by role (``%d`` is the layer) and what a step feeds.

    The defaults are the optimum names (ferry's own graphs'); a GenAI graph's come from its
    ``genai_config.json``. ``position_ids`` None: the graph has no such input (it derives
    positions from the attention mask).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    past_dtype: str = "float32"
    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    position_ids: str | None = "position_ids"
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"
    logits: str = "logits"
    use_cache_branch: bool = False
    """The graph takes a merged optimum model's ``use_cache_branch`` (fed: is there a past?)."""

    def pasts(self) -> list[str]:
        """The past inputs, layer by layer, key before value."""
        return [t % i for i in range(self.num_layers) for t in (self.past_key, self.past_value)]

    def presents(self) -> list[str]:
        """The present outputs, in the order of :meth:`pasts`."""
        return [
            t % i for i in range(self.num_layers) for t in (self.present_key, self.present_value)
        ]


class OnnxDecoder(NamedTuple):
    """What :func:`read_onnx_decoder` gives ``convert_decoder``."""

    model: ir.Model
    """The graph with the optimum I/O names and ferry's decoder metadata."""
    config: dict[str, Any]
    """The decoder config as far as the folder and the graph tell (DecoderConfig's keys)."""
    files: DecoderFiles
    """The tokenizer, chat template and generation config."""
    io: DecoderIO
    """The I/O of ``model`` (the optimum names)."""
    model_file: Path
    """The graph's file in the source folder."""
    source_io: DecoderIO
    """The I/O of the graph as stored in ``model_file`` (checked there when too big to check
    in memory)."""
    report: dict[str, Any]
    """For ferry.json: the layout, the file, the renames, the weights as stored."""
    precision: str
    """The precision most of the weights' values are stored in ("int4", "fp16", "fp32")."""


def onnx_decoder_kind(folder: Path) -> str | None:
    """ "onnx-genai" for a folder with ``genai_config.json``; "onnx-optimum" for one with an
    optimum decoder file (``decoder_model_merged.onnx``, or the split pair, refused later with
    what to do) or with ``model.onnx`` beside a ``config.json`` naming a causal LM; else None.

    A plain ``model.onnx`` folder (an image classifier, a ferry artifact) is left to the ONNX
    converter."""
    if not folder.is_dir():
        return None
    if (folder / GENAI_CONFIG).is_file():
        return "onnx-genai"
    if any((folder / name).is_file() for name in (_MERGED, *_SPLIT)):
        return "onnx-optimum"
    if (folder / _MODEL).is_file() and _is_causal_lm(_json(folder / "config.json", "") or {}):
        return "onnx-optimum"
    return None


def read_onnx_decoder(folder: Path, kind: str) -> OnnxDecoder:
    """Read an optimum or GenAI decoder folder (``kind`` from :func:`onnx_decoder_kind`).

    Raises:
        ModelLoadError: no graph, a split optimum pair, a graph that is not a decoder with past
            key/values (the message names the missing input or output), no tokenizer, sizes the
            folder and the graph disagree on or do not give.
    """
    from ferry.generate._artifact import TOKENIZER_FILE
    from ferry.generate._loop import CONFIG_KEY, GENERATIVE_KEY
    from ferry.graph import load_model

    layout = "genai" if kind == "onnx-genai" else "optimum"
    if layout == "genai":
        genai = _json(folder / GENAI_CONFIG, GENAI_CONFIG) or {}
        model_file, settings, names = _genai_settings(folder, genai)
    else:
        model_file = _optimum_model_file(folder)
        settings, names = _optimum_settings(folder), {}
    if not (folder / TOKENIZER_FILE).is_file():
        raise ModelLoadError(
            f"{folder} has no {TOKENIZER_FILE}: ferry needs the decoder's tokenizer beside it "
            "(the tokenizers library's file, as optimum and the GenAI model builder write it)"
        )
    model = load_model(model_file)
    # A graph ferry wrote carries its config: the sizes come from there before any guess.
    for key, value in _json_text(model.metadata_props.get(CONFIG_KEY)).items():
        settings.setdefault(key, value)
    source_io = _graph_io(model, names, settings, model_file.name)
    renames = _renames(source_io)
    config = _decoder_config(settings, source_io)
    files = _files(folder, config)
    _rename_io(model, renames)
    _compute_use_cache_branch(model)
    model.metadata_props[GENERATIVE_KEY] = "decoder"
    model.metadata_props[CONFIG_KEY] = json.dumps(config)
    io = replace(
        DecoderIO(
            num_layers=source_io.num_layers,
            num_kv_heads=source_io.num_kv_heads,
            head_dim=source_io.head_dim,
            vocab_size=source_io.vocab_size,
            past_dtype=source_io.past_dtype,
        ),
        position_ids="position_ids" if source_io.position_ids else None,
    )
    weights, precision = _weights_as_stored(model)
    report: dict[str, Any] = {
        "source_kind": kind,
        "layout": layout,
        "model_file": model_file.name,
        "parameters": _parameters(model),
        "weights": weights,
        # As ferry's own builds say it: "ort" when the graph needs onnxruntime's contrib ops.
        "flavour": "ort" if _uses_contrib_ops(model) else "standard",
    }
    if renames:
        report["renamed"] = renames
    return OnnxDecoder(model, config, files, io, model_file, source_io, report, precision)


def _is_causal_lm(config: dict[str, Any]) -> bool:
    archs = config.get("architectures")
    return isinstance(archs, list) and any(
        isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs
    )


def _optimum_model_file(folder: Path) -> Path:
    for name in (_MERGED, _MODEL):
        if (folder / name).is_file():
            return folder / name
    split = [name for name in _SPLIT if (folder / name).is_file()]
    raise ModelLoadError(
        f"{folder} holds {' and '.join(split)} without a merged model: ferry runs one graph for "
        "the prompt and each token; export with `optimum-cli export onnx --task "
        "text-generation-with-past` (model.onnx) or keep the merged decoder_model_merged.onnx"
    )


def _optimum_settings(folder: Path) -> dict[str, Any]:
    """The decoder config a Hugging Face config.json gives (DecoderConfig's key names)."""
    hf = _json(folder / "config.json", "config.json") or {}
    # Multimodal configs keep the language model's sizes in text_config.
    cfg = {**hf, **_section(hf, "text_config")}
    # GPT-2's config spells the sizes its own way.
    for ours, theirs in _GPT2_NAMES.items():
        cfg.setdefault(ours, cfg.get(theirs))
    heads = _int(cfg.get("num_attention_heads"))
    hidden = _int(cfg.get("hidden_size"))
    out: dict[str, Any] = {
        "architecture": cfg.get("model_type") or _first(hf.get("architectures")),
        "vocab_size": _int(cfg.get("vocab_size")),
        "hidden_size": hidden,
        "num_layers": _int(cfg.get("num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": _int(cfg.get("num_key_value_heads")),
        "head_dim": _int(cfg.get("head_dim")),
        "context_length": next((_int(cfg[k]) for k in _CONTEXT_KEYS if _int(cfg.get(k))), None),
        "bos_id": _int(cfg.get("bos_token_id")),
        "eos_ids": _ids(cfg.get("eos_token_id")),
        "pad_id": _int(cfg.get("pad_token_id")),
    }
    return {k: v for k, v in out.items() if v not in (None, [])}


def _genai_settings(
    folder: Path, genai: dict[str, Any]
) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """The graph file, the decoder config and the I/O name templates genai_config.json gives."""
    model = _section(genai, "model")
    decoder = _section(model, "decoder")
    if not decoder:
        raise ModelLoadError(f"{folder / GENAI_CONFIG} has no model.decoder section")
    if "pipeline" in decoder:
        raise ModelLoadError(
            f"{folder / GENAI_CONFIG} describes a pipeline of several graphs; ferry takes one "
            "decoder graph with past key/values"
        )
    filename = decoder.get("filename") or _MODEL
    model_file = folder / str(filename)
    if not model_file.is_file():
        raise ModelLoadError(f"{folder} has no {filename} (the decoder {GENAI_CONFIG} names)")
    names: dict[str, str] = {}
    for section, keys in (
        ("inputs", ("input_ids", "attention_mask", "position_ids")),
        ("outputs", ("logits",)),
    ):
        given = _section(decoder, section)
        names.update({k: str(given[k]) for k in keys if isinstance(given.get(k), str)})
        for role in ("past_key", "past_value", "present_key", "present_value"):
            if isinstance(given.get(f"{role}_names"), str):
                names[role] = given[f"{role}_names"]
    out: dict[str, Any] = {
        "architecture": model.get("type"),
        "vocab_size": _int(model.get("vocab_size")),
        "hidden_size": _int(decoder.get("hidden_size")),
        "num_layers": _int(decoder.get("num_hidden_layers")),
        "num_heads": _int(decoder.get("num_attention_heads")),
        "num_kv_heads": _int(decoder.get("num_key_value_heads")),
        "head_dim": _int(decoder.get("head_size")),
        "context_length": _int(model.get("context_length")),
        "bos_id": _int(model.get("bos_token_id")),
        "eos_ids": _ids(model.get("eos_token_id")),
        "pad_id": _int(model.get("pad_token_id")),
    }
    return model_file, {k: v for k, v in out.items() if v not in (None, [])}, names


def _graph_io(
    model: ir.Model, names: dict[str, str], settings: dict[str, Any], file: str
) -> DecoderIO:
    """The graph's I/O checked against the names the folder gives (or optimum's)."""
    inputs = {v.name: v for v in model.graph.inputs}
    outputs = {v.name: v for v in model.graph.outputs}
    base = DecoderIO(num_layers=0, num_kv_heads=0, head_dim=0, vocab_size=0)
    role = {k: names.get(k, getattr(base, k)) for k in ("input_ids", "attention_mask", "logits")}
    templates = {
        k: names.get(k, getattr(base, k))
        for k in ("past_key", "past_value", "present_key", "present_value")
    }
    what = f"not a decoder with past key/values ({file})"
    for key in ("input_ids", "attention_mask"):
        if role[key] not in inputs:
            raise ModelLoadError(f"{what}: no input {role[key]}")
    if role["logits"] not in outputs:
        raise ModelLoadError(f"{what}: no output {role['logits']}")
    layers = 0
    while templates["past_key"] % layers in inputs:
        layers += 1
    if not layers:
        raise ModelLoadError(f"{what}: no input {templates['past_key'] % 0}")
    for i in range(layers):
        for kind in ("past_value", "present_key", "present_value"):
            name = templates[kind] % i
            if name not in (outputs if kind.startswith("present") else inputs):
                side = "output" if kind.startswith("present") else "input"
                raise ModelLoadError(f"{what}: no {side} {name} (layer {i} of {layers})")
    positions = names.get("position_ids", "position_ids")
    position_ids = positions if positions in inputs else None
    known = {role["input_ids"], role["attention_mask"], position_ids, _USE_CACHE}
    known |= {
        t % i for i in range(layers) for t in (templates["past_key"], templates["past_value"])
    }
    # An input with a default (an initializer it overrides, as ferry's logits_to_keep) need
    # not be fed.
    extra = [n for n in inputs if n and n not in known and n not in model.graph.initializers]
    if extra:
        raise ModelLoadError(
            f"the decoder {file} has inputs ferry's token loop does not feed: {', '.join(extra)}"
        )
    for key in (role["input_ids"], role["attention_mask"], position_ids or ""):
        dtype = inputs[key].dtype if key else None
        if dtype is not None and dtype.name != "INT64":
            raise ModelLoadError(f"the decoder {file}'s input {key} is {dtype.name}, not INT64")
    past = inputs[templates["past_key"] % 0]
    dims = list(past.shape.dims) if past.shape is not None else []
    heads = _static(dims, 1, len(dims) == 4)
    dim = _static(dims, 3, len(dims) == 4)
    logits = outputs[role["logits"]]
    vocab = _static(list(logits.shape.dims) if logits.shape is not None else [], -1, True)
    checked = {
        "num_layers": (layers, "past inputs"),
        "num_kv_heads": (heads, f"{past.name}'s dimension 1"),
        "head_dim": (dim, f"{past.name}'s dimension 3"),
        "vocab_size": (vocab, f"{logits.name}'s last dimension"),
    }
    q_heads, hidden = _int(settings.get("num_heads")), _int(settings.get("hidden_size"))
    # What a config that does not say implies (multi-head attention, hidden split evenly).
    implied = {
        "num_kv_heads": q_heads,
        "head_dim": hidden // q_heads if hidden and q_heads else None,
    }
    sizes: dict[str, int] = {}
    for key, (graph_value, where) in checked.items():
        said = settings.get(key)
        if graph_value and said and int(said) != graph_value and key != "vocab_size":
            raise ModelLoadError(
                f"the folder's config says {key} {said}, the graph ({file}) has {graph_value} "
                f"({where})"
            )
        value = graph_value or _int(said) or implied.get(key)
        if not value:
            raise ModelLoadError(
                f"the decoder {file} does not say its {key}: {where} is not fixed and the "
                "folder's config does not give it"
            )
        sizes[key] = value
    dtype_name = past.dtype.name if past.dtype is not None else "FLOAT"
    if dtype_name == "BFLOAT16":
        raise ModelLoadError(
            f"the decoder {file} keeps its past key/values in bfloat16, which onnxruntime's "
            "Python API cannot feed; export it in float16 or float32"
        )
    return DecoderIO(
        num_layers=sizes["num_layers"],
        num_kv_heads=sizes["num_kv_heads"],
        head_dim=sizes["head_dim"],
        vocab_size=sizes["vocab_size"],
        past_dtype="float16" if dtype_name == "FLOAT16" else "float32",
        input_ids=role["input_ids"],
        attention_mask=role["attention_mask"],
        position_ids=position_ids,
        logits=role["logits"],
        use_cache_branch=_USE_CACHE in inputs,
        past_key=templates["past_key"],
        past_value=templates["past_value"],
        present_key=templates["present_key"],
        present_value=templates["present_value"],
    )


def _renames(io: DecoderIO) -> dict[str, str]:
    """The graph's I/O names that differ from optimum's, old -> new."""
    target = DecoderIO(num_layers=io.num_layers, num_kv_heads=0, head_dim=0, vocab_size=0)
    pairs = [
        (io.input_ids, target.input_ids),
        (io.attention_mask, target.attention_mask),
        (io.logits, target.logits),
        *zip(io.pasts(), target.pasts(), strict=True),
        *zip(io.presents(), target.presents(), strict=True),
    ]
    if io.position_ids:
        pairs.append((io.position_ids, "position_ids"))
    return {old: new for old, new in pairs if old != new}


def _rename_io(model: ir.Model, renames: dict[str, str]) -> None:
    """Rename graph inputs and outputs (every use follows: values are shared objects); an
    inner value already holding a new name steps aside first."""
    if not renames:
        return
    import onnx_ir as ir

    io = [*model.graph.inputs, *model.graph.outputs]
    taken = set(renames.values())
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            if value.name in taken and value not in io:
                value.name = f"{value.name}.inner"
    for value in model.graph.initializers.values():
        if value.name in taken and value not in io:
            raise ModelLoadError(f"the graph has a weight named {value.name}, an I/O name")
    for value in io:
        if value.name in renames:
            value.name = renames[value.name]


def _compute_use_cache_branch(model: ir.Model) -> None:
    """A merged optimum decoder picks its branch on ``use_cache_branch``: true once there is a
    past. The token loop does not feed it, so the graph computes it from the past's length
    (Shape, Gather, Greater: ops of every opset an export uses)."""
    import onnx_ir as ir

    inputs = {v.name: v for v in model.graph.inputs}
    flag = inputs.get(_USE_CACHE)
    if flag is None:
        return
    constants = {
        "ferry.use_cache.axis": np.array([2], np.int64),
        "ferry.use_cache.zero": np.array([0], np.int64),
    }
    axis, zero = (ir.Value(name=k, const_value=ir.tensor(v)) for k, v in constants.items())
    for value in (axis, zero):
        model.graph.register_initializer(value)
    model.graph.inputs.remove(flag)
    # Named: a graph's unnamed values get names on saving that could clash with these.
    shape = ir.node(
        "Shape", [inputs["past_key_values.0.key"]], outputs=[ir.Value(name="ferry.use_cache.shape")]
    )
    length = ir.node(
        "Gather",
        [shape.outputs[0], axis],
        attributes={"axis": 0},
        outputs=[ir.Value(name="ferry.use_cache.length")],
    )
    greater = ir.node("Greater", [length.outputs[0], zero], outputs=[flag])
    model.graph.insert_before(model.graph.node(0), [shape, length, greater])


def _decoder_config(settings: dict[str, Any], io: DecoderIO) -> dict[str, Any]:
    """The config the artifact carries: the graph's sizes over the folder's where they differ
    (a padded vocabulary), the rest as the folder says."""
    out = {k: v for k, v in settings.items() if k in _CONFIG_KEYS}
    out.update(
        num_layers=io.num_layers,
        num_kv_heads=io.num_kv_heads,
        head_dim=io.head_dim,
        vocab_size=io.vocab_size,
    )
    out.setdefault("architecture", "unknown")
    out["eos_ids"] = list(out.get("eos_ids") or [])
    return out


_CONFIG_KEYS = (
    "architecture",
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "context_length",
    "bos_id",
    "eos_ids",
    "pad_id",
)


def _files(folder: Path, config: dict[str, Any]) -> DecoderFiles:
    """The folder's tokenizer and template; generation defaults from the config, stopping on
    the folder's generation_config.json eos ids too (its max_length is a generation default,
    not the context, so it is not taken)."""
    from ferry.generate._artifact import generation_config_for, load_decoder_files

    files = load_decoder_files(folder)
    generation = generation_config_for(config)
    theirs = _ids(files.generation_config.get("eos_token_id"))
    generation["eos_token_id"] = list(dict.fromkeys([*generation["eos_token_id"], *theirs]))
    if "bos_token_id" not in generation and _int(files.generation_config.get("bos_token_id")):
        generation["bos_token_id"] = _int(files.generation_config["bos_token_id"])
    return files._replace(generation_config=generation)


def _weights_as_stored(model: ir.Model) -> tuple[dict[str, int], str]:
    """The graph's matrices counted by how they are stored ("int4 (MatMulNBits)",
    "int8 (DequantizeLinear)", "fp16", "fp32"...), and the precision that holds most of their
    values (small helper matrices, a block-sum indicator, do not outvote the projections)."""
    import onnx_ir as ir

    mix: Counter[str] = Counter()
    values: Counter[str] = Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "MatMulNBits":
            attrs = {
                k: node.attributes[k].as_int() for k in ("bits", "N", "K") if k in node.attributes
            }
            bits = attrs.get("bits", 4)
            mix[f"int{bits} (MatMulNBits)"] += 1
            values[f"int{bits}"] += attrs.get("N", 0) * attrs.get("K", 0)
        elif node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1:
            found = _stored_kind(node.inputs[1])
            if found is not None:
                mix[found[0]] += 1
                values[found[0].split(" ", 1)[0]] += found[1]
    precision = values.most_common(1)[0][0] if values else "fp32"
    return dict(mix), precision


def _uses_contrib_ops(model: ir.Model) -> bool:
    import onnx_ir as ir

    return any(
        node.domain == "com.microsoft" for node in ir.traversal.RecursiveGraphIterator(model.graph)
    )


def _stored_kind(value: ir.Value | None) -> tuple[str, int] | None:
    """How a matrix operand is stored, and its values: followed back through casts and
    reshapes to a weight or a DequantizeLinear of one; None for an activation."""
    for _ in range(4):
        if value is None:
            return None
        if value.const_value is not None:
            tensor = value.const_value
            return _FLOAT_NAMES.get(tensor.dtype.name, "fp32"), _size(tensor)
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type == "DequantizeLinear" and producer.inputs[0] is not None:
            stored = producer.inputs[0].const_value
            if stored is None:
                return None
            bits = "int4" if stored.dtype.name in ("INT4", "UINT4") else "int8"
            return f"{bits} (DequantizeLinear)", _size(stored)
        if producer.op_type not in ("Cast", "Reshape", "Transpose", "Identity"):
            return None
        value = producer.inputs[0]
    return None


def _size(tensor: Any) -> int:
    return int(np.prod(tensor.shape.numpy(), dtype=np.int64)) if tensor.shape else 1


_FLOAT_NAMES = {"FLOAT16": "fp16", "BFLOAT16": "bf16", "FLOAT": "fp32", "DOUBLE": "fp64"}


def _parameters(model: ir.Model) -> int:
    """Values in the graph's weights (packed int4 counted as stored bytes x 2)."""
    total = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None:
            continue
        size = _size(tensor)
        total += size * 2 if tensor.dtype.name == "UINT8" else size
    return total


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _static(dims: list[Any], index: int, ok: bool) -> int | None:
    if not ok or not dims:
        return None
    value = dims[index]
    return value if isinstance(value, int) and value > 0 else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value if _int(v) is not None]
    return [int(value)] if _int(value) is not None else []


def _first(value: Any) -> str | None:
    return str(value[0]) if isinstance(value, list) and value else None


def _json_text(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _json(path: Path, what: str) -> dict[str, Any] | None:
    """A JSON object file; None when absent and ``what`` is empty (optional), else refused."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if what:
            raise ModelLoadError(f"{path.parent} has no {what}") from None
        return None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        if not what:
            return None
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        if not what:
            return None
        raise ModelLoadError(f"{path} is not a JSON object")
    return data


def refuse_options(
    path: str | os.PathLike[str],
    *,
    precision: str | None,
    flavour: str,
    accuracy_level: int | None,
) -> None:
    """An ONNX decoder is taken as stored: the build options do not apply.

    Raises:
        InvalidInputError: one of them was given.
    """
    given = [
        f"{name} {value}"
        for name, value in (
            ("precision", precision),
            ("flavour", None if flavour == "ort" else flavour),
            ("accuracy_level", accuracy_level),
        )
        if value is not None
    ]
    if given:
        raise InvalidInputError(
            f"{path} is an ONNX decoder, taken as stored: {', '.join(given)} does not apply "
            "(ferry quantize does not take decoders yet)"
        )
