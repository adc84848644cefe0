"""The compiled form the engine cache stores: a small header, then IREE's vmfb.

Layout::

    b"FERRY-IREE-1\\n" | u32 header length | header (JSON: entry, inputs, outputs) | vmfb

The header says what the vmfb alone does not: the entry function's name and which partition
value each positional argument and result is.
"""

from __future__ import annotations

import dataclasses
import json
import struct

__all__ = ["MAGIC", "Engine", "pack", "unpack"]

MAGIC = b"FERRY-IREE-1\n"


@dataclasses.dataclass(frozen=True)
class Engine:
    """A compiled partition's module and how to call it."""

    vmfb: bytes
    entry: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def pack(engine: Engine) -> bytes:
    """``engine`` as bytes for the engine cache."""
    header = json.dumps(
        {"entry": engine.entry, "inputs": engine.inputs, "outputs": engine.outputs}
    ).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + engine.vmfb


def unpack(blob: bytes) -> Engine:
    """The engine :func:`pack` wrote.

    Raises:
        ValueError: ``blob`` is not one (the engine cache then recompiles).
    """
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 4:
        raise ValueError("not a ferry IREE engine")
    start = len(MAGIC) + 4
    (size,) = struct.unpack("<I", blob[len(MAGIC) : start])
    header = json.loads(blob[start : start + size])
    return Engine(
        bytes(blob[start + size :]),
        str(header["entry"]),
        tuple(header["inputs"]),
        tuple(header["outputs"]),
    )
