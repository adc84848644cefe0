"""Unpacking a bench agent's upload into a job's folder: one ``.onnx`` file, or a tar or zip
archive, refusing whatever could write outside the folder, through links, onto devices, over one
another, or fill the disk (size limit, member count, compression ratio), naming the member at fault.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Protocol

from ferry.serving import HTTPError

__all__ = ["INPUTS_FOLDER", "mib", "too_large", "unpack"]

#: Where an uploaded archive keeps its inputs: ``names.json`` and the ``.npy`` files it names.
INPUTS_FOLDER = "bench-inputs"
_MAX_MEMBERS = 10_000
# The compression ratio is checked only past this many unpacked bytes (see _Unpacker).
_RATIO_FLOOR = 1 << 20
_CHUNK = 1 << 20


def too_large(size: int, limit: int, more: bool = False) -> str:
    """The error for an upload of ``size`` bytes (``more``: at least) over ``limit``."""
    return (
        f"the upload is {'over ' if more else ''}{size / (1 << 20):.1f} MiB; this agent takes at "
        f"most {limit / (1 << 20):.1f} MiB (ferry agent --max-upload-mb)"
    )


def unpack(folder: Path, limit: int, max_ratio: float) -> None:
    """Turn ``folder/upload.bin`` into ``folder/model/`` (holding ``model.onnx``) and
    ``folder/inputs/``.

    Raises:
        HTTPError: 400 for an archive that is unsafe, broken, empty or holds no model (naming the
            member at fault), 413 for one that unpacks to more than ``limit`` bytes.
    """
    upload = folder / "upload.bin"
    with upload.open("rb") as f:
        head = f.read(512)
    model_dir = folder / "model"
    model_dir.mkdir()
    unpacker = _Unpacker(model_dir, limit, upload.stat().st_size, max_ratio)
    # Zip: a local file header, or the end record alone (an empty zip). Tar: gzip's magic, the
    # ustar magic, or an all-zero first block (an empty tar).
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        _extract_zip(upload, unpacker)
    elif head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar" or head == bytes(512):
        _extract_tar(upload, unpacker)
    else:  # a bare model file; reading it tells whether it is one
        upload.replace(model_dir / "model.onnx")
        (folder / "inputs").mkdir()
        return
    upload.unlink()
    entries = [p for p in model_dir.iterdir()]
    if not (model_dir / "model.onnx").exists() and len(entries) == 1 and entries[0].is_dir():
        root = entries[0]  # the archive of a folder: its one top-level folder
    else:
        root = model_dir
    if not (root / "model.onnx").is_file():
        found = [p for p in root.iterdir() if p.suffix == ".onnx" and p.is_file()]
        if len(found) != 1:
            raise HTTPError(
                400,
                "the archive holds no model.onnx"
                + (f" and {len(found)} other .onnx files" if found else "")
                + "; pack an artifact folder (model.onnx and its external data)",
            )
        found[0].rename(root / "model.onnx")
    inputs = root / INPUTS_FOLDER
    if inputs.is_dir():
        _check_inputs(inputs)
        inputs.rename(folder / "inputs")
    else:
        (folder / "inputs").mkdir()
    if root != model_dir:
        root.rename(folder / "model-root")
        model_dir.rmdir()
        (folder / "model-root").rename(model_dir)


def _check_inputs(inputs: Path) -> None:
    names_file = inputs / "names.json"
    if not names_file.is_file():
        raise HTTPError(400, f"{INPUTS_FOLDER}/ needs names.json mapping its .npy files to inputs")
    try:
        names = json.loads(names_file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HTTPError(400, f"{INPUTS_FOLDER}/names.json is not valid JSON: {e}") from e
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise HTTPError(400, f"{INPUTS_FOLDER}/names.json must map file names to input names")
    for file in names:
        if PurePosixPath(file).name != file or not (inputs / file).is_file():
            raise HTTPError(400, f"{INPUTS_FOLDER}/names.json names {file!r}, which is not there")


# What reading a broken archive raises besides the archive modules' own errors: a truncated
# stream (EOFError), a corrupt deflate, bzip2 or xz stream (zlib.error, OSError, LZMAError), a
# compression method this Python lacks (NotImplementedError, RuntimeError), a bad header field
# (ValueError, UnicodeDecodeError).
_ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    OSError,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    ValueError,
)
try:
    import lzma

    _ARCHIVE_ERRORS += (lzma.LZMAError,)
except ImportError:  # a Python built without lzma cannot open such an archive in the first place
    pass

_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_ZIP_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}
# Windows reads "C:x" (in any component) as a path on drive C, and pathlib joins it that way.
_DRIVE = re.compile(r"^[A-Za-z]:")


class _Reader(Protocol):
    """What a member is read from: tarfile's and zipfile's file objects, a GzipFile."""

    def read(self, size: int, /) -> bytes: ...


def mib(size: float) -> str:
    if size < 1 << 20:
        return f"{size / (1 << 10):.1f} KiB"
    return f"{size / (1 << 20):.1f} MiB"


def _not_plain(name: str, what: str) -> HTTPError:
    return HTTPError(
        400,
        f"the archive's member {name!r} is not a plain file but {what}; the agent takes only "
        "files and folders (pack the files themselves, not links or devices)",
    )


def _member_path(name: str, is_dir: bool) -> PurePosixPath | None:
    """The member's path relative to the folder it unpacks into; None for the folder itself
    (``.`` or ``./``, as ``tar -C folder .`` writes it).

    Raises:
        HTTPError: 400 for a name that could lead out of the folder on any system the agent runs
            on: absolute, with ``..``, with a backslash or a drive letter, or empty.
    """
    path = PurePosixPath(name)
    why = None
    if not name:
        why = "an empty name"
    elif "\\" in name:
        why = "a backslash, which Windows reads as a folder separator"
    elif name.startswith("/"):
        why = "an absolute path"
    elif ".." in path.parts:
        why = "a '..' component, which leads out of the folder"
    elif any(_DRIVE.match(part) for part in path.parts):
        why = "a drive letter"
    elif not path.parts:
        if is_dir:
            return None
        why = "no file name"
    if why is not None:
        raise HTTPError(
            400,
            f"the archive's member {name!r} has an unsafe path ({why}); pack the artifact folder "
            "with paths relative to it",
        )
    return path


class _Unpacker:
    """Writes an archive's members into ``dest``, one at a time, after checking each.

    Only folders and plain files with relative paths inside ``dest`` are written, each name once;
    nothing is written as a link, so no later member can be written through one. An archive's
    word about its sizes is never trusted: declared sizes only refuse early, and the bytes that
    actually come out of the decompressor count against the caps:

    * the total unpacked size: at most ``limit`` (413, the same limit as the upload's);
    * the compression ratio: the total at most ``max_ratio`` times the upload's size, and (zip)
      each member at most ``max_ratio`` times its compressed size (400). Only past
      ``_RATIO_FLOOR`` bytes: small files (names.json) compress far better than weights and
      cannot fill a disk.
    """

    def __init__(self, dest: Path, limit: int, packed: int, max_ratio: float) -> None:
        self.dest = dest
        self.root = dest.resolve()
        self.limit = limit
        self.packed = max(packed, 1)
        self.max_ratio = max_ratio
        self.members = 0
        self.declared = 0
        self.total = 0
        # Every path seen (case-folded: two names that differ in case are one file on macOS and
        # Windows) -> whether it is a folder (folders above a member count as seen).
        self.seen: dict[str, bool] = {}

    def admit(self, name: str, is_dir: bool) -> PurePosixPath | None:
        """Check a member's name, and against the names before it; its path (None: the root)."""
        self.members += 1
        if self.members > _MAX_MEMBERS:
            raise HTTPError(
                400,
                f"the archive holds over {_MAX_MEMBERS} entries; pack only the artifact folder "
                "(model.onnx, its external data and bench-inputs/)",
            )
        path = _member_path(name, is_dir)
        if path is None:
            return None
        parts = path.parts
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if self.seen.setdefault(above.casefold(), True) is False:
                raise HTTPError(
                    400,
                    f"the archive's member {name!r} lies inside {above!r}, which the archive "
                    "holds as a file",
                )
        key = "/".join(parts).casefold()
        before = self.seen.get(key)
        if before is not None and not (is_dir and before):
            how = "twice" if before == is_dir else "as a file and as a folder"
            raise HTTPError(
                400,
                f"the archive holds {name!r} {how} (names are compared ignoring case); each "
                "name may appear once",
            )
        self.seen[key] = is_dir
        return path

    def declare(self, name: str, size: int, packed: int | None) -> None:
        """Refuse early what a member says it unpacks to (the bytes written are checked anyway)."""
        self.declared += max(size, 0)
        self._check(name, self.declared, size, packed)

    def mkdir(self, name: str, path: PurePosixPath) -> None:
        self._target(name, path).mkdir(parents=True, exist_ok=True)

    def write(self, name: str, path: PurePosixPath, src: _Reader, packed: int | None) -> None:
        """Copy one member's bytes from ``src``, counting them against the caps as they come."""
        target = self._target(name, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL: never onto an existing file, nor through a link (none is ever written).
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o644)
        except OSError as e:
            raise _write_error(name, e) from e
        written = 0
        with os.fdopen(fd, "wb") as out:
            # A read error is the archive's (the caller's except); a write error the agent's.
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                written += len(chunk)
                self.total += len(chunk)
                self._check(name, self.total, written, packed)
                try:
                    out.write(chunk)
                except OSError as e:
                    raise _write_error(name, e) from e
            try:
                out.flush()
            except OSError as e:
                raise _write_error(name, e) from e

    def write_nowhere(self, name: str, src: _Reader) -> None:
        """Read ``src`` to its end, counting its bytes like a member's, and keep none."""
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            self.total += len(chunk)
            self._check(name, self.total, 0, None)

    def _check(self, name: str, total: int, member: int, packed: int | None) -> None:
        if total > self.limit:
            raise HTTPError(
                413,
                f"the archive is over {mib(self.limit)} unpacked (at its member {name!r}); this "
                f"agent takes at most {mib(self.limit)} (ferry agent --max-upload-mb)",
            )
        advice = (
            "a decompression bomb? If the model really is mostly zeros, send it uncompressed "
            "(the .onnx file, a plain tar, or zip -0)"
        )
        if total > _RATIO_FLOOR and total > self.max_ratio * self.packed:
            raise HTTPError(
                400,
                f"the archive unpacks to over {self.max_ratio:g} times its size of "
                f"{mib(self.packed)} (at its member {name!r}): {advice}",
            )
        if packed is not None and member > _RATIO_FLOOR and member > self.max_ratio * packed:
            raise HTTPError(
                400,
                f"the archive's member {name!r} unpacks to over {self.max_ratio:g} times its "
                f"compressed size of {packed} bytes: {advice}",
            )

    def _target(self, name: str, path: PurePosixPath) -> Path:
        target = self.dest.joinpath(*path.parts)
        # The name checks already keep every path inside, and no link is ever written; this
        # only guards against a case they did not think of.
        if not target.resolve().is_relative_to(self.root):
            raise HTTPError(400, f"the archive's member {name!r} would unpack outside its folder")
        return target


_O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _write_error(name: str, e: OSError) -> HTTPError:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HTTPError(507, f"the agent's disk is full (unpacking {name!r}); try again later")
    return HTTPError(400, f"cannot unpack the archive's member {name!r}: {e.strerror or e}")


def _empty() -> HTTPError:
    return HTTPError(
        400, "the archive is empty; pack an artifact folder (model.onnx and its external data)"
    )


def _tar_is_dir(member: tarfile.TarInfo) -> bool:
    """Whether a tar member is a folder (else a plain file); raises for anything else."""
    if member.isdir():
        return True
    if member.isreg() and not member.issparse():
        return False
    if member.issym():
        what = f"a symbolic link to {member.linkname!r}"
    elif member.islnk():
        what = f"a hard link to {member.linkname!r}"
    elif member.ischr():
        what = "a character device"
    elif member.isblk():
        what = "a block device"
    elif member.isfifo():
        what = "a FIFO (named pipe)"
    elif member.issparse():
        what = "a sparse file"  # holes that unpack to zeros nobody sent
    else:
        what = f"a tar entry of type {member.type!r}"
    raise _not_plain(member.name, what)


def _extract_tar(archive: Path, unpacker: _Unpacker) -> None:
    # Not tar.extract with filter="data": ferry writes each member itself, and only as a folder
    # or a plain file, so there is nothing for the filter to strip. The filter still gives a
    # second opinion where this Python has it (3.11.4+, 3.12, and the backports).
    data_filter = getattr(tarfile, "data_filter", None)
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for member in tar:
                is_dir = _tar_is_dir(member)
                path = unpacker.admit(member.name, is_dir)
                if data_filter is not None:
                    try:
                        data_filter(member, str(unpacker.dest))
                    except tarfile.FilterError as e:
                        raise HTTPError(
                            400, f"the archive's member {member.name!r} is refused: {e}"
                        ) from e
                if path is None:
                    continue
                if is_dir:
                    unpacker.mkdir(member.name, path)
                    continue
                unpacker.declare(member.name, member.size, None)
                src = tar.extractfile(member)
                if src is None:
                    raise HTTPError(400, f"cannot read {member.name!r} from the archive")
                with src:
                    unpacker.write(member.name, path, src, None)
            if isinstance(tar.fileobj, gzip.GzipFile):
                # gzip checks its CRC only at the end of the stream, which tarfile stops short
                # of: read on to it, so that corrupt data fails here. What follows the last
                # member counts as unpacked bytes like any other.
                unpacker.write_nowhere("(after the last member)", tar.fileobj)
    except HTTPError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise HTTPError(
            400,
            f"the upload is not a readable tar archive ({e}); it may be truncated or corrupt",
        ) from e
    if unpacker.members == 0:
        raise _empty()


def _zip_is_dir(info: zipfile.ZipInfo) -> bool:
    """Whether a zip member is a folder (else a plain file); raises for anything else."""
    kind = stat.S_IFMT(info.external_attr >> 16)  # Unix mode; 0 from tools that set none
    if info.is_dir() or kind == stat.S_IFDIR:
        return True
    if kind not in (0, stat.S_IFREG):
        raise _not_plain(info.filename, _ZIP_KINDS.get(kind, f"an entry of mode {kind:o}"))
    if info.flag_bits & 0x1:
        raise HTTPError(
            400, f"the archive's member {info.filename!r} is encrypted; send it unencrypted"
        )
    if info.compress_type not in _ZIP_METHODS:
        raise HTTPError(
            400,
            f"the archive's member {info.filename!r} is compressed with method "
            f"{info.compress_type}, which the agent cannot read; use deflate (zip's default)",
        )
    return False


def _extract_zip(archive: Path, unpacker: _Unpacker) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if not infos:
                raise _empty()
            # The central directory lists every member: check them all before writing any.
            members = []
            for info in infos:
                is_dir = _zip_is_dir(info)
                path = unpacker.admit(info.filename, is_dir)
                if not is_dir:
                    unpacker.declare(info.filename, info.file_size, info.compress_size)
                members.append((info, path, is_dir))
            for info, path, is_dir in members:
                if path is None:
                    continue
                if is_dir:
                    unpacker.mkdir(info.filename, path)
                    continue
                with zf.open(info) as src:
                    unpacker.write(info.filename, path, src, info.compress_size)
    except HTTPError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise HTTPError(
            400,
            f"the upload is not a readable zip archive ({e}); it may be truncated or corrupt",
        ) from e
