"""``ferry serve`` at 4x its capacity on a kit model, driven by Triton's own HTTP client: every
request is answered (success, judged at the task against ONNX Runtime, or 429 with Retry-After
at once), none lost, none wrong, each success within its timeout.

The server is the real ``ferry serve`` process (one instance, the dynamic batcher with batches of
one, a queue of 8); its capacity is measured first with 8 clients in a closed loop, then 4x that rate is
offered open-loop (each request at its scheduled time, from 24 client threads) for 3 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import kit_models

http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

MODEL = "orientation"  # a page's orientation from a photograph (6.8 MB, ~14 ms a call here)
TIMEOUT_US = 1_000_000
THREADS = 24
SECONDS = 3.0


@pytest.fixture(scope="module")
def server(
    onnx_file: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("repository")
    (repo / MODEL / "1").mkdir(parents=True)
    shutil.copyfile(onnx_file(MODEL), repo / MODEL / "1" / "model.onnx")
    config = {
        "max_batch_size": 1,  # a capacity the client threads can offer 4x of, on 2 cores
        "dynamic_batching": {"default_queue_policy": {"max_queue_size": 8}},
        "instance_group": [{"count": 1}],
    }
    (repo / MODEL / "config.json").write_text(json.dumps(config))
    process = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli.main", "serve", str(repo), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )
    try:
        url = None
        start = time.monotonic()
        assert process.stdout is not None
        while url is None and time.monotonic() - start < 120:
            line = process.stdout.readline()
            if not line:
                break
            found = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        assert url is not None, "ferry serve did not start"
        threading.Thread(target=process.stdout.read, daemon=True).start()  # drain its output
        yield url.removeprefix("http://")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def _inputs(x: np.ndarray) -> list[Any]:
    tensor = http.InferInput("x", list(x.shape), np_to_triton_dtype(x.dtype))
    tensor.set_data_from_numpy(x, binary_data=True)
    return [tensor]


def _closed_loop(host: str, seconds: float, clients: int) -> float:
    """Requests per second ``clients`` clients get, each sending its next when answered."""
    x = kit_models.feeds(MODEL, 0)["x"]
    done = [0] * clients
    end = time.perf_counter() + seconds

    def run(i: int) -> None:
        client = http.InferenceServerClient(host)
        while time.perf_counter() < end:
            client.infer(MODEL, _inputs(x))
            done[i] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - start)


def test_four_times_capacity_every_request_answered(server: str, onnx_file: Any) -> None:
    feeds = [kit_models.feeds(MODEL, i)["x"] for i in (0, 1)]
    reference = ort.InferenceSession(str(onnx_file(MODEL)), providers=["CPUExecutionProvider"])
    want = [reference.run(None, {"x": x}) for x in feeds]

    capacity = _closed_loop(server, 2.0, 8)
    rate = 4 * capacity
    total = int(rate * SECONDS)
    results: list[tuple[int, str, float, Any]] = []
    lock = threading.Lock()
    begin = time.perf_counter() + 0.2
    last_send = [begin]

    def run(k: int) -> None:
        client = http.InferenceServerClient(server, network_timeout=30)
        for ident in range(k, total, THREADS):
            delay = begin + ident / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            start = time.perf_counter()
            last_send[0] = max(last_send[0], start)
            try:
                result = client.infer(MODEL, _inputs(feeds[ident % 2]), timeout=TIMEOUT_US)
                outcome: tuple[str, Any] = ("ok", result.as_numpy(reference.get_outputs()[0].name))
            except InferenceServerException as e:
                outcome = (str(e.status()), e.message())
            with lock:
                results.append((ident, outcome[0], time.perf_counter() - start, outcome[1]))
        client.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    offered = total / (last_send[0] - begin)  # what the client threads kept up with

    assert sorted(r[0] for r in results) == list(range(total))  # none lost
    kinds = {r[1] for r in results}
    assert kinds <= {"ok", "429"}, {r[1]: r[3] for r in results if r[1] not in ("ok", "429")}
    ok = [r for r in results if r[1] == "ok"]
    busy = [r for r in results if r[1] == "429"]
    assert ok and busy, (len(ok), len(busy))
    for ident, _, latency, got in ok:
        kit_models.judged(MODEL, "ferry serve at 4x capacity", {"out": got}, [want[ident % 2][0]])
        assert latency < TIMEOUT_US / 1e6 + 0.5  # within its timeout (and the call it ran)
    for _, _, _, message in busy:
        assert "max_queue_size 8" in message or "Request timeout expired" in message, message
    busy_latency = sorted(r[2] for r in busy)
    median = statistics.median(busy_latency)
    print(
        f"\ncapacity {capacity:.0f} req/s, offered {rate:.0f} req/s ({offered:.0f} achieved); "
        f"{len(ok)} answered, {len(busy)} refused 429: median {median * 1e3:.1f} ms, "
        f"p99 {busy_latency[int(len(busy_latency) * 0.99)] * 1e3:.1f} ms"
    )
    assert median < 0.1  # the clients share the 2 cores with the server
    assert offered > 3 * capacity  # the load was overload indeed
