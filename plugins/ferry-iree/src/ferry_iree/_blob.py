"""The compiled form the engine cache stores: a small header, then IREE's vmfb.

Layout::

    b"FERRY-IREE-2\\n" | u32 header length | header (JSON: entry, inputs, outputs, dtypes) | vmfb

The header says what the vmfb alone does not: the entry function's name, which partition value
each positional argument and result is, and each result's ONNX element type (IREE's signless
integers come back as int8 where the model says uint8).
"""

from __future__ import annotations

import dataclasses
import json
import struct

__all__ = ["MAGIC", "Engine", "pack", "unpack"]

MAGIC = b"FERRY-IREE-2\n"


@dataclasses.dataclass(frozen=True)
class Engine:
    """A compiled partition's module and how to call it."""

    vmfb: bytes
    entry: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: Each output's numpy dtype (``np.dtype.str``, ``"|u1"``); empty where the model says none.
    dtypes: tuple[str, ...] = ()


def pack(engine: Engine) -> bytes:
    """``engine`` as bytes for the engine cache."""
    header = json.dumps(
        {
            "entry": engine.entry,
            "inputs": engine.inputs,
            "outputs": engine.outputs,
            "dtypes": engine.dtypes,
        }
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
        tuple(header.get("dtypes", ())),
    )
