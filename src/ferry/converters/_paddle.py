"""PaddlePaddle -> the unified graph, through paddle2onnx run in a Python process of its own.

Before -> After::

    inference model (inference.json + inference.pdiparams, Paddle 3's PIR program; or the legacy
    inference.pdmodel + inference.pdiparams), a folder holding one, or a paddle.nn.Layer
        -> ir.Model, inputs named as the program's feeds, outputs in its fetch order, the leading
           open dim of each input named ``batch``

Why a separate process: paddle2onnx 2.1 pins ``onnx<=1.17`` (older than ferry's), its C++ core
*aborts the process* on an op it cannot convert, and it writes a broken model rather than failing
when the weights file is truncated. So ferry never imports it: a small worker script (below, as
text) runs in the Python that has Paddle and paddle2onnx, and the two exchange files in a
temporary folder. That Python is, in order:

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
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.converters._base import (
    DEFAULT_BATCH,
    Converted,
    ConvertOptions,
    ReferenceFn,
    as_array,
    check_input_options,
    describe_feeds,
    example_items,
    exporter_opset,
    first_line,
    list_ops,
    name_examples,
    require_inputs,
    strip_colors,
    type_modules,
)
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import infer_value_types

__all__ = [
    "DEFAULT_OPSET",
    "PADDLE_PYTHON_ENV",
    "PaddleConverter",
    "VectorOperandsPass",
    "default_paddle_venv",
    "find_paddle_python",
]

logger = logging.getLogger(__name__)

#: The default-domain opset paddle2onnx is asked for when the user names none.
DEFAULT_OPSET = 17
#: The environment variable naming the Python that has ``paddle`` and ``paddle2onnx``.
PADDLE_PYTHON_ENV = "FERRY_PADDLE_PYTHON"

# paddle2onnx 2.1 writes opsets 7..21; a newer one is reached by ferry's opset conversion.
_P2O_MIN_OPSET = 7
_P2O_MAX_OPSET = 21
_PARAMS_SUFFIX = ".pdiparams"
_LEGACY_SUFFIX = ".pdmodel"
_PIR_SUFFIX = ".json"
# How paddle2onnx names the dims it knows nothing about.
_P2O_DIM = re.compile(r"DynamicDimension\.\d+")
# The worker's own exit codes (0 ok, 3 missing module, 4 load, 5 export, 6 run, 7 internal).
_WORKER_CODES = frozenset({0, 3, 4, 5, 6, 7})

_SETUP = (
    "paddle2onnx pins onnx<=1.17, so ferry runs it in a Python environment of its own: run "
    "scripts/setup-paddle.sh from a ferry checkout, or `python -m venv DIR && DIR/bin/pip install "
    "paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging`, then set "
    f"{PADDLE_PYTHON_ENV}=DIR/bin/python (the default DIR is {{default}})"
)


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


# --- finding the Python that runs Paddle -----------------------------------------------------


def default_paddle_venv() -> Path:
    """Where ``scripts/setup-paddle.sh`` puts the Paddle environment unless told otherwise."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ferry" / "paddle-venv"


def find_paddle_python() -> Path | None:
    """The Python to run Paddle and paddle2onnx in, or None when there is none.

    ``$FERRY_PADDLE_PYTHON`` wins; then this interpreter if it can import both; then the default
    environment (:func:`default_paddle_venv`). Nothing is imported to decide.
    """
    named = os.environ.get(PADDLE_PYTHON_ENV)
    if named:
        return Path(named)
    if _importable("paddle") and _importable("paddle2onnx"):
        return Path(sys.executable)
    venv = default_paddle_venv()
    for candidate in (venv / "bin" / "python", venv / "Scripts" / "python.exe"):
        if candidate.is_file():
            return candidate
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _paddle_python() -> Path:
    python = find_paddle_python()
    if python is None:
        raise BackendUnavailableError(
            "converting PaddlePaddle models needs paddlepaddle and paddle2onnx, and no Python "
            f"with them was found; {_setup_hint()}"
        )
    if not python.is_file() or not os.access(python, os.X_OK):
        raise BackendUnavailableError(
            f"{PADDLE_PYTHON_ENV}={python} is not an executable Python; {_setup_hint()}"
        )
    return python


def _setup_hint() -> str:
    return _SETUP.format(default=default_paddle_venv())


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


def _exit_text(code: int) -> str:
    """How the worker process ended, from ``subprocess``'s return code.

    The worker is started directly, not through a shell: a negative code is the signal that
    killed it (paddle2onnx's C++ core aborts with SIGABRT), any other is its exit status
    (Python's ``sys.exit(-1)`` is 255, which is not "signal 127").
    """
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the converter process was killed by {name}"
    return f"the converter process exited with status {code}"


def _log_reason(log: str) -> str:
    """The lines of a worker's output that say what went wrong."""
    lines = [strip_colors(line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line]
    picked = [
        line
        for line in lines
        if "[ERROR]" in line
        or "not supported" in line
        or re.match(r"^(\w+Error|Error)\b", line)
        or line.startswith("(")
    ]
    if not picked:
        picked = lines[-3:]
    text = "; ".join(dict.fromkeys(picked[:4]))
    return text[:1000] or "no message (run with logging at DEBUG to see the converter's output)"


# --- repairing paddle2onnx's output ----------------------------------------------------------

# Operands ONNX requires to be 1-D (by input index): shapes, repeats, slice bounds, pads, sizes.
_VECTOR_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1,),
    "Resize": (1, 2, 3),
    "TopK": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
}


class VectorOperandsPass(ir.passes.InPlacePass):
    """Give ONNX the one-element vectors a legacy Paddle program had, where paddle2onnx made
    0-D scalars of them.

    Programs saved by Paddle before 2.5 have no 0-D tensors: an index or a slice that drops the
    only axis of a shape tensor (``x.shape[0]``) is a tensor of shape [1] there, and so is every
    ``fill_constant`` of a shape list. paddle2onnx 2.x, written for 0-D Paddle, squeezes the
    first to 0-D but keeps the second 1-D, so the ``Concat`` that assembles a new shape (every
    ``reshape`` with a computed dim) mixes ranks, and ONNX's checker and every runtime refuse the
    model ("All inputs to Concat must have same rank", "axis must be in [-rank, rank-1]"). A 0-D
    value where ONNX demands a 1-D one has a single reading, the one-element vector it was in
    Paddle, so the repair is exact.

    Before -> After::

        Concat(axis=0)(a: [1], s: [], b: [1])  ->  Concat(axis=0)(a, Reshape(s, [1]), b)
        Reshape(x, s: [])                       ->  Reshape(x, Reshape(s, [1]))
        (likewise the 1-D operands of Expand, Tile, ConstantOfShape, Slice, Pad, Resize, TopK,
        Squeeze and Unsqueeze)

    Ranks come from ONNX shape inference, which reads weights whether they are initializers or
    Constant nodes (paddle2onnx writes the latter). A value of unknown rank is left as it is; a
    Concat that also takes inputs of rank 2 or more is not this bug and is left to the checker.
    """

    _ROUNDS = 8  # each round can reveal ranks downstream of the Concats it mended

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for _ in range(self._ROUNDS):
            ranks = {
                name: len(shape)
                for name, (_, shape) in infer_value_types(model).items()
                if shape is not None
            }
            if not self._mend(model, ranks):
                break
            modified = True
        return ir.passes.PassResult(model, modified=modified)

    def _mend(self, model: ir.Model, ranks: dict[str, int]) -> bool:
        vectors: dict[tuple[int, ir.Value], ir.Value] = {}
        mended = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.domain not in ("", "ai.onnx") or node.graph is None:
                continue
            known = [None if v is None else ranks.get(v.name or "") for v in node.inputs]
            if node.op_type == "Concat":
                if any(r is not None and r > 1 for r in known):
                    continue
                positions = [i for i, r in enumerate(known) if r == 0]
            else:
                operands = _VECTOR_OPERANDS.get(node.op_type, ())
                positions = [i for i in operands if i < len(known) and known[i] == 0]
            for i in positions:
                value = node.inputs[i]
                if value is None:
                    continue
                # One vector per value and graph: a subgraph may not see its parent's later nodes.
                key = (id(node.graph), value)
                if key not in vectors:
                    vectors[key] = _as_vector(node, node.graph, value, len(vectors))
                node.replace_input_with(i, vectors[key])
                mended = True
        return mended


def _as_vector(consumer: ir.Node, graph: ir.Graph, value: ir.Value, serial: int) -> ir.Value:
    """A ``Reshape(value, [1])`` placed before ``consumer`` in ``graph``."""
    base = f"{value.name or 'scalar'}__vector{serial}"
    shape = ir.Node(
        "",
        "Constant",
        [],
        attributes=[ir.AttrTensor("value", ir.tensor(np.array([1], dtype=np.int64)))],
        name=f"{base}_shape",
    )
    shape.outputs[0].name = f"{base}_shape"
    shape.outputs[0].dtype = ir.DataType.INT64
    shape.outputs[0].shape = ir.Shape([1])
    reshape = ir.Node("", "Reshape", [value, shape.outputs[0]], name=base)
    out = reshape.outputs[0]
    out.name = base
    if value.dtype is not None:  # a value_info needs both; inference fills them in otherwise
        out.dtype = value.dtype
        out.shape = ir.Shape([1])
    graph.insert_before(consumer, [shape, reshape])
    return out


# --- the model's interface -------------------------------------------------------------------


def _fix_interface(model: Any, options: ConvertOptions) -> None:
    """Name open dims (``batch``, ``<input>_<axis>``), then apply input_shapes/dynamic_axes."""
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    check_input_options(options, list(inputs))

    for value in graph.inputs:
        if value.shape is None:
            continue
        value.shape = ir.Shape(
            [
                d if isinstance(d, int) else DEFAULT_BATCH if axis == 0 else f"{value.name}_{axis}"
                for axis, d in enumerate(value.shape.dims)
            ]
        )

    for name, shape in (options.input_shapes or {}).items():
        value = inputs[name]
        have = None if value.shape is None else list(value.shape.dims)
        want = list(shape)
        if have is not None and len(want) != len(have):
            raise InvalidInputError(
                f"input_shapes[{name!r}] = {tuple(want)} has rank {len(want)}, but input "
                f"{name!r} has shape {_shape_text(have)}"
            )
        new_dims: list[int | str | None] = []
        for axis, d in enumerate(want):
            cur = None if have is None else have[axis]
            if isinstance(cur, int) and not (isinstance(d, int) and d == cur):
                if d is None or (isinstance(d, int) and d < 0):
                    new_dims.append(cur)
                    continue
                raise InvalidInputError(
                    f"input_shapes[{name!r}] sets dim {axis} to {d!r}, but the Paddle program "
                    f"fixes it at {cur} ({_shape_text(have)}); re-save it with paddle.jit.save "
                    "and an InputSpec with None there to change it"
                )
            if isinstance(d, str):
                new_dims.append(d)
            elif d is None or int(d) < 0:
                new_dims.append(_dim_name(cur))
            else:
                new_dims.append(int(d))
        value.shape = ir.Shape(new_dims)

    for name, axes in (options.dynamic_axes or {}).items():
        value = inputs[name]
        if value.shape is None:
            continue
        dims2: list[int | str | None] = [_dim_name(d) for d in value.shape.dims]
        for axis, symbol in axes.items():
            axis = int(axis)
            if not 0 <= axis < len(dims2):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has shape "
                    f"{_shape_text(dims2)}"
                )
            if isinstance(dims2[axis], int):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] opens dim {axis}, but the Paddle program fixes it "
                    f"at {dims2[axis]}; re-save it with paddle.jit.save and an InputSpec with "
                    "None there"
                )
            dims2[axis] = str(symbol)
        value.shape = ir.Shape(dims2)

    # paddle2onnx numbers every open dim afresh (DynamicDimension.N), so a name says nothing;
    # shape inference (run by ferry.convert) names output dims from the inputs.
    for value in graph.outputs:
        if value.shape is not None:
            value.shape = ir.Shape(
                [
                    None
                    if isinstance(d, ir.SymbolicDim) and _P2O_DIM.fullmatch(str(d.value or ""))
                    else d
                    for d in value.shape.dims
                ]
            )


def _name_outputs(model: ir.Model, names: Sequence[str] | None, label: str) -> None:
    """Name the outputs as ``paddle.inference`` names them.

    Translating a legacy program to PIR renames its fetch variables (``sigmoid_0.tmp_0``) to
    ``fetch_name_N``, which paddle2onnx keeps; the names a Paddle user knows are the first.
    """
    outputs = list(model.graph.outputs)
    if not names or len(names) != len(outputs) or len(set(names)) != len(names):
        return
    taken = {
        v.name
        for v in (*model.graph.inputs, *(o for n in model.graph for o in n.outputs))
        if v not in outputs
    }
    if taken & set(names):
        logger.debug("%s: outputs keep paddle2onnx's names; Paddle's are taken", label)
        return
    for value, name in zip(outputs, names):
        value.name = name


def _dim_name(d: Any) -> int | str | None:
    if isinstance(d, int):
        return d
    value = getattr(d, "value", d)
    return value if isinstance(value, str) else None


def _shape_text(dims: Sequence[Any] | None) -> str:
    if dims is None:
        return "(unknown rank)"
    return "(" + ", ".join("?" if d is None else str(_dim_name(d) or "?") for d in dims) + ")"


def _input_specs(model: Any) -> list[tuple[str, np.dtype[Any] | None, list[int | str | None]]]:
    specs = []
    for value in model.graph.inputs:
        dtype = value.dtype.numpy() if value.dtype is not None else None
        dims = [_dim_name(d) for d in value.shape.dims] if value.shape is not None else []
        specs.append((value.name, dtype, dims))
    return specs


def _sample_inputs(model: Any, examples: Any, notes: list[str]) -> dict[str, np.ndarray] | None:
    """The example inputs named for the model, in its dtypes, checked against its shapes."""
    if examples is None:
        return None
    specs = _input_specs(model)
    named = name_examples(examples, [name for name, _, _ in specs])
    sample: dict[str, np.ndarray] = {}
    for name, dtype, dims in specs:
        arr = as_array(named[name], name)
        if dtype is not None and arr.dtype != dtype:
            if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
                raise InvalidInputError(
                    f"example input {name!r} has dtype {arr.dtype}; the model takes {dtype}"
                )
            notes.append(f"example input {name!r}: {arr.dtype} cast to {dtype}")
            arr = arr.astype(dtype)
        if dims and (
            arr.ndim != len(dims)
            or any(isinstance(d, int) and d != s for d, s in zip(dims, arr.shape))
        ):
            raise InvalidInputError(
                f"example input {name!r} has shape {arr.shape}; the model takes {_shape_text(dims)}"
            )
        sample[name] = arr
    return sample


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


def _by_output_name(
    outputs: Sequence[np.ndarray], names: Sequence[str], label: str
) -> dict[str, np.ndarray]:
    # paddle2onnx keeps the program's fetch order, which is the order Paddle returns them in.
    if len(outputs) != len(names):
        raise ConversionError(
            f"Paddle returned {len(outputs)} output(s) for {label}, the converted model has "
            f"{len(names)} ({', '.join(names)}); this is a bug in ferry or paddle2onnx"
        )
    return dict(zip(names, outputs))


# --- paddle.nn.Layer -------------------------------------------------------------------------


def _import_paddle() -> Any:
    try:
        import paddle
    except ImportError as e:
        raise BackendUnavailableError(
            f"converting a paddle.nn.Layer needs paddlepaddle in this Python ({e}); "
            "pip install 'ferry[paddle]'"
        ) from e
    return paddle


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


def _layer_inputs(
    layer: Any, options: ConvertOptions, label: str
) -> tuple[list[str], list[str], list[list[int | None]], dict[str, np.ndarray] | None]:
    """Input names (forward's parameters), dtypes, InputSpec shapes and the examples by name."""
    params = _forward_params(layer)
    given = options.example_inputs
    examples: dict[str, np.ndarray] | None = None
    if given is not None:
        items = example_items(given)
        # forward(*args) has no names to give: the extra inputs are numbered.
        extra = [] if items and items[0][0] is not None else range(len(params), len(items))
        named = name_examples(
            given, [*params, *(f"input_{i}" for i in extra)], model=f"{label}.forward", leading=True
        )
        names = list(named)
        examples = {n: as_array(v, n) for n, v in named.items()}
    elif options.input_shapes:
        keys = list(options.input_shapes)
        names = [p for p in params if p in keys] + [k for k in keys if k not in params]
    else:
        raise InvalidInputError(
            f"converting {label} needs example_inputs (or input_shapes) to trace it with"
        )
    check_input_options(options, names, label)

    dtypes: list[str] = []
    shapes: list[list[int | None]] = []
    for name in names:
        arr = None if examples is None else examples[name]
        dtypes.append("float32" if arr is None else arr.dtype.name)
        given_shape = (options.input_shapes or {}).get(name)
        if given_shape is not None:
            shape = [d if isinstance(d, int) and d >= 0 else None for d in given_shape]
            if arr is not None and (
                arr.ndim != len(shape)
                or any(d is not None and d != s for d, s in zip(shape, arr.shape))
            ):
                raise InvalidInputError(
                    f"example input {name!r} has shape {arr.shape}, but input_shapes gives "
                    f"{tuple(given_shape)}"
                )
        elif arr is None:
            raise InvalidInputError(f"no example input and no input_shapes for {name!r}")
        else:
            shape = list(arr.shape)
            # Batch-first by default: tracing with the leading dim open keeps it symbolic.
            if name not in (options.dynamic_axes or {}) and arr.ndim >= 2:
                shape[0] = None
        for axis in (options.dynamic_axes or {}).get(name, {}):
            if not 0 <= int(axis) < len(shape):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has rank "
                    f"{len(shape)}"
                )
            shape[int(axis)] = None
        shapes.append(shape)
    return names, dtypes, shapes, examples


def _symbolic_shapes(
    names: Sequence[str], shapes: Sequence[Sequence[int | None]], options: ConvertOptions
) -> dict[str, list[int | str]]:
    """The Layer's InputSpec shapes as input_shapes for the converted model (str: symbolic)."""
    out: dict[str, list[int | str]] = {}
    for name, shape in zip(names, shapes):
        given = (options.input_shapes or {}).get(name)
        axes = (options.dynamic_axes or {}).get(name, {})
        dims: list[int | str] = []
        for axis, d in enumerate(shape):
            if d is not None and d >= 0:
                dims.append(d)
            elif axis in axes:
                dims.append(str(axes[axis]))
            elif given is not None and isinstance(given[axis], str):
                dims.append(str(given[axis]))
            else:
                dims.append(DEFAULT_BATCH if axis == 0 else f"{name}_{axis}")
        out[name] = dims
    return out


def _forward_params(layer: Any) -> list[str]:
    try:
        signature = inspect.signature(layer.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


class _eval_mode:
    """Puts a Layer in eval mode for the block and restores training mode after it."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.was_training = bool(getattr(layer, "training", False))

    def __enter__(self) -> None:
        self.layer.eval()

    def __exit__(self, *exc: object) -> None:
        if self.was_training:
            self.layer.train()


def _layer_reference(
    paddle: Any, layer: Any, names: Sequence[str], model: Any, label: str
) -> ReferenceFn:
    output_names = [v.name for v in model.graph.outputs]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, names, label)
        try:
            with _eval_mode(layer), paddle.no_grad():
                result = layer(*[paddle.to_tensor(np.asarray(feeds[n])) for n in names])
        except Exception as e:  # the layer's own failure on these inputs
            raise ExecutionError(
                f"{label} failed on inputs {describe_feeds(feeds)}: {type(e).__name__}: {_short(e)}"
            ) from e
        return _by_output_name(_flatten(result), output_names, label)

    return reference


def _flatten(result: Any) -> list[np.ndarray]:
    """A Layer's outputs in the order paddle.jit.save fetches them: nested lists/tuples/dicts."""
    if isinstance(result, (list, tuple)):
        return [a for item in result for a in _flatten(item)]
    if isinstance(result, Mapping):
        return [a for item in result.values() for a in _flatten(item)]
    return [np.asarray(result.numpy() if hasattr(result, "numpy") else result)]


def _spec_text(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int | None]]
) -> str:
    return ", ".join(f"{n}: {d}{_shape_text(list(s))}" for n, d, s in zip(names, dtypes, shapes))


def _short(e: BaseException) -> str:
    # Paddle's C++ errors read "(InvalidArgument) what happened" after a traceback dump.
    for line in str(e).splitlines():
        line = line.strip()
        if line.startswith("(") or re.match(r"^\w+Error: ", line):
            return first_line(line)
    return first_line(e)


# --- the worker ------------------------------------------------------------------------------


def _run_worker(
    python: Path, request: dict[str, Any], work: Path
) -> tuple[int, dict[str, Any], str]:
    """Run the worker on ``request`` in ``work``; returns (exit code, its report, its output)."""
    # Run from a copy in the work folder: Python puts the script's folder first on the import
    # path, and nothing of ferry's beside its source may shadow a package it imports.
    script = work / "ferry_paddle_worker.py"
    script.write_text(_worker_source(), encoding="utf-8")
    report_path = work / "report.json"
    request = dict(request, report=str(report_path))
    (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
    env = dict(os.environ)
    # Paddle's C++ logging is chatty at INFO; its warnings would drown the one line that matters.
    env.setdefault("GLOG_minloglevel", "2")
    env.setdefault("GLOG_v", "0")
    try:
        proc = subprocess.run(
            [str(python), str(script), str(work / "request.json")],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
    except OSError as e:
        raise BackendUnavailableError(f"cannot start {python}: {e}; {_setup_hint()}") from e
    report: dict[str, Any] = {}
    if report_path.is_file():
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except ValueError:
            report = {}
    return proc.returncode, report, proc.stdout


def _worker_source() -> str:
    return (Path(__file__).parent / "_paddle_worker.py").read_text(encoding="utf-8")
