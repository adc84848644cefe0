"""``ferry serve`` drains at Ctrl-C and SIGTERM: every accepted request is answered, then it exits 0.

The server runs as the real ``ferry serve`` process on 127.0.0.1, spoken to with plain
``http.client`` (binary tensors). The models run about 100 ms a request: a Loop of MatMul + Tanh
whose trip count is sized on this machine, with the server's engine threads, so that requests are
still in flight when the signal comes on a slow machine and a fast one alike. Every answer is
compared with ONNX Runtime run directly. About 20 s in all.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ferry.serving import engine_threads  # noqa: E402

WIDTH = 256
ROWS = 64  # rows of one request
CALL_MS = 100  # what one request of ROWS rows costs, about
START_TIMEOUT = 90.0
EXIT_TIMEOUT = 20.0


# ---------------------------------------------------------------------------------------------
# models


def spin_model(rows: int | str, trips: int | None) -> onnx.ModelProto:
    """x[rows, WIDTH] -> ``trips`` times s = tanh(s @ W) -> y; with ``trips`` None, the trip count
    is an input ``n`` (an int64 scalar)."""
    rng = np.random.default_rng(7)
    weight = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["s_in", "w"], ["m"]),
            helper.make_node("Tanh", ["m"], ["s_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None),
        ],
    )
    inits = [numpy_helper.from_array(weight, "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, WIDTH])]
    if trips is None:
        inputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(trips, np.int64), "n"))
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "spin",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def session(model: onnx.ModelProto) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = engine_threads(1)  # what the server gives its one instance
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="module")
def seconds_per_trip() -> float:
    """One trip of the loop on ROWS rows, on this machine, as the server runs it."""
    runner = session(spin_model(ROWS, None))
    x = np.zeros((ROWS, WIDTH), np.float32)
    runner.run(None, {"x": x, "n": np.array(20, np.int64)})
    best = float("inf")
    for _ in range(5):  # the quickest: a busy machine makes calls slower, never quicker
        start = time.perf_counter()
        runner.run(None, {"x": x, "n": np.array(100, np.int64)})
        best = min(best, (time.perf_counter() - start) / 100)
    return best


def trips_for(seconds: float, per_trip: float) -> int:
    return int(min(5_000_000, max(20, seconds / per_trip)))


def sample(seed: int, rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# the server process and the client


class Served:
    """``ferry serve`` as a process: its port once it serves, its output, its exit."""

    def __init__(self, source: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ferry.cli.main", "serve", str(source), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        assert self.process.stdout is not None
        stdout = self.process.stdout
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(iter(stdout.readline, "")), daemon=True
        )
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            found = re.search(r"serving on http://127\.0\.0\.1:(\d+)", self.output)
            if found:
                self.port = int(found.group(1))
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ferry serve did not start:\n{self.output}")
            time.sleep(0.05)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int) -> tuple[int, float]:
        """Send ``sig``; return the exit code and the seconds it took to exit."""
        start = time.monotonic()
        self.process.send_signal(sig)
        code = self.process.wait(timeout=EXIT_TIMEOUT)
        elapsed = time.monotonic() - start
        self._reader.join(timeout=5)
        return code, elapsed

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self._reader.join(timeout=5)


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[Served] = []

    def start(source: Path, *args: str) -> Served:
        served = Served(source, *args)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()


def post_infer(
    connection: http.client.HTTPConnection, model: str, feeds: dict[str, np.ndarray]
) -> tuple[int, dict[str, str], Any]:
    """One binary-tensor inference: the status, the headers, and ``y`` (or the error text)."""
    described = []
    for name, array in feeds.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT64"
        described.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": array.nbytes},
            }
        )
    header = json.dumps(
        {"inputs": described, "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    ).encode()
    body = header + b"".join(np.ascontiguousarray(a).tobytes() for a in feeds.values())
    connection.request(
        "POST",
        f"/v2/models/{model}/infer",
        body,
        {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        },
    )
    response = connection.getresponse()
    content = response.read()
    headers = {k.lower(): v for k, v in response.getheaders()}
    if response.status != 200:
        return response.status, headers, content.decode(errors="replace")
    length = int(headers["inference-header-content-length"])
    meta = json.loads(content[:length])
    (output,) = meta["outputs"]
    y = np.frombuffer(content[length:], np.float32).reshape(output["shape"])
    return response.status, headers, y


class Fired:
    """Requests sent at once, each on its own connection and thread: ``results[i]`` is
    ``(status, y or error text)``, or the exception the client raised."""

    def __init__(self, port: int, model: str, inputs: list[np.ndarray]) -> None:
        self.results: list[Any] = [None] * len(inputs)
        self._sent = [threading.Event() for _ in inputs]
        self._threads = [
            threading.Thread(target=self._call, args=(port, model, i, x), daemon=True)
            for i, x in enumerate(inputs)
        ]
        for thread in self._threads:
            thread.start()

    def _call(self, port: int, model: str, i: int, x: np.ndarray) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        original = connection.getresponse

        def getresponse() -> http.client.HTTPResponse:
            self._sent[i].set()  # the whole request is written: from here on it is the server's
            return original()

        connection.getresponse = getresponse  # type: ignore[method-assign]
        try:
            status, _, y = post_infer(connection, model, {"x": x})
            self.results[i] = (status, y)
        except Exception as e:
            self.results[i] = e
        finally:
            self._sent[i].set()
            connection.close()

    def wait_sent(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for event in self._sent:
            assert event.wait(max(0.0, deadline - time.monotonic())), "a request was not sent"

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "a client is still waiting for its answer"


def drained_count(output: str) -> int:
    found = re.search(r"drained: (\d+) requests? in flight finished", output)
    assert found, output
    return int(found.group(1))


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_drains_every_accepted_request(
    tmp_path: Path, serve: Any, seconds_per_trip: float, batched: bool, stop: int
) -> None:
    trips = trips_for(CALL_MS / 1000, seconds_per_trip)
    model = spin_model("batch" if batched else ROWS, trips)
    folder = tmp_path / "repo" / "spin" / "1"
    folder.mkdir(parents=True)
    onnx.save(model, folder / "model.onnx")
    count = 12 if batched else 8
    if batched:
        # Up to 4 requests a batch, gathered for 20 ms: several batches, each a few calls long.
        config = {
            "max_batch_size": 4 * ROWS,
            "dynamic_batching": {"max_queue_delay_microseconds": 20_000},
        }
        (tmp_path / "repo" / "spin" / "config.json").write_text(json.dumps(config))
    served = serve(tmp_path / "repo")
    inputs = [sample(seed) for seed in range(count)]
    fired = Fired(served.port, "spin", inputs)
    fired.wait_sent(30)
    time.sleep(0.15)  # the server has read them: accepted, most of them still queued
    code, elapsed = served.stop(stop)
    fired.join(30)
    output = served.output
    assert code == 0, output
    assert elapsed < 15, (elapsed, output)
    reference = session(model)
    for x, result in zip(inputs, fired.results):
        assert isinstance(result, tuple), f"{result!r}\n{output}"
        status, y = result
        assert status == 200, f"{status} {y}\n{output}"
        (expected,) = reference.run(None, {"x": x})
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert drained_count(output) >= 1, output  # some were in flight at the signal
    assert "cut off" not in output and "Traceback" not in output, output
    assert output.rstrip().endswith("stopped"), output


def test_drain_timeout_cuts_off_and_refuses_what_comes_during_the_drain(
    tmp_path: Path, serve: Any, seconds_per_trip: float
) -> None:
    model = spin_model(ROWS, None)  # the trip count is an input: a quick call and a slow one
    path = tmp_path / "spin.onnx"
    onnx.save(model, path)
    served = serve(path, "--drain-timeout", "1")
    x = sample(0)
    # A keep-alive connection that has served a request, idle when the drain begins.
    idle = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    status, _, y = post_infer(idle, "spin", {"x": x, "n": np.array(3, np.int64)})
    assert status == 200, y
    (expected,) = session(model).run(None, {"x": x, "n": np.array(3, np.int64)})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    # A request far longer than the drain timeout.
    slow: dict[str, Any] = {}
    trips = trips_for(8.0, seconds_per_trip)

    def call_slow() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        try:
            slow["result"] = post_infer(
                connection, "spin", {"x": x, "n": np.array(trips, np.int64)}
            )
        except Exception as e:
            slow["result"] = e
        finally:
            connection.close()

    caller = threading.Thread(target=call_slow, daemon=True)
    caller.start()
    time.sleep(0.5)
    start = time.monotonic()
    served.process.send_signal(signal.SIGINT)
    time.sleep(0.4)  # the drain has begun (the server checks every 0.1 s)
    # A new request on the open connection: a clear 503 and Connection: close, not a reset.
    status, headers, text = post_infer(idle, "spin", {"x": x, "n": np.array(1, np.int64)})
    assert status == 503 and "shutting down" in text, (status, text)
    assert headers.get("connection") == "close", headers
    idle.close()
    # A new connection: refused.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served.port), timeout=2).close()
    code = served.process.wait(timeout=EXIT_TIMEOUT)
    elapsed = time.monotonic() - start
    caller.join(10)
    served.close()
    output = served.output
    result = slow.get("result")
    assert isinstance(result, tuple), f"{result!r}\n{output}"
    status, _, text = result
    assert status == 503 and "drain timeout" in text, (status, text)
    assert code == 0, output
    # It did not wait for the engine run it cut off (about 8 s).
    assert elapsed < 5, (elapsed, output)
    assert "drain: 1 request still running after 1 s was cut off" in output, output
    assert "Traceback" not in output, output


def test_ctrl_c_in_wait_drains_before_it_returns(tmp_path: Path, seconds_per_trip: float) -> None:
    """The library path of ``ferry serve``: Ctrl-C lands in ``ServerThread.wait`` (on Python 3.11
    an interrupted ``Thread.join`` took the thread for finished, and the process left under it)."""
    from ferry.serving import ServerThread, create_app

    model = spin_model(ROWS, None)
    path = tmp_path / "spin.onnx"
    onnx.save(model, path)
    server = ServerThread(create_app(path), host="127.0.0.1", port=0).start()
    x = sample(1)
    n = np.array(trips_for(1.5, seconds_per_trip), np.int64)
    result: dict[str, Any] = {}

    def call() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            result["answer"] = post_infer(connection, "spin", {"x": x, "n": n})
        except Exception as e:
            result["answer"] = e
        finally:
            connection.close()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 10
    while not server._server.server_state.tasks:  # uvicorn's: the request is being answered
        assert time.monotonic() < deadline, "the request did not arrive"
        time.sleep(0.01)
    interrupt = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    try:
        server.wait()  # the KeyboardInterrupt lands here; it drains, then returns
    finally:
        interrupt.cancel()
        server.stop()
    assert "answer" in result, "wait() returned before the request in flight was answered"
    assert not server.is_alive() and server._thread is not None
    assert not server._thread.is_alive()
    caller.join(10)
    answer = result.get("answer")
    assert isinstance(answer, tuple), answer
    status, _, y = answer
    assert status == 200, y
    (expected,) = session(model).run(None, {"x": x, "n": n})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert (server.drained, server.cut_off) == (1, 0)
