"""Load, save, prepare and inspect models in the unified graph (ONNX held as ``onnx_ir.Model``).

``load_model`` accepts a file, an artifact folder, an ``onnx_ir.Model`` or an ``onnx.ModelProto`` and
always gives an ``ir.Model``; ``save_model`` writes one atomically (a reader never sees a half-written
file, and a failed save leaves an existing file untouched); ``prepare`` gives the named, typed copy
that plans, placement and sessions work on; ``summarize`` describes a model: its inputs and
outputs, opsets, op histogram, parameters and a FLOPs estimate. ``subgraphs`` and ``node_reads``
answer what an If/Loop/Scan node holds and reads, for everyone who walks a graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import re
import secrets
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from ferry.errors import ModelLoadError

__all__ = [
    "Dim",
    "InferTypesPass",
    "ModelSummary",
    "TensorInfo",
    "atomic_path",
    "dim",
    "dtype_name",
    "graph_inputs",
    "infer_value_types",
    "inference_proto",
    "load_model",
    "model_source_path",
    "named_subgraphs",
    "node_reads",
    "prepare",
    "proto_shapes",
    "resolve_model_file",
    "save_model",
    "shape_of",
    "subgraphs",
    "summarize",
    "symbolic_shape_inference",
    "tensor_info",
]

logger = logging.getLogger(__name__)

#: A dimension: a fixed size, a symbolic name (``"batch"``), or None when unknown.
Dim = int | str | None

#: Above this many bytes of weights a model is saved with external data: protobuf cannot hold 2 GiB.
_EXTERNAL_DATA_THRESHOLD = 1 << 30

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


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on success it replaces ``dest`` in one rename.

    The file is flushed to disk before the rename, and the rename after it, so that after a
    crash or a power cut ``dest`` holds either its old bytes or all of the new ones. On any error
    the temporary file is removed and ``dest`` is left as it was.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_path, fd = _new_temp_file(dest, suffix)
    os.close(fd)
    try:
        yield tmp_path
        _fsync_file(tmp_path)
        tmp_path.replace(dest)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)


#: os.O_BINARY exists only on Windows, where without it os-level writes translate newlines.
_O_BINARY: int = getattr(os, "O_BINARY", 0)


def _new_temp_file(dest: Path, suffix: str = "") -> tuple[Path, int]:
    """Create a hidden empty file beside ``dest`` that nobody else has; return it and its fd.

    Mode 0666 lets the kernel apply the umask, which gives the permissions a plain ``open()``
    gives: ``mkstemp`` makes 0600, and fixing that up means reading the umask, which can only be
    done by setting it, racing with other threads that create files meanwhile.
    """
    while True:
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}{suffix}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666)
        except FileExistsError:
            continue


def _fsync_file(path: Path) -> None:
    # Windows cannot fsync a read-only descriptor; POSIX can, and the caller may have closed
    # the file read-only.
    fd = os.open(path, os.O_RDONLY if os.name == "posix" else os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Make the renames and creations in ``folder`` durable (POSIX; Windows cannot open folders)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder (EINVAL); nothing more to do
        pass
    finally:
        os.close(fd)


#: Tensors of at most this many bytes stay in the model file (onnx_ir's default too): an entry in
#: a data file would cost about as much as it saves.
_INLINE_TENSOR_BYTES = 256


def save_model(
    model: ir.Model, path: str | os.PathLike[str], *, external_data: bool | None = None
) -> Path:
    """Save ``model`` to ``path`` atomically.

    A reader, or a crash at any moment, finds at ``path`` either the model that was there
    before, with its weights, or the new one, with its weights: never a half-written file, nor a
    model beside another model's weights. Saving over the very files the model is being read
    from lazily (``load_model(p)`` then ``save_model(model, p)``) works.

    With external data, the weights above 256 bytes go to one data file beside the model, named

    - ``<file>.data`` (``model.onnx.data`` for ``model.onnx``) when no file has that name, else
    - ``<file>.<hash>.data``, ``<hash>`` the first 8 hex digits of the data's SHA-256 (16 random
      hex digits instead in the unlikely case that name is taken too).

    A data file is never written in place: it is written under a temporary name, flushed to disk
    and renamed to its free name; only then is the model that points at it renamed over
    ``path``. After that, the data files the replaced model pointed at are removed when they are
    named as above for ``path`` and lie beside it (a data file named otherwise may be another
    model's, and is left). Saving over a model with external data thus alternates between the
    two names. A crash can leave a file that no model points at, a hidden ``.<file>.*.tmp`` or
    a data file named as above: never read, safe to delete.

    Args:
        model: the model. It is not changed, except that weights it read lazily from a data file
            that this save removes are read from the new data file from then on (or kept in
            memory when small).
        path: the ``.onnx`` file to write.
        external_data: keep weights in a data file beside the model (named as above). None
            decides by itself: yes when the model already had external weights or they pass
            1 GiB.

    Returns:
        The path written.
    """
    path = Path(path)
    if external_data is None:
        # Subgraphs count: an If branch's weights held externally stay so.
        external_data = (
            any(isinstance(v.const_value, ir.ExternalTensor) for v in _initializers(model))
            or _param_bytes(model) > _EXTERNAL_DATA_THRESHOLD
        )
    if not external_data:
        # Weights another file holds are read in, so the file written stands alone (saved as
        # they are, they would still point at the other file, relative to the new one).
        swapped = [
            (v, v.const_value)
            for v in _initializers(model)
            if isinstance(v.const_value, ir.ExternalTensor)
        ]
        try:
            for value, tensor in swapped:
                value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
            with atomic_path(path) as tmp:
                ir.save(model, tmp)
        finally:
            for value, tensor in swapped:
                value.const_value = tensor
        return path
    _save_with_external_data(model, path)
    return path


# Saving with external data: why a new data file name each time, rather than two renames or one
# renamed folder.
#
# The model file names its data file, so the pair cannot be replaced by renaming two files over
# the old two: a crash between the renames leaves the new data under the old model (or the
# reverse), read at offsets that mean nothing. Writing both into a temporary folder and renaming
# that would be atomic, but the user names a file in a folder that holds other things (an
# artifact's plan.json, other models), and a folder cannot replace a file. So the data goes to a
# name no file has, complete and flushed before the model that points at it replaces the old
# model in one rename, and the old data file is removed only after that. Every state a crash can
# stop in has the model at ``path`` pointing at a complete data file: the old pair, or the new
# pair, each perhaps beside a file nobody points at. Never writing a data file in place also
# keeps the old one intact while the new one is written from it, which saving over the files the
# model is lazily read from needs.


@dataclasses.dataclass
class _Swap:
    """A tensor of the model replaced while it is serialized: how to put the original back, and
    the data files the original reads."""

    undo: Callable[[], None]
    reads: frozenset[Path]


def _save_with_external_data(model: ir.Model, path: Path) -> None:
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    replaced = _own_data_files_of(path)
    external = [
        v
        for v in _initializers(model)
        if v.const_value is not None
        and v.const_value.nbytes > _INLINE_TENSOR_BYTES
        and v.const_value.dtype != ir.DataType.STRING  # ONNX keeps strings in the model only
    ]
    swaps: list[_Swap] = []
    data_file: Path | None = None
    in_place = False
    try:
        if external:
            tensors = [v.const_value for v in external if v.const_value is not None]
            data_file, spans = _write_data_file(tensors, path)
            base_dir = str(folder.absolute())
            for value, tensor, (offset, length) in zip(external, tensors, spans):
                new = ir.ExternalTensor(
                    data_file.name,
                    offset,
                    length,
                    tensor.dtype,
                    shape=ir.Shape(tensor.shape.numpy()),
                    name=tensor.name or value.name or "",
                    base_dir=base_dir,
                )
                swaps.append(_swap_initializer(value, new))
        # Anything else read from a data file is small and goes into the model file, so that the
        # model written never points at a file this save may remove.
        _inline_other_external_tensors(model, exclude=set(external), swaps=swaps)
        serialized = ir.to_proto(model).SerializeToString()
        tmp, fd = _new_temp_file(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(serialized)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        in_place = True
        _fsync_dir(folder)
    except BaseException:
        for swap in swaps:
            swap.undo()
        if data_file is not None and not in_place:
            data_file.unlink(missing_ok=True)  # no model points at it
        raise
    removed = _remove_replaced(replaced, keep=data_file)
    for swap in swaps:
        # The caller's model gets its own tensors back, except those read from a file just
        # removed: it keeps the new ones, which hold the same values.
        if not swap.reads & removed:
            swap.undo()


def _write_data_file(
    tensors: list[ir.TensorProtocol], path: Path
) -> tuple[Path, list[tuple[int, int]]]:
    """Write ``tensors`` end to end into a new data file beside the model file ``path``.

    Returns:
        The data file, under a name no file had before, and each tensor's (offset, length).
    """
    digest = hashlib.sha256()
    spans: list[tuple[int, int]] = []
    tmp, fd = _new_temp_file(path, ".data")
    claimed: Path | None = None
    try:
        with os.fdopen(fd, "wb") as f:
            offset = 0
            for tensor in tensors:
                raw = tensor.tobytes()
                f.write(raw)
                digest.update(raw)
                spans.append((offset, len(raw)))
                offset += len(raw)
            f.flush()
            os.fsync(f.fileno())
        claimed = _claim_data_name(path, digest.hexdigest())
        # The claimed name holds an empty file no model points at; this rename fills it. (A hard
        # link would need no placeholder, but onnx_ir refuses to read a data file with two links,
        # which a crash between linking and removing the temporary name would leave.)
        tmp.replace(claimed)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if claimed is not None:
            claimed.unlink(missing_ok=True)  # the placeholder or the data: no model points at it
        raise
    _fsync_dir(path.parent)
    return claimed, spans


def _claim_data_name(path: Path, sha256: str) -> Path:
    """Create, empty, the first free one of ``<file>.data``, ``<file>.<hash8>.data``, then random
    names. O_EXCL makes the claim atomic: no other file, and no concurrent save, has the name."""
    names = [f"{path.name}.data", f"{path.name}.{sha256[:8]}.data"]
    while True:
        name = names.pop(0) if names else f"{path.name}.{secrets.token_hex(8)}.data"
        candidate = path.with_name(name)
        try:
            os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o666))
        except FileExistsError:
            continue
        return candidate


def _own_data_files_of(path: Path) -> dict[Path, tuple[int, int]]:
    """The data files the model now at ``path`` points at and that ``save_model`` would name for
    it (so they are its own, and removed once it is replaced), each with its device and inode.

    The identity guards the removal: a file that another save has put under that name since is
    not the one the replaced model pointed at.
    """
    own = re.compile(re.escape(path.name) + r"(\.[0-9a-f]{8,64})?\.data")
    # Parse the old model only when it can have such a file: it may be large and inline.
    if not path.is_file() or not any(own.fullmatch(p.name) for p in _siblings(path)):
        return {}
    try:
        old = ir.load(path)
    except Exception as e:  # a corrupt or foreign file: nothing is removed
        logger.debug("not removing data files of %s, which does not load: %s", path, e)
        return {}
    folder = path.parent.resolve()
    found: dict[Path, tuple[int, int]] = {}
    for tensor in _all_tensors(old):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = os.fspath(tensor.location)
        if not own.fullmatch(location):  # also refuses any location with a folder in it
            continue
        file = folder / location
        try:
            st = file.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):  # never a link: what it points at may be anyone's
            found[file] = (st.st_dev, st.st_ino)
    return found


def _siblings(path: Path) -> Iterator[Path]:
    try:
        yield from path.parent.iterdir()
    except OSError:
        return


def _remove_replaced(replaced: dict[Path, tuple[int, int]], keep: Path | None) -> frozenset[Path]:
    """Remove the replaced model's data files, but ``keep`` and any file since replaced under
    the same name. A failure is logged, not raised: the save itself has succeeded."""
    keep_id = None
    if keep is not None:
        with contextlib.suppress(OSError):
            st = keep.lstat()
            keep_id = (st.st_dev, st.st_ino)
    removed: set[Path] = set()
    for file, identity in replaced.items():
        try:
            st = file.lstat()
            if (st.st_dev, st.st_ino) != identity or identity == keep_id:
                continue
            file.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:  # e.g. Windows, while something still maps it
            logger.warning("could not remove %s, which no model points at any more: %s", file, e)
            continue
        removed.add(file)
    return frozenset(removed)


def _read_from(tensor: ir.TensorProtocol | None) -> frozenset[Path]:
    if isinstance(tensor, ir.ExternalTensor):
        return frozenset({Path(os.path.realpath(tensor.path))})
    return frozenset()


def _in_memory(tensor: ir.TensorProtocol) -> ir.Tensor:
    # A copy: the array of an external tensor maps a file that the save may remove.
    return ir.Tensor(np.array(tensor.numpy(), copy=True), dtype=tensor.dtype, name=tensor.name)


def _swap_initializer(value: ir.Value, tensor: ir.TensorProtocol) -> _Swap:
    original = value.const_value

    def undo() -> None:
        value.const_value = original

    value.const_value = tensor
    return _Swap(undo, _read_from(original))


def _swap_attribute(node: ir.Node, attr: ir.Attr) -> _Swap:
    """Give ``node`` a copy of tensor attribute ``attr`` holding its tensors in memory."""
    tensors = list(attr.value) if attr.type == ir.AttributeType.TENSORS else [attr.value]
    loaded = [_in_memory(t) if isinstance(t, ir.ExternalTensor) else t for t in tensors]
    value = loaded if attr.type == ir.AttributeType.TENSORS else loaded[0]
    node.attributes[attr.name] = ir.Attr(attr.name, attr.type, value, doc_string=attr.doc_string)

    def undo() -> None:
        node.attributes[attr.name] = attr

    return _Swap(undo, frozenset().union(*(_read_from(t) for t in tensors)))


def _inline_other_external_tensors(
    model: ir.Model, exclude: set[ir.Value], swaps: list[_Swap]
) -> None:
    """Hold in memory every external tensor of ``model`` but the initializers in ``exclude``:
    the small initializers and the tensor attributes (Constant values stored externally).

    Each swap is added to ``swaps`` as it is made, so that a read failing half-way (a missing
    data file) can still be undone.
    """
    for value in _initializers(model):
        if value not in exclude and isinstance(value.const_value, ir.ExternalTensor):
            swaps.append(_swap_initializer(value, _in_memory(value.const_value)))
    for node in _all_nodes(model):
        for attr in list(node.attributes.values()):
            if _external_attribute(attr):
                swaps.append(_swap_attribute(node, attr))


def _external_attribute(attr: ir.Attr) -> bool:
    if attr.is_ref():
        return False
    if attr.type == ir.AttributeType.TENSOR:
        return isinstance(attr.value, ir.ExternalTensor)
    if attr.type == ir.AttributeType.TENSORS:
        return any(isinstance(t, ir.ExternalTensor) for t in attr.value)
    return False


def _all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node: of the graph, of its subgraphs and of the model's functions."""
    yield from model.graph.all_nodes()
    for function in model.functions.values():
        yield from function.all_nodes()


def _all_tensors(model: ir.Model) -> Iterator[ir.TensorProtocol]:
    """Every tensor the model holds: initializers and tensor attributes, at any depth."""
    for value in _initializers(model):
        if value.const_value is not None:
            yield value.const_value
    for node in _all_nodes(model):
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.TENSOR and attr.value is not None:
                yield attr.value
            elif attr.type == ir.AttributeType.TENSORS and attr.value is not None:
                yield from attr.value


def _has_external_data(model: ir.Model) -> bool:
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def _param_bytes(model: ir.Model) -> int:
    return sum(t.nbytes for t in _weights(model))


def _weights(model: ir.Model) -> Iterator[ir.TensorProtocol]:
    """Every weight tensor: initializers and the values of Constant nodes (Paddle's exporter, for
    one, keeps all weights in Constant nodes), subgraphs included."""
    for value in _initializers(model):
        if value.const_value is not None:
            yield value.const_value
    for node in model.graph.all_nodes():
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = node.attributes.get("value")
            if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
                yield attr.as_tensor()


def _initializers(model: ir.Model) -> Iterator[ir.Value]:
    for graph in (model.graph, *model.graph.subgraphs()):
        yield from graph.initializers.values()


# ---------------------------------------------------------------------------------------------
# Walking graphs


def named_subgraphs(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """``(attribute name, graph)`` for every graph ``node`` holds directly: If branches, Loop and
    Scan bodies (none for most ops)."""
    found: list[tuple[str, ir.Graph]] = []
    for name, attr in node.attributes.items():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            found.append((name, attr.as_graph()))
        elif attr.type == ir.AttributeType.GRAPHS:
            found.extend((name, g) for g in attr.as_graphs())
    return found


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` holds directly (see :func:`named_subgraphs`)."""
    return [graph for _, graph in named_subgraphs(node)]


def node_reads(node: ir.Node) -> list[ir.Value]:
    """Every value of ``node``'s graph that ``node`` reads: its inputs, then the outer values its
    subgraphs read at any depth (If/Loop/Scan capture them), each once, in order of first read."""
    reads: dict[ir.Value, None] = {v: None for v in node.inputs if v is not None}
    graph = node.graph
    for body in subgraphs(node):
        for inner in body.all_nodes():
            for value in inner.inputs:
                # Only the node's own scope crosses; a body's values travel with the body.
                if value is not None and value.graph is graph:
                    reads[value] = None
    return list(reads)


# ---------------------------------------------------------------------------------------------
# Preparing


class InferTypesPass(ir.passes.InPlacePass):
    """Give values the dtypes and shapes ONNX shape inference finds, where the model declares none.

    Before -> After::

        node output: dtype None, shape None  ->  dtype FLOAT, shape [batch, 8]   (as inferred)
        node output: dtype FLOAT, shape [batch, 8]  ->  unchanged (declared types are kept)

    Best effort: a model inference cannot handle (custom ops) keeps its declared types. Weights
    above 1 KiB are left out of the proto given to inference (their types stay), so nothing large
    is copied; onnx_ir's ``ShapeInferencePass`` would also deserialize the whole inferred model to
    merge it back, which dominates on large graphs; this reads only the value infos.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        inferred = _inferred_value_infos(model)
        if inferred is None:
            return ir.passes.PassResult(model, modified=False)
        untyped = {
            value.name or "": value
            for node in model.graph
            for value in node.outputs
            if value.dtype is None or value.shape is None
        }
        modified = False
        for info in inferred.graph.value_info:
            target = untyped.get(info.name)
            if target is None or not info.type.HasField("tensor_type"):
                continue
            tensor_type = info.type.tensor_type
            if target.dtype is None and tensor_type.elem_type:
                target.dtype = ir.DataType(tensor_type.elem_type)
                modified = True
            if target.shape is None and tensor_type.HasField("shape"):
                target.shape = ir.Shape([_dim(d) for d in tensor_type.shape.dim])
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def prepare(model: ir.Model) -> ir.Model:
    """The copy of ``model`` that plans, placement and sessions work on.

    Before -> After::

        model (nodes or values unnamed or named twice, intermediate types unknown)
            -> copy: every node and value named uniquely (onnx_ir's ``NameFixPass``), value types
               inferred where undeclared (:class:`InferTypesPass`)

    Weights are shared, not copied, and ``model`` is not changed. Naming is deterministic, so a
    plan made on one prepared copy fits every other copy of the same model.
    """
    from onnx_ir.passes.common import NameFixPass

    try:
        work = model.clone()
    except RuntimeError:
        # onnx_ir clones only topologically sorted graphs; a round trip through the proto takes
        # any order (and copies the weights, which only such rare models pay for).
        work = ir.from_proto(ir.to_proto(model))
    ir.passes.PassManager([NameFixPass(), InferTypesPass()])(work)
    return work


# ---------------------------------------------------------------------------------------------
# Inspection


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, element type and shape (None when unknown)."""

    name: str
    dtype: str | None
    shape: tuple[Dim, ...] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """What ``ferry info`` shows about a model."""

    producer: str
    ir_version: int
    opsets: dict[str, int]
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    op_counts: dict[str, int]
    node_count: int
    param_count: int
    param_bytes: int
    #: FLOPs of one inference (Conv, ConvTranspose, MatMul, Gemm) at ``flops_shapes``, or with
    #: every symbolic dim taken as 1 when no shapes were given.
    flops: int
    #: Nodes of those four op types whose FLOPs could not be estimated (shapes unknown).
    flops_unknown_nodes: int
    has_subgraphs: bool
    external_data: bool
    #: Inputs with a default the caller may override (initializers the model also lists as
    #: inputs, IR >= 4): a streaming model's state, say.
    optional_inputs: tuple[TensorInfo, ...] = ()
    #: The input shapes ``flops`` was counted at (None: symbolic dims as 1).
    flops_shapes: dict[str, list[int]] | None = None
    #: Symbolic input dims past the first (``x[2]``) that ``flops`` depends on and took as 1: an
    #: image model's height and width. Give shapes for the real figure.
    flops_assumed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = [t.to_dict() for t in self.inputs]
        d["outputs"] = [t.to_dict() for t in self.outputs]
        d["optional_inputs"] = [t.to_dict() for t in self.optional_inputs]
        return d


#: Names exporters give a dim that has no identity of its own; like an empty name, they bind nothing.
_PLACEHOLDER_NAMES = frozenset({"none", "null", "unknown", "dynamic", "unk", "nan"})


def dim(d: int | str | ir.SymbolicDim | None) -> Dim:
    """One dim as ferry reads it: a fixed size, a name, or None when unknown.

    Exporters spell "any size" several ways, and none of them is a fixed size or a name that binds
    two dims together: a negative size (``dim_value: -1``), an empty name, and placeholder names
    such as ``?``, ``-1`` or ``None``. All of them are None here. A real name (``batch``,
    ``height``, ``unk__3``) is kept: the same name on two inputs or axes means the same size.
    """
    if isinstance(d, ir.SymbolicDim):
        d = d.value
    if d is None:
        return None
    if isinstance(d, int):
        return d if d >= 0 else None
    name = str(d).strip()
    if not any(c.isalnum() for c in name) or name.lstrip("+-").isdigit():
        return None
    return None if name.lower() in _PLACEHOLDER_NAMES else name


def shape_of(value: ir.Value) -> tuple[Dim, ...] | None:
    """The shape of ``value`` as ferry reads it (see :func:`dim`); None when the rank is unknown."""
    if value.shape is None:
        return None
    return tuple(dim(d) for d in value.shape)


def dtype_name(dtype: ir.DataType) -> str:
    """numpy's name for an ONNX element type (``float32``, ``int64``, ``bfloat16``), or ONNX's."""
    if dtype == ir.DataType.STRING:
        return "string"
    try:
        return str(np.dtype(dtype.numpy()).name)
    except (TypeError, ValueError):
        return dtype.name.lower()


def tensor_info(value: ir.Value) -> TensorInfo:
    """The name, dtype and shape of a graph value."""
    dtype = dtype_name(value.dtype) if value.dtype is not None else None
    return TensorInfo(name=value.name or "", dtype=dtype, shape=shape_of(value))


def graph_inputs(model: ir.Model) -> list[ir.Value]:
    """Inputs the caller must feed: graph inputs that are not initializers (IR < 4 lists both)."""
    return [v for v in model.graph.inputs if v.name not in model.graph.initializers]


def infer_value_types(model: ir.Model) -> dict[str, tuple[str | None, tuple[Dim, ...] | None]]:
    """Run ONNX shape inference on ``model``; map each value name to ``(dtype, shape)``.

    The model is not changed. Shape inference failing (custom ops, malformed graphs) gives an empty
    mapping, not an error: it only refines what is declared.
    """
    inferred = _inferred_value_infos(model)
    if inferred is None:
        return {}
    found: dict[str, tuple[str | None, tuple[Dim, ...] | None]] = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dtype = dtype_name(ir.DataType(tt.elem_type)) if tt.elem_type else None
        shape: tuple[Dim, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(_dim(d) for d in tt.shape.dim)
        found[vi.name] = (dtype, shape)
    return found


#: Weights larger than this are left out of the proto given to shape inference (their type stays).
_INFERENCE_WEIGHT_LIMIT = 1024


def inference_proto(model: ir.Model) -> onnx.ModelProto:
    """``model`` as a proto for shape inference: weights above the limit are typed inputs instead
    of initializers (shapes never depend on their values, and no large tensor is copied). The
    model itself is not changed, beyond giving weights the type their tensor has."""
    graph = model.graph
    small: list[ir.Value] = []
    large: list[ir.Value] = []
    for value in graph.initializers.values():
        tensor = value.const_value
        if tensor is not None and tensor.nbytes <= _INFERENCE_WEIGHT_LIMIT:
            small.append(value)
            continue
        if tensor is not None:  # a weight's type is its tensor's, declared or not
            value.shape = value.shape if value.shape is not None else ir.Shape(tensor.shape.numpy())
            value.dtype = value.dtype if value.dtype is not None else tensor.dtype
        if not value.is_graph_input():
            large.append(value)
    view = ir.GraphView(
        [*graph.inputs, *large],
        graph.outputs,
        nodes=graph,
        initializers=small,
        opset_imports=dict(graph.opset_imports),
        name=graph.name,
    )
    shell = ir.Model(
        view,  # type: ignore[arg-type]  # onnx_ir serializes a GraphView like a Graph
        ir_version=max(model.ir_version, 4),
        functions=list(model.functions.values()),
    )
    return ir.to_proto(shell)


def _inferred_value_infos(model: ir.Model) -> onnx.ModelProto | None:
    """ONNX shape inference's result on ``model`` (see :func:`inference_proto`), or None."""
    try:
        proto = inference_proto(model)
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises a zoo of types; inference is best effort here
        logger.info("shape inference failed, shapes stay as declared: %s", e)
        return None


def symbolic_shape_inference(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference on ``proto``, what it found even where it did not
    finish; None where it is not available (it needs sympy) or fails.

    Its public ``infer_shapes`` raises on the first op it cannot infer, losing the rest, and then
    saves the model in the working directory; this runs the same loop without either.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception as e:  # ImportError without sympy
        logger.debug("ONNX Runtime's symbolic shape inference is unavailable: %s", e)
        return None
    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)
    try:
        inference._preprocess(proto)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        out = inference.out_mp_
    except Exception as e:  # best effort, like ONNX's
        logger.info("ONNX Runtime's symbolic shape inference stopped early: %s", e)
        found = getattr(inference, "known_vi_", None)
        if not found:
            return None
        out = onnx.ModelProto()
        out.graph.value_info.extend(
            vi for name, vi in found.items() if vi.type.HasField("tensor_type") and name
        )
    return out if isinstance(out, onnx.ModelProto) else None


def proto_shapes(proto: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Each tensor value's shape in ``proto`` (value infos and outputs), where it has one."""
    shapes: dict[str, tuple[Dim, ...]] = {}
    for info in (*proto.graph.value_info, *proto.graph.output):
        if not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = tuple(
                dim(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
                for d in tensor_type.shape.dim
            )
    return shapes


def _dim(d: Any) -> Dim:
    """A dim of a protobuf shape, read as :func:`dim` reads any other."""
    return dim(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))


def summarize(
    model: ir.Model, input_shapes: dict[str, tuple[int, ...]] | None = None
) -> ModelSummary:
    """Describe ``model``: I/O specs, opsets, op histogram, parameters, FLOPs estimate.

    Args:
        model: the model (not changed).
        input_shapes: concrete shapes of (some of) the inputs to count FLOPs at; without them,
            FLOPs are per sample with every symbolic dim taken as 1.

    Raises:
        ModelLoadError: ``input_shapes`` names an input the model does not have, or gives it
            another rank or a fixed dim another size.
    """
    types = infer_value_types(model)
    if input_shapes:
        dims = _dims_reader(infer_value_types(_at_shapes(model, input_shapes)), concrete=True)
    else:
        dims = _dims_reader(types, concrete=False)
    op_counts: Counter[str] = Counter()
    flops = 0
    unknown = 0
    node_count = 0
    for node in model.graph.all_nodes():
        node_count += 1
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        op_counts[key] += 1
        if node.domain in ("", "ai.onnx") and node.op_type in _FLOP_COUNTERS:
            estimate = _FLOP_COUNTERS[node.op_type](node, dims)
            if estimate is None:
                unknown += 1
            else:
                flops += estimate
    params = list(_weights(model))

    def io(value: ir.Value) -> TensorInfo:
        info = tensor_info(value)
        dtype, shape = types.get(info.name, (None, None))
        return TensorInfo(info.name, info.dtype or dtype, info.shape or shape)

    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ModelSummary(
        producer=producer or "unknown",
        ir_version=model.ir_version,
        opsets={(k or "ai.onnx"): v for k, v in model.opset_imports.items()},
        inputs=tuple(io(v) for v in graph_inputs(model)),
        outputs=tuple(io(v) for v in model.graph.outputs),
        op_counts=dict(op_counts.most_common()),
        node_count=node_count,
        param_count=sum(t.size for t in params),
        param_bytes=sum(t.nbytes for t in params),
        flops=flops,
        flops_unknown_nodes=unknown,
        has_subgraphs=any(True for _ in model.graph.subgraphs()),
        external_data=_has_external_data(model),
        optional_inputs=tuple(
            io(v)
            for v in model.graph.inputs
            if v.name in model.graph.initializers and model.ir_version >= 4
        ),
        flops_shapes={k: list(v) for k, v in input_shapes.items()} if input_shapes else None,
        flops_assumed=()
        if input_shapes
        else tuple(
            f"{v.name}[{axis}]"
            for v in graph_inputs(model)
            for axis, d in enumerate(shape_of(v) or ())
            if axis > 0 and not isinstance(d, int)
        ),
    )


def _at_shapes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> ir.Model:
    """A shallow copy of ``model`` whose inputs have the given concrete shapes and whose other
    values have none declared, so that shape inference works them all out from those."""
    copy = model.clone()
    for node in copy.graph:
        for output in node.outputs:
            output.shape = None
    inputs = {v.name: v for v in graph_inputs(copy)}
    for name, shape in shapes.items():
        value = inputs.get(name)
        if value is None:
            raise ModelLoadError(
                f"--shape names {name!r}, which is not an input; inputs: {', '.join(map(str, inputs))}"
            )
        declared = shape_of(value)
        if declared is not None and (
            len(declared) != len(shape)
            or any(isinstance(d, int) and d != s for d, s in zip(declared, shape))
        ):
            raise ModelLoadError(
                f"--shape {name}={','.join(map(str, shape))} does not fit its declared shape "
                f"{list(declared)}"
            )
        value.shape = ir.Shape(list(shape))
    return copy


# FLOPs: a multiply-add counts as two. Symbolic dims count as 1, i.e. the figure is per sample.


#: Reads a value's dims for FLOP counting: a list of sizes, or None when unknown.
_DimsOf = Callable[[ir.Value | None], list[int] | None]


def _dims_reader(
    types: dict[str, tuple[str | None, tuple[Dim, ...] | None]], concrete: bool
) -> _DimsOf:
    """Declared dims, else inferred ones (``types``), symbolic dims as 1; with ``concrete``
    types (inferred at given input shapes), those come first."""

    def dims(value: ir.Value | None) -> list[int] | None:
        if value is None:
            return None
        inferred = types.get(value.name or "", (None, None))[1]
        shape = shape_of(value)
        if (concrete and inferred is not None) or shape is None or any(d is None for d in shape):
            shape = inferred
        if shape is None:
            return None
        return [d if isinstance(d, int) else 1 for d in shape]

    return dims


def _conv_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    w = dims(node.inputs[1])
    out = dims(node.outputs[0])
    if w is None or out is None or len(out) < 2:
        return None
    # out [N, M, *spatial]; weight [M, C/group, *kernel]: each output element is one dot product.
    return 2 * math.prod(out) * math.prod(w[1:])


def _conv_transpose_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    x = dims(node.inputs[0])
    w = dims(node.inputs[1])
    if x is None or w is None:
        return None
    # Each input element scatters into (M/group) * prod(kernel) outputs: weight [C, M/group, *k].
    return 2 * math.prod(x) * math.prod(w[1:])


def _matmul_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    a = dims(node.inputs[0])
    out = dims(node.outputs[0])
    if a is None or out is None or not a:
        return None
    return 2 * math.prod(out) * a[-1]


def _gemm_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    a = dims(node.inputs[0])
    out = dims(node.outputs[0])
    if a is None or out is None or len(a) != 2:
        return None
    trans_a = node.attributes.get_int("transA", 0)
    k = a[0] if trans_a else a[1]
    return 2 * math.prod(out) * k


_FLOP_COUNTERS = {
    "Conv": _conv_flops,
    "ConvTranspose": _conv_transpose_flops,
    "MatMul": _matmul_flops,
    "Gemm": _gemm_flops,
}
