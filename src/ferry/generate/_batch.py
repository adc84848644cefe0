"""Continuous batching: many sequences through one decoder, joining and leaving the running batch
at every step.

One worker thread loops: admit waiting requests (first come, first served) while a cache row is
free and their reserved slots fit the budget; run one chunk of the oldest prompt still being read
(``prefill_chunk`` tokens); run one decode step for every sequence past its prompt, as one batch
where the engine's pool can (``Session.kv_pool``); free the rows of sequences that finished or
whose client went away. Prompts and decoding alternate, so a long prompt delays the running
streams by one chunk at a time and a long generation never starves a new one.

Requests and their token events cross between the event loop and the worker: ``submit`` is
called on the loop; the worker hands each event back with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ferry.errors import EngineBusyError, EngineClosedError, FerryError, InvalidInputError
from ferry.generate._loop import Generation, TokenEvent
from ferry.generate._sampling import Sampler, SamplingOptions
from ferry.generate._text import SequenceText

if TYPE_CHECKING:
    from ferry.backends import KVPool
    from ferry.generate._loop import DecoderSession

__all__ = ["BatchEngine", "EngineObserver", "GenerationRequest", "GenerationStream"]

DEFAULT_MAX_NUM_SEQS = 16
DEFAULT_MAX_QUEUE = 256
DEFAULT_PREFILL_CHUNK = 512


@dataclass(frozen=True)
class GenerationRequest:
    """One generation to run.

    Attributes:
        prompt_ids: the prompt, tokenized (chat template applied by the caller).
        max_new_tokens: at most this many new tokens (>= 1); clipped to what the context leaves.
        sampling: how the next token is chosen (``sampling_options(...)``).
        stop: strings that end the generation; the text is cut before the first.
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stop: tuple[str, ...] = ()


class EngineObserver(Protocol):
    """What the engine reports as it runs (the server's metrics)."""

    def admitted(self, queued_seconds: float) -> None: ...

    def token(self, first: bool, seconds: float) -> None:
        """A new token: ``seconds`` since the request came (first) or since its last token."""
        ...

    def finished(self, prompt_tokens: int, new_tokens: int, reason: str) -> None: ...


class GenerationStream:
    """One request's tokens as they come: an async iterator of :class:`TokenEvent`, then one
    :class:`Generation` (finish_reason "stop", "length", or "abort" when the server cut it off
    while draining). Create it with :meth:`BatchEngine.submit`.

    Attributes:
        prompt_tokens: the prompt's length in tokens.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent | Generation | BaseException] = asyncio.Queue()
        self.cancelled = False

    def cancel(self) -> None:
        """The client went away: the sequence is dropped at the engine's next step."""
        self.cancelled = True

    def _put(self, item: TokenEvent | Generation | BaseException) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            self.cancelled = True

    async def __aiter__(self) -> AsyncIterator[TokenEvent | Generation]:
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, Generation):
                return


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    stream: GenerationStream
    budget: int  # new tokens it may take
    submitted: float
    text: SequenceText
    sampler: Sampler
    seen: list[int]
    row: int = -1
    used: int = 0  # cache slots written
    pending: list[int] = field(default_factory=list)  # tokens to run next
    last: float = 0.0  # when its last token came

    @property
    def reserved(self) -> int:
        return len(self.request.prompt_ids) + self.budget

    @property
    def prefilling(self) -> bool:
        return self.used < len(self.request.prompt_ids)


class BatchEngine:
    """Continuous batching over one decoder.

    Args:
        decoder: the decoder (its session, tokenizer, eos ids).
        max_num_seqs: sequences running at once (cache rows).
        max_model_len: a sequence's prompt + new tokens at most (default: the decoder's context).
        kv_cache_mib: the cache's budget: each running sequence reserves its prompt + new tokens'
            slots out of it, and a request waits until its reservation fits (default: every row
            ``max_model_len`` wide).
        max_queue: requests waiting beyond this are refused (:class:`EngineBusyError`).
        prefill_chunk: prompt tokens read per step (long prompts are read in chunks between
            decode steps).
        observer: told of admissions, tokens and finished requests.

    Raises:
        InvalidInputError: a setting out of range, or a budget that holds no sequence.
    """

    def __init__(
        self,
        decoder: DecoderSession,
        *,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_model_len: int | None = None,
        kv_cache_mib: float | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        observer: EngineObserver | None = None,
    ) -> None:
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_queue", max_queue),
            ("prefill_chunk", prefill_chunk),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name}={value!r}: it takes an int >= 1")
        context = decoder.context_length
        if max_model_len is None:
            if context is None:
                raise InvalidInputError(
                    "the decoder does not say its context length: give max_model_len "
                    "(ferry serve --max-model-len N)"
                )
            max_model_len = context
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int):
            raise InvalidInputError(f"max_model_len={max_model_len!r}: it takes an int >= 2")
        if max_model_len < 2 or (context is not None and max_model_len > context):
            raise InvalidInputError(
                f"max_model_len={max_model_len}: it takes an int from 2 to the decoder's context"
                + (f" ({context})" if context is not None else "")
            )
        self.decoder = decoder
        self.context_length = max_model_len
        self.max_num_seqs = max_num_seqs
        layout = decoder.kv_layout(max_model_len)
        itemsize = np.dtype(layout.dtype).itemsize
        self.slot_bytes = len(layout.past) * layout.kv_heads * layout.head_dim * itemsize
        if kv_cache_mib is None:
            self.budget_slots = max_num_seqs * max_model_len
        else:
            if not kv_cache_mib > 0:
                raise InvalidInputError(f"kv_cache_mib={kv_cache_mib!r}: it takes a number > 0")
            self.budget_slots = int(kv_cache_mib * 2**20 // max(self.slot_bytes, 1))
            if self.budget_slots < 2:
                raise InvalidInputError(
                    f"a KV cache of {kv_cache_mib} MiB holds {self.budget_slots} token slots "
                    f"({self.slot_bytes} bytes each): give --kv-cache-mib of at least "
                    f"{2 * self.slot_bytes / 2**20:.2f}"
                )
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._observer = observer
        self._pool: KVPool = decoder.session.kv_pool(layout, max_num_seqs)
        #: Decode steps run at least this many rows (see :meth:`_find_min_batch`).
        self.min_batch = self._find_min_batch()
        self._free_rows = list(range(max_num_seqs))
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._reserved = 0
        self._lock = threading.Condition()
        self._admitting = True
        self._abort = False
        self._closed = False
        self._idle_events: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._thread = threading.Thread(target=self._work, name="ferry-batch-engine", daemon=True)
        self._thread.start()

    # -- the event loop's side ------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue a request; call on the event loop that reads the stream.

        Raises:
            InvalidInputError: an empty prompt, one that fills the context, a request larger
                than the whole cache budget, max_new_tokens < 1.
            EngineBusyError: ``max_queue`` requests wait already.
            EngineClosedError: the engine is draining or closed.
        """
        prompt = [int(i) for i in request.prompt_ids]
        if not prompt:
            raise InvalidInputError("the prompt is empty: give at least one token")
        new = request.max_new_tokens
        if isinstance(new, bool) or not isinstance(new, int) or new < 1:
            raise InvalidInputError(f"max_new_tokens={new!r}: it takes an int >= 1")
        if len(prompt) >= self.context_length:
            raise InvalidInputError(
                f"the prompt is {len(prompt)} tokens; the context is {self.context_length} "
                "tokens, and the prompt must leave room for at least one new token"
            )
        budget = min(new, self.context_length - len(prompt))
        if len(prompt) + 1 > self.budget_slots:
            raise InvalidInputError(
                f"the prompt is {len(prompt)} tokens; the KV cache budget holds "
                f"{self.budget_slots} token slots: raise --kv-cache-mib"
            )
        # what fits the budget when the sequence runs alone
        budget = min(budget, self.budget_slots - len(prompt))
        loop = asyncio.get_running_loop()
        stream = GenerationStream(loop, len(prompt))
        decoder = self.decoder
        sequence = _Sequence(
            request=request,
            stream=stream,
            budget=budget,
            submitted=time.perf_counter(),
            text=SequenceText(decoder.tokenizer, decoder.eos_ids, list(request.stop), budget),
            sampler=Sampler(request.sampling),
            seen=list(prompt),
            pending=list(prompt),
        )
        with self._lock:
            if not self._admitting or self._closed:
                raise EngineClosedError("the server is shutting down: it admits no new request")
            if len(self._waiting) >= self.max_queue:
                raise EngineBusyError(
                    f"{len(self._waiting)} requests are waiting already (the queue holds "
                    f"{self.max_queue}): retry later",
                    retry_after=self._retry_after(),
                )
            self._waiting.append(sequence)
            self._lock.notify()
        return stream

    def stats(self) -> dict[str, float]:
        """``running``, ``waiting`` sequences and ``kv_cache_usage`` (reserved / budget)."""
        with self._lock:
            return {
                "running": float(len(self._running)),
                "waiting": float(len(self._waiting)),
                "kv_cache_usage": self._reserved / self.budget_slots,
            }

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop admitting; let every admitted request finish, up to ``timeout`` seconds, then
        end the rest with finish_reason "abort". True when all finished in time."""
        loop = asyncio.get_running_loop()
        idle = asyncio.Event()
        with self._lock:
            self._admitting = False
            if not self._waiting and not self._running:
                return True
            self._idle_events.append((loop, idle))
        try:
            await asyncio.wait_for(idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            with self._lock:
                self._abort = True
                self._lock.notify()
            await idle.wait()
            return False

    def close(self) -> None:
        """Stop the worker; what still runs ends with "abort"."""
        with self._lock:
            self._admitting = False
            self._abort = True
            self._closed = True
            self._lock.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _find_min_batch(self) -> int:
        """Whether one row decoded alone rounds as it does among others: one decode step of
        row 0 alone and beside row 1, compared bit for bit. Where they differ (onnxruntime's
        4-bit MatMulNBits at accuracy level 0 has its own one-row kernel), every step runs at
        least two rows, so a sequence's tokens never depend on what else runs."""
        pool: Any = self._pool
        if self.max_num_seqs < 2 or self.context_length < 5 or not hasattr(pool, "min_batch"):
            return 1
        prompt = [[1, 2, 3]]
        for row in (0, 1):
            feeds = self._feeds_at([0], prompt)
            pool.run([row], feeds)
        step = self._feeds_at([3, 3], [[4], [4]])
        pool.min_batch = 1
        alone = pool.run([0], {k: v[:1] for k, v in step.items()})
        together = pool.run([0, 1], step)
        if np.array_equal(alone[0], together[0]):
            return 1
        pool.min_batch = 2
        return 2

    def _retry_after(self) -> float:
        # roughly one running sequence's remaining time; at least a second
        return 1.0

    # -- the worker ---------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not (self._waiting or self._running) and not self._closed:
                    self._notify_idle()
                    self._lock.wait()
                if self._abort:
                    for sequence in [*self._running, *self._waiting]:
                        self._finish(sequence, "abort")
                    self._waiting.clear()
                    self._notify_idle()
                    if self._closed:
                        return
                    self._abort = False
                    continue
                self._admit()
                running = list(self._running)
            try:
                self._step(running)
            except Exception as e:  # an engine failure ends the sequences it was running
                error = e if isinstance(e, FerryError) else FerryError(f"generation failed: {e}")
                with self._lock:
                    for sequence in running:
                        if sequence in self._running:
                            sequence.stream._put(error)
                            self._release(sequence)

    def _notify_idle(self) -> None:
        for loop, event in self._idle_events:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)
        self._idle_events.clear()

    def _admit(self) -> None:
        """Waiting requests in order of arrival, while a row is free and each one's slots fit."""
        while self._waiting and self._free_rows:
            head = self._waiting[0]
            if head.stream.cancelled:
                self._waiting.popleft()
                self._finish(head, "cancelled")
                continue
            if self._reserved + head.reserved > self.budget_slots:
                break  # the first in line waits for room; later ones do not pass it
            self._waiting.popleft()
            self._free_rows.sort()
            head.row = self._free_rows.pop(0)  # the lowest row: decode batches stay compact
            self._reserved += head.reserved
            self._running.append(head)
            if self._observer is not None:
                self._observer.admitted(time.perf_counter() - head.submitted)

    def _release(self, sequence: _Sequence) -> None:
        if sequence in self._running:
            self._running.remove(sequence)
            self._pool.release(sequence.row)
            self._free_rows.append(sequence.row)
            self._reserved -= sequence.reserved

    def _finish(self, sequence: _Sequence, reason: str) -> None:
        text = sequence.text
        self._release(sequence)
        if self._observer is not None:
            self._observer.finished(len(sequence.request.prompt_ids), len(text.ids), reason)
        # last: whoever reads the stream sees the engine's books already closed
        sequence.stream._put(
            Generation(text.text, text.ids, reason, len(sequence.request.prompt_ids))
        )

    def _step(self, running: list[_Sequence]) -> None:
        live = []
        for sequence in running:
            if sequence.stream.cancelled:
                with self._lock:
                    self._finish(sequence, "cancelled")  # counted; nobody reads the stream
            else:
                live.append(sequence)
        reading = [s for s in live if s.prefilling]
        if reading:
            self._prefill(reading[0])
        decoding = [s for s in live if not s.prefilling]
        if decoding:
            self._decode(decoding)

    def _feeds(self, sequences: Sequence[_Sequence], tokens: list[list[int]]) -> dict[str, Any]:
        return self._feeds_at([s.used for s in sequences], tokens)

    def _feeds_at(self, used: Sequence[int], tokens: list[list[int]]) -> dict[str, Any]:
        """Feeds for rows holding ``used`` slots each, running ``tokens`` (one list a row)."""
        new = len(tokens[0])
        mask = np.zeros((len(used), self.context_length), dtype=np.int64)
        positions = np.empty((len(used), new), dtype=np.int64)
        for index, slots in enumerate(used):
            mask[index, : slots + new] = 1
            positions[index] = np.arange(slots, slots + new)
        feeds: dict[str, Any] = {
            "input_ids": np.asarray(tokens, dtype=np.int64),
            "attention_mask": mask,
        }
        if self.decoder.takes_positions:
            feeds["position_ids"] = positions
        return feeds

    def _prefill(self, sequence: _Sequence) -> None:
        chunk = sequence.pending[: self.prefill_chunk]
        feeds = self._feeds([sequence], [chunk])
        last = len(chunk) == len(sequence.pending)
        if last and self.decoder.keeps_last_logits:
            feeds["logits_to_keep"] = np.array(1, dtype=np.int64)
        logits = self._pool.run([sequence.row], feeds)
        sequence.used += len(chunk)
        sequence.pending = sequence.pending[len(chunk) :]
        if last:
            self._take(sequence, logits[0, -1])

    def _decode(self, sequences: list[_Sequence]) -> None:
        sequences.sort(key=lambda s: s.row)
        feeds = self._feeds(sequences, [s.pending for s in sequences])
        logits = self._pool.run([s.row for s in sequences], feeds)
        for index, sequence in enumerate(sequences):
            sequence.used += 1
            self._take(sequence, logits[index, -1])

    def _take(self, sequence: _Sequence, logits: np.ndarray) -> None:
        """Sample the next token from ``logits`` and hand it to the stream."""
        token = sequence.sampler(logits, sequence.seen)
        sequence.seen.append(token)
        sequence.pending = [token]
        first = not sequence.text.ids
        text = sequence.text.add(token)
        now = time.perf_counter()
        if self._observer is not None:
            self._observer.token(first, now - (sequence.submitted if first else sequence.last))
        sequence.last = now
        sequence.stream._put(TokenEvent(token, text))
        if sequence.text.finish_reason is not None:
            with self._lock:
                self._finish(sequence, sequence.text.finish_reason)
