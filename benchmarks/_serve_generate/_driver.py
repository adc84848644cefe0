"""A closed-loop load driver for an OpenAI-compatible ``/v1/chat/completions`` endpoint.

``concurrency`` virtual users each send ``requests_per_user`` streamed chat completions one after
another (greedy, a fixed ``max_tokens``), from a fixed list of conversations, over one pooled
``httpx.AsyncClient``. Each request's server-sent events are read as they come: the time of every
chunk that carries content, the ``usage`` the server reports at the end (``stream_options:
{"include_usage": true}``), the finish reason, and why it failed if it did. A request fails on a
status other than 200, a stream that breaks or ends without ``data: [DONE]``, an error object in
the stream, a chunk that is not JSON, or the per-request timeout: failures are kept and counted,
never dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx
import numpy as np

Chat = list[dict[str, str]]


@dataclass
class RequestResult:
    """One request as the client saw it.

    Attributes:
        user: the virtual user that sent it.
        start: when it was sent, seconds after the load began.
        end: when its stream ended (or it failed), seconds after the load began.
        chunk_times: seconds after ``start`` at which each chunk with content arrived.
        completion_tokens: ``usage.completion_tokens`` when the server sent it.
        finish_reason: the last choice's finish reason, if any.
        status: the HTTP status (None when no response came).
        error: why the request failed, one line; None when it did not.
    """

    user: int
    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        """Seconds to the first chunk with content."""
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def tokens(self) -> int:
        """Output tokens: the server's usage count, else one per content chunk."""
        return (
            self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)
        )

    @property
    def itls(self) -> list[float]:
        """Seconds between consecutive content chunks."""
        times = self.chunk_times
        return [b - a for a, b in pairwise(times)]

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time from the first content chunk to the last."""
        times = self.chunk_times
        span = times[-1] - times[0] if times else 0.0
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "start_s": self.start,
            "end_s": self.end,
            "status": self.status,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "chunks": len(self.chunk_times),
            "completion_tokens": self.completion_tokens,
            "ttft_ms": None if self.ttft is None else self.ttft * 1e3,
            "e2e_ms": (self.end - self.start) * 1e3,
            # The longest pause inside the stream: where a stall (or the machine's other work)
            # shows.
            "itl_max_ms": max(self.itls) * 1e3 if len(self.chunk_times) > 1 else None,
        }


@dataclass(frozen=True)
class LoadSpec:
    """What one load run sends.

    Attributes:
        url: the server's base URL (``http://127.0.0.1:PORT``).
        model: the ``model`` field of each request.
        chats: the conversations; request ``n`` (counted across users, round by round) takes
            ``chats[n % len(chats)]``, so that the requests in flight at once differ.
        concurrency: virtual users.
        requests_per_user: requests each user sends, one after another.
        max_tokens: ``max_tokens`` of each request.
        extra_body: more fields for each request (a server's own sampling knobs).
        timeout_s: a request still running after this long fails.
    """

    url: str
    model: str
    chats: Sequence[Chat]
    concurrency: int
    requests_per_user: int = 3
    max_tokens: int = 128
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0

    def body(self, chat: Chat) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": chat,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra_body,
        }


@dataclass
class Load:
    """A load run's requests and the window they fell in (seconds)."""

    requests: list[RequestResult]
    window_s: float


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event in ``lines``: an event's ``data:`` lines joined by
    newlines, yielded at the blank line that ends it (or at the end of the stream); comments
    (``: ping``) and the other fields are skipped."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def _read_stream(response: httpx.Response, result: RequestResult, sent: float) -> None:
    """Fill ``result`` from the events of a 200 response."""
    async for data in sse_data(response.aiter_lines()):
        now = time.perf_counter()
        if data.strip() == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            result.error = f"a chunk that is not JSON: {_one_line(data, 80)}"
            return
        if not isinstance(chunk, dict):
            result.error = f"a chunk that is not an object: {_one_line(data, 80)}"
            return
        if chunk.get("error"):
            result.error = f"an error in the stream: {_one_line(json.dumps(chunk['error']))}"
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            result.completion_tokens = int(usage["completion_tokens"])
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                result.chunk_times.append(now - sent)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
    result.error = "the stream ended without data: [DONE]"


async def stream_chat(
    client: httpx.AsyncClient, spec: LoadSpec, chat: Chat, user: int, origin: float
) -> RequestResult:
    """One streamed chat completion; never raises for what the server or the network does."""
    sent = time.perf_counter()
    result = RequestResult(user=user, start=sent - origin)

    async def run() -> None:
        async with client.stream(
            "POST", f"{spec.url}/v1/chat/completions", json=spec.body(chat)
        ) as response:
            result.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                result.error = f"HTTP {response.status_code}: {_one_line(text)}"
                return
            await _read_stream(response, result, sent)

    try:
        await asyncio.wait_for(run(), spec.timeout_s)
    except TimeoutError:
        result.error = f"no end after {spec.timeout_s:g} s"
    except httpx.HTTPError as e:
        result.error = f"{type(e).__name__}: {_one_line(str(e)) or 'broken connection'}"
    result.end = time.perf_counter() - origin
    return result


async def run_load(spec: LoadSpec) -> Load:
    """``spec.concurrency`` users, each sending its requests one after another."""
    if spec.concurrency < 1 or spec.requests_per_user < 1 or not spec.chats:
        raise ValueError("a load needs at least one user, one request each and one chat")
    limits = httpx.Limits(
        max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency
    )
    results: list[RequestResult] = []
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(spec.timeout_s)) as client:
        origin = time.perf_counter()

        async def user(u: int) -> None:
            for i in range(spec.requests_per_user):
                chat = spec.chats[(i * spec.concurrency + u) % len(spec.chats)]
                results.append(await stream_chat(client, spec, chat, u, origin))

        await asyncio.gather(*(user(u) for u in range(spec.concurrency)))
        window = time.perf_counter() - origin
    results.sort(key=lambda r: r.start)
    return Load(results, window)


def percentiles_ms(values: Iterable[float]) -> dict[str, float] | None:
    """p50, p99 and mean of ``values`` (seconds) in milliseconds; None when there are none."""
    array = np.asarray(list(values), dtype=np.float64) * 1e3
    if array.size == 0:
        return None
    return {
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
        "mean": float(array.mean()),
        "count": int(array.size),
    }


def summarize(load: Load) -> dict[str, Any]:
    """The load's figures: output tokens/s of the completed requests over the whole window,
    TTFT, inter-token latency and end-to-end percentiles, and the failures by kind."""
    done = [r for r in load.requests if r.ok]
    failed = [r for r in load.requests if not r.ok]
    tokens = sum(r.tokens for r in done)
    from_usage = sum(r.completion_tokens is not None for r in done)
    counted = "usage" if from_usage == len(done) else "chunks" if from_usage == 0 else "mixed"
    return {
        "requests": len(load.requests),
        "completed": len(done),
        "errors": len(failed),
        "error_kinds": dict(Counter(str(r.error) for r in failed).most_common()),
        "window_s": load.window_s,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / load.window_s if load.window_s > 0 else 0.0,
        "chunks": sum(len(r.chunk_times) for r in done),
        "tokens_counted_from": counted,
        "finish_reasons": dict(Counter(str(r.finish_reason) for r in done)),
        "ttft_ms": percentiles_ms(r.ttft for r in done if r.ttft is not None),
        "itl_ms": percentiles_ms(x for r in done for x in r.itls),
        "e2e_ms": percentiles_ms(r.end - r.start for r in done),
        "decode_tokens_per_s": _median(r.decode_tokens_per_s for r in done),
    }


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None
