"""ONNX Runtime keeps many sequences' caches in one pool and decodes them as one batch.

One zeroed buffer per cache tensor, ``[rows, kv_heads, capacity, head_dim]``; row ``r`` is one
sequence's cache from its prompt to its last token. GroupQueryAttention writes each row's new
slot where that row's mask ends, so a decode step over rows of different lengths runs as one
batch, every row in place: the rows a step covers are bound as one contiguous slice of the pool
(rows between them that are idle ride along with an empty mask, which costs one slot of
attention each). A prompt runs for its row alone: the first chunk as a plain run whose presents
are copied into the row (an empty wide past made a prefill 1.6x slower), later chunks in place on
the row's slice (GroupQueryAttention takes a batch of prompts only without a past).

Memory is committed as rows fill, not up front, and given back when a sequence ends: the buffers
are anonymous memory maps kept off transparent huge pages (with them, the first slot of each
head's segment of a row 8,192 slots wide faulted in a 2 MiB page: 360 MiB and 0.4-0.9 s per new
row on SmolLM2), and a finished row's pages are dropped (``release``).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.backends._kv import KVLayout
from ferry.backends._onnxruntime_kv import _static_vocab, run_prompt
from ferry.errors import ExecutionError

__all__ = ["OrtKVPool"]


class OrtKVPool:
    """A :class:`~ferry.backends.KVPool` on an ``onnxruntime.InferenceSession`` whose graph
    shares past and present (``KVLayout.in_place``)."""

    def __init__(
        self, session: Any, layout: KVLayout, rows: int, error_message: Callable[[Any], str]
    ) -> None:
        import onnxruntime as ort

        self._session = session
        self.layout = layout
        self.rows = rows
        self._message = error_message
        self._ortvalue = ort.OrtValue.ortvalue_from_numpy
        shape = (rows, layout.kv_heads, layout.capacity, layout.head_dim)
        self._maps = [
            _anonymous(int(np.prod(shape)) * np.dtype(layout.dtype).itemsize) for _ in layout.past
        ]
        self._buffers = [
            np.frombuffer(memory, dtype=layout.dtype).reshape(shape) for memory in self._maps
        ]
        self._row_bytes = self._buffers[0][0].nbytes if rows else 0
        self._binding = session.io_binding()
        self._bound: tuple[int, int] | None = None  # the slice of rows bound now
        self._defaults = {value.name for value in session.get_overridable_initializers()}
        self._vocab = _static_vocab(session, layout.logits)
        # slots each row holds: an idle row a step covers gets its new slot after them, where
        # no sequence's data is (a row between two chunks of its prompt keeps its cache)
        self._used = [0] * rows
        #: The fewest rows a decode step runs: 2 where one row alone would take another kernel
        #: than rows in company and round differently (onnxruntime's 4-bit MatMulNBits with float
        #: activations has its own one-row kernel), so a sequence's tokens do not depend on
        #: whether others run beside it. The caller finds out which (``BatchEngine``).
        self.min_batch = 1

    def release(self, row: int) -> None:
        """The sequence in ``row`` ended: its pages go back to the system (read as zeros)."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None or not self._row_bytes:
            return
        start = row * self._row_bytes
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the row only
        end = (start + self._row_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > first:
            for memory in self._maps:
                memory.madvise(advice, first, end - first)
        self._used[row] = 0

    def run(self, rows: Sequence[int], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        logits = self._run(rows, feeds)
        for row, mask in zip(rows, feeds["attention_mask"]):
            self._used[row] = int(mask.sum())
        return logits

    def _run(self, rows: Sequence[int], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        new = int(feeds["input_ids"].shape[1])
        if new > 1:
            if len(rows) != 1:
                raise ValueError("a prompt runs for one row at a time")
            used = int(feeds["attention_mask"][0].sum()) - new
            if used == 0:
                return self._prefill(rows[0], feeds, new)
        first, last = min(rows), max(rows)
        if new == 1 and last - first + 1 < self.min_batch:  # an idle neighbour rides along
            if last + 1 < self.rows:
                last += self.min_batch - (last - first + 1)
            else:
                first = max(0, last - self.min_batch + 1)
        width = last - first + 1
        if len(rows) == width and list(rows) == list(range(first, last + 1)):
            batch = dict(feeds)
        else:  # idle rows in between ride along with an empty mask
            batch = {}
            where = [row - first for row in rows]
            for name, array in feeds.items():
                if not array.ndim:
                    batch[name] = array
                    continue
                full = np.zeros((width, *array.shape[1:]), dtype=array.dtype)
                full[where] = array
                batch[name] = full
            mask = batch["attention_mask"]
            busy = set(where)
            for index in range(width):
                if index not in busy:
                    mask[index, : min(self._used[first + index] + 1, mask.shape[1])] = 1
        logits = self._step(first, width, batch, new)
        if len(rows) == width:
            return logits
        return logits[[row - first for row in rows]]

    def _prefill(self, row: int, feeds: Mapping[str, np.ndarray], new: int) -> np.ndarray:
        outputs = run_prompt(self._session, self.layout, feeds, new, self._message)
        for buffer, present in zip(self._buffers, outputs[1:]):
            buffer[row, :, :new] = present[0]
        logits: np.ndarray = outputs[0]
        return logits

    def _bind(self, first: int, width: int) -> None:
        if self._bound == (first, width):
            return
        for past, present, buffer in zip(self.layout.past, self.layout.present, self._buffers):
            value = self._ortvalue(buffer[first : first + width])
            self._binding.bind_ortvalue_input(past, value)
            self._binding.bind_ortvalue_output(present, value)
        self._bound = (first, width)

    def _step(
        self, first: int, width: int, feeds: Mapping[str, np.ndarray], new: int
    ) -> np.ndarray:
        self._bind(first, width)
        binding = self._binding
        for name, array in feeds.items():
            if name in self._defaults:
                continue  # I/O binding takes only true inputs (logits_to_keep is an initializer)
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        if self._vocab is not None:
            logits = np.empty((width, new, self._vocab), dtype=np.float32)
            binding.bind_ortvalue_output(self.layout.logits, self._ortvalue(logits))
        else:
            binding.bind_output(self.layout.logits)
        try:
            self._session.run_with_iobinding(binding)
        except Exception as e:  # ORT raises its own exception types from C++
            raise ExecutionError(
                f"onnxruntime failed to run the decoder: {self._message(e)}"
            ) from e
        if self._vocab is not None:
            return logits
        result: np.ndarray = binding.get_outputs()[-1].numpy()
        return result


def _anonymous(size: int) -> mmap.mmap:
    """Zeroed memory of ``size`` bytes, committed page by page as it is written, on small pages."""
    memory = mmap.mmap(-1, max(size, 1))
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        memory.madvise(advice)
    return memory
