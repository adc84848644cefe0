"""``backends="auto"``: measure candidate plans on this machine and keep the fastest correct one.

Candidates: each available engine alone at each precision it offers (what it cannot run falls back
to ONNX Runtime), plus the partitioned plan of all available engines together. Each is compiled,
checked against plain ONNX Runtime fp32 on the same inputs, and timed in alternating blocks of calls
(one engine's spinning worker threads would otherwise slow the next engine's call). The fastest
candidate within the tolerance wins; the choice is cached per model and machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK, get_backend, known_backends, place
from ferry.errors import FerryError
from ferry.graph import atomic_path
from ferry.parity import compare_outputs
from ferry.plan import Plan

__all__ = ["AutoChoice", "Candidate", "auto_plan", "machine_fingerprint"]

logger = logging.getLogger(__name__)

_BLOCK = 5


@dataclasses.dataclass
class Candidate:
    """One configuration tried, and how it did."""

    label: str
    plan: Plan
    load_s: float = 0.0
    latency_ms: float = float("inf")
    max_abs_error: float | None = None
    passed: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "partitions": len(self.plan.partitions),
            "backends": self.plan.backends,
            "load_s": self.load_s,
            "latency_ms": None if self.error else self.latency_ms,
            "max_abs_error": self.max_abs_error,
            "passed": self.passed,
            "error": self.error,
        }


@dataclasses.dataclass
class AutoChoice:
    """The plan chosen, the table measured (empty when it came from the cache)."""

    plan: Plan
    label: str
    candidates: list[Candidate]
    from_cache: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.label,
            "from_cache": self.from_cache,
            "plan": self.plan.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def auto_plan(
    model: ir.Model,
    *,
    backends: Sequence[str] | None = None,
    tolerance: tuple[float, float] | None = None,
    budget_s: float = 20.0,
    feeds: Mapping[str, np.ndarray] | None = None,
    threads: int | None = None,
    cache: bool = True,
) -> AutoChoice:
    """Measure candidate plans for ``model`` (nodes named) and return the fastest that is correct.

    Args:
        model: the model; nodes and values must be named.
        backends: engines to consider; None: every known backend available here.
        tolerance: (atol, rtol) against ONNX Runtime fp32; None: by output dtype.
        budget_s: rough bound on the time spent timing calls (compiling comes on top).
        feeds: inputs to measure and check with; None: random inputs from the input specs.
        threads: intra-op threads for every engine.
        cache: reuse and store the choice for this model and machine.
    """
    names = _available(backends)
    key = _cache_key(model, names, tolerance, threads)
    if cache:
        cached = _read_cache(key)
        if cached is not None:
            return cached
    candidates = _candidates(model, names)
    from ferry.runtime._feeds import random_feeds
    from ferry.runtime._session import load

    baseline = load(model, threads=threads)
    if feeds is None:
        feeds = random_feeds(baseline.inputs, seed=0)
    expected = baseline.run(dict(feeds))
    sessions = []
    for candidate in candidates:
        start = time.perf_counter()
        try:
            session = load(model, plan=candidate.plan, threads=threads)
            got = session.run(dict(feeds))
        except FerryError as e:
            candidate.error = str(e)
            continue
        candidate.load_s = time.perf_counter() - start
        report = compare_outputs(got, expected, tolerance=tolerance)
        candidate.passed = report.passed
        candidate.max_abs_error = report.max_abs_error
        sessions.append((candidate, session))
    _time_in_blocks(sessions, feeds, budget_s)
    passing = [c for c in candidates if c.passed and c.error is None]
    if not passing:
        raise FerryError(
            "no candidate plan matched ONNX Runtime fp32 within the tolerance: "
            + "; ".join(
                f"{c.label}: {c.error or f'max abs error {c.max_abs_error:.3g}'}"
                for c in candidates
            )
        )
    best = min(passing, key=lambda c: c.latency_ms)
    choice = AutoChoice(best.plan, best.label, candidates)
    if cache:
        _write_cache(key, choice)
    return choice


def _available(backends: Sequence[str] | None) -> list[str]:
    names = list(backends) if backends is not None else known_backends()
    found = []
    for name in names:
        try:
            get_backend(name)
        except FerryError as e:
            if backends is not None:
                raise
            logger.info("auto: skipping %s: %s", name, e)
            continue
        found.append(name)
    if FALLBACK not in found:
        found.append(FALLBACK)
    return found


def _candidates(model: ir.Model, names: list[str]) -> list[Candidate]:
    out: list[Candidate] = [Candidate(f"{FALLBACK} fp32", Plan.whole_graph(model, FALLBACK))]
    seen = {_plan_signature(out[0].plan)}
    engines = [n for n in names if n != FALLBACK]
    for name in engines:
        backend = get_backend(name)
        placed = place(model, [backend, get_backend(FALLBACK)])  # once: precision is an option
        for precision in backend.precisions:
            plan = placed.with_options({name: {"precision": precision}})
            _add(out, seen, Candidate(f"{name} {precision}", plan))
    if len(engines) > 1:
        plan = place(model, [get_backend(n) for n in names])
        _add(out, seen, Candidate("+".join(names) + " fp32", plan))
    return out


def _add(out: list[Candidate], seen: set[str], candidate: Candidate) -> None:
    signature = _plan_signature(candidate.plan)
    if signature not in seen:
        seen.add(signature)
        out.append(candidate)


def _plan_signature(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True)


def _time_in_blocks(
    sessions: list[tuple[Candidate, Any]], feeds: Mapping[str, np.ndarray], budget_s: float
) -> None:
    if not sessions:
        return
    blocks: dict[str, list[float]] = {c.label: [] for c, _ in sessions}
    for _, session in sessions:  # warm up: first calls allocate
        for _ in range(_BLOCK):
            session.run(dict(feeds))
    deadline = time.perf_counter() + budget_s
    rounds = 0
    while rounds < 3 or (time.perf_counter() < deadline and rounds < 200):
        for candidate, session in sessions:
            start = time.perf_counter()
            for _ in range(_BLOCK):
                session.run(dict(feeds))
            blocks[candidate.label].append((time.perf_counter() - start) / _BLOCK)
        rounds += 1
    for candidate, _ in sessions:
        candidate.latency_ms = statistics.median(blocks[candidate.label]) * 1000


def machine_fingerprint() -> str:
    """What makes timings from one machine meaningless on another: CPU, cores, engine versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for name in known_backends():
        try:
            versions.append(f"{name}={get_backend(name).version}")
        except FerryError:
            continue
    return f"{cpu}|{os.cpu_count()}|{'|'.join(versions)}"


def _cache_key(model: ir.Model, names: list[str], tolerance: Any, threads: Any) -> str:
    digest = hashlib.sha256()
    digest.update(ir.to_proto(model).SerializeToString(deterministic=True))
    digest.update(json.dumps([names, tolerance, threads, machine_fingerprint()]).encode())
    return digest.hexdigest()[:32]


def _cache_dir() -> Path:
    base = os.environ.get("FERRY_CACHE_DIR") or str(Path.home() / ".cache" / "ferry")
    return Path(base) / "auto"


def _read_cache(key: str) -> AutoChoice | None:
    path = _cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        plan = Plan.from_dict(data["plan"])
        label = str(data["chosen"])
    except (OSError, ValueError, KeyError, FerryError):
        return None
    logger.info("auto: using the cached choice %s (%s)", label, path)
    return AutoChoice(plan, label, [], from_cache=True)


def _write_cache(key: str, choice: AutoChoice) -> None:
    path = _cache_dir() / f"{key}.json"
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(choice.to_dict(), indent=2), encoding="utf-8")
    except OSError as e:  # a read-only home must not break loading a model
        logger.warning("auto: cannot cache the choice in %s: %s", path, e)
