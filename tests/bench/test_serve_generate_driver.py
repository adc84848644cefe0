"""benchmarks/serve_generate.py's load driver and report against a fake streaming chat server
(an ASGI app in this process, served by uvicorn on 127.0.0.1): what it counts, what it measures,
and that a broken stream, a 429, a 500 and an error in the stream are failures it reports."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks._serve_generate import (
    Load,
    LoadSpec,
    RequestResult,
    ServerError,
    ServerSpec,
    cpu_seconds,
    ferry_spec,
    llamacpp_spec,
    markdown,
    notes,
    percentiles_ms,
    plain,
    run_load,
    running,
    sse_data,
    summarize,
)

from ferry.serving import ServerThread

TOKENS = 5
# Seconds between the fake server's chunks: ITLs are at least this.
GAP = 0.01
CHAT = [{"role": "user", "content": "hi"}]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def _fake(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The behaviour is the request's model: ``ok`` (content chunks, then usage), ``nousage``,
    ``manytokens`` (usage says more tokens than chunks), ``cut`` (the body ends without
    [DONE]), ``broken`` (the connection dies mid-stream), ``busy`` (429), ``fail`` (500),
    ``errorchunk`` (an error object in the stream), ``garbage`` (a chunk that is not JSON)."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] == "GET":  # no /v1/models: a server without the OpenAI routes
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    model = request["model"]
    if model in ("busy", "fail"):
        status = 429 if model == "busy" else 500
        error = json.dumps({"error": {"message": model, "type": "server_error"}}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": error})
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def out(data: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})

    await out(b": ping\n\n" + _chunk({"role": "assistant"}))
    for i in range(TOKENS):
        await asyncio.sleep(GAP)
        await out(_chunk({"content": f"t{i} "}, "length" if i == TOKENS - 1 else None))
        if model == "broken" and i == 1:
            raise RuntimeError("the fake server dies mid-stream")
        if model == "errorchunk" and i == 1:
            await out(b'data: {"error": {"message": "out of memory"}}\n\n')
        if model == "garbage" and i == 1:
            await out(b"data: {not json\n\n")
    if model == "cut":
        await out(b"", more=False)
        return
    if model != "nousage":
        tokens = 2 * TOKENS if model == "manytokens" else TOKENS
        usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
        await out(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await out(b"data: [DONE]\n\n", more=False)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServerThread(_fake, port=0, drain_timeout=1) as server:
        yield str(server.url).rstrip("/")


def load(url: str, model: str, concurrency: int = 2, per_user: int = 2) -> Load:
    spec = LoadSpec(
        url=url,
        model=model,
        chats=[CHAT],
        concurrency=concurrency,
        requests_per_user=per_user,
        max_tokens=8,
        timeout_s=30,
    )
    return asyncio.run(run_load(spec))


def test_a_healthy_stream_is_timed_and_counted_from_usage(url: str) -> None:
    found = load(url, "ok", concurrency=3, per_user=2)
    assert len(found.requests) == 6 and all(r.ok for r in found.requests)
    for r in found.requests:
        assert r.status == 200 and r.finish_reason == "length"
        assert len(r.chunk_times) == TOKENS and r.completion_tokens == TOKENS
        # The server sleeps GAP between chunks, so they span at least that; one gap may read
        # near 0 when a busy client reads two chunks at once (seen in CI: 0.8 ms).
        assert len(r.itls) == TOKENS - 1 and min(r.itls) >= 0
        assert r.chunk_times[-1] - r.chunk_times[0] >= (TOKENS - 2) * GAP
        assert r.ttft is not None and 0 < r.ttft <= r.end - r.start
        assert r.as_dict()["itl_max_ms"] >= GAP * 1e3 * 0.5 and r.as_dict()["chunks"] == TOKENS
    s = summarize(found)
    assert (s["requests"], s["completed"], s["errors"]) == (6, 6, 0)
    assert s["output_tokens"] == 6 * TOKENS and s["tokens_counted_from"] == "usage"
    assert s["output_tokens_per_s"] == pytest.approx(6 * TOKENS / found.window_s)
    assert s["itl_ms"]["count"] == 6 * (TOKENS - 1) and s["ttft_ms"]["count"] == 6
    assert s["itl_ms"]["p50"] >= GAP * 1e3 * 0.5


def test_without_usage_tokens_are_the_content_chunks(url: str) -> None:
    s = summarize(load(url, "nousage"))
    assert s["errors"] == 0 and s["tokens_counted_from"] == "chunks"
    assert s["output_tokens"] == 4 * TOKENS


def test_usage_counts_tokens_that_chunks_carry_several_of(url: str) -> None:
    s = summarize(load(url, "manytokens", concurrency=1, per_user=1))
    assert s["output_tokens"] == 2 * TOKENS and s["chunks"] == TOKENS


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("busy", "HTTP 429"),
        ("fail", "HTTP 500"),
        ("cut", "ended without data: [DONE]"),
        ("broken", "RemoteProtocolError"),
        ("errorchunk", "an error in the stream"),
        ("garbage", "not JSON"),
    ],
)
def test_failures_are_counted_and_named_never_dropped(url: str, model: str, why: str) -> None:
    found = load(url, model)
    s = summarize(found)
    assert (s["requests"], s["completed"], s["errors"]) == (4, 0, 4)
    assert s["output_tokens"] == 0 and s["ttft_ms"] is None
    [(kind, count)] = s["error_kinds"].items()
    assert why in kind and count == 4, kind


def test_a_server_that_is_not_there_is_a_failure(url: str) -> None:
    # A port nobody listens on: the connection is refused, the request fails, nothing raises.
    found = load("http://127.0.0.1:9", "ok", concurrency=1, per_user=1)
    assert not found.requests[0].ok and "ConnectError" in str(found.requests[0].error)


def test_sse_data_joins_lines_and_skips_comments() -> None:
    async def lines() -> AsyncIterator[str]:
        for line in [": ping", "event: x", "data: a", "data:b", "", "", "id: 3", "data: last"]:
            yield line

    async def collect() -> list[str]:
        return [d async for d in sse_data(lines())]

    assert asyncio.run(collect()) == ["a\nb", "last"]


def test_percentiles_and_summary_by_hand() -> None:
    assert percentiles_ms([]) is None
    p = percentiles_ms([0.001 * i for i in range(1, 101)])
    assert p is not None and p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01)
    good = RequestResult(user=0, start=0.0, end=1.0, chunk_times=[0.2, 0.3, 0.5])
    bad = RequestResult(user=1, start=0.0, end=0.1, chunk_times=[0.05], error="HTTP 500: x")
    s = summarize(Load([good, bad], window_s=2.0))
    assert s["output_tokens"] == 3 and s["output_tokens_per_s"] == 1.5
    assert s["ttft_ms"]["p50"] == pytest.approx(200) and s["itl_ms"]["count"] == 2
    assert s["error_kinds"] == {"HTTP 500: x": 1}
    # 3 tokens, the last two 0.3 s after the first: 2 / 0.3 tok/s once the stream started.
    assert s["decode_tokens_per_s"] == pytest.approx(2 / 0.3)


def _results(fast: float, slow: float) -> dict[str, Any]:
    def run(title: str, name: str, rate: float, errors: int) -> dict[str, Any]:
        good = RequestResult(user=0, start=0.0, end=1.0, chunk_times=[0.1 / rate, 0.2, 0.3])
        failed = [RequestResult(user=1, start=0, end=0.1, error="HTTP 429: busy")] * errors
        summary = summarize(Load([good, *failed], window_s=3 / rate))
        return {
            "server": title,
            "name": name,
            "concurrency": 16,
            "summary": summary,
            "load_before": (0.5, 0.5, 0.5),
            "load_after": (1.0, 0.5, 0.5),
            "server_cpu_s": 1.5 * summary["window_s"],
            "client_cpu_s": 0.25 * summary["window_s"],
        }

    return {
        "settings": {
            "requests_per_user": 1,
            "chats": 16,
            "max_tokens": 8,
            "threads": 2,
            "warmup_s": 10,
        },
        "machine": {"cpus": 2, "load_before": (0.1, 0.2, 0.3), "load_after": (1.0, 0.5, 0.4)},
        "servers": [{"title": "ferry serve", "version": "0.1", "note": "n"}],
        "runs": [
            run("llama.cpp server", "llamacpp", slow, 0),
            run("ferry serve", "ferry", fast, 2),
            {"server": "other", "name": "other", "concurrency": 4, "error": "no venv"},
        ],
    }


def test_report_table_errors_and_comparison() -> None:
    results = _results(fast=4.0, slow=1.0)
    table = markdown(results).splitlines()
    assert table[0].startswith("| server | concurrency |") and "errors" in table[0]
    assert table[3].startswith("| ferry serve | 16 | 1/3 | 4.0 |") and table[3].endswith("| 2 |")
    assert "| other | 4 | - | failed |" in table[4]
    assert "failed" in plain(results).splitlines()[-1]
    lines = notes(results)
    assert "  2 failed: HTTP 429: busy" in lines
    assert "other at concurrency 4: not measured: no venv" in lines
    assert any("ferry serve at concurrency 16: 3 tokens" in line for line in lines)
    assert any(line.endswith("CPU: server 1.50 cores, client 0.25 cores") for line in lines)
    assert any(
        line.startswith("ferry / llama.cpp server at concurrency 16: output tok/s 4.00x")
        for line in lines
    )


def test_concurrency_one_against_ferry_generate() -> None:
    results = _results(fast=4.0, slow=1.0)
    results["runs"][1]["concurrency"] = 1
    decode = results["runs"][1]["summary"]["decode_tokens_per_s"]
    results["reference"] = {"decode_tokens_per_s": decode / 0.95, "label": "onnxruntime int4"}
    [line] = [x for x in notes(results) if x.startswith("ferry serve at concurrency 1 decodes")]
    assert "0.95x (goal: within 10%)" in line
    results["reference"] = {"error": "ferry bench --generate failed (1): boom"}
    assert any(x.endswith("failed (1): boom") for x in notes(results))


def test_cpu_seconds_of_this_process() -> None:
    import os
    import time

    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after - before >= 0.02


def test_server_commands(tmp_path: Path) -> None:
    llama = llamacpp_spec(tmp_path / "m.gguf", threads=2, port=1234)
    command = " ".join(llama.command)
    assert "-m llama_cpp.server --model" in command and "--interrupt_requests False" in command
    assert "--n_threads 2 --n_threads_batch 2" in command and llama.url.endswith(":1234")
    assert llama.extra_body == {"repeat_penalty": 1.0} and llama.model == "m"
    bare = ferry_spec(tmp_path / "art", concurrency=4, threads=2, flags=set(), port=5)
    assert "--max-num-seqs" not in bare.command and bare.model == "art"
    full = ferry_spec(
        tmp_path / "art", concurrency=4, threads=2, flags={"--max-num-seqs", "--threads"}, port=5
    )
    assert full.command[-4:] == ["--max-num-seqs", "4", "--threads", "2"]


def test_a_server_that_exits_or_has_no_openai_routes_is_one_error(url: str, tmp_path: Path) -> None:
    import sys

    dies = ServerSpec(
        "x",
        "dies",
        [sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"],
        port=9,
        model="m",
    )
    with pytest.raises(ServerError, match="dies exited with 3"), running(dies, tmp_path / "a.log"):
        pass
    # The fake's port stands for a server that is up but answers 404 at /v1/models.
    port = int(url.rsplit(":", 1)[1])
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    spec = ServerSpec("y", "y", sleeper, port=port, model="m")
    with pytest.raises(ServerError, match="404 at /v1/models"), running(spec, tmp_path / "b.log"):
        pass
