"""``ferry export --target web`` on a generative artifact: a static folder whose page chats with
the model, the token loop running in the browser.

Before -> After::

    artifact/ (``ferry convert`` of a GGUF or a Hugging Face checkpoint; never modified)
        model.onnx, model.onnx.data, tokenizer.json, tokenizer_config.json,
        generation_config.json, ferry.json
        -> out_dir/
             model.onnx, model.onnx.data   the decoder (weights in the external data file, which
                                           onnxruntime-web loads through ``externalData``);
                                           ``logits_to_keep`` made a plain input the page feeds
             tokenizer.json, tokenizer_config.json, generation_config.json
             ort/         onnxruntime-web (wasm SIMD+threads, WebGPU) from the pinned npm release
             lib/         tokenizers.mjs (@huggingface/tokenizers: the tokenizer.json pipeline
                          in JavaScript) and jinja.mjs (@huggingface/jinja: the chat template),
                          pinned npm releases copied in: nothing is fetched from elsewhere
             chat.js      loadChat() -> encode(messages), generate(ids, {onToken...}): the
                          token loop (prefill, then one token a step with the cache fed back)
             index.html   the chat page: streamed answers, the model's size, tokens/s
             manifest.json  what the page reads (decoder I/O, eos ids, context), versions,
                            sha256 of every file, the Node verification

Which graph runs well where (measured, onnxruntime-web 1.30, SmolLM2-135M int4, in Node): the
wasm build has kernels for every op of both flavours (MatMulNBits, GroupQueryAttention,
SkipSimplifiedLayerNormalization, GatherBlockQuantized included), but no block-quantized matmul:
its MatMulNBits dequantizes the whole weight at every call (0.7 tokens/s). A DequantizeLinear of
a constant weight is folded once, at load, when the page turns ONNX Runtime's QDQ fusion off
(``session.disable_quant_qdq``): 28 tokens/s, float32 weights in memory. So the bundle's graph
has its MatMulNBits rewritten to DequantizeLinear -> MatMul over the same bytes
(:mod:`ferry.web._chat_graph`), and both flavours run at that speed; the page computes the
dequantized model in float32.

The export is verified in Node before it is published: the bundle's own ``chat.js`` renders and
tokenizes a chat and generates greedy tokens, against ``DecoderSession`` on the artifact. The
prompt's ids must be identical (the template and tokenizer in JavaScript against Python's); the
new ids are compared and the agreement is reported: they are identical where both sides compute
in float32, but native ONNX Runtime runs quantized matmuls with int8 activations (the QDQ
fusion's default accuracy level, and the output head's level 4 in the ``ort`` flavour) where
onnxruntime-web computes them in float32, so a close call may go the other way. For a float32
artifact they must be identical.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from ferry._folders import publish_dir, staging_dir
from ferry._version import __version__
from ferry.errors import BackendUnavailableError, ConversionError, InvalidInputError
from ferry.web._chat_graph import dequantize_nbits
from ferry.web._export import (
    BUNDLE_FORMAT,
    MANIFEST_FILE,
    MODEL_FILE,
    _check_out_dir,
    _html_escape,
    _sha256,
    _write_manifest,
)
from ferry.web._npm import (
    ENTRY_MODULE,
    PINNED_ORT_WEB_VERSION,
    bundle_files,
    ensure_npm_package,
    ensure_onnxruntime_web,
    run_in_node,
)
from ferry.web._ops import WebOpsCheck, check_web_ops
from ferry.web._ort_web_ops import MAX_IR_VERSION

__all__ = ["CHAT_KIND", "JS_LIBRARIES", "ChatExport", "export_chat", "run_chat_in_node"]

logger = logging.getLogger(__name__)

#: ``manifest.json``'s ``kind`` for a chat bundle (a plain model's bundle has none).
CHAT_KIND = "chat"
#: npm packages copied into ``lib/``: (package, pinned version, file in the package, name in lib/).
#: Both are plain ES modules without imports, so the page imports them as they are.
JS_LIBRARIES = (
    ("@huggingface/tokenizers", "0.2.0", "dist/tokenizers.min.mjs", "tokenizers.mjs"),
    ("@huggingface/jinja", "0.5.11", "dist/index.js", "jinja.mjs"),
)
#: The chat the export verifies with when none is given.
DEFAULT_VERIFY_MESSAGES = ({"role": "user", "content": "What is the capital of France?"},)
_ASSETS = Path(__file__).with_name("assets") / "chat"
_RUNNER = Path(__file__).with_name("_run_chat.mjs")
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_COPIED = ("tokenizer.json", "generation_config.json")
_KV_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}


@dataclasses.dataclass(frozen=True)
class ChatExport:
    """What :func:`export_chat` wrote.

    Attributes:
        out_dir: the bundle folder.
        files: every file in it, relative paths.
        manifest: ``manifest.json``'s content.
        ops: the ops check against onnxruntime-web's wasm build.
        verification: the Node chat against Python's (``manifest["verification"]``); None
            when ``verify=False``.
        warnings: what the user should know (an ``ort`` flavour's speed on wasm).
    """

    out_dir: Path
    files: tuple[str, ...]
    manifest: dict[str, Any]
    ops: WebOpsCheck
    verification: dict[str, Any] | None
    warnings: tuple[str, ...] = ()

    @property
    def index_html(self) -> Path:
        return self.out_dir / "index.html"

    def lines(self) -> list[str]:
        """A short human-readable report (the CLI prints it)."""
        m = self.manifest
        size = sum((self.out_dir / f).stat().st_size for f in self.files)
        d = m["decoder"]
        out = [
            f"chat bundle {self.out_dir} ({len(self.files)} files, {size / 2**20:.1f} MiB): "
            f"onnxruntime-web {m['onnxruntime_web_version']}, "
            + ", ".join(f"{name} {version}" for name, version in m["libraries"].items()),
            f"decoder: {d['num_layers']} layers, {d['flavour']} flavour, {d['precision']}, "
            f"model {m['model']['bytes'] / 2**20:.1f} MiB; context {d['context_length']}",
            self.ops.summary(),
        ]
        v = self.verification
        if v is not None:
            out.append(
                f"in Node (chat.js, wasm): prompt ids identical to Python's "
                f"({v['prompt_tokens']} tokens); {_agreement(v)}; "
                f"{_speed(v['node_tokens_per_second'])}"
            )
        out += [f"warning: {w}" for w in self.warnings]
        out.append(
            f"open {self.index_html} through a web server, e.g. `ferry serve --web {self.out_dir}`"
        )
        return out


def _agreement(v: Mapping[str, Any]) -> str:
    n = len(v["python_ids"])
    if v["identical"]:
        return f"greedy tokens identical to DecoderSession's ({n})"
    return (
        f"greedy tokens: the first {v['agree']} of {n} as DecoderSession's (native ONNX Runtime "
        "runs quantized matmuls with int8 activations; the page computes them in float32)"
    )


def _speed(tps: float | None) -> str:
    return "speed n/a" if tps is None else f"{tps:.1f} tokens/s (Node, one thread)"


def export_chat(
    artifact: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    ort_version: str = PINNED_ORT_WEB_VERSION,
    force: bool = False,
    verify: bool = True,
    verify_messages: Sequence[Mapping[str, Any]] | None = None,
    verify_tokens: int = 8,
) -> ChatExport:
    """Write a chat page bundle of the generative artifact ``artifact`` into ``out_dir`` (see
    the module docstring).

    Args:
        artifact: a folder ``ferry convert`` wrote for a decoder.
        out_dir: the folder to write. It must not exist, be empty, or hold an earlier ferry web
            bundle (which is replaced), unless ``force``.
        ort_version: the onnxruntime-web release from npm.
        force: replace ``out_dir`` even if it holds other files.
        verify: chat in Node through the bundle's own files before publishing it.
        verify_messages: the chat to verify with (default: one question).
        verify_tokens: how many greedy tokens to compare.

    Raises:
        InvalidInputError: not a generative artifact, no chat template, a bad option, or
            ``out_dir`` holds other files.
        ModelLoadError: the artifact's files are missing or corrupt.
        UnsupportedOpError: ops onnxruntime-web lacks (all listed).
        BackendUnavailableError: npm/Node missing, or ``npm install`` failed.
        ConversionError: the page's prompt ids differ from Python's, or a float32 decoder's
            greedy tokens do.
    """
    from ferry.generate._artifact import load_decoder_files, read_generative_manifest
    from ferry.generate._loop import is_generative_artifact

    source = Path(artifact)
    out = Path(out_dir)
    if not is_generative_artifact(source):
        raise InvalidInputError(
            f"{source} is not a generative artifact (a folder `ferry convert` wrote for a "
            "decoder, with model.onnx, tokenizer.json and ferry.json)"
        )
    if isinstance(verify_tokens, bool) or not isinstance(verify_tokens, int) or verify_tokens < 1:
        raise InvalidInputError(f"verify_tokens={verify_tokens!r}: it takes an int >= 1")
    _check_out_dir(out, force)
    files = load_decoder_files(source)
    if files.template is None:
        raise InvalidInputError(
            f"{source} has no chat template (tokenizer_config.json's chat_template): the chat "
            "page renders its messages through it"
        )
    info = read_generative_manifest(source) or {}
    proto = onnx.load(str(source / MODEL_FILE), load_external_data=False)
    decoder = _decoder_io(proto, info, files.generation_config)
    decoder["chat_template"] = files.template.source
    graph = _bundle_graph(proto, source, decoder)
    ops = check_web_ops(_ir(graph))
    ops.raise_if_unsupported()
    warnings = []
    if decoder["matmul_nbits_kept"]:
        warnings.append(
            f"{decoder['matmul_nbits_kept']} MatMulNBits node(s) could not be rewritten to "
            "DequantizeLinear -> MatMul: onnxruntime-web's wasm build dequantizes their weights "
            "at every step (WebGPU has kernels for them)"
        )
    dist = ensure_onnxruntime_web(ort_version)
    libraries = {
        name: ensure_npm_package(name, version, [file]) / file
        for name, version, file, _ in JS_LIBRARIES
    }
    staging = staging_dir(out)
    try:
        model_bytes = _write_model(graph, source, staging, decoder)
        for name in _COPIED:
            if (source / name).is_file():
                shutil.copyfile(source / name, staging / name)
        tokenizer_config = _read_json(source / "tokenizer_config.json")
        tokenizer_config["chat_template"] = files.template.source
        (staging / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (staging / "ort").mkdir()
        for name in bundle_files(ort_version):
            shutil.copyfile(dist / name, staging / "ort" / name)
        (staging / "lib").mkdir()
        for name, _, _, target in JS_LIBRARIES:
            shutil.copyfile(libraries[name], staging / "lib" / target)
        substitutions = {
            "__ORT_ENTRY__": ENTRY_MODULE,
            "__ORT_VERSION__": ort_version,
            "__FERRY_VERSION__": __version__,
            "__TITLE__": _html_escape(source.absolute().name),
        }
        for asset in ("chat.js", "index.html"):
            text = (_ASSETS / asset).read_text(encoding="utf-8")
            for key, value in substitutions.items():
                text = text.replace(key, value)
            (staging / asset).write_text(text, encoding="utf-8")
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "kind": CHAT_KIND,
            "ferry_version": __version__,
            "onnxruntime_web_version": ort_version,
            "runtime": {"entry": f"ort/{ENTRY_MODULE}", "files": bundle_files(ort_version)},
            "libraries": {name: version for name, version, _, _ in JS_LIBRARIES},
            "model": {
                "file": MODEL_FILE,
                "bytes": model_bytes,
                "ir_version": proto.ir_version,
                "source": str(source.absolute()),
            },
            "opset": {e.domain or "": e.version for e in proto.opset_import},
            "decoder": decoder,
            "ops_check": ops.to_dict(),
            "warnings": warnings,
            "verification": None,
        }
        _write_manifest(staging, manifest)
        verification = None
        if verify:
            messages = list(verify_messages or DEFAULT_VERIFY_MESSAGES)
            verification = _verify(source, staging, messages, verify_tokens, decoder)
            manifest["verification"] = verification
        written = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        manifest["files"] = {f: _sha256(staging / f) for f in written if f != MANIFEST_FILE}
        _write_manifest(staging, manifest)
        publish_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported a chat bundle into %s", out)
    return ChatExport(
        out_dir=out,
        files=tuple(written),
        manifest=manifest,
        ops=ops,
        verification=verification,
        warnings=tuple(warnings),
    )


def _ir(proto: onnx.ModelProto) -> Any:
    import onnx_ir as ir

    # The graph alone: the ops check reads nodes and opsets, never the weights.
    return ir.serde.deserialize_model(proto)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"cannot read {path}: {e}") from e
    return data if isinstance(data, dict) else {}


def _decoder_io(
    proto: onnx.ModelProto, info: Mapping[str, Any], generation: Mapping[str, Any]
) -> dict[str, Any]:
    """What the page's token loop needs to know about the graph, from the graph itself."""
    inputs = {i.name: i for i in proto.graph.input}
    initializers = {t.name for t in proto.graph.initializer}
    outputs = {o.name for o in proto.graph.output}
    missing = [n for n in ("input_ids", "attention_mask") if n not in inputs]
    if missing or "logits" not in outputs:
        raise InvalidInputError(
            "the artifact's model.onnx is not a decoder graph: it needs inputs input_ids, "
            "attention_mask and output logits"
        )
    layers = sorted(
        {int(m.group(1)) for n in inputs if (m := _PAST.fullmatch(n)) and n not in initializers}
    )
    past = [f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in layers for kind in ("key", "value")]
    absent = [n for n in present if n not in outputs]
    if absent:
        raise InvalidInputError(f"the decoder's past inputs have no present outputs: {absent[:4]}")
    heads = dim = None
    kv_dtype = "float32"
    if past:
        t = inputs[past[0]].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if len(dims) == 4:
            heads, dim = dims[1], dims[3]
        if t.elem_type not in _KV_DTYPES:
            raise InvalidInputError(
                f"the decoder's cache is {onnx.TensorProto.DataType.Name(t.elem_type)}; the "
                "page feeds float32 or float16 caches"
            )
        kv_dtype = _KV_DTYPES[t.elem_type]
    heads = heads or info.get("num_kv_heads")
    dim = dim or info.get("head_dim")
    if past and (not heads or not dim):
        raise InvalidInputError(
            "the decoder's past_key_values.0.key has no fixed kv-heads and head-dim sizes and "
            "ferry.json does not give them"
        )
    eos = generation.get("eos_token_id", info.get("eos_ids"))
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    external = sorted(
        {
            entry.value
            for t in proto.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
    )
    for name in external:
        if Path(name).name != name or name.startswith("."):
            raise InvalidInputError(
                f"the decoder's weights are in {name!r}, not a file beside model.onnx; the page "
                "fetches external data from its own folder"
            )
    return {
        "tokenizer": "tokenizer.json",
        "tokenizer_config": "tokenizer_config.json",
        "external_data": external,
        "past": past,
        "present": present,
        "num_layers": len(layers),
        "num_kv_heads": heads,
        "head_dim": dim,
        "kv_dtype": kv_dtype,
        "position_ids": "position_ids" in inputs,
        # ferry's graphs carry it as an overridable initializer, which onnxruntime-web does not
        # let a page feed: the bundle's graph takes it as a plain input (see _write_model).
        "logits_to_keep": "logits_to_keep" in inputs,
        "eos_ids": [int(i) for i in eos_ids],
        "context_length": generation.get("max_length") or info.get("context_length"),
        "flavour": info.get("flavour", _meta(proto, "ferry.flavour") or "unknown"),
        "precision": info.get("precision", _meta(proto, "ferry.precision") or "unknown"),
        "parameters": info.get("parameters"),
        "architecture": info.get("architecture"),
    }


def _meta(proto: onnx.ModelProto, key: str) -> str | None:
    return next((p.value for p in proto.metadata_props if p.key == key), None)


def _bundle_graph(proto: onnx.ModelProto, source: Path, decoder: dict[str, Any]) -> onnx.ModelProto:
    """The graph the page runs (its weights stay in the external data files, as they are):
    ``logits_to_keep`` a plain input, MatMulNBits as DequantizeLinear -> MatMul
    (:mod:`ferry.web._chat_graph`: 40x faster on wasm), at an IR version onnxruntime-web loads.
    Notes in ``decoder`` how many MatMulNBits were rewritten and kept."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    if decoder["logits_to_keep"]:
        keep = [t for t in model.graph.initializer if t.name == "logits_to_keep"]
        for t in keep:
            model.graph.initializer.remove(t)
    rewritten, kept = dequantize_nbits(model, source)
    decoder["matmul_nbits_dequantized"] = rewritten
    decoder["matmul_nbits_kept"] = kept
    if model.ir_version > MAX_IR_VERSION:
        # The writer stamps its newest IR version; the ops check sees that the opsets load.
        model.ir_version = MAX_IR_VERSION
    return model


def _write_model(
    model: onnx.ModelProto, source: Path, staging: Path, decoder: Mapping[str, Any]
) -> int:
    """Save the graph and copy its weight files; the bytes of them all together."""
    onnx.save(model, str(staging / MODEL_FILE))
    total = (staging / MODEL_FILE).stat().st_size
    for name in decoder["external_data"]:
        if not (source / name).is_file():
            raise InvalidInputError(f"the artifact's weights file {source / name} is missing")
        shutil.copyfile(source / name, staging / name)
        total += (staging / name).stat().st_size
    return total


# ---------------------------------------------------------------------------------------------
# Verification in Node


def run_chat_in_node(
    bundle: str | os.PathLike[str],
    messages: Sequence[Mapping[str, Any]],
    max_new_tokens: int,
    *,
    options: Mapping[str, Any] | None = None,
    timeout: float = 600,
) -> dict[str, Any]:
    """Chat with a chat bundle's decoder in Node through its own ``chat.js`` (wasm, one thread);
    ``options`` go to ``chat.generate`` (``temperature``, ``topP``, ``topK``, ``seed``; default
    greedy).

    Returns:
        ``prompt_text``, ``prompt_ids``, ``ids`` (greedy), ``text``, ``finish_reason``,
        ``prefill_ms``, ``tokens_per_second``, ``backend``.

    Raises:
        BackendUnavailableError: Node is not installed.
        ExecutionError: the page's code failed (its message included).
    """
    node = shutil.which("node")
    if node is None:
        raise BackendUnavailableError(
            "node was not found on PATH: install Node.js (Debian/Ubuntu: `apt-get install "
            "nodejs npm`; elsewhere https://nodejs.org), or export with verify=False (--no-verify)"
        )
    with tempfile.TemporaryDirectory(prefix="ferry-chat-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        io = [str(request), str(result)]
        request.write_text(
            json.dumps(
                {
                    "messages": [dict(m) for m in messages],
                    "max_new_tokens": max_new_tokens,
                    "options": dict(options or {}),
                }
            ),
            encoding="utf-8",
        )
        run_in_node(
            node, _RUNNER, [str(Path(bundle).absolute()), *io], timeout, "the chat page's code"
        )
        data: dict[str, Any] = json.loads(result.read_text(encoding="utf-8"))
        return data


def _verify(
    source: Path,
    bundle: Path,
    messages: list[Mapping[str, Any]],
    tokens: int,
    decoder: Mapping[str, Any],
) -> dict[str, Any]:
    """Chat in Node and in Python on the same messages; compare (see the module docstring)."""
    from ferry.generate._loop import DecoderSession, Generation, TokenEvent

    page = run_chat_in_node(bundle, messages, tokens)
    python = DecoderSession.from_folder(source, backends="onnxruntime")
    events = list(python.generate(messages=messages, max_new_tokens=tokens, stream=True))
    want = events[-1]
    assert isinstance(want, Generation)
    streamed = [e.text for e in events[:-1] if isinstance(e, TokenEvent)]
    prompt = python._prompt_ids(None, messages, None)
    if page["prompt_ids"] != prompt:
        first = next(
            (i for i, (a, b) in enumerate(zip(page["prompt_ids"], prompt)) if a != b),
            min(len(prompt), len(page["prompt_ids"])),
        )
        raise ConversionError(
            "the page's chat template and tokenizer (JavaScript) give other prompt ids than "
            f"Python's, first at position {first} of {len(prompt)}: "
            f"{page['prompt_ids'][first : first + 5]} vs {prompt[first : first + 5]}; "
            "nothing was written"
        )
    agree = 0
    for a, b in zip(page["ids"], want.ids):
        if a != b:
            break
        agree += 1
    full = agree == len(want.ids) == len(page["ids"])
    if not full and decoder["precision"] == "fp32":
        raise ConversionError(
            f"the page's greedy tokens differ from Python's on a float32 decoder after {agree} "
            f"token(s): {page['ids']} vs {want.ids}; nothing was written"
        )
    if full and (page["text"] != want.text or page["streamed"] != streamed):
        raise ConversionError(
            "the page decodes the same tokens to other text than Python's: "
            f"{page['streamed']!r} vs {streamed!r}; nothing was written"
        )
    return {
        "messages": [dict(m) for m in messages],
        "prompt_tokens": len(prompt),
        "prompt_ids_identical": True,
        "page_ids": page["ids"],
        "python_ids": list(want.ids),
        "agree": agree,
        "identical": full,
        "page_text": page["text"],
        "python_text": want.text,
        # Token by token as each side streamed it (partial UTF-8 held back alike).
        "page_streamed": page["streamed"],
        "python_streamed": streamed,
        "node_prefill_ms": page["prefill_ms"],
        "node_tokens_per_second": page["tokens_per_second"],
    }
