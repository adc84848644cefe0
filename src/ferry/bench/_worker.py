"""Child processes of ``ferry bench``, run as ``python -m ferry.bench._worker MODE ...``.

``measure JOB.json OUT.json``: one configuration in a fresh process, so that its cold start pays
for everything a fresh deployment pays (the engine's plugins, its first compile) and the process's
peak RSS is this configuration's alone. It writes::

    {"cold_start_s", "first_run_ms", "warm_start_s", "rss_before_load_mb",
     "peak_rss_mb": {"<batch>": MiB, ...}, "engine_origins", "error"}

``generate JOB.json OUT.json``: one engine's timed generations of a generative artifact
(``ferry bench --generate``, :func:`ferry.bench._generate.measure_job`).

``job DIR [--memory-bytes N]``: a whole benchmark for the agent (``DIR/spec.json``,
``DIR/model/``, and ``DIR/inputs/names.json`` mapping ``.npy`` files there to input names),
writing ``DIR/result.json`` or ``DIR/error.json`` (``{"error"}``, a message for the client), each
in one rename. A job in its own process cannot take the agent down with it, whatever the engine
does with a broken model: a crash leaves neither file, and the agent reports the signal. With
``--memory-bytes`` the process (and what it starts) cannot take more memory than that; an engine
that needs more fails the job with a message naming the limit.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from ferry.bench._device import peak_rss_mb

__all__ = ["main"]


def _measure(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from ferry.backends import get_backend
    from ferry.plan import Plan
    from ferry.runtime import load

    plan = Plan.from_dict(job["plan"])
    # Import the engines before the clock starts: a cold start is the model's, not Python's.
    backends = [get_backend(name) for name in plan.backends]
    with np.load(job["feeds"], allow_pickle=True) as data:  # our own file, written by the parent
        feeds: dict[int, dict[str, Any]] = {}
        for key in data.files:
            batch, _, name = key.partition("/")
            feeds.setdefault(int(batch), {})[name] = data[key]
    out: dict[str, Any] = {"rss_before_load_mb": peak_rss_mb()}
    start = time.perf_counter()
    session = load(job["model"], plan=plan, threads=job["threads"], cache_dir=False)
    out["cold_start_s"] = time.perf_counter() - start
    peaks: dict[str, float | None] = {}
    first = True
    # Smallest batch first: the high-water mark after each batch is then that batch's peak.
    for batch in sorted(feeds):
        for _ in range(max(1, int(job["calls"]))):
            start = time.perf_counter()
            session.run(feeds[batch])
            if first:
                out["first_run_ms"] = (time.perf_counter() - start) * 1000
                first = False
        peaks[str(batch)] = peak_rss_mb()
    out["peak_rss_mb"] = peaks
    del session
    gc.collect()
    out["warm_start_s"] = None
    # Only engines that may store a compiled engine have a warm start to speak of (ONNX Runtime
    # builds its session from the model every time: its ``engine_cache`` is False).
    if any(b.engine_cache is not False for b in backends):
        cache = tempfile.mkdtemp(prefix="ferry-bench-cache-")
        try:
            stored = load(job["model"], plan=plan, threads=job["threads"], cache_dir=cache)
            origins = list(stored.engine_origins)
            del stored
            gc.collect()
            if "compiled" in origins:
                start = time.perf_counter()
                warm = load(job["model"], plan=plan, threads=job["threads"], cache_dir=cache)
                out["warm_start_s"] = time.perf_counter() - start
                out["engine_origins"] = list(warm.engine_origins)
                del warm
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    out["error"] = None
    return out


# How engines and Python say an allocation failed (ONNX Runtime: "Failed to allocate memory",
# C++: std::bad_alloc, OpenVINO and others: "out of memory", the C library: ENOMEM's text).
_NO_MEMORY = re.compile(
    r"failed to allocate|bad[_ ]alloc|out of memory|cannot allocate memory|MemoryError", re.I
)


def _run_job(folder: Path, memory_bytes: int | None = None) -> None:
    from ferry.errors import FerryError

    # A crash in native code prints the Python stack to stderr, which the agent logs.
    faulthandler.enable()
    try:
        if memory_bytes is not None:
            _limit_memory(memory_bytes)
        from ferry.bench._runner import run_bench
        from ferry.bench._spec import BenchSpec
        from ferry.runtime import load_npy

        spec = BenchSpec.from_dict(json.loads((folder / "spec.json").read_text(encoding="utf-8")))
        inputs = {name: load_npy(folder / "inputs" / file, name) for file, name in _inputs(folder)}
        result = run_bench(folder / "model", spec, inputs=inputs)
    except Exception as e:  # the job's error, for the client; never a traceback
        if isinstance(e, FerryError):
            error = str(e)
        else:
            traceback.print_exc()  # to stderr: the agent's log
            error = f"{type(e).__name__}: {e}".rstrip(": ")
        if memory_bytes is not None and (isinstance(e, MemoryError) or _NO_MEMORY.search(error)):
            error = (
                f"the job ran out of memory under the agent's limit of "
                f"{memory_bytes / (1 << 20):.0f} MiB (ferry agent --job-memory): {error}"
            )
        _write_json(folder / "error.json", {"error": error})
        return
    _write_json(folder / "result.json", result)


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``path`` in one rename: a process killed halfway leaves no half a document."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document), encoding="utf-8")
    tmp.replace(path)


def _limit_memory(size: int) -> None:
    """Cap this process's memory, and its children's, at ``size`` bytes.

    Linux (and Android) count private writable memory (``RLIMIT_DATA``, since Linux 4.7): what
    allocations take, and not address space merely reserved (threads' malloc arenas, a GPU
    driver's mappings), which ``RLIMIT_AS`` would count and fail on first. Other POSIX systems
    have ``RLIMIT_AS`` alone. Soft and hard limits both: nothing in the job may raise it again.
    """
    import resource

    linux = sys.platform.startswith("linux") or sys.platform == "android"
    which = resource.RLIMIT_DATA if linux else resource.RLIMIT_AS
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        size = min(size, hard)
    resource.setrlimit(which, (size, size))


def _inputs(folder: Path) -> list[tuple[str, str]]:
    """``(file, input name)`` pairs: ``inputs/names.json`` maps file names to input names (which
    may hold characters a file name cannot)."""
    names_file = folder / "inputs" / "names.json"
    if not names_file.is_file():
        return []
    names = json.loads(names_file.read_text(encoding="utf-8"))
    return [(str(file), str(name)) for file, name in names.items()]


def main(argv: list[str]) -> int:
    """Entry point; returns the exit status."""
    mode = argv[0] if argv else ""
    if mode == "measure" and len(argv) == 3:
        job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        try:
            result = _measure(job)
        except Exception as e:  # reported as this configuration's error, in the parent
            from ferry.errors import FerryError

            message = str(e) if isinstance(e, FerryError) else f"{type(e).__name__}: {e}"
            if not isinstance(e, FerryError):
                traceback.print_exc()
            result = {"error": message}
        Path(argv[2]).write_text(json.dumps(result), encoding="utf-8")
        return 0
    if mode == "generate" and len(argv) == 3:
        # ``ferry bench --generate``: one engine's generations (ferry.bench._generate).
        from ferry.bench._generate import measure_safely

        job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        _write_json(Path(argv[2]), measure_safely(job))
        return 0
    if mode == "job" and len(argv) == 2:
        _run_job(Path(argv[1]))
        return 0
    if mode == "job" and len(argv) == 4 and argv[2] == "--memory-bytes" and argv[3].isdigit():
        _run_job(Path(argv[1]), int(argv[3]))
        return 0
    print(
        "usage: python -m ferry.bench._worker measure JOB OUT | generate JOB OUT | "
        "job DIR [--memory-bytes N]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
