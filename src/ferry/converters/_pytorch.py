"""PyTorch -> ONNX: ``nn.Module`` objects, torch.export programs (``.pt2``), TorchScript (``.pt``)
and pickled full-module checkpoints, through torch's own ONNX exporters.

Before -> After::

    nn.Module + example inputs       -> torch.export -> ONNX (the torch.export-based exporter)
    ExportedProgram / .pt2 archive   -> ONNX (the torch.export-based exporter)
    ScriptModule / TorchScript .pt   -> ONNX (the TorchScript exporter, the only one that reads it)
    torch.save(module) checkpoint    -> (trust_pickle only) nn.Module -> as above

Loading files: ``torch.load``, ``torch.jit.load`` and ``torch.export.load`` can all run code
embedded in the file (torch's own documentation says so for each), so every file is loaded only
with ``trust_pickle``. Without it the converter still says what a checkpoint holds (a state_dict, a
pickled ``nn.Module`` subclass...) by reading the pickle's opcodes, which executes nothing.

The result keeps the exporter's input names (the ``forward`` parameter names) and names outputs
after the structure ``forward`` returns: ``output`` for one tensor, ``output_0``, ``output_1``...
for a tuple, the keys for a dict. The reference runs the original module (in eval mode, under
``torch.no_grad()``), the exported program's module, or the script module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import logging
import os
import pickletools
import re
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import numpy as np

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    check_names,
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
    FerryError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["PyTorchConverter", "detach_from_torch", "silence_exporter_logs"]

logger = logging.getLogger(__name__)

#: Loggers that chatter during export about things users cannot act on: torch's "torchvision is
#: not installed. Skipping torchvision::nms" warnings, and INFO lines from the onnxscript optimizer
#: and onnx_ir passes that the exporter runs (visible whenever an app logs at INFO).
_NOISY_LOGGERS = (
    "torch.onnx",
    "torch.export",
    "torch._export",
    "torch.fx.experimental",
    "onnxscript",
    "onnx_ir",
)

#: The oldest opset torch's torch.export-based exporter builds (its torchlib); lower ones are
#: reached by ferry.convert's version conversion afterwards.
_DYNAMO_MIN_OPSET = 18
#: What torch.onnx.export builds when no opset is asked for.
_DYNAMO_DEFAULT_OPSET = 20
#: The opsets torch's TorchScript exporter builds natively.
_TORCHSCRIPT_OPSETS = range(7, 21)
_TORCHSCRIPT_DEFAULT_OPSET = 20

#: Class names (defined somewhere under ``torch``) of the in-memory models this converter takes.
_MODEL_CLASS_NAMES = frozenset({"Module", "ExportedProgram", "ScriptModule", "ScriptFunction"})

#: ``torch.save``'s legacy (non-zip) format: pickle protocol 2, then this magic number as a long.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")

#: Modules whose globals a weights-only checkpoint references (tensor rebuilders, storages, dtypes,
#: OrderedDict); any other global in the pickle is a Python object such as an ``nn.Module``.
_WEIGHTS_ONLY_MODULES = ("torch._utils", "torch.storage")
_WEIGHTS_ONLY_GLOBALS = frozenset(
    {
        "collections.OrderedDict",
        "_codecs.encode",  # bytes under pickle protocol 2
        *(
            f"{module}.{name}"
            # pickle protocol 2 spells builtins "__builtin__"
            for module in ("builtins", "__builtin__")
            for name in ("set", "frozenset", "slice", "bytearray", "complex")
        ),
    }
)

_FileKind = Literal["pt2", "torchscript", "checkpoint"]


class PyTorchConverter:
    """Converts PyTorch models to ONNX with torch's own exporters (see the module docstring)."""

    name = "pytorch"
    extra = "torch"
    suffixes = (".pt", ".pth", ".pt2")

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` is a torch.export archive, TorchScript archive or torch.save file."""
        return _file_kind(Path(path)) is not None

    def accepts(self, obj: object) -> bool:
        """Whether ``obj`` is an ``nn.Module``, ``ExportedProgram``, ``ScriptModule`` or
        ``ScriptFunction`` (checked by class names, without importing torch)."""
        if "torch" not in type_modules(obj):
            return False
        return any(
            cls.__name__ in _MODEL_CLASS_NAMES and cls.__module__.split(".")[0] == "torch"
            for cls in type(obj).__mro__
        )

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert a module, program or file to ONNX.

        Args:
            source: an ``nn.Module``, ``ExportedProgram``, ``ScriptModule``/``ScriptFunction``,
                or the path of a ``.pt2`` / TorchScript / ``torch.save`` file.
            options: example inputs (required to trace an ``nn.Module`` or a TorchScript
                module, unless ``input_shapes`` describe float32 inputs), dynamic axes, opset,
                and ``trust_pickle`` (required to load any file).

        Returns:
            The ONNX model, a reference that runs the source in torch, and the sample inputs.

        Raises:
            BackendUnavailableError: torch is not installed.
            ModelLoadError: the file is missing, not a PyTorch file, not trusted, or holds no model.
            InvalidInputError: example inputs are missing or do not fit the model.
            UnsupportedOpError: ops without an ONNX translation (all of them listed).
            ConversionError: torch.export or the exporter failed for another reason.
        """
        _import_torch()  # BackendUnavailableError before anything else
        if isinstance(source, (str, os.PathLike)):
            return self._convert_file(Path(source), options)
        return self._convert_object(source, options, notes=[])

    # ----------------------------------------------------------------------------------------
    # Sources
    # ----------------------------------------------------------------------------------------

    def _convert_object(self, obj: object, options: ConvertOptions, notes: list[str]) -> Converted:
        torch = _import_torch()
        if isinstance(obj, torch.export.ExportedProgram):
            return _convert_program(obj, options, notes)
        if isinstance(obj, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
            return _convert_script(obj, options, notes)
        if isinstance(obj, torch.nn.Module):
            return _convert_module(obj, options, notes)
        raise ModelLoadError(
            f"not a PyTorch model: got a {type(obj).__module__}.{type(obj).__qualname__}; the "
            "PyTorch converter takes an nn.Module, a torch.export ExportedProgram, a TorchScript "
            "module or function, or a .pt/.pth/.pt2 file"
        )

    def _convert_file(self, path: Path, options: ConvertOptions) -> Converted:
        torch = _import_torch()
        if not path.exists():
            raise ModelLoadError(f"{path}: no such file")
        if path.is_dir():
            raise ModelLoadError(
                f"{path} is a folder; the PyTorch converter reads .pt2, TorchScript .pt and "
                "torch.save (.pt/.pth) files"
            )
        kind = _file_kind(path)
        if kind is None:
            raise ModelLoadError(
                f"{path} is not a PyTorch file: expected a torch.export archive (.pt2), a "
                "TorchScript archive (torch.jit.save) or a torch.save checkpoint"
            )
        if kind == "pt2":
            loader = "torch.export.load"
            program = _load_archive(
                path, options, "a torch.export archive", loader, lambda: torch.export.load(path)
            )
            return _convert_program(program, options, [f"loaded {path.name} with {loader}"])
        if kind == "torchscript":
            loader = "torch.jit.load"
            script = _load_archive(
                path,
                options,
                "a TorchScript archive",
                loader,
                lambda: torch.jit.load(path, map_location="cpu"),
            )
            return _convert_script(script, options, [f"loaded {path.name} with {loader}"])
        model, notes = _load_checkpoint(path, options)
        return self._convert_object(model, options, notes)


# --------------------------------------------------------------------------------------------
# nn.Module: torch.export, then the torch.export-based ONNX exporter
# --------------------------------------------------------------------------------------------


def _convert_module(module: Any, options: ConvertOptions, notes: list[str]) -> Converted:
    params = _forward_parameters(module)
    axes = _requested_axes(options)
    args, kwargs = _module_example(module, params, options)
    device = _module_device(module)
    args, kwargs = _tree_map_tensors(lambda t: t.to(device), (args, kwargs))
    bound = _bind(params, args, kwargs, module)
    input_axes = {name: dims for name, dims in axes.items() if name in bound}
    opset = _dynamo_opset(options.opset, notes)

    with _eval_mode(module):
        model, out_spec = _export_module_once(module, args, kwargs, bound, input_axes, opset)
        fixed = _static_axes(model, input_axes)
        ones = [(n, a) for n, a, size in fixed if size == 1]
        if ones:
            # torch.export fixes a dim it only saw at size 1 when the code depends on it (a
            # branch on the batch size, ...); tracing at size 2 keeps it symbolic.
            args, kwargs = _repeat_axes(args, kwargs, params, ones)
            bound = _bind(params, args, kwargs, module)
            model, out_spec = _export_module_once(module, args, kwargs, bound, input_axes, opset)
            notes.append(
                "traced again with the example inputs repeated to size 2 along "
                + ", ".join(f"{n}[{a}]" for n, a in ones)
                + ": at size 1 torch.export made those dims static"
            )
    _finish_dynamo_model(model, out_spec, axes, notes)
    binder = _Binder.from_example(args, kwargs, model)

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with _eval_mode(module):
            return module(*args, **kwargs)

    return _converted(model, binder, run, device, notes)


def _export_module_once(
    module: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    bound: Mapping[str, Any],
    input_axes: Mapping[str, Mapping[int, str]],
    opset: int | None,
) -> tuple[ir.Model, Any]:
    torch = _import_torch()
    dynamic_shapes = _dynamic_shapes(bound, input_axes) if input_axes else None
    try:
        program = _dynamo_export(module, args, kwargs, dynamic_shapes, opset)
    except FerryError:
        raise
    except Exception as e:
        _raise_export_error(
            e,
            what=f"the {type(module).__name__} module",
            analyze=lambda: _unsupported_nodes(
                torch.export.export(module, args, kwargs=kwargs, strict=False), opset
            ),
        )
    return program.model, program.exported_program.call_spec.out_spec


# --------------------------------------------------------------------------------------------
# ExportedProgram (.pt2)
# --------------------------------------------------------------------------------------------


def _convert_program(program: Any, options: ConvertOptions, notes: list[str]) -> Converted:
    torch = _import_torch()
    opset = _dynamo_opset(options.opset, notes)
    # The reference runs the program as exported, before the exporter decomposes it.
    runnable = program.module()
    try:
        onnx_program = _dynamo_export(program, (), None, None, opset)
    except FerryError:
        raise
    except Exception as e:
        _raise_export_error(
            e, what="the ExportedProgram", analyze=lambda: _unsupported_nodes(program, opset)
        )
    model = onnx_program.model
    _finish_dynamo_model(model, program.call_spec.out_spec, _requested_axes(options), notes)
    binder = _Binder.from_program(program, model, options)

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return runnable(*args, **kwargs)

    return _converted(model, binder, run, torch.device("cpu"), notes)


# --------------------------------------------------------------------------------------------
# TorchScript: the TorchScript-based exporter
# --------------------------------------------------------------------------------------------


def _convert_script(script: Any, options: ConvertOptions, notes: list[str]) -> Converted:
    """Export a ScriptModule or ScriptFunction.

    torch 2.13's torch.export-based exporter refuses TorchScript ("Exporting a ScriptModule is
    not supported"); the TorchScript-based exporter (``dynamo=False``, deprecated but shipped)
    reads it directly, control flow included. torch's private TS2EPConverter could turn it into
    an ExportedProgram, but it is experimental and 10-40x slower.
    """
    torch = _import_torch()
    names = _script_parameters(script)
    args = _script_example(names, options)
    is_module = isinstance(script, torch.nn.Module)
    with torch.no_grad(), _eval_mode(script) if is_module else contextlib.nullcontext():
        try:
            example_out = script(*args)
        except Exception as e:
            raise InvalidInputError(
                f"the TorchScript model fails on the example inputs: {first_line(e)}"
            ) from e
    paths = _tree_paths(example_out)
    output_names = _output_names(paths)
    input_names = names[: len(args)] if all(isinstance(a, torch.Tensor) for a in args) else None
    axes = _requested_axes(options)
    known = set(input_names or ()) | set(output_names)
    unknown = sorted(set(axes) - known)
    if unknown:
        raise InvalidInputError(
            f"dynamic_axes names {', '.join(map(repr, unknown))}, which the TorchScript model "
            f"does not have; inputs: {', '.join(input_names or ())}; outputs: "
            f"{', '.join(output_names)}"
        )
    opset = _TORCHSCRIPT_DEFAULT_OPSET
    if options.opset is not None:
        opset = exporter_opset(
            options.opset,
            notes,
            exporter="torch's TorchScript exporter",
            oldest=_TORCHSCRIPT_OPSETS[0],
            newest=_TORCHSCRIPT_OPSETS[-1],
        )
    export = dict(
        input_names=input_names,
        output_names=output_names,
        dynamic_axes={k: dict(v) for k, v in axes.items()} or None,
        opset_version=opset,
    )
    try:
        model = _torchscript_export(script, args, **export)
    except FerryError:
        raise
    except Exception as e:
        if type(e).__name__ == "UnsupportedOperatorError":
            ops = _torchscript_unsupported(script, args, export, e)
            raise UnsupportedOpError(_unsupported_message(ops, "TorchScript"), ops) from e
        raise ConversionError(
            f"torch's TorchScript exporter cannot convert the model: {first_line(e)}"
        ) from e
    notes.append(
        "exported with torch's TorchScript exporter (the torch.export-based one does "
        "not read TorchScript)"
    )
    fixed = _static_axes(model, axes)
    if fixed:
        _raise_static(fixed, "the TorchScript model")
    kept = {v.name for v in model.graph.inputs}
    dropped = [n for n in input_names or () if n not in kept]
    if dropped:
        notes.append(f"the TorchScript exporter dropped unused input(s) {', '.join(dropped)}")
    # The TorchScript exporter drops unused inputs: bind the rest by name.
    binder = (
        _Binder.from_names(args, input_names, model)
        if input_names is not None
        else _Binder.from_example(args, {}, model)
    )

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with _eval_mode(script) if is_module else contextlib.nullcontext():
            return script(*args, **kwargs)

    return _converted(model, binder, run, torch.device("cpu"), notes)


def _script_parameters(script: Any) -> list[str]:
    schema = script.schema if hasattr(script, "schema") else script.forward.schema
    names = [arg.name for arg in schema.arguments]
    return names[1:] if names and names[0] == "self" else names


def _script_example(names: list[str], options: ConvertOptions) -> tuple[Any, ...]:
    example = options.example_inputs
    if example is None:
        if not options.input_shapes:
            raise InvalidInputError(
                "converting TorchScript needs example inputs to run it with: pass example_inputs "
                f"(a dict by argument name ({', '.join(names)}), a tuple, or one array; CLI: "
                "--example-input NAME=FILE.npy), or input_shapes for float32 inputs (CLI: "
                "--shape NAME=DIMS)"
            )
        check_names(options.input_shapes, names, "input_shapes", "the TorchScript model")
        example = {
            n: _random_input(n, options.input_shapes[n]) for n in names if n in options.input_shapes
        }
    named = name_examples(example, names, model="the TorchScript model", leading=True)
    return tuple(_to_torch(x) for x in named.values())


@contextlib.contextmanager
def _quiet_torchscript_log() -> Iterator[None]:
    """Keeps the TorchScript exporter from dumping its IR graph to stderr when it fails.

    Its ``setup_onnx_logging`` tests the *function* ``_jit_is_onnx_log_enabled`` for truth, so it
    always enables the C++ log (and never disables it again); replacing that context manager with
    a no-op and restoring the flag afterwards keeps the log as the caller had it.
    """
    torch = _import_torch()
    was_enabled = torch._C._jit_is_onnx_log_enabled()
    utils: Any = None
    with contextlib.suppress(ImportError):
        utils = importlib.import_module("torch.onnx._internal.torchscript_exporter.utils")
    original = getattr(utils, "setup_onnx_logging", None)
    if original is not None:
        utils.setup_onnx_logging = lambda verbose: contextlib.nullcontext()
    try:
        yield
    finally:
        if original is not None:
            utils.setup_onnx_logging = original
        torch._C._jit_set_onnx_log_enabled(was_enabled)


def _torchscript_export(script: Any, args: tuple[Any, ...], **export: Any) -> ir.Model:
    import onnx_ir as ir

    torch = _import_torch()
    # A file rather than a buffer: models past 2 GB are written with external data.
    with tempfile.TemporaryDirectory(prefix="ferry-torchscript-") as tmp:
        path = Path(tmp) / "model.onnx"
        with _quiet_exporter(), _quiet_torchscript_log():
            torch.onnx.export(script, args, str(path), dynamo=False, verbose=False, **export)
        model = ir.load(path)
        _detach(model)  # reads any external data before the folder goes
    return model


def _torchscript_unsupported(
    script: Any, args: tuple[Any, ...], export: dict[str, Any], error: Exception
) -> list[tuple[str, str]]:
    """Every op the TorchScript exporter has no symbolic for (it stops at the first).

    Exporting again with ``ONNX_FALLTHROUGH`` keeps untranslatable ops as nodes in their own
    domain; those without a registered symbolic are the unsupported ones (others in a foreign
    domain only fell through because their inputs came from an unsupported op).
    """
    torch = _import_torch()
    found: list[tuple[str, str]] = []
    try:
        registry = importlib.import_module(
            "torch.onnx._internal.torchscript_exporter.registration"
        ).registry
        model = _torchscript_export(
            script,
            args,
            **export,
            operator_export_type=torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH,
        )
        for node in model.graph.all_nodes():
            if node.domain in ("", "ai.onnx"):
                continue
            namespace = "aten" if node.domain == "org.pytorch.aten" else node.domain
            kind = f"{namespace}::{node.op_type}"
            if not registry.is_registered_op(kind, export["opset_version"]):
                found.append((kind, node.name or "?"))
    except Exception:  # the analysis is best effort: the error below still names one op
        logger.debug("TorchScript unsupported-op analysis failed", exc_info=True)
    named = re.search(r"operator '([\w:.]+)'|namespace ([\w:.]+?)\.?\s", str(error))
    if named:
        op = named.group(1) or named.group(2)
        if all(op != kind for kind, _ in found):
            found.append((op, "?"))
    return found


# --------------------------------------------------------------------------------------------
# The torch.export-based exporter: call, errors, unsupported ops
# --------------------------------------------------------------------------------------------


def _dynamo_export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: dict[str, Any] | None,
    opset: int | None,
) -> Any:
    torch = _import_torch()
    with _quiet_exporter():
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs or None,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    if program is None:  # only the TorchScript exporter returns None
        raise ConversionError("torch.onnx.export returned no ONNX program")
    return program


def _dynamo_opset(requested: int | None, notes: list[str]) -> int | None:
    if requested is None:
        return None  # the exporter's own default
    return exporter_opset(requested, notes, exporter="torch's exporter", oldest=_DYNAMO_MIN_OPSET)


def _raise_export_error(
    error: Exception, *, what: str, analyze: Callable[[], list[tuple[str, str]]]
) -> NoReturn:
    """Turn an exporter failure into a FerryError; list every unsupported op when ops are why."""
    chain = _causes(error)
    if any(type(c).__name__ == "DispatchError" for c in chain):
        try:
            ops = analyze()
        except Exception:  # the analysis is best effort: fall back to the op the error names
            logger.debug("unsupported-op analysis failed", exc_info=True)
            ops = []
        ops = ops or _ops_from_message(str(error))
        raise UnsupportedOpError(_unsupported_message(ops, "torch.onnx"), ops) from error
    summary = _summary(error)
    if type(error).__name__ == "TorchExportError":
        raise ConversionError(
            f"torch.export cannot capture {what}: {summary}. Make forward() traceable by "
            "torch.export: no Python branches on tensor values (use torch.cond), see "
            "https://pytorch.org/docs/stable/generated/exportdb/index.html"
        ) from error
    raise ConversionError(f"torch.onnx cannot convert {what}: {summary}") from error


def _unsupported_nodes(program: Any, opset: int | None) -> list[tuple[str, str]]:
    """``(op, node)`` for every node of ``program`` the exporter has no ONNX function for.

    The exporter stops at the first such node; this runs its decomposition and dispatcher over
    the whole graph (torch-private APIs, so callers treat failure as "no analysis").
    """
    torch = _import_torch()
    from torch.onnx._internal.exporter import _core, _dispatching, _registration

    with _quiet_exporter():
        registry = _registration.ONNXRegistry.from_torchlib(
            opset_version=max(opset or _DYNAMO_DEFAULT_OPSET, _DYNAMO_MIN_OPSET)
        )
        decomposed = _core._prepare_exported_program_for_export(program, registry=registry)
    found: list[tuple[str, str]] = []
    for graph_module in decomposed.graph_module.modules():  # control-flow subgraphs too
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            # Higher-order ops (cond, with_effects...) are lowered specially, not dispatched.
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            function, _ = _dispatching.dispatch(node, registry)
            if function is None:
                found.append((node.target.name(), node.name))
    return found


def _ops_from_message(message: str) -> list[tuple[str, str]]:
    op = re.search(r"OpOverload\(op='([^']+)', overload='([^']+)'\)", message)
    node = re.search(r"translating node %(\S+)", message)
    if not op:
        return []
    namespace, _, name = op.group(1).partition(".")
    overload = "" if op.group(2) == "default" else f".{op.group(2)}"
    return [(f"{namespace}::{name}{overload}", node.group(1) if node else "?")]


def _unsupported_message(ops: list[tuple[str, str]], exporter: str) -> str:
    torch = _import_torch()
    listed = list_ops(ops)
    return (
        f"cannot convert to ONNX: {len({op for op, _ in ops})} op(s) have no ONNX translation in {exporter} "
        f"(torch {torch.__version__}): {listed or 'unknown (see the cause)'}. Rewrite them with "
        "supported torch ops, or export to ONNX yourself with a translation for them "
        "(torch.onnx.export's custom_translation_table) and convert that ONNX file"
    )


def _summary(error: BaseException) -> str:
    """The useful part of an exporter error: the exception chain of its 'Exception summary' (one
    ``Type: message`` per link), else the innermost cause's first line."""
    text = strip_colors(str(error))
    found: list[tuple[str, str]] = []
    if "## Exception summary" in text:
        body = text.split("## Exception summary", 1)[1]
        found = re.findall(r"^<class '(?:[\w.]+\.)?(\w+)'>: (.*)$", body, flags=re.MULTILINE)
    if found:
        summary = " <- ".join(
            f"{name}: {message.replace('See the stack trace for more information.', '').strip()}"
            for name, message in found
        )
    else:
        summary = first_line(_causes(error)[-1])
    return summary if len(summary) <= 600 else summary[:600] + "..."


def _causes(error: BaseException) -> list[BaseException]:
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    return chain


# --------------------------------------------------------------------------------------------
# Example inputs and dynamic shapes
# --------------------------------------------------------------------------------------------


def _forward_parameters(module: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return []


def _module_example(
    module: Any, params: list[inspect.Parameter], options: ConvertOptions
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
    what = type(module).__name__
    example = options.example_inputs
    if example is None:
        if not options.input_shapes:
            raise InvalidInputError(
                f"converting the {what} module needs example inputs: "
                "torch.export traces forward() with them. Pass example_inputs to ferry.convert "
                f"(a dict by forward() argument name ({', '.join(names)}), a tuple, or one "
                "array; CLI, for a pickled module: --example-input NAME=FILE.npy), or "
                "input_shapes for float32 inputs (CLI: --shape NAME=DIMS)"
            )
        if not takes_kwargs:
            check_names(options.input_shapes, names, "input_shapes", f"{what}.forward()")
        example = {
            n: _random_input(n, shape)
            for n, shape in sorted(
                options.input_shapes.items(),
                key=lambda item: names.index(item[0]) if item[0] in names else len(names),
            )
        }
    items = example_items(example)
    if items and items[0][0] is not None:
        given = {str(n): v for n, v in items}
        if not takes_kwargs:
            check_names(given, names, "example_inputs", f"{what}.forward()")
        ordered = {n: given[n] for n in names if n in given}
        ordered.update({n: v for n, v in given.items() if n not in ordered})
        converted = {n: _to_torch(v) for n, v in ordered.items()}
        try:
            bound = inspect.Signature(params).bind_partial(**converted)
        except TypeError as e:
            raise InvalidInputError(f"example_inputs do not fit forward(): {e}") from e
        # Positional where the signature allows: torch.export names inputs either way.
        return tuple(bound.args), dict(bound.kwargs)
    return tuple(_to_torch(x) for _, x in items), {}


def _bind(
    params: list[inspect.Parameter], args: tuple[Any, ...], kwargs: dict[str, Any], module: Any
) -> dict[str, Any]:
    try:
        return dict(inspect.Signature(params).bind(*args, **kwargs).arguments)
    except TypeError as e:
        raise InvalidInputError(
            f"the example inputs do not fit {type(module).__name__}.forward(): {e}"
        ) from e


def _requested_axes(options: ConvertOptions) -> dict[str, dict[int, str]]:
    """dynamic_axes, plus the str dims of input_shapes (dynamic_axes wins where both name one)."""
    axes: dict[str, dict[int, str]] = {}
    for name, shape in (options.input_shapes or {}).items():
        for axis, dim in enumerate(shape):
            if isinstance(dim, str):
                axes.setdefault(name, {})[axis] = dim
    for name, dims in (options.dynamic_axes or {}).items():
        axes.setdefault(name, {}).update({int(a): str(d) for a, d in dims.items()})
    return axes


def _dynamic_shapes(
    bound: Mapping[str, Any], input_axes: Mapping[str, Mapping[int, str]]
) -> dict[str, Any]:
    """torch.export ``dynamic_shapes`` keyed by forward() parameter, one ``Dim`` per dim name."""
    torch = _import_torch()
    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        if name not in dims:
            # Dim names must be identifiers; the ONNX dims are renamed to the requested names.
            ident = re.sub(r"\W", "_", name)
            ident = ident if ident and not ident[0].isdigit() else f"d_{ident}"
            while ident in {str(d.__name__) for d in dims.values()}:
                ident += "_"
            dims[name] = torch.export.Dim(ident)
        return dims[name]

    shapes: dict[str, Any] = {}
    for param, value in bound.items():
        if param not in input_axes:
            shapes[param] = None  # static, whatever the structure
            continue
        if not isinstance(value, torch.Tensor):
            raise InvalidInputError(
                f"dynamic_axes names {param!r}, which is not a tensor input of forward(); "
                "dynamic axes apply to top-level tensor arguments"
            )
        spec: dict[int, Any] = {}
        for axis, name in input_axes[param].items():
            if not -value.dim() <= axis < value.dim():
                raise InvalidInputError(
                    f"dynamic_axes asks for axis {axis} of {param!r}, which has rank {value.dim()}"
                )
            spec[axis % value.dim()] = dim(name)
        shapes[param] = spec
    return shapes


def _repeat_axes(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    params: list[inspect.Parameter],
    axes: list[tuple[str, int]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    torch = _import_torch()
    bound = inspect.Signature(params).bind(*args, **kwargs)
    for name, axis in axes:
        value = bound.arguments[name]
        bound.arguments[name] = torch.cat([value, value], dim=axis)
    return tuple(bound.args), dict(bound.kwargs)


def _static_axes(
    model: ir.Model, axes: Mapping[str, Mapping[int, str]]
) -> list[tuple[str, int, int]]:
    """Rename the requested symbolic dims; return ``(value, axis, size)`` of those left static.

    Raises:
        InvalidInputError: a name is neither an input nor an output, or an axis is out of range.
    """
    import onnx_ir as ir

    graph = model.graph
    values = {v.name: v for v in [*graph.inputs, *graph.outputs] if v.name}
    renames: dict[str, str] = {}
    fixed: list[tuple[str, int, int]] = []
    for name, dims in axes.items():
        value = values.get(name)
        if value is None:
            raise InvalidInputError(
                f"dynamic_axes names {name!r}, which is neither an input nor an output of the "
                f"converted model; inputs: {', '.join(v.name or '?' for v in graph.inputs)}; "
                f"outputs: {', '.join(v.name or '?' for v in graph.outputs)}"
            )
        shape = value.shape
        for axis, dim_name in dims.items():
            if shape is None or not -len(shape) <= axis < len(shape):
                raise InvalidInputError(
                    f"dynamic_axes asks for axis {axis} of {name!r}, which has shape {shape}"
                )
            dim = shape[axis]
            if isinstance(dim, int):
                fixed.append((name, axis % len(shape), dim))
            elif dim.value is None:
                dims_list = list(shape.dims)
                dims_list[axis] = ir.SymbolicDim(dim_name)
                value.shape = ir.Shape(dims_list)
            elif dim.value != dim_name:
                renames.setdefault(dim.value, dim_name)
    if renames:
        _rename_dims(model, renames)
    return fixed


def _raise_static(fixed: list[tuple[str, int, int]], what: str) -> NoReturn:
    listed = ", ".join(f"{name}[{axis}] = {size}" for name, axis, size in fixed)
    raise ConversionError(
        f"cannot make {listed} dynamic: {what} fixes those dims (a reshape to a constant size, "
        "a branch on the size, or a program exported with static shapes). Change the code "
        "(e.g. reshape(-1, ...)) or re-export it with dynamic shapes"
    )


def _rename_dims(model: ir.Model, renames: Mapping[str, str]) -> None:
    import onnx_ir as ir

    graph = model.graph
    values: list[ir.Value] = [*graph.inputs, *graph.outputs]
    for node in graph.all_nodes():
        values.extend(node.outputs)

    def renamed(dim: int | ir.SymbolicDim) -> int | ir.SymbolicDim:
        if isinstance(dim, ir.SymbolicDim) and dim.value is not None and dim.value in renames:
            return ir.SymbolicDim(renames[dim.value])
        return dim

    for value in values:
        shape = value.shape
        if shape is not None and any(renamed(d) is not d for d in shape.dims):
            value.shape = ir.Shape([renamed(d) for d in shape.dims])


def _random_input(name: str, shape: Sequence[int | str]) -> np.ndarray:
    """Standard-normal float32 data, seeded by the input's name: inputs of one shape get
    different data, so parity would notice two of them swapped."""
    # A symbolic dim gets 2: torch.export specializes dims it sees at size 0 or 1.
    dims = [2 if isinstance(d, str) else int(d) for d in shape]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.standard_normal(dims).astype(np.float32)


def _to_torch(value: Any) -> Any:
    """numpy arrays (also nested in lists/dicts) -> tensors; tensors and other values as given."""
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    def convert(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            # A copy: forward() may write into its inputs, and read-only arrays make torch warn.
            return torch.from_numpy(np.array(x, copy=True, order="C"))
        if isinstance(x, np.generic):
            return torch.from_numpy(np.array(x))
        return x

    return pytree.tree_map(convert, value)


def _tree_map_tensors(fn: Callable[[Any], Any], tree: Any) -> Any:
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, tree)


def _module_device(module: Any) -> Any:
    torch = _import_torch()
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """Puts every submodule in eval mode (dropout off, batch-norm running stats) and restores
    each one's own flag afterwards: inference graphs are what ferry deploys."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training


# --------------------------------------------------------------------------------------------
# The result: output names, sample inputs, reference
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Binder:
    """Maps feeds named as the ONNX inputs back to the source's ``(args, kwargs)`` structure.

    Attributes:
        spec: pytree spec of ``(args, kwargs)``.
        leaves: the flattened example (or placeholders); non-tensor leaves are passed as traced.
        slots: positions in ``leaves`` of the ONNX graph inputs, in graph-input order.
        names: the ONNX graph input names.
        has_sample: whether ``leaves`` hold real example tensors.
    """

    spec: Any
    leaves: list[Any]
    slots: list[int]
    names: list[str]
    has_sample: bool

    @classmethod
    def from_example(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], model: ir.Model
    ) -> _Binder | None:
        torch = _import_torch()
        from torch.utils import _pytree as pytree

        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        names = [v.name or "" for v in model.graph.inputs]
        if len(slots) != len(names):
            return None
        return cls(spec, leaves, slots, names, has_sample=True)

    @classmethod
    def from_names(
        cls, args: tuple[Any, ...], arg_names: list[str], model: ir.Model
    ) -> _Binder | None:
        """For top-level tensor arguments named ``arg_names``, of which the ONNX graph may keep
        a subset (the rest are passed as in the example)."""
        from torch.utils import _pytree as pytree

        leaves, spec = pytree.tree_flatten((args, {}))
        names = [v.name or "" for v in model.graph.inputs]
        if len(leaves) != len(arg_names) or not set(names) <= set(arg_names):
            return None
        return cls(spec, leaves, [arg_names.index(n) for n in names], names, has_sample=True)

    @classmethod
    def from_program(cls, program: Any, model: ir.Model, options: ConvertOptions) -> _Binder | None:
        _import_torch()
        from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

        spec = program.call_spec.in_spec
        user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        names = [v.name or "" for v in model.graph.inputs]
        if spec is None or spec.num_leaves != len(user):
            return None
        leaves: list[Any] = []
        slots: list[int] = []
        for i, s in enumerate(user):
            if isinstance(s.arg, TensorArgument):
                slots.append(i)
                leaves.append(None)
            elif isinstance(s.arg, ConstantArgument):
                leaves.append(s.arg.value)
            else:  # SymInt inputs: not feedable from ONNX here
                return None
        if len(slots) != len(names):
            return None
        binder = cls(spec, leaves, slots, names, has_sample=False)
        tensors = _program_example(program, options, names)
        if tensors is not None and len(tensors) == len(slots):
            for slot, tensor in zip(slots, tensors):
                binder.leaves[slot] = tensor
            binder.has_sample = True
        return binder

    def sample(self) -> dict[str, np.ndarray] | None:
        if not self.has_sample:
            return None
        return {n: _to_numpy(self.leaves[s]) for n, s in zip(self.names, self.slots)}

    def bind(self, feeds: Mapping[str, np.ndarray]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from torch.utils import _pytree as pytree

        require_inputs(feeds, self.names, "the torch reference")
        leaves = list(self.leaves)
        for name, slot in zip(self.names, self.slots):
            leaves[slot] = _to_torch(np.asarray(feeds[name]))
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)


def _program_example(program: Any, options: ConvertOptions, names: list[str]) -> list[Any] | None:
    """Example tensors for a program's ONNX inputs: the options', else the program's own."""
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    example = options.example_inputs
    if example is None and options.input_shapes:
        check_names(options.input_shapes, names, "input_shapes", "the ExportedProgram")
        if set(options.input_shapes) != set(names):
            return None
        example = {n: _random_input(n, options.input_shapes[n]) for n in names}
    if example is None:
        stored = getattr(program, "example_inputs", None)
        if stored is None:
            return None
        return [x for x in pytree.tree_leaves(stored) if isinstance(x, torch.Tensor)]
    items = example_items(example)
    if items and items[0][0] is not None:
        named = name_examples(example, names, model="the ExportedProgram")
        return [_to_torch(named[n]) for n in names]
    leaves = [x for _, x in items]
    return [x for x in pytree.tree_leaves(_to_torch(leaves)) if isinstance(x, torch.Tensor)]


def _converted(
    model: ir.Model,
    binder: _Binder | None,
    run: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    device: Any,
    notes: list[str],
) -> Converted:
    torch = _import_torch()
    if binder is None:
        notes.append(
            "the ONNX inputs do not map one-to-one onto the tensors of forward()'s arguments; "
            "no torch reference, so parity is not checked"
        )
        return Converted(model=model, notes=notes)

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        args, kwargs = binder.bind(feeds)
        args, kwargs = _tree_map_tensors(lambda t: t.to(device), (args, kwargs))
        with torch.no_grad():
            return _flat_outputs(run(args, kwargs))

    return Converted(model=model, reference=reference, sample_inputs=binder.sample(), notes=notes)


def _finish_dynamo_model(
    model: ir.Model, out_spec: Any, axes: Mapping[str, Mapping[int, str]], notes: list[str]
) -> None:
    """Name the outputs, apply the requested dim names (checking they stayed dynamic), and
    detach the weights from torch."""
    from torch.utils import _pytree as pytree

    if out_spec is not None:
        paths = _tree_paths(pytree.tree_unflatten([0] * out_spec.num_leaves, out_spec))
        _rename_outputs(model, _output_names(paths), notes)
    fixed = _static_axes(model, axes)
    if fixed:
        _raise_static(fixed, "the model")
    _name_torch_symbols(model, notes)
    _detach(model)


# torch.export's own names for sizes it traced symbolically: s0, s43 (backed), u0 (unbacked).
_TORCH_SYMBOL = re.compile(r"^[su]\d+$")


def _name_torch_symbols(model: ir.Model, notes: list[str]) -> None:
    """Give the dims torch.export named ``s43`` a name that says where they come from.

    Before -> After::

        x: [s43, 3, s77, s77], y: [s43, 10]  ->  x: [batch, 3, x_dim2, x_dim2], y: [batch, 10]

    An ExportedProgram keeps no trace of the ``Dim("batch")`` names it was exported with, so
    the names are made from the inputs: a symbol only ever seen as a first dim is ``batch``, any
    other ``<input>_dim<axis>`` where it first appears. Names the user gave (``dynamic_axes``,
    ``--shape``) were applied before and are not touched.
    """
    seen: dict[str, list[tuple[str, int]]] = {}
    for value in model.graph.inputs:
        for axis, d in enumerate(value.shape or ()):
            name = getattr(d, "value", None)
            if isinstance(name, str) and _TORCH_SYMBOL.match(name):
                seen.setdefault(name, []).append((value.name or "input", axis))
    batch_like = [sym for sym, places in seen.items() if all(axis == 0 for _, axis in places)]
    renames = {}
    for sym, places in seen.items():
        name, axis = places[0]
        renames[sym] = "batch" if batch_like == [sym] else f"{name}_dim{axis}"
    if renames:
        _rename_dims(model, renames)
        listed = ", ".join(f"{old} -> {new}" for old, new in renames.items())
        notes.append(
            f"torch.export names dynamic dims after its own symbols; renamed {listed} (name them "
            "yourself with dynamic_axes or --shape NAME=batch,3,height,width)"
        )


def _tree_paths(tree: Any) -> list[tuple[Any, ...]]:
    from torch.utils import _pytree as pytree

    return [path for path, _ in pytree.tree_flatten_with_path(tree)[0]]


def _output_names(paths: list[tuple[Any, ...]]) -> list[str]:
    """``output`` for a lone tensor, ``output_0``... for sequences, keys for dicts."""
    if len(paths) == 1 and not paths[0]:
        return ["output"]
    names = []
    for path in paths:
        parts = [_key_str(key) for key in path]
        name = "_".join(parts)
        if not parts or parts[0].isdigit():
            name = "_".join(["output", *parts])
        names.append(name)
    if len(set(names)) != len(names) or any(not n for n in names):
        return [f"output_{i}" for i in range(len(paths))]
    return names


def _key_str(key: Any) -> str:
    for attr in ("key", "idx", "name"):  # MappingKey, SequenceKey, GetAttrKey
        if hasattr(key, attr):
            return re.sub(r"\s+", "_", str(getattr(key, attr)))
    return re.sub(r"\W+", "_", str(key)).strip("_")


def _rename_outputs(model: ir.Model, names: list[str], notes: list[str]) -> None:
    graph = model.graph
    if len(names) != len(graph.outputs):
        notes.append(
            f"forward() returns {len(names)} tensors but the ONNX model has "
            f"{len(graph.outputs)} outputs; kept the exporter's output names"
        )
        return
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph.all_nodes():
        taken.update(v.name for v in node.outputs)
    seen: set[int] = set()
    for value, name in zip(graph.outputs, names):
        if value.name == name:
            seen.add(id(value))
            continue
        # A value that is also a graph input/initializer, or returned twice, keeps its name.
        if name in taken or id(value) in seen or value.is_graph_input() or value.is_initializer():
            notes.append(f"kept output name {value.name!r} (could not rename it to {name!r})")
        else:
            taken.discard(value.name)
            value.name = name
            taken.add(name)
        seen.add(id(value))


def _flat_outputs(out: Any) -> list[np.ndarray]:
    from torch.utils import _pytree as pytree

    return [_to_numpy(leaf) for leaf in pytree.tree_leaves(out)]


def _to_numpy(value: Any) -> np.ndarray:
    torch = _import_torch()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        if tensor.dtype == torch.bfloat16:
            import ml_dtypes

            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy().copy()
    return np.asarray(value)


def _detach(model: ir.Model) -> None:
    """Copy torch-backed (and external) weights into NumPy so the model does not alias the
    module's parameters or a temporary file."""
    detach_from_torch(model)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _file_kind(path: Path) -> _FileKind | None:
    """What a torch file is, from its zip layout or magic bytes (nothing is unpickled)."""
    try:
        if not path.is_file():
            return None
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return _zip_kind(archive.namelist())
        with path.open("rb") as f:
            head = f.read(len(_LEGACY_MAGIC))
    except (OSError, zipfile.BadZipFile):
        return None
    return "checkpoint" if head == _LEGACY_MAGIC else None


def _zip_kind(names: list[str]) -> _FileKind | None:
    # Every torch archive keeps its entries under one top-level folder (named after the file).
    inner = {name.split("/", 1)[1] for name in names if "/" in name}
    if "archive_format" in inner or any(
        n.startswith("models/") and n.endswith(".json") for n in inner
    ):
        return "pt2"
    if "constants.pkl" in inner or any(n.startswith("code/") for n in inner):
        return "torchscript"
    if "data.pkl" in inner:
        return "checkpoint"
    return None


def _load_archive(
    path: Path, options: ConvertOptions, what: str, loader: str, load: Callable[[], Any]
) -> Any:
    """``load()`` a torch archive (``what``, read by ``loader``), if the user trusts the file."""
    if not options.trust_pickle:
        raise ModelLoadError(
            f"{path} is {what}; {loader} unpickles data that can run arbitrary code, so ferry "
            "loads it only if you trust the file: pass --trust-pickle (trust_pickle=True)"
        )
    try:
        with _quiet_exporter():
            return load()
    except Exception as e:  # corrupt archive, newer torch, unknown custom op classes...
        raise ModelLoadError(f"cannot load {path} with {loader}: {first_line(e)}") from e


def _load_checkpoint(path: Path, options: ConvertOptions) -> tuple[Any, list[str]]:
    """Unpickle a torch.save file (trust_pickle only) and return the model inside."""
    torch = _import_torch()
    globals_ = _pickle_globals(path)
    python_objects = sorted(g for g in globals_ if not _weights_only_global(g))
    if globals_ and not python_objects:
        # Only tensors, dicts and numbers (what torch's weights-only loader accepts): no model
        # in there, whatever the trust. Nothing was unpickled to find out.
        raise ModelLoadError(_state_dict_message(path))
    if not options.trust_pickle:
        held = ""
        if python_objects:
            more = ", ..." if len(python_objects) > 3 else ""
            held = f" ({', '.join(python_objects[:3])}{more})"
        raise ModelLoadError(
            f"{path} is a pickled checkpoint holding Python objects{held}; "
            "unpickling it can run arbitrary code, so ferry loads it only if you trust the "
            "file: pass --trust-pickle (trust_pickle=True)"
        )
    try:
        with _quiet_exporter():
            obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a missing class (defined in a script that is not imported)...
        raise ModelLoadError(
            f"cannot unpickle {path}: {first_line(e)}. The model's class must be importable "
            "(import the module that defines it first, or pass the module object itself)"
        ) from e
    notes = [f"unpickled {path.name} with torch.load (trust_pickle)"]
    if isinstance(obj, (torch.nn.Module, torch.export.ExportedProgram)):
        return obj, notes
    if isinstance(obj, Mapping):
        models = [(k, v) for k, v in obj.items() if isinstance(v, torch.nn.Module)]
        if len(models) == 1:
            notes.append(f"converted the module under key {models[0][0]!r} of the checkpoint")
            return models[0][1], notes
        if all(isinstance(v, (torch.Tensor, Mapping, int, float, str)) for v in obj.values()):
            raise ModelLoadError(_state_dict_message(path))
    raise ModelLoadError(
        f"{path} holds a {type(obj).__module__}.{type(obj).__qualname__}, not a model: save the "
        "nn.Module itself (torch.save(model)), a torch.export program (.pt2) or TorchScript"
    )


def _state_dict_message(path: Path) -> str:
    return (
        f"{path} holds weights only (a state_dict), not a model: a state_dict needs the model's "
        "Python class. Build the model, load_state_dict() the weights, and convert the module "
        "with the Python API: ferry.convert(model, example_inputs=...)"
    )


def _pickle_globals(path: Path) -> set[str]:
    """The ``module.name`` globals a torch.save pickle references, read from its opcodes without
    running it (so nothing in the file executes)."""
    found: set[str] = set()
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                entry = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
                _scan_pickle(io.BytesIO(archive.read(entry)), found)
        else:
            # The legacy format is several pickles in a row (magic, version, system info,
            # the object, storage keys) followed by raw storage bytes.
            with path.open("rb") as f:
                for _ in range(5):
                    _scan_pickle(f, found)
    except (OSError, StopIteration, ValueError, zipfile.BadZipFile):
        pass  # unreadable parts: what was found so far (possibly nothing) decides
    return found


def _scan_pickle(stream: Any, found: set[str]) -> None:
    strings: list[str] = []
    memo: dict[int, str] = {}
    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name in ("GLOBAL", "INST") and isinstance(arg, str):
            found.add(".".join(arg.split(" ", 1)) if " " in arg else arg.replace("\n", "."))
        elif name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str) and "UNICODE" in name:
            strings.append(arg)
        elif name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET") and isinstance(arg, int) and arg in memo:
            strings.append(memo[arg])
        if name == "STOP":
            return


def _weights_only_global(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    if name in _WEIGHTS_ONLY_GLOBALS or module.startswith(_WEIGHTS_ONLY_MODULES):
        return True
    # torch.FloatStorage, torch.float32, torch.Size, torch.device...
    return module == "torch" and (
        attr.endswith("Storage") or attr in {"Size", "device"} or attr.islower()
    )


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailableError(
            "converting PyTorch models needs torch: pip install 'ferry[torch]'"
        ) from e
    return torch


@contextlib.contextmanager
def silence_exporter_logs() -> Iterator[None]:
    """Silences the exporter's warnings and log lines for the duration of one export."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name, level in saved.items():
            # Only ever raise the threshold: a caller who silenced a logger further keeps that.
            logging.getLogger(name).setLevel(max(level, logging.ERROR))
        with warnings.catch_warnings():
            # torch's pytree emits FutureWarnings/DeprecationWarnings while exporting; they are
            # about torch internals, not the caller's code.
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def detach_from_torch(model: ir.Model) -> None:
    """Replaces torch-backed tensors in the model with NumPy-backed copies.

    The exporter leaves some initializers as views of the torch module's parameters (while
    constant-folded ones are already NumPy). Copying them makes the returned model
    self-contained: it does not keep torch tensors alive, does not alias the module, and behaves
    like any model loaded from disk (plain ``ir.Tensor`` everywhere).
    """
    import onnx_ir as ir

    def copy(tensor: ir.TensorProtocol) -> ir.Tensor:
        return ir.Tensor(np.array(tensor.numpy(), copy=True), name=tensor.name)

    for value in model.graph.initializers.values():
        if value.const_value is not None and type(value.const_value) is not ir.Tensor:
            value.const_value = copy(value.const_value)
    for node in model.graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and type(attr.value) is not ir.Tensor:
                node.attributes[attr.name] = ir.AttrTensor(attr.name, copy(attr.as_tensor()))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silences torch while it exports or loads: :func:`silence_exporter_logs` for log lines and
    warnings, plus what torch prints itself (torch.export prints the partial graph to stderr when
    it fails), which goes to this module's debug log instead.

    The print capture swaps ``sys.stdout``/``sys.stderr`` for the process while it lasts, as
    ``contextlib.redirect_stdout`` does; conversions are one-off jobs, not served requests.
    """
    captured = io.StringIO()
    try:
        with (
            silence_exporter_logs(),
            contextlib.redirect_stdout(captured),
            contextlib.redirect_stderr(captured),
        ):
            yield
    finally:
        if captured.getvalue().strip():
            logger.debug("torch printed while exporting:\n%s", captured.getvalue())
