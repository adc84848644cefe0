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

This module holds the converter and one conversion per kind of source; beside it,
``_pytorch_files`` reads files, ``_pytorch_inputs`` makes example inputs and dynamic shapes,
``_pytorch_export`` calls torch's exporters and reports their failures, and ``_pytorch_result``
names the result and builds the reference.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    check_names,
    exporter_opset,
    first_line,
    name_examples,
    type_modules,
)
from ferry.converters._pytorch_export import (
    _TORCHSCRIPT_DEFAULT_OPSET,
    _TORCHSCRIPT_OPSETS,
    _dynamo_export,
    _dynamo_opset,
    _import_torch,
    _raise_export_error,
    _torchscript_export,
    _torchscript_unsupported,
    _unsupported_message,
    _unsupported_nodes,
)
from ferry.converters._pytorch_files import _file_kind, _load_archive, _load_checkpoint
from ferry.converters._pytorch_inputs import (
    _bind,
    _dynamic_shapes,
    _eval_mode,
    _forward_parameters,
    _module_device,
    _module_example,
    _raise_static,
    _random_input,
    _repeat_axes,
    _requested_axes,
    _static_axes,
    _to_torch,
    _tree_map_tensors,
)
from ferry.converters._pytorch_result import (
    _Binder,
    _converted,
    _finish_dynamo_model,
    _output_names,
    _tree_paths,
)
from ferry.errors import (
    ConversionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["PyTorchConverter"]

logger = logging.getLogger(__name__)

#: Class names (defined somewhere under ``torch``) of the in-memory models this converter takes.
_MODEL_CLASS_NAMES = frozenset({"Module", "ExportedProgram", "ScriptModule", "ScriptFunction"})


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
