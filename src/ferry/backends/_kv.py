"""A decoder's key/value cache kept by the engine: the layout a token loop asks for and the
runner an engine hands back.

The plain way to run a decoder step by step feeds each step's ``present.*`` outputs back as the
next ``past_key_values.*`` inputs: the engine allocates and fills a cache one slot longer every
step, and the caller holds it. An engine that can do better keeps the cache itself: ONNX Runtime
binds past and present to one buffer per tensor (``OrtKVRunner``), allocated once for the
sequence and written in place where the graph allows it (``GroupQueryAttention`` sharing past and
present), and otherwise hands its presents back to itself as the next pasts without a copy
through numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["CopyingKVRunner", "KVLayout", "KVPool", "KVRunner", "PerRowKVPool"]


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """What a decoder graph's cache looks like, for one sequence.

    Attributes:
        past: the past inputs, ``[batch, kv_heads, slots, head_dim]`` each.
        present: the outputs that become them, in the same order.
        logits: the logits output.
        kv_heads: key/value heads per layer.
        head_dim: the width of one head.
        dtype: the cache's element type.
        capacity: the slots this sequence needs (prompt + new tokens); an in-place cache is
            allocated this wide once.
        in_place: the graph takes a past as wide as ``capacity`` with ``attention_mask`` as wide
            (1 for the slots in use) and writes each step's new slots into it, so past and
            present may share one buffer.
        batch: rows of the batch.
    """

    past: tuple[str, ...]
    present: tuple[str, ...]
    logits: str
    kv_heads: int
    head_dim: int
    dtype: Any
    capacity: int
    in_place: bool
    batch: int = 1

    def empty(self, slots: int) -> np.ndarray:
        """A zeroed cache tensor ``slots`` wide."""
        return np.zeros((self.batch, self.kv_heads, slots, self.head_dim), dtype=self.dtype)


class KVRunner(Protocol):
    """Runs a decoder one step at a time over one sequence, the cache kept inside.

    ``in_place`` says how wide ``attention_mask`` must be: the layout's ``capacity`` (an in-place
    cache) or the slots in use so far plus the new ones.
    """

    layout: KVLayout
    in_place: bool

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """One step: ``feeds`` without the past inputs; the logits ``[batch, new, vocab]``."""
        ...


class CopyingKVRunner:
    """The plain way, for any engine: each step's presents fed back as the next pasts.

    Args:
        run: runs the graph on all its inputs and returns the outputs asked for by name
            (``Session.run`` or a compiled partition's ``run``).
        layout: the cache's layout; ``in_place`` is not used.
    """

    in_place = False

    def __init__(self, run: Any, layout: KVLayout) -> None:
        self._run = run
        self.layout = layout
        empty = layout.empty(0)
        self._past: dict[str, np.ndarray] = dict.fromkeys(layout.past, empty)
        self._wanted = [layout.logits, *layout.present]

    def run(self, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        outputs = self._run({**feeds, **self._past}, self._wanted)
        for past, present in zip(self.layout.past, self.layout.present):
            self._past[past] = outputs[present]
        logits: np.ndarray = outputs[self.layout.logits]
        return logits


class KVPool(Protocol):
    """The caches of up to ``rows`` sequences, kept by the engine, run together: what continuous
    batching steps. Each sequence owns one row of ``layout.capacity`` slots from its prompt to
    its last token; a decode step runs one new token for many rows at once.

    ``run`` takes feeds for the rows it is given, in their order: ``input_ids`` ``[n, S]``,
    ``attention_mask`` ``[n, capacity]`` (1 for each row's slots in use, the new ones
    included), ``position_ids``; ``S > 1`` (a prompt or a chunk of one) only for one row. A row
    whose mask is the new tokens' alone starts a new sequence there.
    """

    layout: KVLayout
    rows: int

    def run(self, rows: Sequence[int], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        """One step for ``rows``: the logits ``[len(rows), S, vocab]``."""
        ...

    def release(self, row: int) -> None:
        """The sequence in ``row`` ended: the memory its cache held may go."""
        ...


class PerRowKVPool:
    """A pool for any engine: one :class:`KVRunner` per row (the engine's own where it keeps a
    cache, e.g. OpenVINO's stateful requests), stepped one row after another.

    Args:
        make_runner: a new runner for one sequence (``Session.kv_runner`` on a one-row layout).
        layout: one row's layout (``batch`` 1, ``capacity`` slots).
        rows: how many sequences at once.
    """

    def __init__(
        self, make_runner: Callable[[KVLayout], KVRunner], layout: KVLayout, rows: int
    ) -> None:
        self.layout = layout
        self.rows = rows
        self._make = make_runner
        self._runners: list[KVRunner | None] = [None] * rows

    def release(self, row: int) -> None:
        self._runners[row] = None

    def run(self, rows: Sequence[int], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        new = int(feeds["input_ids"].shape[1])
        out = []
        for index, row in enumerate(rows):
            mask = feeds["attention_mask"][index : index + 1]
            used = int(mask.sum()) - new
            runner = self._runners[row]
            if used == 0 or runner is None:  # a new sequence in this row
                runner = self._runners[row] = self._make(self.layout)
            one = {
                name: array[index : index + 1] if array.ndim else array
                for name, array in feeds.items()
            }
            if not runner.in_place:
                one["attention_mask"] = np.ones((1, used + new), dtype=mask.dtype)
            out.append(runner.run(one))
        return np.concatenate(out, axis=0)
