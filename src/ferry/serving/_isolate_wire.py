"""The wire between the server and an isolated model's worker: a pipe, and shared memory for
large tensors.

A message is pickled with protocol 5, its numpy buffers out of band. A buffer of
:data:`SHARED_MIN_BYTES` or more is copied into a shared-memory block, the others follow the
pickle down the pipe; the receiver copies each out into a writable buffer of its own (an input
a live session keeps for a later trial must not change under it, an output must outlive the next
call). A 1x3x640x640 float image (4.9 MB) there and an answer as large back cost about 3-4 ms
a call through shared memory, 7-9 ms through the pipe (a busy 2-core machine); a small tensor,
about 0.15 ms.

The server's end owns both blocks, one for what it sends and one for what the worker answers,
and names them in every message: it grows its own when a request needs more, and the worker's
when an answer came through the pipe for want of room; it unlinks them at close. A worker that
crashes leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import pickle
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

__all__ = ["SHARED_MIN_BYTES", "Wire"]

#: Buffers this large or larger travel through shared memory; smaller ones through the pipe.
SHARED_MIN_BYTES = 1 << 16
_ALIGN = 64
_FIRST_BLOCK = 1 << 20


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Wire:
    """One end of the wire.

    Args:
        conn: the pipe's end.
        owner: the server's end (creates, grows and unlinks the shared blocks).
    """

    def __init__(self, conn: Connection, owner: bool) -> None:
        self.conn = conn
        self.owner = owner
        self._out: SharedMemory | None = None  # where this end's large buffers go
        self._in: SharedMemory | None = None  # where the other end's arrive

    def send(self, message: Any) -> None:
        """Send ``message`` (its large contiguous buffers through shared memory)."""
        buffers: list[pickle.PickleBuffer] = []
        header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        large = sum(_aligned(r.nbytes) for r in raws if r.nbytes >= SHARED_MIN_BYTES)
        if self.owner and large and (self._out is None or self._out.size < large):
            self._out = _grown(self._out, large)
        layout: list[tuple[int, int]] = []  # (offset in the block, or -1: the pipe; size)
        piped = []
        offset = 0
        block = self._out
        for raw in raws:
            size = raw.nbytes
            if size >= SHARED_MIN_BYTES and block is not None and offset + size <= block.size:
                _view(block)[offset : offset + size] = raw
                layout.append((offset, size))
                offset = _aligned(offset + size)
            else:
                layout.append((-1, size))
                piped.append(raw)
        names = None
        if self.owner:
            names = (_name(self._out), _name(self._in))
        self.conn.send_bytes(pickle.dumps((header, layout, names), protocol=5))
        for raw in piped:
            self.conn.send_bytes(raw)

    def receive(self) -> Any:
        """Receive what the other end sent; its arrays come back writable, in buffers of their own.

        Raises:
            EOFError: the other end is gone.
        """
        header, layout, names = pickle.loads(self.conn.recv_bytes())
        if names is not None:  # the worker's end: the server names the blocks
            self._in = _attached(self._in, names[0])
            self._out = _attached(self._out, names[1])
        buffers = []
        piped_large = False
        for offset, size in layout:
            # Into numpy buffers: a bytearray is zeroed first, and copies into it are slower.
            if offset >= 0:
                assert self._in is not None
                buffer = np.frombuffer(_view(self._in), np.uint8, size, offset).copy()
            else:
                buffer = np.empty(size, np.uint8)
                if size:
                    self.conn.recv_bytes_into(buffer)
                    piped_large = piped_large or size >= SHARED_MIN_BYTES
                else:
                    self.conn.recv_bytes()
            buffers.append(buffer)
        if self.owner and piped_large:  # room for such answers next time
            need = sum(_aligned(size) for _, size in layout if size >= SHARED_MIN_BYTES)
            self._in = _grown(self._in, need)
        return pickle.loads(header, buffers=buffers)

    def close(self) -> None:
        """Release the blocks (and unlink them, at the server's end) and the pipe."""
        for block in (self._out, self._in):
            if block is not None:
                _release(block, self.owner)
        self._out = self._in = None
        self.conn.close()


def _view(block: SharedMemory) -> memoryview:
    view = block.buf
    assert view is not None  # None only once closed
    return view


def _name(block: SharedMemory | None) -> str | None:
    return None if block is None else block.name


def _grown(block: SharedMemory | None, need: int) -> SharedMemory:
    """A new block of at least ``need`` bytes (doubling), in place of ``block``."""
    size = max(_FIRST_BLOCK, 2 * block.size if block is not None else 0)
    while size < need:
        size *= 2
    if block is not None:
        _release(block, owner=True)
    return SharedMemory(create=True, size=size)


def _attached(block: SharedMemory | None, name: str | None) -> SharedMemory | None:
    """The block called ``name``, attached (``block`` when it is that one already)."""
    if block is not None and block.name == name:
        return block
    if block is not None:
        _release(block, owner=False)
    return None if name is None else SharedMemory(name=name)


def _release(block: SharedMemory, owner: bool) -> None:
    with contextlib.suppress(BufferError, OSError):
        block.close()
    if owner:
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
