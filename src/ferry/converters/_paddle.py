"""PaddlePaddle -> the unified graph, through paddle2onnx run in a Python process of its own.

Before -> After::

    inference model (inference.json + inference.pdiparams, Paddle 3's PIR program; or the legacy
    inference.pdmodel + inference.pdiparams), a folder holding one, or a paddle.nn.Layer
        -> ir.Model, inputs named as the program's feeds, outputs in its fetch order, the leading
           open dim of each input named ``batch``

Why a separate process: paddle2onnx 2.1 pins ``onnx<=1.17`` (older than ferry's), its C++ core
*aborts the process* on an op it cannot convert, and it writes a broken model rather than failing
when the weights file is truncated. So ferry never imports it: a small worker script
(``_paddle_worker.py``, copied as text) runs in the Python that has Paddle and paddle2onnx, and the
two exchange files in a temporary folder. That Python is, in order:

1. ``$FERRY_PADDLE_PYTHON``;
2. this interpreter, when both ``paddle`` and ``paddle2onnx`` are importable here;
3. ``${XDG_DATA_HOME:-~/.local/share}/ferry/paddle-venv`` (what ``scripts/setup-paddle.sh``
   creates: ``paddlepaddle==3.3.1``, ``paddle2onnx==2.1.0``).

The worker first loads the model with Paddle itself (which catches a missing or corrupt
``.pdiparams`` with Paddle's own message) and lists the program's ops against paddle2onnx's
registry of convertible ops (paddle2onnx 2.x no longer prints which ops it lacks before it aborts),
then converts. The reference runs the inference model with ``paddle.inference`` in the same
Python, without Paddle's graph optimizations and with Paddle's own CPU kernels (not oneDNN's), so
it is the program as written; an in-memory Layer is its own reference, run in this process in
eval mode.

Where paddle2onnx 2.1 and the Paddle beside it disagree, ferry mends the two known classes of
failure on the way: attributes Paddle 3.3 writes in a newer type are written back in the old one
before paddle2onnx reads the program (the worker's ``program_for_p2o``), and the 0-D scalars
paddle2onnx makes of a legacy program's one-element shape tensors are made one-element vectors
again where ONNX demands them (:class:`VectorOperandsPass`).

This module holds the converter, finding a program's files and converting them; beside it,
``_paddle_process`` finds the Python that runs Paddle and runs the worker (``_paddle_worker.py``)
there, ``_paddle_fixups`` mends paddle2onnx's output and the model's interface, and
``_paddle_layer`` traces and runs a ``paddle.nn.Layer`` in this process.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    ReferenceFn,
    describe_feeds,
    exporter_opset,
    list_ops,
    require_inputs,
    type_modules,
)
from ferry.converters._paddle_fixups import (
    VectorOperandsPass,
    _by_output_name,
    _fix_interface,
    _name_outputs,
    _sample_inputs,
)
from ferry.converters._paddle_layer import (
    _eval_mode,
    _import_paddle,
    _layer_inputs,
    _layer_reference,
    _short,
    _spec_text,
    _symbolic_shapes,
)
from ferry.converters._paddle_process import (
    _WORKER_CODES,
    _exit_text,
    _log_reason,
    _paddle_python,
    _run_worker,
    _setup_hint,
)
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    ModelLoadError,
    UnsupportedOpError,
)

__all__ = ["DEFAULT_OPSET", "PaddleConverter"]

logger = logging.getLogger(__name__)

#: The default-domain opset paddle2onnx is asked for when the user names none.
DEFAULT_OPSET = 17
# paddle2onnx 2.1 writes opsets 7..21; a newer one is reached by ferry's opset conversion.
_P2O_MIN_OPSET = 7
_P2O_MAX_OPSET = 21
_PARAMS_SUFFIX = ".pdiparams"
_LEGACY_SUFFIX = ".pdmodel"
_PIR_SUFFIX = ".json"


class PaddleConverter:
    """Paddle inference models (PIR ``.json`` or legacy ``.pdmodel``, each with its
    ``.pdiparams``) and ``paddle.nn.Layer`` objects, converted with paddle2onnx."""

    name = "paddle"
    extra = "paddle"
    suffixes = (_LEGACY_SUFFIX, _PIR_SUFFIX)

    def sniff(self, path: Path) -> bool:
        """A ``.pdmodel`` file, a ``.json`` file holding a Paddle PIR program, a ``.pdiparams``
        file beside one of those, or a folder holding one of them."""
        path = Path(path)
        if path.is_dir():
            return bool(_programs_in(path))
        if not path.is_file():
            return False
        suffix = path.suffix.lower()
        if suffix == _LEGACY_SUFFIX:
            return True
        if suffix == _PIR_SUFFIX:
            return _is_pir_json(path)
        if suffix == _PARAMS_SUFFIX:
            return _program_for_params(path) is not None
        return False

    def accepts(self, obj: object) -> bool:
        """A ``paddle.nn.Layer`` (by its class hierarchy; imports nothing)."""
        if "paddle" not in type_modules(obj):
            return False
        return any(
            cls.__name__ == "Layer" and cls.__module__.startswith("paddle.")
            for cls in type(obj).__mro__
        )

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert an inference model (file or folder) or a ``paddle.nn.Layer``.

        Raises:
            BackendUnavailableError: no Python with Paddle and paddle2onnx was found (or, for a
                Layer, Paddle is not importable here).
            ModelLoadError: the files are missing, not a Paddle program, or the weights are
                missing or corrupt.
            InvalidInputError: input shapes, dynamic axes or example inputs do not fit the model.
            UnsupportedOpError: ops paddle2onnx cannot convert, every one of them.
            ConversionError: paddle2onnx failed otherwise.
        """
        if isinstance(source, (str, os.PathLike)):
            model_file, params_file = _resolve_files(Path(source))
            return _convert_files(model_file, params_file, options)
        if self.accepts(source):
            return _convert_layer(source, options)
        raise ConversionError(
            f"the paddle converter cannot convert a {type(source).__name__}; pass a "
            "paddle.nn.Layer, or the path of an inference model (.json or .pdmodel, with its "
            ".pdiparams)"
        )


# --- finding the files -----------------------------------------------------------------------


def _is_pir_json(path: Path) -> bool:
    """Paddle's PIR programs open with ``{"base_code":{"magic":"pir",...``."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"base_code"' in head and re.search(rb'"magic"\s*:\s*"pir"', head) is not None


def _is_program(path: Path) -> bool:
    suffix = path.suffix.lower()
    return path.is_file() and (
        suffix == _LEGACY_SUFFIX or (suffix == _PIR_SUFFIX and _is_pir_json(path))
    )


def _programs_in(folder: Path) -> list[Path]:
    """The program files directly in ``folder``; where a stem has both formats, the PIR one."""
    by_stem: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if not _is_program(path):
            continue
        have = by_stem.get(path.stem)
        if have is None or path.suffix.lower() == _PIR_SUFFIX:
            by_stem[path.stem] = path
    return list(by_stem.values())


def _program_for_params(params: Path) -> Path | None:
    for suffix in (_PIR_SUFFIX, _LEGACY_SUFFIX):
        candidate = params.with_suffix(suffix)
        if _is_program(candidate):
            return candidate
    return None


def _resolve_files(path: Path) -> tuple[Path, Path]:
    """The program file and its weights file (which may not exist: a model without weights)."""
    if path.is_dir():
        found = _programs_in(path)
        if not found:
            raise ModelLoadError(
                f"{path} holds no Paddle inference model: expected NAME.json (Paddle 3) or "
                "NAME.pdmodel, each with NAME.pdiparams"
            )
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ModelLoadError(
                f"{path} holds several Paddle programs ({names}); pass the one to convert"
            )
        model_file = found[0]
    elif not path.exists():
        raise ModelLoadError(f"Paddle model not found: {path}")
    elif path.suffix.lower() == _PARAMS_SUFFIX:
        program = _program_for_params(path)
        if program is None:
            raise ModelLoadError(
                f"{path} holds only weights; its program ({path.stem}.json or "
                f"{path.stem}.pdmodel) is not beside it"
            )
        model_file = program
    elif path.suffix.lower() == _PIR_SUFFIX and not _is_pir_json(path):
        raise ModelLoadError(
            f"{path} is not a Paddle program: Paddle's .json programs begin with "
            '{"base_code":{"magic":"pir",...}'
        )
    else:
        model_file = path
    if model_file.stat().st_size == 0:
        raise ModelLoadError(f"{model_file} is empty (0 bytes); was it written completely?")
    # The worker runs in a temporary folder: relative paths would point there.
    model_file = model_file.resolve()
    return model_file, model_file.with_suffix(_PARAMS_SUFFIX)


# --- converting files ------------------------------------------------------------------------


def _convert_files(
    model_file: Path,
    params_file: Path,
    options: ConvertOptions,
    *,
    label: str | None = None,
    run_files: bool = True,
    notes: list[str] | None = None,
) -> Converted:
    """Convert a program file; with ``run_files`` the reference runs it with Paddle (else the
    caller sets one)."""
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    label = label or str(model_file)
    notes = list(notes or [])
    python = _paddle_python()
    opset = DEFAULT_OPSET
    if options.opset is not None:
        opset = exporter_opset(
            options.opset,
            notes,
            exporter="paddle2onnx",
            oldest=_P2O_MIN_OPSET,
            newest=_P2O_MAX_OPSET,
        )
    with tempfile.TemporaryDirectory(prefix="ferry-paddle-") as tmp:
        work = Path(tmp)
        out = work / "model.onnx"
        request = {
            "action": "export",
            "model": str(model_file),
            "params": str(params_file) if params_file.is_file() else "",
            "opset": opset,
            "out": str(out),
        }
        code, report, log = _run_worker(python, request, work)
        _raise_for_export(code, report, log, label, model_file, params_file, python)
        try:
            model = ir.load(out)
        except Exception as e:  # whatever paddle2onnx wrote does not parse
            raise ConversionError(
                f"paddle2onnx wrote an unreadable model for {label}: {e}; {_log_reason(log)}"
            ) from e
    logger.debug("paddle2onnx log for %s:\n%s", label, log)
    if report.get("rewritten"):
        logger.info(
            "%s: float64 attribute lists given to paddle2onnx as float32: %s",
            label,
            ", ".join(sorted(set(report["rewritten"]))),
        )
    # On paddle2onnx's graph as it wrote it: weights still in Constant nodes.
    VectorOperandsPass()(model)
    _name_outputs(model, report.get("fetch_names"), label)

    reached = model.opset_imports.get("", opset)
    if reached > opset:
        notes.append(
            f"paddle2onnx needed opset {reached} for some op (asked for {opset}); "
            "ferry converts it to the requested opset if one was given"
        )
    # paddle2onnx writes weights as Constant nodes; as initializers they are what every tool
    # (and ferry's own summaries and external-data saving) counts as parameters.
    LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=2)(model)
    model.producer_name = "paddle2onnx"
    model.producer_version = str(report.get("paddle2onnx_version", ""))
    _fix_interface(model, options)
    sample = _sample_inputs(model, options.example_inputs, notes)
    reference = (
        _file_reference(python, model_file, params_file, model, label) if run_files else None
    )
    return Converted(model=model, reference=reference, sample_inputs=sample, notes=notes)


def _raise_for_export(
    code: int,
    report: dict[str, Any],
    log: str,
    label: str,
    model_file: Path,
    params_file: Path,
    python: Path,
) -> None:
    error = report.get("error")
    if error == "missing":
        raise BackendUnavailableError(
            f"{python} cannot import {report.get('module')} ({report.get('message')}); "
            f"{_setup_hint()}"
        )
    if error == "load":
        message = str(report.get("message") or "").rstrip(".")
        about_weights = any(
            word in message.lower() for word in (_PARAMS_SUFFIX, "param", "tensor", "loadcombine")
        )
        if about_weights and not params_file.is_file():
            hint = f"; its weights file {params_file.name} is missing: copy it beside the program"
        elif about_weights:
            hint = f"; {params_file.name} may be truncated or not belong to this program"
        else:
            hint = f"; {model_file.name} may be truncated or not a Paddle inference program"
        raise ModelLoadError(f"Paddle cannot load {label}: {message}{hint}")
    if code == 0 and report.get("ok"):
        return
    unsupported = [tuple(op) for op in report.get("unsupported") or []]
    if unsupported and ("unsupported" in log.lower() or "not supported" in log.lower()):
        ops = [(str(op), str(node)) for op, node in unsupported]
        version = report.get("paddle2onnx_version", "")
        raise UnsupportedOpError(
            f"paddle2onnx {version} cannot convert {len({op for op, _ in ops})} op type(s) in "
            f"{label} ({len(ops)} node(s)): {list_ops(ops)}; replace them in the model (or export the "
            "layer without them), or convert with a newer paddle2onnx",
            ops=ops,
        )
    if error == "export" and report.get("message"):
        reason = str(report["message"])
    else:
        reason = _log_reason(log)
    if code not in _WORKER_CODES:
        reason += f" ({_exit_text(code)})"
    raise ConversionError(f"paddle2onnx failed to convert {label}: {reason}")


# --- the reference ---------------------------------------------------------------------------


def _file_reference(
    python: Path, model_file: Path, params_file: Path, model: Any, label: str
) -> ReferenceFn:
    """Runs the inference model with paddle.inference in the worker."""
    input_names = [v.name for v in model.graph.inputs]
    output_names = [v.name for v in model.graph.outputs]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, input_names, label)
        with tempfile.TemporaryDirectory(prefix="ferry-paddle-") as tmp:
            work = Path(tmp)
            arrays: dict[str, Any] = {n: np.asarray(feeds[n]) for n in input_names}
            np.savez(work / "inputs.npz", **arrays)
            request = {
                "action": "run",
                "model": str(model_file),
                "params": str(params_file) if params_file.is_file() else "",
                "inputs": str(work / "inputs.npz"),
                "out": str(work / "outputs.npz"),
            }
            code, report, log = _run_worker(python, request, work)
            if report.get("error") == "missing":
                raise BackendUnavailableError(
                    f"{python} cannot import {report.get('module')}; {_setup_hint()}"
                )
            if code != 0 or not report.get("ok"):
                reason = str(report.get("message") or _log_reason(log))
                raise ExecutionError(
                    f"Paddle failed to run {label} on inputs {describe_feeds(feeds)}: {reason}"
                )
            with np.load(work / "outputs.npz") as data:
                outputs = [np.array(data[f"out{i}"]) for i in range(int(report["count"]))]
        return _by_output_name(outputs, output_names, label)

    return reference


# --- paddle.nn.Layer -------------------------------------------------------------------------


def _convert_layer(layer: Any, options: ConvertOptions) -> Converted:
    paddle = _import_paddle()
    label = f"{type(layer).__name__} (paddle.nn.Layer)"
    notes: list[str] = []
    names, dtypes, shapes, examples = _layer_inputs(layer, options, label)
    specs = [
        # InputSpec rewrites the list it is given (None -> -1): give it a copy.
        paddle.static.InputSpec(shape=list(shape), dtype=dtype, name=name)
        for name, dtype, shape in zip(names, dtypes, shapes)
    ]
    _paddle_python()  # fail before tracing when paddle2onnx cannot run anyway
    with tempfile.TemporaryDirectory(prefix="ferry-paddle-layer-") as tmp:
        prefix = Path(tmp) / "model"
        with _eval_mode(layer):
            try:
                paddle.jit.save(layer, str(prefix), input_spec=specs)
            except Exception as e:  # the layer's own code, or dy2static, failing to trace
                raise ConversionError(
                    f"paddle.jit.save cannot trace {label} for inputs "
                    f"{_spec_text(names, dtypes, shapes)}: {type(e).__name__}: {_short(e)}; "
                    "pass example_inputs (or input_shapes) the layer accepts"
                ) from e
        model_file = next(
            (
                p
                for p in (prefix.with_suffix(_PIR_SUFFIX), prefix.with_suffix(_LEGACY_SUFFIX))
                if p.is_file()
            ),
            None,
        )
        if model_file is None:
            raise ConversionError(f"paddle.jit.save wrote no program for {label} in {tmp}")
        if getattr(layer, "training", False):
            notes.append(f"{label} was converted (and is verified) in eval mode")
        converted = _convert_files(
            model_file,
            prefix.with_suffix(_PARAMS_SUFFIX),
            ConvertOptions(
                example_inputs=examples,
                input_shapes=_symbolic_shapes(names, shapes, options),
                opset=options.opset,
            ),
            label=label,
            run_files=False,  # the files are gone by then; the layer itself is the reference
            notes=notes,
        )
    converted.reference = _layer_reference(paddle, layer, names, converted.model, label)
    return converted
