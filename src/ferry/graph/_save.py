"""Saving a model atomically, with its weights inline or in one external data file beside it.

A reader never sees a half-written file, and a failed save leaves an existing file untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ferry.graph._tensors import all_initializers, all_nodes, tensors

__all__ = ["atomic_path", "save_model"]

logger = logging.getLogger(__name__)

#: Above this many bytes of weights a model is saved with external data: protobuf cannot hold 2 GiB.
_EXTERNAL_DATA_THRESHOLD = 1 << 30


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
            any(isinstance(v.const_value, ir.ExternalTensor) for v in all_initializers(model))
            or _param_bytes(model) > _EXTERNAL_DATA_THRESHOLD
        )
    if not external_data:
        # Weights another file holds are read in, so the file written stands alone (saved as
        # they are, they would still point at the other file, relative to the new one).
        swapped = [
            (v, v.const_value)
            for v in all_initializers(model)
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
        for v in all_initializers(model)
        if v.const_value is not None
        and v.const_value.nbytes > _INLINE_TENSOR_BYTES
        and v.const_value.dtype != ir.DataType.STRING  # ONNX keeps strings in the model only
    ]
    swaps: list[_Swap] = []
    data_file: Path | None = None
    in_place = False
    try:
        if external:
            held = [v.const_value for v in external if v.const_value is not None]
            data_file, spans = _write_data_file(held, path)
            base_dir = str(folder.absolute())
            for value, tensor, (offset, length) in zip(external, held, spans):
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
    for tensor in tensors(old):
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
    for value in all_initializers(model):
        if value not in exclude and isinstance(value.const_value, ir.ExternalTensor):
            swaps.append(_swap_initializer(value, _in_memory(value.const_value)))
    for node in all_nodes(model):
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


def _param_bytes(model: ir.Model) -> int:
    return sum(t.nbytes for t in tensors(model, weights_only=True))
