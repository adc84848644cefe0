"""``ferry export --target web``: a folder any static host serves, where the model runs in the page.

Before -> After::

    model (an .onnx file, an artifact folder, an ir.Model or a ModelProto; never modified)
        -> out_dir/
             model.onnx       the model, weights inline (a page fetches one file)
             ort/             onnxruntime-web's ES module and the SIMD+threads wasm runtime it
                              loads (WebGPU included), from the pinned npm release
             ferry.js         load(url, options) -> session with inputs, outputs, run(feeds)
             index.html       runs the model on an image (with the declared preprocessing) or on
                              generated input, shows the outputs and the latency
             manifest.json    versions, the model's sha256, inputs/outputs, opsets,
                              preprocessing, the ops check, the Node verification

The ops check runs first, against what onnxruntime-web's wasm build was measured to run
(:mod:`ferry.web._ort_web_ops`): every node it lacks is listed at once and nothing is written.
Unless ``verify=False``, the model then runs on ONNX Runtime (the reference). Declared shapes the
graph contradicts, which onnxruntime-web refuses to load where ONNX Runtime only warns, are
rewritten in the bundle's copy (:mod:`ferry.web._shapes`; the report names each). Then the bundle
is built in a temporary folder beside ``out_dir`` and, unless ``verify=False``, its
model is run in Node through the bundle's own ``ferry.js`` and ``ort/`` files against ONNX Runtime
on the source model (onnxruntime-web runs in Node with the very wasm binary a browser gets). Only
then does the folder move into place by rename: a failed export leaves ``out_dir`` as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry._folders import publish_dir, staging_dir
from ferry._version import __version__
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    InvalidInputError,
)
from ferry.graph import graph_inputs, load_model, reduced_precision, without_randomness
from ferry.parity import (
    BudgetVerdict,
    ParityReport,
    Tolerance,
    compare_outputs,
    infer_judge,
    within_budget,
)
from ferry.runtime import found_inputs, spec_of
from ferry.web._npm import (
    ENTRY_MODULE,
    PINNED_ORT_WEB_VERSION,
    bundle_files,
    ensure_onnxruntime_web,
    run_in_node,
)
from ferry.web._ops import WebOpsCheck, check_web_ops
from ferry.web._shapes import ShapeRepair, describe_repairs, repair_declared_shapes

if TYPE_CHECKING:
    from ferry.optimizer.quantize import ImagePreprocessing

__all__ = ["BUNDLE_FORMAT", "WebExport", "export_web", "is_bundle", "run_bundle_in_node"]

logger = logging.getLogger(__name__)

#: ``manifest.json``'s ``format``: how ferry recognizes a folder it may replace.
BUNDLE_FORMAT = "ferry-web-bundle"
MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
_ASSETS = Path(__file__).with_name("assets")
_RUNNER = Path(__file__).with_name("_run_bundle.mjs")
#: Protobuf's limit: a model file larger than this cannot hold its weights inline.
_INLINE_LIMIT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class TaskCheck:
    """A quantized model judged at its task, where elementwise parity cannot hold: integer
    kernels round differently from one engine to the next (onnxruntime-web's wasm ones from ONNX
    Runtime's), a quantization step apart.

    Attributes:
        source: the quantization the model holds (``dynamic int8 (MatMulInteger x4, ...)``).
        judge: the judge its outputs call for, and why (:func:`ferry.parity.infer_judge`).
        verdict: the judge's verdict on the Node run against ONNX Runtime.
    """

    source: str
    judge: str
    verdict: BudgetVerdict

    def summary(self) -> str:
        state = "ok" if self.verdict.passed else "FAILED"
        return f"at the task ({self.source}): {state}, {self.judge}: {self.verdict.summary()}"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "judge": self.judge, **self.verdict.to_dict()}


@dataclasses.dataclass(frozen=True)
class WebExport:
    """What :func:`export_web` wrote.

    Attributes:
        out_dir: the bundle folder.
        files: every file in it, relative paths (``ort/ort.min.mjs``...).
        manifest: ``manifest.json``'s content.
        ops: the ops check.
        verification: the Node run against ONNX Runtime; None when ``verify=False``.
        task: for a quantized model whose elementwise parity failed, the verdict at its task
            (what decides then).
        repairs: declared shapes rewritten in the bundle's copy of the model.
        inputs: how the inputs verified on were found (or that they were given).
    """

    out_dir: Path
    files: tuple[str, ...]
    manifest: dict[str, Any]
    ops: WebOpsCheck
    verification: ParityReport | None
    repairs: tuple[ShapeRepair, ...] = ()
    inputs: str | None = None
    task: TaskCheck | None = None

    @property
    def index_html(self) -> Path:
        return self.out_dir / "index.html"

    def lines(self) -> list[str]:
        """A short human-readable report (the CLI prints it)."""
        m = self.manifest
        size = sum((self.out_dir / f).stat().st_size for f in self.files)
        out = [
            f"web bundle {self.out_dir} ({len(self.files)} files, {size / 2**20:.1f} MiB): "
            f"onnxruntime-web {m['onnxruntime_web_version']}",
            f"model {m['model']['file']}: opset {m['opset'].get('', '?')}, "
            f"{len(m['inputs'])} input(s), {len(m['outputs'])} output(s)",
            self.ops.summary(),
        ]
        repaired = describe_repairs(self.repairs)
        if repaired is not None:
            out.append(repaired)
        if self.verification is not None:
            out.append(
                "in Node (onnxruntime-web, wasm) vs ONNX Runtime: " + self.verification.summary()
            )
            if self.task is not None:
                out.append(self.task.summary())
            if self.inputs:
                out.append(f"verified on: {self.inputs}")
        out.append(
            f"open {self.index_html} through a web server, e.g. `ferry serve --web {self.out_dir}`"
        )
        return out


def export_web(
    model: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    out_dir: str | os.PathLike[str],
    *,
    ort_version: str = PINNED_ORT_WEB_VERSION,
    preprocessing: ImagePreprocessing | None = None,
    force: bool = False,
    verify: bool = True,
    samples: Mapping[str, Any] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    tolerance: Tolerance | None = None,
) -> WebExport:
    """Write a browser bundle of ``model`` into ``out_dir`` (see the module docstring).

    Args:
        model: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or a ModelProto.
        out_dir: the folder to write. It must not exist, be empty, or hold an earlier ferry web
            bundle (which is replaced), unless ``force``.
        ort_version: the onnxruntime-web release from npm (the ops table is measured on the
            pinned one).
        preprocessing: how an image becomes the model's input (an
            :class:`ferry.optimizer.quantize.ImagePreprocessing`): the page then takes an image
            file. None: the page runs generated input.
        force: replace ``out_dir`` even if it holds other files.
        verify: run the bundle in Node against ONNX Runtime before publishing it.
        samples: the input to verify on (``{name: array}``); None: inputs found to run (sizes
            the graph takes, ids within its tables).
        shapes: sizes of symbolic dims for the found inputs.
        tolerance: ``(atol, rtol)``; None: :mod:`ferry.parity`'s per dtype.

    Raises:
        ModelLoadError: the model cannot be read.
        UnsupportedOpError: ops onnxruntime-web lacks (all listed), or an opset it cannot load.
        InvalidInputError: ``out_dir`` holds other files, or a bad option.
        BackendUnavailableError: npm/Node missing, or ``npm install`` failed.
        ConversionError: the bundle computes something else than the model in Node.
    """
    out = Path(out_dir)
    _check_out_dir(out, force)
    loaded = load_model(model)
    ops = check_web_ops(loaded)
    ops.raise_if_unsupported()
    pre = _preprocessing_dict(preprocessing, loaded)
    dist = ensure_onnxruntime_web(ort_version)
    proto, source_ir = _model_proto(loaded, ops.max_ir_version)
    # Random ops (a voice's noise) make two runs of one model differ: the bundle is verified with
    # its draws at their expected value, in both runtimes; the bundle ships the model as it is.
    steady, fixed = without_randomness(loaded)
    check = _model_proto(steady, ops.max_ir_version)[0] if fixed else proto
    reference = _reference_run(steady, check, samples, shapes, fixed) if verify else None
    produced = {k: v.shape for k, v in reference.want.items()} if reference else None
    repairs = repair_declared_shapes(proto, loaded, produced)
    if check is not proto:
        repair_declared_shapes(check, steady, produced)
    staging = staging_dir(out)
    try:
        model_info = _write_model(proto, source_ir, staging / MODEL_FILE)
        (staging / "ort").mkdir()
        for name in bundle_files(ort_version):
            shutil.copyfile(dist / name, staging / "ort" / name)
        substitutions = {
            "__ORT_ENTRY__": ENTRY_MODULE,
            "__ORT_VERSION__": ort_version,
            "__FERRY_VERSION__": __version__,
            "__TITLE__": _html_escape(_title(model, loaded)),
        }
        for asset in ("ferry.js", "index.html"):
            text = (_ASSETS / asset).read_text(encoding="utf-8")
            for key, value in substitutions.items():
                text = text.replace(key, value)
            (staging / asset).write_text(text, encoding="utf-8")
        specs = [spec_of(v) for v in graph_inputs(loaded)]
        out_specs = [
            spec_of(ir.serde.deserialize_value_info_proto(o, None)) for o in proto.graph.output
        ]
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "ferry_version": __version__,
            "onnxruntime_web_version": ort_version,
            "runtime": {"entry": f"ort/{ENTRY_MODULE}", "files": bundle_files(ort_version)},
            "model": model_info,
            "opset": {d or "": v for d, v in loaded.opset_imports.items()},
            "inputs": [s.to_dict() for s in specs],
            "outputs": [s.to_dict() for s in out_specs],
            "preprocessing": pre,
            "ops_check": ops.to_dict(),
            "shape_repairs": [],
            "verification": None,
        }
        _write_manifest(staging, manifest)
        verification = None
        task = None
        if reference is not None:
            feeds, want = reference.feeds, reference.want
            if check is not proto:
                _write_model(check, source_ir, staging / MODEL_FILE)
            got, dropped = _node_run(staging, feeds, check, steady, produced, source_ir)
            if dropped and check is not proto:
                dropped = repair_declared_shapes(proto, loaded, produced, drop_unconfirmed=True)
            repairs += dropped
            if check is not proto or dropped:
                manifest["model"] = _write_model(proto, source_ir, staging / MODEL_FILE)
            verification = compare_outputs(got, want, tolerance=tolerance, inputs=feeds)
            task = None if verification.passed else _task_check(loaded, got, want)
            manifest["verification"] = {
                **verification.to_dict(),
                "inputs": reference.how,
                "task": None if task is None else task.to_dict(),
            }
            if not verification.passed and (task is None or not task.verdict.passed):
                at_task = "" if task is None else f"; {task.summary()}"
                raise ConversionError(
                    f"the bundle's model does not compute in onnxruntime-web what it computes in "
                    f"ONNX Runtime, so nothing was written to {out}: {verification.summary()}"
                    f"{at_task}"
                )
        manifest["shape_repairs"] = [r.to_dict() for r in repairs]
        files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        manifest["files"] = {f: _sha256(staging / f) for f in files if f != MANIFEST_FILE}
        _write_manifest(staging, manifest)
        publish_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported a web bundle into %s", out)
    return WebExport(
        out_dir=out,
        files=tuple(files),
        manifest=manifest,
        ops=ops,
        verification=verification,
        repairs=tuple(repairs),
        inputs=reference.how if reference is not None else None,
        task=task,
    )


def is_bundle(folder: Path) -> bool:
    """Whether ``folder`` holds a ferry web bundle (its manifest says so)."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == BUNDLE_FORMAT


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"{out} is a file; the web export writes a folder (-o SITE/)")
    if out.is_dir() and any(out.iterdir()) and not is_bundle(out) and not force:
        raise InvalidInputError(
            f"output folder {out} is not empty and holds no ferry web bundle; choose a new "
            "folder, or pass force=True (--force) to replace everything in it"
        )


def _model_proto(model: ir.Model, max_ir: int) -> tuple[onnx.ModelProto, int]:
    """The bundle's copy of ``model``: every weight inline, at an IR version onnxruntime-web
    loads; and the IR version the source had.

    A page fetches one file: weights kept in external data files (read lazily from the source's
    folder) are read into the model file.
    """
    proto = ir.to_proto(model)
    base_dirs = {
        str(v.const_value.base_dir)
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }
    for base_dir in base_dirs:
        onnx.external_data_helper.load_external_data_for_model(proto, base_dir)
    if proto.ByteSize() > _INLINE_LIMIT:
        raise InvalidInputError(
            f"the model is {proto.ByteSize() / 2**30:.1f} GiB: a browser bundle holds its "
            "weights in the one model file, which protobuf caps at 2 GiB; compress it first "
            "(`ferry quantize`)"
        )
    source_ir = proto.ir_version
    if source_ir > max_ir:
        # The writer stamps its newest IR version; the ops check has ensured the opsets load,
        # and nothing an older IR lacks is used by opsets this runtime takes.
        proto.ir_version = max_ir
    return proto, source_ir


def _write_model(proto: onnx.ModelProto, source_ir: int, path: Path) -> dict[str, Any]:
    path.write_bytes(proto.SerializeToString())
    return {
        "file": path.name,
        "sha256": _sha256(path),
        "bytes": path.stat().st_size,
        "ir_version": proto.ir_version,
        "source_ir_version": source_ir,
    }


def _preprocessing_dict(pre: Any, model: ir.Model) -> dict[str, Any] | None:
    if pre is None:
        return None
    if not dataclasses.is_dataclass(pre) or isinstance(pre, type) or not hasattr(pre, "size"):
        raise InvalidInputError(
            "preprocessing must be a ferry.optimizer.quantize.ImagePreprocessing, got "
            f"{type(pre).__name__}"
        )
    inputs = graph_inputs(model)
    image_inputs = [v for v in inputs if v.shape is not None and len(v.shape) == 4]
    if not image_inputs:
        raise InvalidInputError(
            "preprocessing was given but the model has no 4-D (image) input; its inputs: "
            + ", ".join(str(v.name) for v in inputs)
        )
    data = dataclasses.asdict(pre)
    data["size"] = list(data["size"])
    data["mean"] = list(data["mean"])
    data["std"] = list(data["std"])
    data["input"] = image_inputs[0].name
    return data


def _title(source: Any, model: ir.Model) -> str:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return path.stem if path.suffix else path.name
    return model.graph.name or "model"


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Verification in Node

_JS_DTYPES = {
    "float32": "float32",
    "float64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "uint16": "uint16",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "bool": "bool",
    "float16": "float16",
}


def run_bundle_in_node(
    bundle: str | os.PathLike[str], feeds: Mapping[str, np.ndarray], *, timeout: float = 300
) -> dict[str, np.ndarray]:
    """Run a bundle's model in Node through its own ``ferry.js`` and ``ort/`` files.

    Args:
        bundle: the bundle folder.
        feeds: ``{input name: array}``.
        timeout: seconds before the run is abandoned.

    Returns:
        ``{output name: array}`` as onnxruntime-web computed them.

    Raises:
        BackendUnavailableError: Node is not installed.
        ExecutionError: the model failed in onnxruntime-web (its message included).
    """
    node = shutil.which("node")
    if node is None:
        raise BackendUnavailableError(
            "node was not found on PATH: install Node.js (Debian/Ubuntu: `apt-get install "
            "nodejs npm`; elsewhere https://nodejs.org), or export with verify=False (--no-verify)"
        )
    with tempfile.TemporaryDirectory(prefix="ferry-web-") as tmp:
        io = Path(tmp)
        listing = []
        for i, (name, value) in enumerate(feeds.items()):
            array = np.ascontiguousarray(value)
            dtype = "bool" if array.dtype == np.bool_ else str(array.dtype)
            if dtype not in _JS_DTYPES:
                raise InvalidInputError(
                    f"input {name} is {array.dtype}: ferry.js feeds numbers and booleans only"
                )
            file = f"in{i}.bin"
            (io / file).write_bytes(array.astype(array.dtype.newbyteorder("<")).tobytes())
            listing.append({"name": name, "dtype": dtype, "shape": list(array.shape), "file": file})
        (io / "feeds.json").write_text(json.dumps(listing), encoding="utf-8")
        run_in_node(
            node, _RUNNER, [str(Path(bundle).absolute()), str(io)], timeout, "the bundle's model"
        )
        outputs = {}
        for entry in json.loads((io / "outputs.json").read_text(encoding="utf-8")):
            out_dtype = np.dtype(np.bool_ if entry["dtype"] == "bool" else entry["dtype"])
            raw = np.frombuffer(
                (io / entry["file"]).read_bytes(), dtype=out_dtype.newbyteorder("<")
            )
            outputs[entry["name"]] = raw.astype(out_dtype).reshape(entry["shape"])
        return outputs


def _node_run(
    staging: Path,
    feeds: Mapping[str, np.ndarray],
    proto: onnx.ModelProto,
    model: ir.Model,
    produced: Mapping[str, Sequence[int]] | None,
    source_ir: int,
) -> tuple[dict[str, np.ndarray], list[ShapeRepair]]:
    """The staged bundle's outputs in Node, and the declarations dropped to get them.

    Where onnxruntime-web's own inference (contrib ops ONNX's does not know) still contradicts a
    declaration, every one ONNX inference could not confirm is left to the runtime, once.
    """
    try:
        return run_bundle_in_node(staging, feeds), []
    except ExecutionError as e:
        if "ShapeInferenceError" not in str(e):
            raise
    dropped = repair_declared_shapes(proto, model, produced, drop_unconfirmed=True)
    _write_model(proto, source_ir, staging / MODEL_FILE)
    return run_bundle_in_node(staging, feeds), dropped


def _task_check(
    model: ir.Model, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]
) -> TaskCheck | None:
    """A quantized model judged at its task; None for a float model (its elementwise parity
    decides: a float kernel that differs is a bug)."""
    held = reduced_precision(model)
    if not held:
        return None
    specs, why = infer_judge(model, want)
    return TaskCheck(held.describe(), why, within_budget(got, want, specs))


@dataclasses.dataclass(frozen=True)
class _Reference:
    """The inputs the bundle is verified on, what ONNX Runtime computes from them, and how the
    inputs were found."""

    feeds: dict[str, np.ndarray]
    want: dict[str, np.ndarray]
    how: str


def _reference_run(
    model: ir.Model,
    proto: onnx.ModelProto,
    samples: Mapping[str, Any] | None,
    shapes: Mapping[str, Sequence[int]] | None,
    fixed: Sequence[str] = (),
) -> _Reference:
    """The inputs to verify on and what ONNX Runtime computes from them on the bundle's copy of
    the model (before its declared shapes are repaired: ONNX Runtime takes them); ``fixed``
    names the random ops that copy has at their expected value."""
    import onnxruntime as ort

    from ferry.backends import ORT_SILENT

    if samples is not None:
        from ferry.runtime import InputChecker

        specs = [spec_of(v) for v in graph_inputs(model)]
        feeds = dict(InputChecker(specs).check(dict(samples)))
        how = "the samples given"
    else:
        # Sizes the graph takes and ids within its tables, checked on ONNX Runtime: random
        # sizes and ids fail on models that are fine (a text line's height, token types).
        found = found_inputs(model, shapes)
        feeds, how = found.feeds, found.how
    so = ort.SessionOptions()
    so.log_severity_level = ORT_SILENT
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        want = session.run(None, feeds)
    except Exception as e:  # ORT raises its own types from C++
        raise ExecutionError(f"ONNX Runtime cannot run the model to verify the bundle: {e}") from e
    names = [o.name for o in session.get_outputs()]
    if fixed:
        how += f"; random ops at their expected value ({', '.join(fixed)})"
    return _Reference(feeds, dict(zip(names, want, strict=True)), how)
