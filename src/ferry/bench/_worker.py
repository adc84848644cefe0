"""Child processes of ``ferry bench``, run as ``python -m ferry.bench._worker MODE ...``.

``measure JOB.json OUT.json``: one configuration in a fresh process, so that its cold start pays
for everything a fresh deployment pays (the engine's plugins, its first compile) and the process's
peak RSS is this configuration's alone. It writes::

    {"cold_start_s", "first_run_ms", "warm_start_s", "rss_before_load_mb",
     "peak_rss_mb": {"<batch>": MiB, ...}, "engine_origins", "error"}

``job DIR``: a whole benchmark for the agent (``DIR/spec.json``, ``DIR/model/``, and
``DIR/inputs/names.json`` mapping ``.npy`` files there to input names), writing ``DIR/result.json`` or ``DIR/error.json``. A job in its own process
cannot take the agent down with it, whatever the engine does with a broken model.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from ferry.bench._device import proc_mb

__all__ = ["main", "peak_rss_mb"]


def peak_rss_mb() -> float | None:
    """This process's resident-set high-water mark in MiB (None where the OS does not say).

    Linux and Android: ``VmHWM`` from ``/proc/self/status``, the high-water mark of this
    process's own memory map. Not ``ru_maxrss``: Linux carries it over ``fork`` + ``exec``, so a
    child started by a big parent reports the parent's peak (measured here: a child of a 400 MiB
    process said 407 MiB by ``ru_maxrss``, 10 MiB by ``VmHWM``). Elsewhere ``ru_maxrss``.
    """
    peak = proc_mb("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        return None
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # macOS counts bytes, the BSDs KiB.
    return round(maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


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
    # Only engines that store a compiled engine have a warm start to speak of (ONNX Runtime
    # builds its session from the model every time).
    if any(getattr(b, "engine_cache", b.name != "onnxruntime") for b in backends):
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


def _run_job(folder: Path) -> None:
    from ferry.bench._runner import BenchSpec, run_bench
    from ferry.errors import FerryError
    from ferry.runtime import load_npy

    try:
        spec = BenchSpec.from_dict(json.loads((folder / "spec.json").read_text(encoding="utf-8")))
        inputs = {name: load_npy(folder / "inputs" / file, name) for file, name in _inputs(folder)}
        result = run_bench(folder / "model", spec, inputs=inputs)
    except FerryError as e:
        (folder / "error.json").write_text(json.dumps({"error": str(e)}), encoding="utf-8")
        return
    (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")


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
    if mode == "job" and len(argv) == 2:
        _run_job(Path(argv[1]))
        return 0
    print("usage: python -m ferry.bench._worker measure JOB OUT | job DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
