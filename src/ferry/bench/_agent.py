"""``ferry agent``: benchmarks on the device it runs on, for ``ferry bench --device URL``.

It runs on any machine with Python, ferry and its engines (a board, a phone under Termux, a
server) and speaks plain HTTP; every request carries ``Authorization: Bearer TOKEN``, or gets 401.

* ``GET /device``: the device block of the results (CPU, cores, memory, Python, ferry, engines
  with versions and precisions).
* ``GET /agent``: the agent's limits and queue (``max_upload_bytes``, ``max_queue``, ``queued``,
  ``running``, ``job_timeout_s``).
* ``POST /jobs``: the body is the model (an ``.onnx`` file), or a tar (optionally gzipped) or zip
  of an artifact folder: ``model.onnx`` (or one ``.onnx`` file) with its external data, at the
  top or in one top-level folder, and optionally ``bench-inputs/names.json`` mapping ``.npy``
  files there to input names. The bench spec (:class:`ferry.bench.BenchSpec` as JSON) is
  the ``X-Ferry-Spec`` header or the ``spec`` query parameter. Answers 202 with
  ``{"id", "status": "queued", "position"}``; 413 when the body (or what an archive unpacks to)
  is over the size limit, 400 for a bad spec or archive, 422 when the model cannot be read, 503
  when the queue is full.
* ``GET /jobs/{id}?wait=S``: the job; waits up to ``S`` seconds (at most 60) for it to finish.
  ``{"status": "queued" | "running", "position"}``, or 200 with ``{"status": "done", "result"}``
  (the same document a local ``ferry bench --json`` writes), or 422 with
  ``{"status": "failed", "error"}``; always with ``created``, ``started`` and ``finished`` (Unix
  times, null until they happen).

Jobs run one at a time, in the order they came (a benchmark sharing the device with another
measures neither). Each runs in its own process (``python -m ferry.bench._worker job``), so an
engine crashing on a broken model fails that job, not the agent. Uploaded files live in a
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
import secrets
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from ferry._version import __version__
from ferry.errors import FerryError
from ferry.serving import HTTPError, check_bearer, error_response, save_body

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "DEFAULT_PORT", "INPUTS_FOLDER", "create_agent_app"]

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_MAX_UPLOAD_BYTES = 1 << 30
#: Where an uploaded archive keeps its inputs: ``names.json`` and the ``.npy`` files it names.
INPUTS_FOLDER = "bench-inputs"
_MAX_MEMBERS = 10_000
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

    def __init__(self, max_queue: int, job_timeout_s: float) -> None:
        self.max_queue = max_queue
        self.job_timeout_s = job_timeout_s
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
            if self.running is not None and self.running.proc is not None:
                self.running.proc.kill()
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
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ferry.bench._worker", "job", str(folder)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            job.proc = proc
            try:
                code = proc.wait(timeout=self.job_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                job.status = "failed"
                job.error = f"the job ran over the agent's limit of {self.job_timeout_s:.0f} s"
                return
            finally:
                job.proc = None
        if (folder / "result.json").is_file():
            job.result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
            job.status = "done"
        elif (folder / "error.json").is_file():
            job.error = json.loads((folder / "error.json").read_text(encoding="utf-8"))["error"]
            job.status = "failed"
        else:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            job.status = "failed"
            job.error = f"the benchmark process died ({how})" + (
                f": {' | '.join(tail)}" if tail else ""
            )

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.status in ("done", "failed")]
        for job in finished[: max(0, len(finished) - _KEEP_FINISHED)]:
            del self.jobs[job.id]


def create_agent_app(
    token: str,
    *,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_queue: int = 8,
    job_timeout_s: float = 3600.0,
) -> Starlette:
    """The agent as an ASGI app (Starlette). See the module docstring for the API.

    Raises:
        BackendUnavailableError: Starlette is not installed (the ``serve`` extra).
        FerryError: an empty token.
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
    agent = _Agent(max_queue, job_timeout_s)
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
            await run_in_threadpool(_unpack, Path(folder.name), max_upload_bytes)
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
    from ferry.bench._runner import BenchSpec

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


def _unpack(folder: Path, limit: int) -> None:
    """Turn ``folder/upload.bin`` into ``folder/model/`` (holding ``model.onnx``) and
    ``folder/inputs/``."""
    upload = folder / "upload.bin"
    with upload.open("rb") as f:
        head = f.read(512)
    model_dir = folder / "model"
    model_dir.mkdir()
    if head.startswith(b"PK\x03\x04"):
        _extract_zip(upload, model_dir, limit)
    elif head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar":
        _extract_tar(upload, model_dir, limit)
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


def _member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or "\\" in name:
        raise HTTPError(400, f"the archive holds an unsafe path {name!r}")
    return path


def _copy_capped(src: IO[bytes], dest: Path, budget: list[int], limit: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("wb") as out:
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            budget[0] += len(chunk)
            if budget[0] > limit:
                raise HTTPError(413, _too_large(budget[0], limit, more=True) + " unpacked")
            out.write(chunk)


def _extract_tar(archive: Path, dest: Path, limit: int) -> None:
    budget = [0]
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for count, member in enumerate(tar):
                if count >= _MAX_MEMBERS:
                    raise HTTPError(400, f"the archive holds over {_MAX_MEMBERS} entries")
                path = _member_path(member.name)
                if member.isdir():
                    (dest / path).mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isfile():
                    raise HTTPError(
                        400, f"the archive holds {member.name!r}, which is not a plain file"
                    )
                src = tar.extractfile(member)
                if src is None:
                    raise HTTPError(400, f"cannot read {member.name!r} from the archive")
                with src:
                    _copy_capped(src, dest / path, budget, limit)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise HTTPError(400, f"the upload is not a readable tar archive: {e}") from e


def _extract_zip(archive: Path, dest: Path, limit: int) -> None:
    budget = [0]
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > _MAX_MEMBERS:
                raise HTTPError(400, f"the archive holds over {_MAX_MEMBERS} entries")
            for info in infos:
                path = _member_path(info.filename.rstrip("/") or info.filename)
                if info.is_dir():
                    (dest / path).mkdir(parents=True, exist_ok=True)
                    continue
                if (info.external_attr >> 16) & 0o170000 not in (0, 0o100000):
                    raise HTTPError(
                        400, f"the archive holds {info.filename!r}, which is not a plain file"
                    )
                with zf.open(info) as src:
                    _copy_capped(src, dest / path, budget, limit)
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise HTTPError(400, f"the upload is not a readable zip archive: {e}") from e


def _check_job(folder: Path, spec: dict[str, Any]) -> None:
    """Refuse now what would fail the job at once: a model that cannot be read, engines or
    precisions this device does not have."""
    from ferry.bench._runner import BenchSpec, resolve_targets
    from ferry.graph import load_model

    try:
        resolve_targets(BenchSpec.from_dict(spec))
    except FerryError as e:
        raise HTTPError(400, str(e)) from e
    try:
        load_model(folder / "model")
    except FerryError as e:
        raise HTTPError(422, str(e)) from e
