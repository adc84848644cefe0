"""Isolated models (``--isolate``): a crashing engine takes only its model down, for a while.

The crashing engine is ``crashy`` (``_crash_engine``): ONNX Runtime, except that an input holding
``CRASH_VALUE`` segfaults its process. It is registered in this process; its workers learn it from
the backend registry's target.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _crash_engine
import numpy as np
import pytest
from _serving_models import add_const, write_config, write_model
from starlette.testclient import TestClient

from ferry.serving import _isolate, create_app
from ferry.serving._config import ConfigError, parse_config
from ferry.serving._isolate import exit_text

X = np.arange(8, dtype=np.float32).reshape(2, 4)
START_TIMEOUT = 120.0


def body(x: np.ndarray) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        ]
    }


def answer(client: TestClient, model: str, x: np.ndarray) -> tuple[int, Any]:
    response = client.post(f"/v2/models/{model}/infer", json=body(x))
    data = response.json()
    if response.status_code != 200:
        return response.status_code, data["error"]
    out = data["outputs"][0]
    return 200, np.array(out["data"], np.float32).reshape(out["shape"])


@pytest.fixture
def two_models(repo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``crash`` (isolated, on ``crashy``: +1) and ``plain`` (in-process ONNX Runtime: +2)."""
    _crash_engine.register(monkeypatch)
    write_model(repo, "crash", 1, add_const(1.0))
    write_config(repo, "crash", {"backends": ["crashy"], "isolate": True})
    write_model(repo, "plain", 1, add_const(2.0))
    return repo


@pytest.fixture
def started(two_models: Path) -> Iterator[TestClient]:
    with TestClient(create_app(two_models)) as client:
        wait_ready(client, "/v2/health/ready")
        yield client


def wait_ready(client: TestClient, path: str, timeout: float = START_TIMEOUT) -> float:
    """Poll ``path`` until it answers 200; the seconds it took."""
    start = time.monotonic()
    while client.get(path).status_code != 200:
        assert time.monotonic() - start < timeout, client.get(path).text
        time.sleep(0.05)
    return time.monotonic() - start


def worker_pids(client: TestClient, model: str) -> list[int]:
    repository = client.app.state.ferry.repository  # type: ignore[attr-defined]
    version = repository.serving(model)[-1]  # serving, even while down
    return [w.process.pid for w in version.loaded.isolation.workers]


def gone(pid: int, timeout: float = 10.0, zombie: bool = False) -> bool:
    """True once ``pid`` has exited; a zombie counts as running (its parent, us, did not reap
    it) unless ``zombie`` (an orphan's reaping is up to the machine's init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return zombie
        time.sleep(0.05)
    return False


def test_a_segfault_is_named_and_the_model_comes_back_while_another_keeps_serving(
    started: TestClient,
) -> None:
    client = started
    assert answer(client, "crash", X)[0] == 200
    pids = worker_pids(client, "crash")
    plain_answers: list[int] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            status, y = answer(client, "plain", X)
            plain_answers.append(status)
            if status == 200:
                np.testing.assert_allclose(y, X + 2)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        bad = X.copy()
        bad[1, 2] = _crash_engine.CRASH_VALUE
        status, error = answer(client, "crash", bad)
        assert status == 503
        assert error == "model 'crash' worker died (SIGSEGV); restarting"
        rows = client.post("/v2/repository/index", json={}).json()
        assert {"name": "crash", "version": "1", "state": "UNAVAILABLE",
                "reason": "worker died (SIGSEGV); restarting"} in rows  # fmt: skip
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 400
        assert "model 'crash' version 1 is UNAVAILABLE: worker died (SIGSEGV)" in ready.text
        status, error = answer(client, "crash", X)
        assert status == 503 and "worker died (SIGSEGV)" in error
        assert client.get("/v2/models/crash/ready").status_code == 400
        wait_ready(client, "/v2/models/crash/ready", timeout=60)
    finally:
        stop.set()
        asker.join()
    status, y = answer(client, "crash", X)
    assert status == 200
    np.testing.assert_allclose(y, X + 1)
    assert client.get("/v2/health/ready").status_code == 200
    assert plain_answers and set(plain_answers) == {200}
    assert worker_pids(client, "crash") != pids
    assert all(gone(pid) for pid in pids)


def test_no_worker_outlives_the_server(two_models: Path) -> None:
    with TestClient(create_app(two_models)) as client:
        wait_ready(client, "/v2/health/ready")
        pids = worker_pids(client, "crash")
    assert pids and all(gone(pid) for pid in pids)


def test_repeated_crashes_leave_the_model_unavailable_saying_why(
    two_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_isolate, "MAX_CRASHES", 2)
    monkeypatch.setattr(_isolate, "BACKOFF_S", 0.05)
    bad = X.copy()
    bad[0, 0] = _crash_engine.CRASH_VALUE
    with TestClient(create_app(two_models)) as client:
        wait_ready(client, "/v2/health/ready")
        assert answer(client, "crash", bad)[0] == 503
        wait_ready(client, "/v2/models/crash/ready", timeout=60)
        assert answer(client, "crash", bad)[0] == 503
        deadline = time.monotonic() + 10
        while True:
            rows = client.post("/v2/repository/index", json={}).json()
            reason = next(r["reason"] for r in rows if r["name"] == "crash")
            if "not restarted" in reason or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert reason == (
            "worker died (SIGSEGV), 2 crashes within 300 s; not restarted: fix the model or its "
            "engine, then load it again"
        )
        time.sleep(0.3)  # no restart comes
        assert client.get("/v2/models/crash/ready").status_code == 400
        assert answer(client, "plain", X)[0] == 200
        pids = worker_pids(client, "crash")
        # A load request loads it again, though its files did not change.
        assert client.post("/v2/repository/models/crash/load").status_code == 200
        status, y = answer(client, "crash", X)
        assert status == 200
        np.testing.assert_allclose(y, X + 1)
        assert all(gone(pid) for pid in pids)


def test_unloading_a_model_while_its_worker_restarts_leaves_no_worker(
    two_models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing

    monkeypatch.setattr(_isolate, "BACKOFF_S", 0.0)  # the restart is loading when it unloads
    bad = X.copy()
    bad[0, 0] = _crash_engine.CRASH_VALUE
    with TestClient(create_app(two_models)) as client:
        wait_ready(client, "/v2/health/ready")
        assert answer(client, "crash", bad)[0] == 503
        time.sleep(0.2)
        assert client.post("/v2/repository/models/crash/unload").status_code == 200

        def workers() -> list[str]:
            return [p.name for p in multiprocessing.active_children() if "crash" in p.name]

        deadline = time.monotonic() + 30
        while workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert workers() == []
        assert answer(client, "plain", X)[0] == 200


def test_isolated_answers_equal_in_process_answers(repo: Path) -> None:
    write_model(repo, "add", 1, add_const(3.0))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    answers = []
    for isolate in (False, True):
        with TestClient(create_app(repo, isolate=isolate)) as client:
            wait_ready(client, "/v2/health/ready")
            isolated = client.app.state.ferry.repository.get("add").loaded.isolation
            assert (isolated is not None) == isolate
            meta = client.get("/v2/models/add").json()
            config = client.get("/v2/models/add/config").json()
            status, y = answer(client, "add", x)
            assert status == 200
            answers.append((meta, config["max_batch_size"], y))
    assert answers[0][:2] == answers[1][:2]
    np.testing.assert_array_equal(answers[0][2], answers[1][2])


def test_the_loads_probes_run_in_the_worker(tmp_path: Path) -> None:
    """The rows probe runs the engine, so in the worker: rows that see each other (a softmax
    over the batch) are not batched, isolated or not."""
    import onnx
    import onnx.helper as h

    from ferry.serving import ModelConfig
    from ferry.serving._isolate import load_isolated

    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    node = h.make_node("Softmax", ["x"], ["y"], axis=0)
    model = h.make_model(
        h.make_graph([node], "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)]
    )
    path = tmp_path / "round.onnx"
    onnx.save(model, path)
    loaded = load_isolated("round", path, ModelConfig(), cores=1)
    try:
        assert loaded.resolved.max_batch_size == 0 and not loaded.resolved.dynamic_batching
        assert [type(s).__name__ for s in loaded.sessions] == ["WorkerSession"]
    finally:
        loaded.isolation.close()
    assert not loaded.sessions[0].alive


def test_the_wire_carries_tensors_of_every_kind_and_the_engines_errors() -> None:
    from ferry.errors import InvalidInputError
    from ferry.serving._isolate import WorkerSession
    from ferry.serving._isolate_worker import WorkerSpec

    worker = WorkerSession(
        WorkerSpec("add", add_const(1.0), ("onnxruntime",), 1, None, "fixed", {}), "t-worker"
    )
    worker.start()
    try:
        assert [s.name for s in worker.inputs] == ["x"]
        x = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
        y = worker.run({"x": x})["y"]
        np.testing.assert_array_equal(y, x + 1)
        y[0, 0] = 5  # outputs are the caller's to change
        with pytest.raises(InvalidInputError):
            worker.run({"x": np.zeros((2, 5), np.float32)})
        np.testing.assert_array_equal(worker.run({"x": x[:0]})["y"], np.zeros((0, 4)))
        for rows in (20_000, 5_000, 90_000):  # through shared memory, which grows as needed
            big = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
            np.testing.assert_array_equal(worker.run({"x": big})["y"], big + 1)
    finally:
        worker.stop()
    assert not worker.alive
    with pytest.raises(_isolate.WorkerDiedError, match="model 'add' is unavailable: stopped"):
        worker.run({"x": x})


def test_a_load_that_fails_in_the_worker_says_why_and_leaves_no_worker(tmp_path: Path) -> None:
    from ferry.errors import ModelLoadError
    from ferry.serving._isolate import WorkerSession
    from ferry.serving._isolate_worker import WorkerSpec

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    worker = WorkerSession(WorkerSpec("bad", bad, ("onnxruntime",), 1, None, "fixed", {}), "t-bad")
    with pytest.raises(ModelLoadError, match=r"^model 'bad': .*bad\.onnx"):
        worker.start()
    assert worker.process is None and worker.refusal == "not started"


def test_exit_text_names_signals_and_codes() -> None:
    assert exit_text(-signal.SIGSEGV) == "SIGSEGV"
    assert exit_text(-signal.SIGKILL) == "SIGKILL"
    assert exit_text(3) == "exit code 3"


def test_config_isolate_must_be_a_boolean() -> None:
    assert parse_config({"isolate": True}, "m").isolate is True
    assert parse_config({}, "m").isolate is None
    with pytest.raises(ConfigError, match="'isolate' must be true or false, got 'yes'"):
        parse_config({"isolate": "yes"}, "m")


# -- the server as a process: its workers die with it -------------------------------------------


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


#: ``ferry serve`` with the crashing engine registered first (its workers learn it from there).
_WITH_CRASHY = (
    "import sys, _crash_engine, ferry.backends._registry as r; "
    "r._BUILTIN[_crash_engine.NAME] = '_crash_engine:CrashEngine'; "
    "from ferry.cli.main import main; main(sys.argv[1:])"
)


def serve(source: Path) -> tuple[subprocess.Popen[str], list[str]]:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", _WITH_CRASHY, "serve", str(source), "--port", "0", "--isolate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while not re.search(r"serving on http://127\.0\.0\.1:\d+", "".join(lines)):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("ferry serve did not start:\n" + "".join(lines))
        time.sleep(0.05)
    time.sleep(1.0)  # past the models' table, into the wait a signal drains (not before it)
    return process, lines


def test_ferry_serve_isolate_survives_a_segfault_and_stops_clean(two_models: Path) -> None:
    """The whole story over HTTP, on ``ferry serve --isolate``: a segfault in one model's engine
    is named, the other model keeps answering, the model comes back, SIGTERM leaves no worker."""
    import http.client
    import json

    process, lines = serve(two_models)
    port = int(re.findall(r"serving on http://127\.0\.0\.1:(\d+)", "".join(lines))[0])

    def post(model: str, x: np.ndarray) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body(x)))
            response = connection.getresponse()
            data = json.loads(response.read())
        finally:
            connection.close()
        if response.status != 200:
            return response.status, data["error"]
        out = data["outputs"][0]
        return 200, np.array(out["data"], np.float32).reshape(out["shape"])

    try:
        workers = children(process.pid)
        bad = X.copy()
        bad[0, 1] = _crash_engine.CRASH_VALUE
        assert post("crash", bad) == (503, "model 'crash' worker died (SIGSEGV); restarting")
        assert process.poll() is None
        deadline = time.monotonic() + 60
        while True:
            status, y = post("plain", X)
            assert status == 200
            np.testing.assert_allclose(y, X + 2)
            status, y = post("crash", X)
            if status == 200 or time.monotonic() > deadline:
                break
            assert status == 503 and "worker died (SIGSEGV)" in y
            time.sleep(0.1)
        assert status == 200, y
        np.testing.assert_allclose(y, X + 1)
        workers += children(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, "".join(lines)
        assert all(gone(pid, timeout=15, zombie=True) for pid in workers)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_workers_exit_with_the_server_process(repo: Path, how: str) -> None:
    """SIGTERM: the server stops its workers as it drains; SIGKILL: they notice and exit."""
    write_model(repo, "add", 1, add_const(1.0))
    process, lines = serve(repo)
    try:
        workers = children(process.pid)
        assert workers, "".join(lines)
        process.send_signal(getattr(signal, how))
        code = process.wait(timeout=60)
        assert code == (0 if how == "SIGTERM" else -signal.SIGKILL), "".join(lines)
        assert all(gone(pid, timeout=15, zombie=True) for pid in workers), subprocess.run(
            ["ps", "-o", "pid,ppid,stat,cmd", "-p", ",".join(map(str, workers))],
            capture_output=True,
            text=True,
        ).stdout
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
