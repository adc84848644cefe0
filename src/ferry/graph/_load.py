"""Loading a model into the unified graph, with the checks that name what is wrong with a file."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from ferry.errors import ModelLoadError

__all__ = ["load_model", "model_source_path", "resolve_model_file"]

_ARTIFACT_MODEL = "model.onnx"


def resolve_model_file(path: str | os.PathLike[str]) -> Path:
    """Return the ``.onnx`` file that ``path`` names: the file itself or an artifact's ``model.onnx``.

    Raises:
        ModelLoadError: the path does not exist, or is a folder with no ``model.onnx`` in it.
    """
    p = Path(path)
    if p.is_dir():
        candidate = p / _ARTIFACT_MODEL
        if not candidate.is_file():
            raise ModelLoadError(
                f"{p} is a folder but holds no {_ARTIFACT_MODEL}; pass the model file itself "
                "or a ferry artifact folder"
            )
        return candidate
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelLoadError(f"{p} is not a regular file")
    return p


def load_model(source: str | os.PathLike[str] | ir.Model | onnx.ModelProto) -> ir.Model:
    """Load a model into the unified graph.

    Args:
        source: a path to an ``.onnx`` file (its external data files beside it are read lazily), an
            artifact folder holding ``model.onnx``, an ``onnx_ir.Model`` (returned as is), or an
            ``onnx.ModelProto``.

    Returns:
        The model. When it came from a file, ``model_source_path(model)`` gives that file.

    Raises:
        ModelLoadError: the file is missing, empty, corrupt, not ONNX, or its external data is missing.
    """
    if isinstance(source, ir.Model):
        return source
    if isinstance(source, onnx.ModelProto):
        model = _from_proto(source, "the given ModelProto")
        _check_not_empty(model, "the given ModelProto")
        _check_values_defined(model, "the given ModelProto")
        return model
    if not isinstance(source, (str, os.PathLike)):
        raise ModelLoadError(
            f"cannot load a model from a {type(source).__name__}; pass a path to an .onnx file, "
            "an onnx_ir.Model or an onnx.ModelProto (other formats: see `ferry convert --help`)"
        )
    path = resolve_model_file(source)
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes); was it written completely?")
    try:
        model = ir.load(path)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(
            f"{path} is not a valid ONNX model ({e}); it may be truncated or in another format "
            "(convert it first with `ferry convert`)"
        ) from e
    _check_not_empty(model, str(path))
    _check_values_defined(model, str(path))
    _check_external_data(model, path)
    model.meta["ferry.source_path"] = str(path.resolve())
    return model


def model_source_path(model: ir.Model) -> Path | None:
    """The file ``model`` was loaded from, if it was loaded from a file by :func:`load_model`."""
    path = model.meta.get("ferry.source_path")
    return Path(path) if path else None


def _from_proto(proto: onnx.ModelProto, what: str) -> ir.Model:
    try:
        return ir.from_proto(proto)
    except Exception as e:  # the deserializer raises many kinds on malformed protos
        raise ModelLoadError(f"{what} is not a well-formed ONNX model: {e}") from e


def _check_not_empty(model: ir.Model, what: str) -> None:
    # protobuf happily parses many non-ONNX byte strings into an empty ModelProto.
    if model.ir_version == 0 or (len(model.graph) == 0 and not model.graph.outputs):
        raise ModelLoadError(
            f"{what} holds no ONNX graph (no IR version, nodes or outputs); it is probably not an "
            "ONNX file (other formats: see `ferry convert --help`)"
        )


def _check_values_defined(model: ir.Model, what: str) -> None:
    """Every value a top-level node reads must come from somewhere; say which ones do not."""
    undefined = [
        (node, value.name)
        for node in model.graph
        for value in node.inputs
        if value is not None
        and value.producer() is None
        and not value.is_graph_input()
        and not value.is_initializer()
    ]
    if undefined:
        listing = "; ".join(
            f"node {n.name or n.op_type!r} ({n.op_type}) reads {v!r}" for n, v in undefined[:5]
        )
        more = f" and {len(undefined) - 5} more" if len(undefined) > 5 else ""
        raise ModelLoadError(
            f"{what} is malformed: {listing}{more}, which no node, input or initializer defines"
        )


def _check_external_data(model: ir.Model, path: Path) -> None:
    """Fail now, with the file name, rather than deep inside an engine when weights are missing."""
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            tensor = value.const_value
            if not isinstance(tensor, ir.ExternalTensor):
                continue
            data_file = Path(tensor.base_dir) / tensor.location
            if not data_file.is_file():
                raise ModelLoadError(
                    f"{path} keeps weight {value.name!r} in external data file "
                    f"{tensor.location!r}, which is missing; copy it next to the model"
                )
            end = (tensor.offset or 0) + (tensor.length or tensor.nbytes)
            if data_file.stat().st_size < end:
                raise ModelLoadError(
                    f"external data file {data_file} is too short for weight {value.name!r} "
                    f"(needs {end} bytes, has {data_file.stat().st_size}); it is truncated"
                )
