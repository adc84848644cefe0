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
import errno
import gzip
import json
import logging
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from ferry._version import __version__
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
#: Where an uploaded archive keeps its inputs: ``names.json`` and the ``.npy`` files it names.
INPUTS_FOLDER = "bench-inputs"
_MAX_MEMBERS = 10_000
# The compression ratio is checked only past this many unpacked bytes (see _Unpacker).
_RATIO_FLOOR = 1 << 20
_MAX_WAIT_S = 60.0
_KEEP_FINISHED = 32
_CHUNK = 1 << 20


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
        f"; it may have run out of the agent's memory limit of {_mib(memory_bytes)} "
        "(ferry agent --job-memory)"
        if memory_bytes is not None
        else ""
    )
    if code >= 0:
        return f"the benchmark process exited with status {code} without a result{limit}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
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
            await run_in_threadpool(_unpack, Path(folder.name), max_upload_bytes, max_unpack_ratio)
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
            too_large=lambda size, counted: _too_large(size, limit, more=counted),
        )
    if size == 0:
        raise HTTPError(400, "the upload is empty; send the model file or an archive as the body")


def _too_large(size: int, limit: int, more: bool = False) -> str:
    return (
        f"the upload is {'over ' if more else ''}{size / (1 << 20):.1f} MiB; this agent takes at "
        f"most {limit / (1 << 20):.1f} MiB (ferry agent --max-upload-mb)"
    )


def _unpack(folder: Path, limit: int, max_ratio: float) -> None:
    """Turn ``folder/upload.bin`` into ``folder/model/`` (holding ``model.onnx``) and
    ``folder/inputs/``.

    Raises:
        HTTPError: 400 for an archive that is unsafe, broken, empty or holds no model (naming the
            member at fault), 413 for one that unpacks to more than ``limit`` bytes.
    """
    upload = folder / "upload.bin"
    with upload.open("rb") as f:
        head = f.read(512)
    model_dir = folder / "model"
    model_dir.mkdir()
    unpacker = _Unpacker(model_dir, limit, upload.stat().st_size, max_ratio)
    # Zip: a local file header, or the end record alone (an empty zip). Tar: gzip's magic, the
    # ustar magic, or an all-zero first block (an empty tar).
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        _extract_zip(upload, unpacker)
    elif head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar" or head == bytes(512):
        _extract_tar(upload, unpacker)
    else:  # a bare model file; reading it tells whether it is one
        upload.replace(model_dir / "model.onnx")
        (folder / "inputs").mkdir()
        return
    upload.unlink()
    entries = [p for p in model_dir.iterdir()]
    if not (model_dir / "model.onnx").exists() and len(entries) == 1 and entries[0].is_dir():
        root = entries[0]  # the archive of a folder: its one top-level folder
    else:
        root = model_dir
    if not (root / "model.onnx").is_file():
        found = [p for p in root.iterdir() if p.suffix == ".onnx" and p.is_file()]
        if len(found) != 1:
            raise HTTPError(
                400,
                "the archive holds no model.onnx"
                + (f" and {len(found)} other .onnx files" if found else "")
                + "; pack an artifact folder (model.onnx and its external data)",
            )
        found[0].rename(root / "model.onnx")
    inputs = root / INPUTS_FOLDER
    if inputs.is_dir():
        _check_inputs(inputs)
        inputs.rename(folder / "inputs")
    else:
        (folder / "inputs").mkdir()
    if root != model_dir:
        root.rename(folder / "model-root")
        model_dir.rmdir()
        (folder / "model-root").rename(model_dir)


def _check_inputs(inputs: Path) -> None:
    names_file = inputs / "names.json"
    if not names_file.is_file():
        raise HTTPError(400, f"{INPUTS_FOLDER}/ needs names.json mapping its .npy files to inputs")
    try:
        names = json.loads(names_file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HTTPError(400, f"{INPUTS_FOLDER}/names.json is not valid JSON: {e}") from e
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise HTTPError(400, f"{INPUTS_FOLDER}/names.json must map file names to input names")
    for file in names:
        if PurePosixPath(file).name != file or not (inputs / file).is_file():
            raise HTTPError(400, f"{INPUTS_FOLDER}/names.json names {file!r}, which is not there")


# What reading a broken archive raises besides the archive modules' own errors: a truncated
# stream (EOFError), a corrupt deflate, bzip2 or xz stream (zlib.error, OSError, LZMAError), a
# compression method this Python lacks (NotImplementedError, RuntimeError), a bad header field
# (ValueError, UnicodeDecodeError).
_ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    EOFError,
    OSError,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    ValueError,
)
try:
    import lzma

    _ARCHIVE_ERRORS += (lzma.LZMAError,)
except ImportError:  # a Python built without lzma cannot open such an archive in the first place
    pass

_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_ZIP_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}
# Windows reads "C:x" (in any component) as a path on drive C, and pathlib joins it that way.
_DRIVE = re.compile(r"^[A-Za-z]:")


class _Reader(Protocol):
    """What a member is read from: tarfile's and zipfile's file objects, a GzipFile."""

    def read(self, size: int, /) -> bytes: ...


def _mib(size: float) -> str:
    if size < 1 << 20:
        return f"{size / (1 << 10):.1f} KiB"
    return f"{size / (1 << 20):.1f} MiB"


def _not_plain(name: str, what: str) -> HTTPError:
    return HTTPError(
        400,
        f"the archive's member {name!r} is not a plain file but {what}; the agent takes only "
        "files and folders (pack the files themselves, not links or devices)",
    )


def _member_path(name: str, is_dir: bool) -> PurePosixPath | None:
    """The member's path relative to the folder it unpacks into; None for the folder itself
    (``.`` or ``./``, as ``tar -C folder .`` writes it).

    Raises:
        HTTPError: 400 for a name that could lead out of the folder on any system the agent runs
            on: absolute, with ``..``, with a backslash or a drive letter, or empty.
    """
    path = PurePosixPath(name)
    why = None
    if not name:
        why = "an empty name"
    elif "\\" in name:
        why = "a backslash, which Windows reads as a folder separator"
    elif name.startswith("/"):
        why = "an absolute path"
    elif ".." in path.parts:
        why = "a '..' component, which leads out of the folder"
    elif any(_DRIVE.match(part) for part in path.parts):
        why = "a drive letter"
    elif not path.parts:
        if is_dir:
            return None
        why = "no file name"
    if why is not None:
        raise HTTPError(
            400,
            f"the archive's member {name!r} has an unsafe path ({why}); pack the artifact folder "
            "with paths relative to it",
        )
    return path


class _Unpacker:
    """Writes an archive's members into ``dest``, one at a time, after checking each.

    Only folders and plain files with relative paths inside ``dest`` are written, each name once;
    nothing is written as a link, so no later member can be written through one. An archive's
    word about its sizes is never trusted: declared sizes only refuse early, and the bytes that
    actually come out of the decompressor count against the caps:

    * the total unpacked size: at most ``limit`` (413, the same limit as the upload's);
    * the compression ratio: the total at most ``max_ratio`` times the upload's size, and (zip)
      each member at most ``max_ratio`` times its compressed size (400). Only past
      ``_RATIO_FLOOR`` bytes: small files (names.json) compress far better than weights and
      cannot fill a disk.
    """

    def __init__(self, dest: Path, limit: int, packed: int, max_ratio: float) -> None:
        self.dest = dest
        self.root = dest.resolve()
        self.limit = limit
        self.packed = max(packed, 1)
        self.max_ratio = max_ratio
        self.members = 0
        self.declared = 0
        self.total = 0
        # Every path seen (case-folded: two names that differ in case are one file on macOS and
        # Windows) -> whether it is a folder (folders above a member count as seen).
        self.seen: dict[str, bool] = {}

    def admit(self, name: str, is_dir: bool) -> PurePosixPath | None:
        """Check a member's name, and against the names before it; its path (None: the root)."""
        self.members += 1
        if self.members > _MAX_MEMBERS:
            raise HTTPError(
                400,
                f"the archive holds over {_MAX_MEMBERS} entries; pack only the artifact folder "
                "(model.onnx, its external data and bench-inputs/)",
            )
        path = _member_path(name, is_dir)
        if path is None:
            return None
        parts = path.parts
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if self.seen.setdefault(above.casefold(), True) is False:
                raise HTTPError(
                    400,
                    f"the archive's member {name!r} lies inside {above!r}, which the archive "
                    "holds as a file",
                )
        key = "/".join(parts).casefold()
        before = self.seen.get(key)
        if before is not None and not (is_dir and before):
            how = "twice" if before == is_dir else "as a file and as a folder"
            raise HTTPError(
                400,
                f"the archive holds {name!r} {how} (names are compared ignoring case); each "
                "name may appear once",
            )
        self.seen[key] = is_dir
        return path

    def declare(self, name: str, size: int, packed: int | None) -> None:
        """Refuse early what a member says it unpacks to (the bytes written are checked anyway)."""
        self.declared += max(size, 0)
        self._check(name, self.declared, size, packed)

    def mkdir(self, name: str, path: PurePosixPath) -> None:
        self._target(name, path).mkdir(parents=True, exist_ok=True)

    def write(self, name: str, path: PurePosixPath, src: _Reader, packed: int | None) -> None:
        """Copy one member's bytes from ``src``, counting them against the caps as they come."""
        target = self._target(name, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL: never onto an existing file, nor through a link (none is ever written).
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o644)
        except OSError as e:
            raise _write_error(name, e) from e
        written = 0
        with os.fdopen(fd, "wb") as out:
            # A read error is the archive's (the caller's except); a write error the agent's.
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                written += len(chunk)
                self.total += len(chunk)
                self._check(name, self.total, written, packed)
                try:
                    out.write(chunk)
                except OSError as e:
                    raise _write_error(name, e) from e
            try:
                out.flush()
            except OSError as e:
                raise _write_error(name, e) from e

    def write_nowhere(self, name: str, src: _Reader) -> None:
        """Read ``src`` to its end, counting its bytes like a member's, and keep none."""
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            self.total += len(chunk)
            self._check(name, self.total, 0, None)

    def _check(self, name: str, total: int, member: int, packed: int | None) -> None:
        if total > self.limit:
            raise HTTPError(
                413,
                f"the archive is over {_mib(self.limit)} unpacked (at its member {name!r}); this "
                f"agent takes at most {_mib(self.limit)} (ferry agent --max-upload-mb)",
            )
        advice = (
            "a decompression bomb? If the model really is mostly zeros, send it uncompressed "
            "(the .onnx file, a plain tar, or zip -0)"
        )
        if total > _RATIO_FLOOR and total > self.max_ratio * self.packed:
            raise HTTPError(
                400,
                f"the archive unpacks to over {self.max_ratio:g} times its size of "
                f"{_mib(self.packed)} (at its member {name!r}): {advice}",
            )
        if packed is not None and member > _RATIO_FLOOR and member > self.max_ratio * packed:
            raise HTTPError(
                400,
                f"the archive's member {name!r} unpacks to over {self.max_ratio:g} times its "
                f"compressed size of {packed} bytes: {advice}",
            )

    def _target(self, name: str, path: PurePosixPath) -> Path:
        target = self.dest.joinpath(*path.parts)
        # The name checks already keep every path inside, and no link is ever written; this
        # only guards against a case they did not think of.
        if not target.resolve().is_relative_to(self.root):
            raise HTTPError(400, f"the archive's member {name!r} would unpack outside its folder")
        return target


_O_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def _write_error(name: str, e: OSError) -> HTTPError:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HTTPError(507, f"the agent's disk is full (unpacking {name!r}); try again later")
    return HTTPError(400, f"cannot unpack the archive's member {name!r}: {e.strerror or e}")


def _empty() -> HTTPError:
    return HTTPError(
        400, "the archive is empty; pack an artifact folder (model.onnx and its external data)"
    )


def _tar_is_dir(member: tarfile.TarInfo) -> bool:
    """Whether a tar member is a folder (else a plain file); raises for anything else."""
    if member.isdir():
        return True
    if member.isreg() and not member.issparse():
        return False
    if member.issym():
        what = f"a symbolic link to {member.linkname!r}"
    elif member.islnk():
        what = f"a hard link to {member.linkname!r}"
    elif member.ischr():
        what = "a character device"
    elif member.isblk():
        what = "a block device"
    elif member.isfifo():
        what = "a FIFO (named pipe)"
    elif member.issparse():
        what = "a sparse file"  # holes that unpack to zeros nobody sent
    else:
        what = f"a tar entry of type {member.type!r}"
    raise _not_plain(member.name, what)


def _extract_tar(archive: Path, unpacker: _Unpacker) -> None:
    # Not tar.extract with filter="data": ferry writes each member itself, and only as a folder
    # or a plain file, so there is nothing for the filter to strip. The filter still gives a
    # second opinion where this Python has it (3.11.4+, 3.12, and the backports).
    data_filter = getattr(tarfile, "data_filter", None)
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for member in tar:
                is_dir = _tar_is_dir(member)
                path = unpacker.admit(member.name, is_dir)
                if data_filter is not None:
                    try:
                        data_filter(member, str(unpacker.dest))
                    except tarfile.FilterError as e:
                        raise HTTPError(
                            400, f"the archive's member {member.name!r} is refused: {e}"
                        ) from e
                if path is None:
                    continue
                if is_dir:
                    unpacker.mkdir(member.name, path)
                    continue
                unpacker.declare(member.name, member.size, None)
                src = tar.extractfile(member)
                if src is None:
                    raise HTTPError(400, f"cannot read {member.name!r} from the archive")
                with src:
                    unpacker.write(member.name, path, src, None)
            if isinstance(tar.fileobj, gzip.GzipFile):
                # gzip checks its CRC only at the end of the stream, which tarfile stops short
                # of: read on to it, so that corrupt data fails here. What follows the last
                # member counts as unpacked bytes like any other.
                unpacker.write_nowhere("(after the last member)", tar.fileobj)
    except HTTPError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise HTTPError(
            400,
            f"the upload is not a readable tar archive ({e}); it may be truncated or corrupt",
        ) from e
    if unpacker.members == 0:
        raise _empty()


def _zip_is_dir(info: zipfile.ZipInfo) -> bool:
    """Whether a zip member is a folder (else a plain file); raises for anything else."""
    kind = stat.S_IFMT(info.external_attr >> 16)  # Unix mode; 0 from tools that set none
    if info.is_dir() or kind == stat.S_IFDIR:
        return True
    if kind not in (0, stat.S_IFREG):
        raise _not_plain(info.filename, _ZIP_KINDS.get(kind, f"an entry of mode {kind:o}"))
    if info.flag_bits & 0x1:
        raise HTTPError(
            400, f"the archive's member {info.filename!r} is encrypted; send it unencrypted"
        )
    if info.compress_type not in _ZIP_METHODS:
        raise HTTPError(
            400,
            f"the archive's member {info.filename!r} is compressed with method "
            f"{info.compress_type}, which the agent cannot read; use deflate (zip's default)",
        )
    return False


def _extract_zip(archive: Path, unpacker: _Unpacker) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if not infos:
                raise _empty()
            # The central directory lists every member: check them all before writing any.
            members = []
            for info in infos:
                is_dir = _zip_is_dir(info)
                path = unpacker.admit(info.filename, is_dir)
                if not is_dir:
                    unpacker.declare(info.filename, info.file_size, info.compress_size)
                members.append((info, path, is_dir))
            for info, path, is_dir in members:
                if path is None:
                    continue
                if is_dir:
                    unpacker.mkdir(info.filename, path)
                    continue
                with zf.open(info) as src:
                    unpacker.write(info.filename, path, src, info.compress_size)
    except HTTPError:
        raise
    except _ARCHIVE_ERRORS as e:
        raise HTTPError(
            400,
            f"the upload is not a readable zip archive ({e}); it may be truncated or corrupt",
        ) from e


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
