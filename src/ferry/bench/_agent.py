"""``ferry agent``: benchmarks on the device it runs on, for ``ferry bench --device URL``.

It runs on any machine with Python, ferry and its engines (a board, a phone under Termux, a
server) and speaks plain HTTP; every request carries ``Authorization: Bearer TOKEN``, or gets 401.

* ``GET /device``: the device block of the results (CPU, cores, memory, Python, ferry, engines
  with versions and precisions).
* ``GET /agent``: the agent's limits and queue (``max_upload_bytes``, ``max_queue``, ``queued``,
  ``running``, ``job_timeout_s``, ``job_memory_bytes``, ``max_unpack_ratio``).
* ``POST /jobs``: the body is the model (an ``.onnx`` file), or a tar (optionally gzipped) or zip
  of an artifact folder: ``model.onnx`` (or one ``.onnx`` file) with its external data, at the
  top or in one top-level folder, and optionally ``bench-inputs/names.json`` mapping ``.npy``
  files there to input names. The bench spec (:class:`ferry.bench.BenchSpec` as JSON) is
  the ``X-Ferry-Spec`` header or the ``spec`` query parameter. Answers 202 with
  ``{"id", "status": "queued", "position"}``; 413 when the body (or what an archive unpacks to)
  is over the size limit, 400 for a bad spec or archive, 422 when the model cannot be read, 503
  when the queue is full. An archive may hold only folders and plain files, each name once, with
  relative paths that stay inside it (no ``..``, absolute path, backslash or drive letter; no
  link, device or FIFO), at most 10,000 of them, unpacking to at most the size limit and to at
  most ``max_unpack_ratio`` times its own size (counted on the bytes that come out, not on what
  the archive declares); the model's external data must be files of the upload. Anything else is
  refused (400, naming the member) before it is written, and only ever into the job's folder.
* ``GET /jobs/{id}?wait=S``: the job; waits up to ``S`` seconds (at most 60) for it to finish.
  ``{"status": "queued" | "running", "position"}``, or 200 with ``{"status": "done", "result"}``
  (the same document a local ``ferry bench --json`` writes), or 422 with
  ``{"status": "failed", "error"}``; always with ``created``, ``started`` and ``finished`` (Unix
  times, null until they happen).

Jobs run one at a time, in the order they came (a benchmark sharing the device with another
measures neither). Each runs in its own process (``python -m ferry.bench._worker job``), in a
process group of its own, so an engine crashing on a broken model fails that job, not the agent:
the job's error names the signal (``the engine crashed: killed by SIGSEGV (...)``), the job
memory limit it ran out of, or the timeout after which it and everything it started were killed;
the process's last output goes to the agent's log, never to the client. Uploaded files live in a
temporary folder that is removed when the job ends, or at once when the upload is refused.

The HTTP plumbing is serving's: the upload is read under its size cap by
:func:`ferry.serving.save_body`, refusals are :class:`ferry.serving.HTTPError`, and
:class:`ferry.serving.ServerThread` runs the app (``ferry agent`` in the foreground).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry._signals import signal_name
from ferry._version import __version__
from ferry.bench._agent_upload import INPUTS_FOLDER, mib, too_large, unpack
from ferry.errors import FerryError
from ferry.serving import HTTPError, check_bearer, error_response, save_body

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

__all__ = [
    "DEFAULT_MAX_UNPACK_RATIO",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "DEFAULT_PORT",
    "INPUTS_FOLDER",
    "create_agent_app",
]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_MAX_UPLOAD_BYTES = 1 << 30
#: An archive may unpack to at most this many times its size (ONNX weights compress about 1.1x).
DEFAULT_MAX_UNPACK_RATIO = 100.0
_MAX_WAIT_S = 60.0
_KEEP_FINISHED = 32


@dataclasses.dataclass(eq=False)
class _Job:
    id: str
    folder: tempfile.TemporaryDirectory[str]
    status: str = "queued"
    result: dict[str, Any] | None = None
    error: str | None = None
    created: float = dataclasses.field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    proc: subprocess.Popen[bytes] | None = None


class _Agent:
    """The queue and the one worker thread that runs jobs from it, each in a child process."""

    def __init__(
        self, max_queue: int, job_timeout_s: float, job_memory_bytes: int | None = None
    ) -> None:
        self.max_queue = max_queue
        self.job_timeout_s = job_timeout_s
        self.job_memory_bytes = job_memory_bytes
        self.jobs: collections.OrderedDict[str, _Job] = collections.OrderedDict()
        self.pending: collections.deque[_Job] = collections.deque()
        self.running: _Job | None = None
        self.cond = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._work, name="ferry-agent-jobs", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            for job in self.pending:
                job.status, job.error = "failed", "the agent shut down before the job ran"
                job.folder.cleanup()
                job.done.set()
            self.pending.clear()
            # Under the lock: job.proc is cleared (under it too) before the process is reaped,
            # so the process group killed here is still the job's.
            if self.running is not None and self.running.proc is not None:
                _kill_group(self.running.proc)
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def submit(self, job: _Job) -> int:
        """Queue ``job``; return its position (1: next). Raises HTTPError when the queue is full."""
        with self.cond:
            if self.stopping:
                raise HTTPError(503, "the agent is shutting down")
            if len(self.pending) >= self.max_queue:
                raise HTTPError(
                    503, f"the agent's queue is full ({self.max_queue} jobs); try again later"
                )
            self.jobs[job.id] = job
            self.pending.append(job)
            self.cond.notify_all()
            return len(self.pending)

    def position(self, job: _Job) -> int | None:
        with self.cond:
            try:
                return self.pending.index(job) + 1
            except ValueError:
                return None

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                job = self.pending.popleft()
                self.running = job
                job.status, job.started = "running", time.time()
            try:
                self._run(job)
            except Exception as e:  # the agent must outlive any job
                logger.exception("job %s failed", job.id)
                job.status, job.error = "failed", f"the agent failed to run the job: {e}"
            finally:
                job.folder.cleanup()
                job.finished = time.time()
                with self.cond:
                    self.running = None
                    self._forget_old()
                job.done.set()

    def _run(self, job: _Job) -> None:
        folder = Path(job.folder.name)
        log = folder / "stderr.txt"
        # The job runs code from engines on a stranger's model: it need not know the token.
        env = {k: v for k, v in os.environ.items() if k != "FERRY_AGENT_TOKEN"}
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                _worker_command(folder, self.job_memory_bytes),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                # A process group of its own, so that ending the job ends what it started too
                # (the isolated measuring child of `ferry bench`, an engine's helpers).
                start_new_session=_POSIX,
            )
            with self.cond:
                job.proc = proc
            try:
                ended = _wait_unreaped(proc, self.job_timeout_s)
            finally:
                with self.cond:
                    job.proc = None
                _kill_group(proc)  # on a timeout the job; always whatever it left running
                code = proc.wait()
        if not ended:
            self._failed(
                job,
                f"the job timed out after {self.job_timeout_s:g} s (the agent's --job-timeout) "
                "and was stopped; benchmark fewer configurations or iterations, or ask for a "
                "longer timeout",
                log,
            )
            return
        for name in ("result.json", "error.json"):
            try:
                document = json.loads((folder / name).read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except ValueError as e:  # written atomically by the worker: never half a file
                self._failed(job, f"the benchmark process wrote a broken {name}: {e}", log)
                return
            if name == "result.json":
                job.result, job.status = document, "done"
            else:
                error = document.get("error") if isinstance(document, dict) else None
                job.status, job.error = "failed", str(error or document)
                logger.info("job %s failed: %s", job.id, job.error)
            return
        if self.stopping:
            self._failed(job, "the agent shut down while the job ran", log)
        else:
            self._failed(job, _died(code, self.job_memory_bytes), log)

    def _failed(self, job: _Job, error: str, log: Path) -> None:
        """Fail ``job`` with ``error``; the process's last output goes to the agent's log (not to
        the client: it may hold tracebacks and an engine's raw lines)."""
        job.status, job.error = "failed", error
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-20:]
        logger.warning(
            "job %s failed: %s%s", job.id, error, "".join(f"\n  | {line}" for line in tail)
        )

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.status in ("done", "failed")]
        for job in finished[: max(0, len(finished) - _KEEP_FINISHED)]:
            del self.jobs[job.id]


_POSIX = os.name == "posix"
# What a signal that ends the job says about the engine, for the client's error message.
_CRASHES = {
    "SIGSEGV": "a segmentation fault in native code",
    "SIGBUS": "a bus error in native code",
    "SIGABRT": "native code called abort()",
    "SIGILL": "an illegal instruction: an engine built for another CPU?",
    "SIGFPE": "an arithmetic fault in native code",
    "SIGTRAP": "a trap in native code",
    "SIGSYS": "a bad system call in native code",
}


def _worker_command(folder: Path, memory_bytes: int | None) -> list[str]:
    """The child process that runs the job in ``folder``.

    Tests replace this function to stand in a child that crashes or hangs; nothing else does.
    """
    command = [sys.executable, "-m", "ferry.bench._worker", "job", str(folder)]
    if memory_bytes is not None:
        command += ["--memory-bytes", str(memory_bytes)]
    return command


def _wait_unreaped(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``proc`` to end; whether it did.

    Where the OS allows, the process is left unreaped (a zombie): until it is reaped its pid,
    which is also its process group's id, cannot go to another process, so killing the group
    afterwards reaches only what the job started.
    """
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # Windows
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            if waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already: ended
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.2)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and every process in its group (POSIX; elsewhere ``proc`` alone)."""
    if _POSIX:
        # Gone already, or only a zombie left that macOS will not signal: nothing to kill.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        with contextlib.suppress(OSError):
            proc.kill()


def _died(code: int, memory_bytes: int | None) -> str:
    """The error of a job whose process ended with ``code`` and wrote no result."""
    limit = (
        f"; it may have run out of the agent's memory limit of {mib(memory_bytes)} "
        "(ferry agent --job-memory)"
        if memory_bytes is not None
        else ""
    )
    if code >= 0:
        return f"the benchmark process exited with status {code} without a result{limit}"
    name = signal_name(-code)
    if name in _CRASHES:
        return f"the engine crashed: killed by {name} ({_CRASHES[name]}){limit}"
    if name == "SIGKILL" and not limit:
        limit = "; the system's out-of-memory killer does this when the device runs out of memory"
    return f"the benchmark process was killed by {name}{limit}"


def create_agent_app(
    token: str,
    *,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_queue: int = 8,
    job_timeout_s: float = 3600.0,
    job_memory_bytes: int | None = None,
    max_unpack_ratio: float = DEFAULT_MAX_UNPACK_RATIO,
) -> Starlette:
    """The agent as an ASGI app (Starlette). See the module docstring for the API.

    Args:
        token: the secret every request must carry.
        max_upload_bytes: the largest upload, and the most an archive may unpack to.
        max_queue: jobs that may wait while one runs.
        job_timeout_s: seconds a job may run before it is stopped (with what it started).
        job_memory_bytes: the most memory a job may take (None: no limit); an engine that needs
            more fails the job. Linux (and Android) count the job's private memory
            (``RLIMIT_DATA``), other POSIX systems its address space (``RLIMIT_AS``, which GPU
            drivers may not start under).
        max_unpack_ratio: an archive may unpack to at most this many times its size.

    Raises:
        BackendUnavailableError: Starlette is not installed (the ``serve`` extra).
        FerryError: an empty token; a memory limit where the OS has none to set (Windows).
    """
    from ferry.errors import BackendUnavailableError

    try:
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse
        from starlette.routing import Route
    except ImportError as e:
        raise BackendUnavailableError(
            "ferry agent needs Starlette and uvicorn; pip install 'ferry[serve]'"
        ) from e
    if not token:
        raise FerryError("the agent needs a token: --token TOKEN or $FERRY_AGENT_TOKEN")
    if job_memory_bytes is not None:
        if job_memory_bytes <= 0:
            raise FerryError(f"the job memory limit must be positive, got {job_memory_bytes}")
        if not _POSIX:
            raise FerryError(
                "a job memory limit needs a POSIX system (Linux, Android, macOS); leave it out"
            )
    if max_unpack_ratio < 1:
        raise FerryError(f"the unpack ratio must be 1 or more, got {max_unpack_ratio:g}")
    agent = _Agent(max_queue, job_timeout_s, job_memory_bytes)
    device_cache: list[dict[str, Any]] = []

    def authorize(request: Request) -> None:
        check_bearer(
            request.headers.get("authorization"),
            token,
            "missing or wrong token; send Authorization: Bearer TOKEN (the agent's --token)",
        )

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPError)
        return error_response(exc.status, str(exc), exc.headers)

    async def device(request: Request) -> JSONResponse:
        authorize(request)
        if not device_cache:
            from ferry.bench._device import device_info

            device_cache.append(await run_in_threadpool(device_info))
        return JSONResponse(device_cache[0])

    async def info(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(
            {
                "ferry": __version__,
                "max_upload_bytes": max_upload_bytes,
                "max_queue": max_queue,
                "job_timeout_s": job_timeout_s,
                "job_memory_bytes": job_memory_bytes,
                "max_unpack_ratio": max_unpack_ratio,
                "queued": len(agent.pending),
                "running": agent.running is not None,
            }
        )

    async def submit(request: Request) -> JSONResponse:
        authorize(request)
        folder = tempfile.TemporaryDirectory(prefix="ferry-agent-job-")
        try:
            spec = _spec(request)
            await _receive(request, Path(folder.name) / "upload.bin", max_upload_bytes)
            await run_in_threadpool(unpack, Path(folder.name), max_upload_bytes, max_unpack_ratio)
            await run_in_threadpool(_check_job, Path(folder.name), spec)
            (Path(folder.name) / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            job = _Job(secrets.token_hex(8), folder)
            position = agent.submit(job)
        except BaseException:
            folder.cleanup()
            raise
        return JSONResponse(
            {"id": job.id, "status": "queued", "position": position, "url": f"/jobs/{job.id}"},
            status_code=202,
        )

    async def status(request: Request) -> JSONResponse:
        authorize(request)
        job = agent.jobs.get(request.path_params["id"])
        if job is None:
            raise HTTPError(
                404, f"no job {request.path_params['id']!r} (finished jobs are kept a while)"
            )
        try:
            wait = min(float(request.query_params.get("wait", "0")), _MAX_WAIT_S)
        except ValueError:
            raise HTTPError(400, "wait takes seconds, e.g. wait=20") from None
        deadline = time.monotonic() + wait
        while not job.done.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        body: dict[str, Any] = {
            "id": job.id,
            "status": job.status,
            "created": job.created,
            "started": job.started,
            "finished": job.finished,
        }
        if job.status == "queued":
            body["position"] = agent.position(job)
        if job.status == "done":
            body["result"] = job.result
        if job.status == "failed":
            body["error"] = job.error
            return JSONResponse(body, status_code=422)
        return JSONResponse(body)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        agent.start()
        try:
            yield
        finally:
            await run_in_threadpool(agent.stop)

    return Starlette(
        routes=[
            Route("/device", device, methods=["GET"]),
            Route("/agent", info, methods=["GET"]),
            Route("/jobs", submit, methods=["POST"]),
            Route("/jobs/{id}", status, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={HTTPError: refused},
    )


def _spec(request: Request) -> dict[str, Any]:
    from ferry.bench._spec import BenchSpec

    text = request.headers.get("x-ferry-spec") or request.query_params.get("spec") or "{}"
    try:
        data = json.loads(text)
    except ValueError as e:
        raise HTTPError(400, f"the bench spec is not valid JSON: {e}") from e
    try:
        return BenchSpec.from_dict(data).to_dict()
    except FerryError as e:
        raise HTTPError(400, str(e)) from e


async def _receive(request: Request, dest: Path, limit: int) -> None:
    with dest.open("wb") as f:
        size = await save_body(
            request.headers,
            request.receive,
            f,
            limit,
            too_large=lambda size, counted: too_large(size, limit, more=counted),
        )
    if size == 0:
        raise HTTPError(400, "the upload is empty; send the model file or an archive as the body")


def _check_job(folder: Path, spec: dict[str, Any]) -> None:
    """Refuse now what would fail the job at once: a model that cannot be read, engines or
    precisions this device does not have."""
    from ferry.bench._spec import BenchSpec, resolve_targets
    from ferry.graph import external_files, load_model

    try:
        resolve_targets(BenchSpec.from_dict(spec))
    except FerryError as e:
        raise HTTPError(400, str(e)) from e
    try:
        model = load_model(folder / "model")
    except FerryError as e:
        raise HTTPError(422, str(e)) from e
    # An engine would read a file of the device's named by a model's external data (/etc/passwd,
    # ../x) as weights. ONNX Runtime refuses such paths itself; other engines, and ferry's own
    # passes, may not.
    try:
        external_files(model, inside=folder / "model")
    except FerryError as e:
        raise HTTPError(
            400, f"{e}; external data must be a file of the upload, beside model.onnx"
        ) from e
