"""Hugging Face safetensors checkpoints read with our own header parser and a numpy memmap.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the raw bytes. Parsing it ourselves keeps torch and transformers
out of the read path; each :class:`LazyTensor` maps its bytes only when :meth:`LazyTensor.numpy`
is called.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import ModelLoadError

__all__ = ["LazyTensor", "read_safetensors"]

_INDEX = "model.safetensors.index.json"
# Header lengths beyond this are a corrupt file, not a real header (safetensors caps it at 100 MB).
_MAX_HEADER = 100_000_000
_DTYPES: dict[str, Any] = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # widened to float32 by shifting into the high half
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class LazyTensor:
    """One tensor of a safetensors file, read on demand.

    Attributes:
        name: The checkpoint's tensor name.
        shape: Its shape.
        dtype: The safetensors dtype name ("F32", "F16", "BF16", ...).
    """

    def __init__(
        self, name: str, path: Path, offset: int, shape: tuple[int, ...], dtype: str
    ) -> None:
        self.name = name
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self._offset = offset

    def __repr__(self) -> str:
        return f"LazyTensor({self.name!r}, {self.dtype}, {self.shape})"

    def raw(self) -> np.ndarray:
        """The stored values in their own dtype (BF16 as uint16), memory-mapped."""
        np_dtype = np.dtype(_DTYPES[self.dtype])
        count = int(np.prod(self.shape, dtype=np.int64))
        if count == 0:
            return np.zeros(self.shape, dtype=np_dtype)
        return np.memmap(self.path, dtype=np_dtype, mode="r", offset=self._offset, shape=self.shape)

    def numpy(self) -> np.ndarray:
        """The tensor as float32."""
        data = self.raw()
        if self.dtype == "BF16":
            # bfloat16 is the top half of a float32: shift the 16 bits up and reinterpret.
            return (data.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(data, dtype=np.float32)


def _read_header(path: Path) -> dict[str, LazyTensor]:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path}: not a safetensors file (only {size} bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise ModelLoadError(
                f"{path}: bad safetensors header (claims {length} bytes, file has {size})"
            )
        blob = f.read(length)
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: bad safetensors header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: bad safetensors header (not a JSON object)")
    start = 8 + length
    tensors: dict[str, LazyTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(
                f"{path}: bad safetensors header entry for {name!r}: {info!r}"
            ) from None
        if dtype not in _DTYPES:
            raise ModelLoadError(
                f"{path}: tensor {name!r} has dtype {dtype}; readable: {', '.join(_DTYPES)}"
            )
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if end - begin != expected or begin < 0 or start + end > size:
            raise ModelLoadError(
                f"{path}: tensor {name!r} ({dtype} {list(shape)}) has byte range {begin}..{end} "
                f"that does not fit its shape or the {size}-byte file (truncated?)"
            )
        tensors[name] = LazyTensor(name, path, start + begin, shape, dtype)
    return tensors


def read_safetensors(folder_or_file: str | Path) -> dict[str, LazyTensor]:
    """Every tensor of a safetensors checkpoint, lazily.

    Args:
        folder_or_file: A ``.safetensors`` file, or a folder holding ``model.safetensors``, shards
            listed by ``model.safetensors.index.json``, or any ``*.safetensors`` files.

    Returns:
        Tensor name -> :class:`LazyTensor`, in the files' order.

    Raises:
        ModelLoadError: Nothing to read, a bad header, or a shard the index names is missing.
    """
    root = Path(folder_or_file)
    if root.is_file():
        return _read_header(root)
    if not root.is_dir():
        raise ModelLoadError(f"{root}: no such safetensors file or folder")
    index = root / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: bad index ({e})") from None
        files = list(dict.fromkeys(weight_map.values()))
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise ModelLoadError(f"{index}: names shards that are missing: {', '.join(missing)}")
        paths = [root / f for f in files]
    else:
        paths = sorted(root.glob("*.safetensors"))
    if not paths:
        raise ModelLoadError(f"{root}: no *.safetensors files")
    tensors: dict[str, LazyTensor] = {}
    for path in paths:
        tensors.update(_read_header(path))
    return tensors
