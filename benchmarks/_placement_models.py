"""The placement benchmark's models: each kit model as an ONNX file with the kit's inputs, and
the plan descriptions its table prints (``benchmarks/placement.py``).

ONNX kit models are used as they are; the others are converted once per run (``--work`` keeps
them across runs). The generative ``smollm2`` (GGUF) becomes ferry's decoder artifact, timed on
one prefill call: the kit's first chat prompt, templated and tokenized as ``DecoderSession``
does, with an empty past.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ferry.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))

import kit_models

SHORT = {"onnxruntime": "ort", "openvino": "ov"}


@dataclasses.dataclass
class Prepared:
    """One kit model ready to time, or why it is not.

    Attributes:
        mid: the kit id.
        path: the ONNX file (None when skipped).
        feeds: the inputs every configuration runs on.
        origin: where the file came from, in words (format, converted or not, how long).
        what: what the feeds are, in words.
        convert_s: seconds spent converting in this run.
        skipped: why the model is not timed (None: it is).
    """

    mid: str
    path: Path | None = None
    feeds: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    origin: str = ""
    what: str = "the kit's inputs"
    convert_s: float = 0.0
    skipped: str | None = None


def prepare_model(mid: str, work: Path) -> Prepared:
    """The kit model ``mid`` as an ONNX file in ``work`` (or the kit's own) with its feeds;
    a model whose framework is missing here comes back skipped, naming what installs it."""
    fmt = kit_models.entry(mid)["format"]
    missing = kit_models.missing_framework(mid)
    if missing is not None:
        return Prepared(mid, origin=fmt, skipped=missing)
    if fmt == "gguf":
        return _decoder(mid, work)
    if fmt == "onnx":
        path = kit_models.path(mid)
        return Prepared(mid, path, _matched(path, kit_models.feeds(mid)), "onnx")
    # One folder per model: a converted model's ferry.json must not be another model's.
    out = work / mid / f"{mid}.onnx"
    if out.is_file():
        origin, spent = f"{fmt}, converted earlier in {out.parent}", 0.0
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        kit_models.convert(mid, out)
        spent = time.perf_counter() - start
        origin = f"{fmt}, converted in {spent:.0f} s"
    feeds = _matched(out, kit_models.feeds(mid))
    return Prepared(mid, out, feeds, origin, convert_s=spent)


def _matched(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` under the model's input names: a conversion may rename its inputs, then the
    kit's inputs are taken in order."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]
    if set(feeds) <= set(names) or len(names) != len(feeds):
        return feeds
    return dict(zip(names, feeds.values(), strict=True))


def _decoder(mid: str, work: Path) -> Prepared:
    """The GGUF decoder converted to ferry's artifact (its default precision), fed one prefill
    call: the kit's first chat prompt as ``DecoderSession.generate`` tokenizes it, an empty past
    of every layer, the output head on the last position only (as generation's prefill runs)."""
    from ferry.generate import convert_decoder, load_decoder_files

    folder = work / mid
    spent = 0.0
    if (folder / "model.onnx").is_file():
        origin = f"gguf, converted earlier in {folder}"
    else:
        start = time.perf_counter()
        convert_decoder(kit_models.path(mid), folder)
        spent = time.perf_counter() - start
        origin = f"gguf, converted to a decoder artifact in {spent:.0f} s"
    path = folder / "model.onnx"
    files = load_decoder_files(folder)
    if files.template is None:
        return Prepared(
            mid, origin=origin, convert_s=spent, skipped="the artifact has no chat template"
        )
    chat = kit_models.feeds(mid)["messages"][0]
    text = files.template.render(list(chat), add_generation_prompt=True)
    ids = list(files.tokenizer.encode(text, add_special_tokens=False).ids)
    feeds, problem = prefill_feeds(path, ids)
    if problem is not None:
        return Prepared(mid, origin=origin, convert_s=spent, skipped=problem)
    what = f"one prefill call: the kit's first chat prompt ({len(ids)} tokens), empty past"
    return Prepared(mid, path, feeds, origin, what, spent)


def prefill_feeds(path: Path, ids: list[int]) -> tuple[dict[str, np.ndarray], str | None]:
    """A decoder graph's inputs for a prefill of ``ids`` with an empty past, built from the
    graph's own inputs; or why they cannot be built simply (an input this does not know, a past
    without fixed heads and head size)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    n = len(ids)
    feeds: dict[str, np.ndarray] = {}
    for value in proto.graph.input:
        name = value.name
        dims: list[Any] = [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
        if name == "input_ids":
            feeds[name] = np.array([ids], dtype=np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((1, n), dtype=np.int64)
        elif name == "position_ids":
            feeds[name] = np.arange(n, dtype=np.int64)[None]
        elif name.startswith("past_key_values."):
            if len(dims) != 4 or not all(isinstance(d, int) and d for d in (dims[1], dims[3])):
                return {}, f"{name} has no fixed heads and head size ({dims})"
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feeds[name] = np.zeros((1, dims[1], 0, dims[3]), dtype=dtype)
        elif name == "logits_to_keep":
            feeds[name] = np.array(1, dtype=np.int64)
        elif name not in inits:
            return {}, f"the decoder graph has an input this benchmark cannot fill: {name}"
    return feeds, None


def linked_alone(path: Path, folder: Path) -> Path:
    """``path`` seen from a folder of its own (links to its folder's files, ``ferry.json``
    left out): a load there finds no saved sizes nor anything learned before, as a model
    loaded the first time without sizes."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in path.parent.iterdir():
        if item.is_file() and item.name != "ferry.json":
            link = folder / item.name
            if not link.exists():
                link.symlink_to(item.resolve())
    return folder / path.name


def describe_plan(plan: Plan) -> str:
    """Partitions and engines: ``1 ov``, ``7 ov4+ort3``."""
    counts: dict[str, int] = {}
    for p in plan.partitions:
        counts[p.backend] = counts.get(p.backend, 0) + 1
    if len(counts) == 1:
        backend = plan.partitions[0].backend
        return f"{len(plan.partitions)} {SHORT.get(backend, backend)}"
    engines = "+".join(f"{SHORT.get(b, b)}{n}" for b, n in counts.items())
    return f"{len(plan.partitions)} {engines}"


def signature(plan: Plan) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """Which engine runs which nodes at which precision: two plans alike here run alike."""
    return tuple(
        (p.backend, p.nodes, str(p.options.get("precision") or "fp32")) for p in plan.partitions
    )


def whole_on(plan: Plan, backend: str) -> bool:
    """The plan is one partition on ``backend``."""
    return len(plan.partitions) == 1 and plan.partitions[0].backend == backend
