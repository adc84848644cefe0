"""``ferry export --target ort-mobile``: a model as ONNX Runtime Mobile deploys it, verified.

Before -> After::

    model (an .onnx file, an artifact folder, an ir.Model or a ModelProto; never modified)
        -> output_dir/
             model.ort                      ORT format, made by ONNX Runtime itself
             required_operators.config      the ops (and, asked for, their types) a minimal
                                            ORT build needs: --include_ops_by_config
             usability.txt                  ONNX Runtime's mobile usability analysis (NNAPI, CoreML)
             manifest.json                  versions, opsets, inputs/outputs, sha256 of each file,
                                            the optimization, the usability data, the verification

Each part is ONNX Runtime's own tooling, called as its scripts call it but with nothing printed:
the ``.ort`` file is written by an ``InferenceSession`` with ``session.save_model_format=ORT``
(``onnxruntime.tools.convert_onnx_models_to_ort``'s options: the NCHWc transformer left out unless
the target is amd64, saved runtime optimizations for the ``runtime`` style); the config is read
back from the ``.ort`` file by ``onnxruntime.tools.ort_format_model`` and written in
``create_reduced_build_config.py``'s format; the usability analysis runs
``onnxruntime.tools.mobile_helpers.usability_checker``'s checks on the model optimized at the basic
level, as ``check_onnx_model_mobile_usability`` does, its log captured as text.

The ``.ort`` file is then loaded in ONNX Runtime as an app loads it and run on the same inputs
(given samples, else random inputs that fit the input specs) as the source model, which ONNX
Runtime runs with the graph optimizations the file carries; outputs must agree within
:mod:`ferry.parity`'s tolerance. How far those optimizations moved the outputs from the model as
written (a fused int8 op rounds to the neighbouring quantization step) is measured and reported.
Everything is written into a temporary folder beside ``output_dir`` and moved into place only once
verified: a failed export leaves ``output_dir`` as it was.

This module converts, stages, writes the manifest and publishes; the config is
:mod:`ferry.mobile._ort_config`'s, the usability check :mod:`ferry.mobile._ort_usability`'s and
the verification :mod:`ferry.mobile._ort_verify`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
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
import onnx_ir as ir

from ferry._folders import staging_dir
from ferry._version import __version__
from ferry.backends import ORT_SILENT, ort_error_message, unknown_ops
from ferry.errors import (
    ConversionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import dtype_name, graph_inputs, load_model, model_source_path, save_model
from ferry.mobile._ort_config import ort_format_version, ort_version, reduced_build_config
from ferry.mobile._ort_usability import (
    EpUsability,
    UsabilityReport,
    check_usability,
    usability_text,
)
from ferry.mobile._ort_verify import (
    OrtRun,
    OrtVerification,
    ort_session,
    verification_feeds,
    verify_ort_file,
)
from ferry.parity import Tolerance
from ferry.runtime import spec_of

__all__ = [
    "LEVELS",
    "OPTIMIZATIONS",
    "TARGET_PLATFORMS",
    "EpUsability",
    "OrtMobileExport",
    "OrtRun",
    "OrtVerification",
    "UsabilityReport",
    "export_ort_mobile",
]

logger = logging.getLogger(__name__)

#: ``fixed``: optimize fully, then save (for the CPU EP). ``runtime``: save the basic level and
#: record the other optimizations to replay at load time (for NNAPI/CoreML, which take an unknown
#: share of the nodes). ONNX Runtime's ``--optimization_style``.
OPTIMIZATIONS = ("fixed", "runtime")
#: ONNX Runtime's graph optimization levels.
LEVELS = ("disable", "basic", "extended", "layout", "all")
#: ``arm``: allow int8 QDQ fusions (ARM has fast int8 kernels); ``amd64``: keep the NCHWc layout
#: transformer, which makes an x86-only model. ``None``: a model for any CPU, as ONNX Runtime's tool.
TARGET_PLATFORMS = ("arm", "amd64")

MODEL_FILE = "model.ort"
MANIFEST_FILE = "manifest.json"
USABILITY_FILE = "usability.txt"
#: ONNX Runtime's names for the reduced-build config, without and with type information.
CONFIG_FILES = {False: "required_operators.config", True: "required_operators_and_types.config"}

_LEVEL_ENUM = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
_CPU = ["CPUExecutionProvider"]
# Domains beyond ONNX's whose ops the conversion takes as ONNX Runtime's own (contrib ops, layouts).
_ORT_DOMAINS = {"com.microsoft", "com.microsoft.nchwc"}


# ---------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class OrtMobileExport:
    """What :func:`export_ort_mobile` wrote.

    Attributes:
        output_dir: the folder.
        files: each file by role (``model``, ``config``, ``usability``, ``manifest``).
        manifest: the content of ``manifest.json``.
        usability: ONNX Runtime's mobile usability check.
        verification: the ``.ort`` file against the source model; None when ``verify=False``.
        required_operators: ``{domain: {since_version: (op, ...)}}``, as in the config file.
    """

    output_dir: Path
    files: Mapping[str, Path]
    manifest: Mapping[str, Any]
    usability: UsabilityReport
    verification: OrtVerification | None
    required_operators: Mapping[str, Mapping[int, tuple[str, ...]]]

    @property
    def model_path(self) -> Path:
        return self.files["model"]

    def lines(self) -> list[str]:
        """The export in words, for the CLI."""
        opt = self.manifest["optimization"]
        ops = sum(
            len(v) for by_opset in self.required_operators.values() for v in by_opset.values()
        )
        out = [f"wrote {self.output_dir}:"]
        for role, path in self.files.items():
            size = self.manifest["files"].get(path.name, {}).get("bytes")
            detail = {
                "model": f"ORT format v{self.manifest['ort_format_version']}, {opt['style']} "
                f"optimization, level {opt['level']}",
                "config": f"{ops} op(s) in {len(self.required_operators)} domain(s), "
                + ("with types" if opt["type_reduction"] else "without types"),
                "usability": "ONNX Runtime's mobile usability analysis",
                "manifest": "versions, inputs/outputs, sha256 of each file",
            }[role]
            sized = f" ({_size(size)})" if size is not None else ""
            out.append(f"  {path.name}{sized}: {detail}")
        out.append(
            self.verification.summary()
            if self.verification is not None
            else "not verified (verify=False)"
        )
        out.append(self.usability.summary())
        return out


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n} bytes"


# ---------------------------------------------------------------------------------------------
# The export


def export_ort_mobile(
    model: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    output_dir: str | os.PathLike[str],
    *,
    optimization: str = "fixed",
    level: str = "all",
    target_platform: str | None = None,
    type_reduction: bool = False,
    samples: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    tolerance: Tolerance | None = None,
    verify: bool = True,
    overwrite: bool = False,
) -> OrtMobileExport:
    """Export ``model`` for ONNX Runtime Mobile into ``output_dir``, verified.

    Args:
        model: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or a ModelProto.
        output_dir: the folder to write; it must not exist or be empty, unless ``overwrite``.
        optimization: ``fixed`` (optimize now; for the CPU EP) or ``runtime`` (save basic
            optimizations, replay the rest at load time; for NNAPI/CoreML).
        level: ONNX Runtime's optimization level (``disable``, ``basic``, ``extended``,
            ``layout``, ``all``).
        target_platform: ``arm``, ``amd64`` or None (any CPU).
        type_reduction: list the types each op needs in the config, so that a minimal build
            (``--enable_reduced_operator_type_support``) keeps only those kernels.
        samples: inputs to verify on: one ``{name: array}`` or a list of them. None: random
            inputs that fit the input specs (``shapes`` sizes their symbolic dims).
        shapes: sizes for the generated inputs, ``{name: shape}``.
        tolerance: ``(atol, rtol)`` for every output; None: :mod:`ferry.parity`'s per dtype.
        verify: run the ``.ort`` file against the source model (and fail if they differ).
        overwrite: allow a non-empty ``output_dir``: the files written replace those of the same
            name, and files a previous export listed in its manifest are removed; others stay.

    Returns:
        What was written, with the manifest, the usability check and the verification.

    Raises:
        InvalidInputError: an unknown option, a bad sample, or ``output_dir`` not empty.
        ModelLoadError: the model cannot be read, or ONNX Runtime cannot load it.
        UnsupportedOpError: the model uses ops ONNX Runtime does not implement.
        ExecutionError: the source model fails on the verification inputs.
        ConversionError: the conversion failed, or the ``.ort`` file computes something else.
    """
    _check_choice("optimization", optimization, OPTIMIZATIONS)
    _check_choice("level", level, LEVELS)
    if target_platform is not None:
        _check_choice("target_platform", target_platform, TARGET_PLATFORMS)
    out = Path(output_dir)
    _check_output_dir(out, overwrite)
    loaded = load_model(model)
    source_file = (
        model_source_path(loaded) if not isinstance(model, (ir.Model, onnx.ModelProto)) else None
    )
    if source_file is not None:
        _refuse_own_file(source_file, out)
    options = _Options(optimization, level, target_platform, type_reduction)
    # Inputs first: a wrong sample is the user's to fix before any time goes into converting.
    specs = [spec_of(v) for v in graph_inputs(loaded)]
    feeds = verification_feeds(specs, samples, shapes, model=loaded) if verify else None
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-ort-")))
        source = source_file or save_model(loaded, scratch / "source.onnx")
        staging = staging_dir(out)
        stack.callback(shutil.rmtree, staging, ignore_errors=True)
        ort_file = staging / MODEL_FILE
        _convert(loaded, source, ort_file, options, runtime_replay=options.style == "runtime")
        config_models = [ort_file]
        if options.style == "runtime":
            # Runtime optimizations may not be applied on the device (a compiling EP takes their
            # nodes), so the config must cover the model both with and without them, as ORT's
            # own tool does it.
            plain = scratch / "without_runtime_opt.ort"
            _convert(loaded, source, plain, options, runtime_replay=False)
            config_models.append(plain)
        required, config_text = reduced_build_config(
            config_models,
            model_name=MODEL_FILE,
            style=options.style,
            level=options.level,
            type_reduction=options.type_reduction,
        )
        config_file = staging / CONFIG_FILES[type_reduction]
        config_file.write_text(config_text, encoding="utf-8")
        usability = check_usability(source, scratch, _session_options(level="basic"))
        (staging / USABILITY_FILE).write_text(usability_text(usability), encoding="utf-8")
        verification = None
        if feeds is not None:
            verification = verify_ort_file(
                source,
                ort_file,
                style=options.style,
                level=options.level,
                graph_options=options.at_level,
                feeds=feeds,
                tolerance=tolerance,
            )
            if not verification.passed:
                raise ConversionError(
                    f"the ORT format model does not compute what the source does, so nothing was "
                    f"written to {out}: {verification.summary()}"
                )
        manifest = _manifest(loaded, source_file, ort_file, staging, options, required)
        manifest["usability"] = usability.to_dict()
        manifest["verification"] = verification.to_dict() if verification is not None else None
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
        names = {
            "model": MODEL_FILE,
            "config": config_file.name,
            "usability": USABILITY_FILE,
            "manifest": MANIFEST_FILE,
        }
        _publish(staging, out, list(names.values()))
    logger.info("exported %s for ONNX Runtime Mobile into %s", source_file or "the model", out)
    return OrtMobileExport(
        output_dir=out,
        files={role: out / name for role, name in names.items()},
        manifest=manifest,
        usability=usability,
        verification=verification,
        required_operators=required,
    )


@dataclasses.dataclass(frozen=True)
class _Options:
    style: str
    level: str
    target_platform: str | None
    type_reduction: bool

    @property
    def disabled_optimizers(self) -> list[str]:
        return _disabled_optimizers(self.level, self.target_platform)

    def at_level(self, level: str, minimal_build: str | None) -> tuple[Any, list[str]]:
        """The session options and disabled optimizers with which ONNX Runtime optimizes the
        graph at ``level`` as this conversion does (what the verification's references run)."""
        return (
            _graph_options(self, level=level, minimal_build=minimal_build),
            _disabled_optimizers(level, self.target_platform),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "style": self.style,
            "level": self.level,
            "target_platform": self.target_platform,
            "disabled_optimizers": self.disabled_optimizers,
            "type_reduction": self.type_reduction,
        }


def _disabled_optimizers(level: str, target_platform: str | None) -> list[str]:
    # NCHWc blocks the layout for x86 SIMD: a model that runs nowhere else. ORT's tool leaves the
    # transformer out unless told the target is amd64.
    if level in ("layout", "all") and target_platform != "amd64":
        return ["NchwcTransformer"]
    return []


def _check_choice(name: str, value: Any, known: Sequence[str]) -> None:
    if value not in known:
        raise InvalidInputError(
            f"unknown {name} {value!r} for the ort-mobile export; known: {', '.join(known)}"
        )


def _check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"output {out} is a file; the ort-mobile export writes a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise InvalidInputError(
            f"output folder {out} is not empty; choose a new folder, or pass overwrite=True "
            "(--overwrite) to replace the files of a previous export there"
        )


def _refuse_own_file(source: Path, out: Path) -> None:
    ours = {MODEL_FILE, MANIFEST_FILE, USABILITY_FILE, *CONFIG_FILES.values()}
    if source.resolve().parent == out.resolve() and source.name in ours:
        raise InvalidInputError(
            f"the model {source} would be overwritten by the export into {out}; "
            "export into another folder"
        )


def _publish(staging: Path, out: Path, names: list[str]) -> None:
    """Move the staged files into ``out``: the whole folder by one rename when ``out`` is new,
    else file by file (an existing folder keeps its own permissions)."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(out)
        return
    stale = _previous_files(out) - set(names)
    for name in names:  # the manifest last: it describes the files beside it
        (staging / name).replace(out / name)
    for name in stale:
        (out / name).unlink(missing_ok=True)


def _previous_files(out: Path) -> set[str]:
    """The files an earlier export's manifest lists (only plain names inside ``out``)."""
    try:
        manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
        names = set(manifest.get("files", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return set()
    return {n for n in names if isinstance(n, str) and n == Path(n).name and n != MANIFEST_FILE}


# ---------------------------------------------------------------------------------------------
# Conversion


def _session_options(*, level: str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_ENUM[level])
    so.log_severity_level = ORT_SILENT
    return so


def _graph_options(options: _Options, *, level: str, minimal_build: str | None) -> Any:
    """Session options that optimize the graph as the ORT format conversion does."""
    so = _session_options(level=level)
    # Int8 QDQ fusions pay only where int8 kernels are fast (ARM); ORT's tool allows them there.
    so.add_session_config_entry(
        "session.qdqisint8allowed", "1" if options.target_platform == "arm" else "0"
    )
    if minimal_build is not None:
        so.add_session_config_entry("optimization.minimal_build_optimizations", minimal_build)
    return so


def _convert(
    model: ir.Model, source: Path, dest: Path, options: _Options, *, runtime_replay: bool
) -> None:
    """Write ``source`` as an ORT format model to ``dest`` (ORT's converter, quietly).

    ``runtime_replay``: the ``runtime`` style's model, with runtime optimizations saved; without
    it, a ``runtime`` style conversion applies only what a minimal build can replay.
    """
    import onnxruntime as ort

    minimal_build = None
    if options.style == "runtime":
        minimal_build = "save" if runtime_replay else "apply"
    so = _graph_options(options, level=options.level, minimal_build=minimal_build)
    so.optimized_model_filepath = str(dest)
    so.add_session_config_entry("session.save_model_format", "ORT")
    try:
        ort.InferenceSession(
            str(source), so, providers=_CPU, disabled_optimizers=options.disabled_optimizers
        )
    except Exception as e:  # ORT raises its own types from C++; translate them all
        raise _conversion_error(model, source, options, e) from e
    if not dest.is_file() or dest.stat().st_size == 0:
        raise ConversionError(
            f"onnxruntime {ort.__version__} loaded the model but wrote no ORT format file; "
            "this onnxruntime build may lack ORT format support (a minimal build cannot convert)"
        )


def _conversion_error(
    model: ir.Model, source: Path, options: _Options, e: BaseException
) -> FerryError:
    """Why ONNX Runtime could not convert: ops it does not implement (all of them), a model it
    cannot load at all, or a failure of the conversion itself (in ONNX Runtime's words)."""
    import onnxruntime as ort

    unknown = unknown_ops(model, _ORT_DOMAINS)
    if unknown:
        listing = ", ".join(f"{op} (node {name!r})" for op, name in unknown[:8])
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        return UnsupportedOpError(
            f"onnxruntime cannot convert the model to ORT format: it does not implement "
            f"{listing}{more}. Replace those ops with standard ONNX ones (ORT Mobile cannot load "
            "custom op libraries into a minimal build)",
            ops=unknown,
        )
    try:  # can ORT load the model at all, without writing the ORT format?
        ort.InferenceSession(str(source), _session_options(level="disable"), providers=_CPU)
    except Exception as load_error:
        return ModelLoadError(f"onnxruntime cannot load the model: {ort_error_message(load_error)}")
    hint = ""
    if options.style == "runtime":
        hint = "; the fixed optimization style (saving no runtime optimizations) may convert it"
    elif options.level != "disable":
        hint = "; a lower optimization level (level='basic' or 'disable') may convert it"
    return ConversionError(
        f"onnxruntime {ort.__version__} loads the model but fails to convert it to ORT format "
        f"({options.style} optimization, level {options.level}): {ort_error_message(e)}{hint}"
    )


# ---------------------------------------------------------------------------------------------
# The manifest


def _manifest(
    model: ir.Model,
    source_file: Path | None,
    ort_file: Path,
    staging: Path,
    options: _Options,
    required: Mapping[str, Mapping[int, tuple[str, ...]]],
) -> dict[str, Any]:
    session = ort_session(ort_file, replay=False)
    source: dict[str, Any] = {
        "file": source_file.name if source_file is not None else None,
        "sha256": _sha256(source_file) if source_file is not None else None,
        "ir_version": model.ir_version,
        "producer": model.producer_name,
    }
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(staging.iterdir())
        if p.is_file() and p.name != MANIFEST_FILE
    }
    return {
        "format": "ferry ort-mobile export",
        "ferry_version": __version__,
        "onnxruntime_version": ort_version(),
        "ort_format_version": ort_format_version(ort_file),
        "opset_imports": {d or "ai.onnx": v for d, v in sorted(model.opset_imports.items())},
        "source": source,
        "optimization": options.to_dict(),
        "inputs": [_io(v) for v in session.get_inputs()],
        "outputs": [_io(v) for v in session.get_outputs()],
        "files": files,
        "required_operators": {
            d: {str(opset): list(ops) for opset, ops in by.items()} for d, by in required.items()
        },
    }


def _io(arg: Any) -> dict[str, Any]:
    """An ORT NodeArg as ``{"name", "shape", "dtype"}``: symbolic dims by name, unknown ones None."""
    kind = str(arg.type)
    dtype = kind
    match = re.fullmatch(r"tensor\((\w+)\)", kind)
    if match:
        try:
            dtype = dtype_name(ir.DataType[match.group(1).upper()])
        except KeyError:
            dtype = match.group(1)
    shape = arg.shape
    return {
        "name": arg.name,
        "shape": None
        if shape is None
        else [d if isinstance(d, (int, str)) else None for d in shape],
        "dtype": dtype,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
