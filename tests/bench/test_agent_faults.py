"""Jobs that take the engine down: a child that dies of SIGSEGV, SIGABRT or SIGKILL, one that
exits without a result, a real model that runs out of a set memory limit, and jobs that hang
(a real model that loops forever, and a child whose own child hangs). Each ends its job
``failed`` with a message that names the signal, the limit or the timeout (never a traceback),
leaves no process behind, and the agent runs the next job.

The crashes are simulated by replacing ``ferry.bench._agent._worker_command`` (the agent runs in
this process, in a thread) with a child that crashes for real: ``ctypes.string_at(0)`` reads
address 0, ``os.abort()`` aborts. The memory and hang cases run the real worker on real models.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import models  # noqa: E402
from ferry.bench import BenchSpec, _agent  # noqa: E402
from ferry.errors import FerryError  # noqa: E402
from ferry.serving import ServerThread  # noqa: E402

TOKEN = "agent-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = BenchSpec(iterations=3, warmup=0, isolate=False)
# Long enough for a small model's job on a busy machine, short enough to wait out a hang.
TIMEOUT_S = 8.0
MEMORY = 1 << 30  # the job memory limit of the out-of-memory test: 1 GiB

CRASHES = {
    "SIGSEGV": "import ctypes; ctypes.string_at(0)",  # a real segmentation fault
    "SIGABRT": "import os; os.abort()",
    "SIGKILL": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
}


@pytest.fixture
def job_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir the agent makes job folders in: every job's process has it in its command
    line, which is how :func:`_processes_of` finds what a job left running."""
    folder = tmp_path / "agent-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _start(**kw: Any) -> ServerThread:
    app = _agent.create_agent_app(TOKEN, max_upload_bytes=1 << 20, max_queue=4, **kw)
    return ServerThread(app, port=0).start()


@pytest.fixture
def agent(job_tmp: Path) -> Iterator[ServerThread]:
    running = _start(job_timeout_s=TIMEOUT_S)
    try:
        yield running
    finally:
        running.stop()


def _post(agent: ServerThread, model: bytes) -> str:
    headers = {**AUTH, "X-Ferry-Spec": json.dumps(SPEC.to_dict())}
    r = httpx.post(f"{agent.url}/jobs", content=model, headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _wait(agent: ServerThread, job: str, limit_s: float = 90) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        r = httpx.get(f"{agent.url}/jobs/{job}?wait=5", headers=AUTH, timeout=30)
        if r.json()["status"] in ("done", "failed"):
            return r
    raise AssertionError(f"job {job} did not finish in {limit_s} s")


def _failed(agent: ServerThread, model: bytes, *needles: str) -> str:
    r = _wait(agent, _post(agent, model))
    assert r.status_code == 422 and r.json()["status"] == "failed", r.text
    error = str(r.json()["error"])
    for needle in needles:
        assert needle in error, error
    assert "Traceback" not in error and 'File "' not in error, error
    return error


def _serves_on(agent: ServerThread, job_tmp: Path) -> None:
    """The next job, a real one, runs; and nothing of the jobs before is left."""
    r = _wait(agent, _post(agent, models.mlp().SerializeToString()))
    assert r.status_code == 200, r.text
    assert r.json()["result"]["configurations"][0]["error"] is None
    assert _processes_of(job_tmp) == []
    assert list(job_tmp.iterdir()) == []


def _processes_of(job_tmp: Path) -> list[tuple[int, str]]:
    """Live processes whose command line names a job folder (zombies have none)."""
    if not Path("/proc/self/cmdline").exists():
        return []  # no /proc (macOS): the pid checks in the tests still run
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(job_tmp) in cmdline:
            found.append((int(entry.name), cmdline))
    return found


def _gone(pid: int) -> bool:
    """Whether ``pid`` is dead (gone, or a zombie its new parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" in status.read_text(encoding="utf-8")


def _replace_worker(monkeypatch: pytest.MonkeyPatch, script: str, *args: str) -> None:
    """Jobs run ``python -c script JOB_FOLDER *args`` instead of the worker."""

    def command(folder: Path, memory_bytes: int | None) -> list[str]:
        return [sys.executable, "-c", script, str(folder), *args]

    monkeypatch.setattr(_agent, "_worker_command", command)


@pytest.mark.skipif(os.name != "posix", reason="signals are POSIX's")
@pytest.mark.parametrize("signal_name", list(CRASHES))
def test_a_crashing_engine_fails_its_job_and_the_agent_serves_on(
    agent: ServerThread, job_tmp: Path, monkeypatch: pytest.MonkeyPatch, signal_name: str
) -> None:
    model = models.mlp().SerializeToString()
    with monkeypatch.context() as patch:
        _replace_worker(patch, CRASHES[signal_name])
        error = _failed(agent, model, f"killed by {signal_name}")
    if signal_name == "SIGKILL":
        assert "out-of-memory killer" in error
    else:
        assert error.startswith(f"the engine crashed: killed by {signal_name} (")
    _serves_on(agent, job_tmp)


def test_a_process_that_ends_without_a_result(
    agent: ServerThread, job_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = models.mlp().SerializeToString()
    with monkeypatch.context() as patch:
        _replace_worker(patch, "import sys; sys.exit(3)")
        _failed(agent, model, "exited with status 3 without a result")
        # Half a result (the worker writes it in one rename; this child does not).
        script = "import pathlib, sys; pathlib.Path(sys.argv[1], 'result.json').write_text('{\"s')"
        _replace_worker(patch, script)
        _failed(agent, model, "wrote a broken result.json")
    _serves_on(agent, job_tmp)


def _loops_forever() -> bytes:
    """y = x + 1, 2**62 times: a real model that ONNX Runtime runs for ever. The trip count and
    the loop's state depend on the input, so nothing folds it away before it runs."""
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [one],
    )
    trips = numpy_helper.from_array(np.array(2**62, np.int64), "trips")
    keep_going = numpy_helper.from_array(np.array(True), "keep_going")
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)],
        "forever",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [trips, keep_going],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_hanging_model_times_out_and_leaves_nothing_running(
    agent: ServerThread, job_tmp: Path
) -> None:
    start = time.monotonic()
    _failed(agent, _loops_forever(), f"timed out after {TIMEOUT_S:g} s", "--job-timeout")
    assert time.monotonic() - start < TIMEOUT_S + 30
    _serves_on(agent, job_tmp)


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX's")
def test_a_timeout_ends_what_the_job_started_too(
    agent: ServerThread, job_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
        "sys.argv[1]])\n"
        "pathlib.Path(sys.argv[2]).write_text(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    with monkeypatch.context() as patch:
        _replace_worker(patch, script, str(pid_file))
        _failed(agent, models.mlp().SerializeToString(), f"timed out after {TIMEOUT_S:g} s")
    grandchild = int(pid_file.read_text(encoding="utf-8"))
    deadline = time.monotonic() + 10  # its new parent reaps it in its own time
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild)
    _serves_on(agent, job_tmp)


def test_shutting_down_ends_the_running_job(job_tmp: Path) -> None:
    running = _start(job_timeout_s=600)
    try:
        job = _post(running, _loops_forever())
        deadline = time.monotonic() + 60
        while _processes_of(job_tmp) == [] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_of(job_tmp) != []
    finally:
        running.stop()
    assert not running.is_alive()
    assert _processes_of(job_tmp) == []
    assert list(job_tmp.iterdir()) == []
    assert job


def _needs_gigabytes() -> bytes:
    """x[1] expanded to 2**30 floats (4 GiB), then summed: a real model whose one intermediate
    tensor is bigger than the job may have."""
    shape = numpy_helper.from_array(np.array([1 << 30], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Expand", ["x", "shape"], ["big"], name="expand"),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0, name="sum"),
        ],
        "needs_gigabytes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="RLIMIT_DATA bounds allocations on Linux only; elsewhere this would take 4 GiB",
)
def test_a_model_out_of_memory_under_the_limit_fails_its_job(job_tmp: Path) -> None:
    running = _start(job_timeout_s=120, job_memory_bytes=MEMORY)
    try:
        info = httpx.get(f"{running.url}/agent", headers=AUTH).json()
        assert info["job_memory_bytes"] == MEMORY
        error = _failed(running, _needs_gigabytes(), "ran out of memory", "1024 MiB")
        assert "--job-memory" in error
        _serves_on(running, job_tmp)  # a small model runs under the same limit
    finally:
        running.stop()


def test_limits_are_checked() -> None:
    with pytest.raises(FerryError, match="memory limit must be positive"):
        _agent.create_agent_app(TOKEN, job_memory_bytes=0)
    with pytest.raises(FerryError, match="unpack ratio must be 1 or more"):
        _agent.create_agent_app(TOKEN, max_unpack_ratio=0.5)
