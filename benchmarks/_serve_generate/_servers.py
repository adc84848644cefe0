"""The servers benchmarks/serve_generate.py loads, one at a time, each in its own process on
127.0.0.1 and a free port: llama.cpp's (``python -m llama_cpp.server`` from llama-cpp-python's
``[server]`` extra, in ``.venv-llamacpp``) on the GGUF, and ``ferry serve`` on an artifact that
``ferry convert`` built from the same GGUF.

llama-cpp-python's server (0.3.36) holds one ``Llama`` (one context, one sequence) behind a lock:
it has no parallel slots, so concurrent requests wait their turn. By default it also cuts the
stream in progress short when another request arrives (``interrupt_requests``); the benchmark
turns that off so that every request runs to its end. Its requests default to a repeat penalty of
1.1, which the benchmark sets to 1.0 (plain greedy, as ferry's temperature 0 is).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from benchmarks.scale_out import free_port

ROOT = Path(__file__).resolve().parents[2]
LLAMACPP_PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"
# How long a server gets to load its model and answer /v1/models.
READY_TIMEOUT_S = 300.0


class ServerError(Exception):
    """A server that would not start, or stopped answering; the message says why, one line
    (then the tail of its log)."""


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server and what to send it.

    Attributes:
        name: its short name (``llamacpp``, ``ferry``).
        title: its name in the table.
        command: the command line that starts it (listening on ``port``).
        port: where it listens on 127.0.0.1.
        model: the ``model`` field of requests (and the id /v1/models should list).
        extra_body: request fields of its own (sampling defaults to undo).
        note: what the report says about how it ran.
    """

    name: str
    title: str
    command: list[str]
    port: int
    model: str
    extra_body: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def llamacpp_version(python: Path = LLAMACPP_PYTHON) -> str | None:
    """llama-cpp-python's version in its venv, or None when the venv or its server is missing."""
    if not python.is_file():
        return None
    probe = "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def llamacpp_spec(
    gguf: Path, *, threads: int, port: int | None = None, python: Path = LLAMACPP_PYTHON
) -> ServerSpec:
    """llama.cpp's server on ``gguf``: ``threads`` for decoding and for prompts, requests
    served to their end one after another (no parallel slots: module docstring)."""
    port = port or free_port()
    model = gguf.stem
    command = [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        "2048",
        "--interrupt_requests",
        "False",
        "--verbose",
        "False",
    ]
    return ServerSpec(
        name="llamacpp",
        title="llama.cpp server",
        command=command,
        port=port,
        model=model,
        extra_body={"repeat_penalty": 1.0},
        note=(
            "llama-cpp-python's server: one sequence at a time (no parallel slots in its "
            "Python server; concurrent requests queue), interrupt_requests off, repeat_penalty "
            "1.0, n_ctx 2048; its stream carries no usage, so tokens are its content chunks "
            "(one per token)"
        ),
    )


def ferry_serve_flags() -> set[str]:
    """The long options ``ferry serve --help`` lists (the flags this ferry has)."""
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli.main", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))


def ferry_spec(
    artifact: Path,
    *,
    concurrency: int,
    threads: int,
    flags: set[str],
    port: int | None = None,
) -> ServerSpec:
    """``ferry serve ARTIFACT`` with ``--max-num-seqs`` set to the concurrency and ``--threads``
    where this ferry has those flags (``flags``: :func:`ferry_serve_flags`)."""
    port = port or free_port()
    command = [sys.executable, "-m", "ferry.cli.main", "serve", str(artifact)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    notes = []
    if "--max-num-seqs" in flags:
        command += ["--max-num-seqs", str(concurrency)]
        notes.append("--max-num-seqs set to the concurrency")
    else:
        notes.append("no --max-num-seqs in this ferry serve (its default)")
    if "--threads" in flags:
        command += ["--threads", str(threads)]
        notes.append(f"--threads {threads}")
    else:
        notes.append("no --threads in this ferry serve (its default)")
    return ServerSpec(
        name="ferry",
        title="ferry serve",
        command=command,
        port=port,
        model=artifact.name,
        note=f"ferry serve on {artifact.name}: " + ", ".join(notes),
    )


def build_artifact(gguf: Path, folder: Path, *, rebuild: bool = False) -> bool:
    """``ferry convert GGUF -o FOLDER`` unless ``folder`` holds a built artifact already; True
    when it was built now. ServerError when the conversion fails."""
    if not rebuild and (folder / "model.onnx").is_file():
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "ferry.cli.main", "convert", str(gguf), "-o", str(folder)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise ServerError(f"ferry convert {gguf.name} failed ({done.returncode}): {tail[0]}")
    return True


def _log_tail(log: Path, chars: int = 2000) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def wait_ready(
    spec: ServerSpec, process: subprocess.Popen[Any], log: Path, timeout_s: float
) -> None:
    """Until ``GET /v1/models`` lists ``spec.model``. ServerError when the process exits, the
    server has no such route (404), or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(
                f"{spec.title} exited with {process.returncode} before it was ready:\n"
                f"{_log_tail(log)}"
            )
        try:
            response = httpx.get(f"{spec.url}/v1/models", timeout=5)
        except httpx.HTTPError:
            time.sleep(0.3)
            continue
        if response.status_code == 404:
            raise ServerError(
                f"{spec.title} answers 404 at /v1/models: it serves no OpenAI-compatible API"
            )
        if response.status_code == 200:
            listed = {m.get("id") for m in response.json().get("data", [])}
            if spec.model in listed:
                return
        time.sleep(0.3)
    raise ServerError(f"{spec.title} was not ready after {timeout_s:g} s:\n{_log_tail(log)}")


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) process ``pid`` has used so far, from /proc; None where
    there is no /proc."""
    try:
        # Fields after the command (which may hold spaces) in its parentheses: utime is the 12th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """SIGTERM (a server drains), then SIGKILL after ``timeout_s``."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def running(
    spec: ServerSpec, log: Path, ready_timeout_s: float = READY_TIMEOUT_S
) -> Iterator[subprocess.Popen[Any]]:
    """The server of ``spec`` started, ready, and stopped when the block ends (its output in
    ``log``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(spec.command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(spec, process, log, ready_timeout_s)
        yield process
    finally:
        stop(process)
