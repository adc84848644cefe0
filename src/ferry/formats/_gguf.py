"""GGUF files (llama.cpp's format) read through the ``gguf`` package's memory-mapped reader.

:func:`read_gguf` parses the header only: metadata become plain Python values and each tensor a
:class:`GGUFTensor` holding a view into the mapped file, so no tensor byte is read until asked for
and none is read twice. :meth:`GGUFTensor.blocks` exposes Q4_0, Q4_1 and Q8_0 blocks exactly as
stored (codes, scales, zero points or minimums), so a decoder can carry them into int4/int8 kernels
without rounding the weights a second time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.errors import BackendUnavailableError, ModelLoadError

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["GGUFFile", "GGUFTensor", "QuantBlocks", "read_gguf"]

_MAGIC = b"GGUF"
_BLOCK = 32
# Bytes of one 32-value block: an f16 scale (+ an f16 minimum for Q4_1) and the packed codes.
_BLOCK_BYTES = {"Q4_0": 2 + 16, "Q4_1": 2 + 2 + 16, "Q8_0": 2 + 32}


@dataclass(frozen=True)
class QuantBlocks:
    """One quantized matrix as stored, blocks of 32 along the last axis.

    ``dequantized = scales * (values - zero_points)`` per block or, when ``mins`` is given (Q4_1),
    ``scales * values + mins``.

    Attributes:
        bits: 4 or 8.
        values: uint8 (out, in): the unsigned codes, 0..15 or 0..255.
        scales: float32 (out, in // 32).
        zero_points: uint8 (out, in // 32), or None when ``mins`` is used.
        mins: float32 (out, in // 32), or None.
    """

    bits: int
    values: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    mins: np.ndarray | None

    def dequantize(self) -> np.ndarray:
        """The float32 matrix these blocks encode (the same arithmetic as ``gguf``'s)."""
        out, cols = self.values.shape
        codes = self.values.reshape(out, cols // _BLOCK, _BLOCK).astype(np.float32)
        scales = self.scales[..., None]
        if self.mins is not None:
            full = scales * codes + self.mins[..., None]
        else:
            assert self.zero_points is not None
            full = scales * (codes - self.zero_points[..., None].astype(np.float32))
        return full.reshape(out, cols)


class GGUFTensor:
    """One tensor of a GGUF file, still in the mapped file.

    Attributes:
        name: The tensor's GGUF name (``blk.0.attn_q.weight``).
        ggml_type: Its storage type name ("F32", "Q4_1", "Q6_K", ...).
        shape: numpy (row-major) order, GGUF's ``ne`` reversed: a matrix is (out, in).
    """

    def __init__(
        self, name: str, ggml_type: str, shape: tuple[int, ...], raw: np.ndarray, qtype: Any
    ) -> None:
        self.name = name
        self.ggml_type = ggml_type
        self.shape = shape
        self._raw = raw
        self._qtype = qtype

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.ggml_type}, {self.shape})"

    @property
    def nbytes(self) -> int:
        """Bytes the tensor takes in the file."""
        return int(self._raw.nbytes)

    def raw(self) -> np.ndarray:
        """The stored bytes (or typed values for F32/F16), a view into the mapped file."""
        return self._raw

    def dequantize(self) -> np.ndarray:
        """The tensor as float32 of :attr:`shape`, through ``gguf.quants.dequantize``."""
        from gguf import quants

        try:
            data = quants.dequantize(self._raw, self._qtype)
        except NotImplementedError as e:
            raise ModelLoadError(
                f"GGUF tensor {self.name}: {self.ggml_type} cannot be dequantized ({e})"
            ) from None
        return np.asarray(data, dtype=np.float32).reshape(self.shape)

    def blocks(self) -> QuantBlocks | None:
        """The stored Q4_0 / Q4_1 / Q8_0 blocks, exactly; None for every other type."""
        size = _BLOCK_BYTES.get(self.ggml_type)
        if size is None:
            return None
        rows = int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1
        cols = self.shape[-1]
        raw = np.asarray(self._raw).reshape(rows, cols // _BLOCK, size)
        scales = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        if self.ggml_type == "Q8_0":
            # int8 codes stored two's complement; +128 makes them the unsigned codes around 128.
            codes = (raw[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            zeros = np.full(scales.shape, 128, dtype=np.uint8)
            return QuantBlocks(8, codes.reshape(rows, cols), scales, zeros, None)
        packed = raw[..., 4:] if self.ggml_type == "Q4_1" else raw[..., 2:]
        # ggml packs element j in the low nibble of byte j and element j + 16 in its high nibble.
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, cols)
        if self.ggml_type == "Q4_1":
            mins = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
            return QuantBlocks(4, codes, scales, None, mins)
        return QuantBlocks(4, codes, scales, np.full(scales.shape, 8, dtype=np.uint8), None)


@dataclass
class GGUFFile:
    """A parsed GGUF file.

    Attributes:
        path: The file.
        metadata: Key/value metadata as plain Python values (token and merge arrays as lists).
        architecture: ``general.architecture``.
        tensors: Every tensor, in file order.
    """

    path: Path
    metadata: dict[str, Any]
    architecture: str
    tensors: dict[str, GGUFTensor]

    def __iter__(self) -> Iterator[GGUFTensor]:
        return iter(self.tensors.values())


def _gguf_reader() -> Any:
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise BackendUnavailableError(
            f"reading GGUF files needs the gguf package ({e}); pip install 'ferry[generate]'"
        ) from None
    return GGUFReader


def _field_value(field: Any) -> Any:
    from gguf import GGUFValueType

    value = field.contents()
    if field.types == [GGUFValueType.FLOAT32]:
        # float32 metadata (1e-5 stored as 9.9999997e-06) read back as the decimal it was written as.
        return float(str(np.float32(value)))
    return value


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's header (metadata and tensor table); tensor data stays mapped.

    Args:
        path: The ``.gguf`` file.

    Returns:
        The :class:`GGUFFile`.

    Raises:
        ModelLoadError: The file is missing, not GGUF, truncated or corrupt, or holds an unknown
            tensor type.
        BackendUnavailableError: The ``gguf`` package is not installed.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    with path.open("rb") as f:
        head = f.read(4)
    if head != _MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (starts with {head!r}, expected {_MAGIC!r})")
    reader_cls = _gguf_reader()
    try:
        reader = reader_cls(path, "r")
        metadata = {
            name: _field_value(field)
            for name, field in reader.fields.items()
            if not name.startswith("GGUF.")
        }
        tensors = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            tensors[t.name] = GGUFTensor(t.name, t.tensor_type.name, shape, t.data, t.tensor_type)
    except (
        ValueError,
        IndexError,
        KeyError,
        TypeError,
        OverflowError,
        UnicodeDecodeError,
        MemoryError,
    ) as e:
        # The type enum's own ValueError: a tensor type this gguf package does not know.
        unknown = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", str(e))
        if unknown:
            raise ModelLoadError(
                f"{path}: unknown GGUF tensor type {unknown.group(1)}; a newer gguf package may read it"
            ) from None
        size = path.stat().st_size
        raise ModelLoadError(
            f"{path}: truncated or corrupt GGUF file ({size} bytes): {e}"
        ) from None
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        raise ModelLoadError(f"{path}: GGUF file without general.architecture")
    return GGUFFile(path, metadata, architecture, tensors)
