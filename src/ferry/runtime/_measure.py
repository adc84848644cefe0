"""Measuring: the one block timer, the sizes to time at, where verdicts are kept, and the
ONNX Runtime session both ``auto`` and the pays check time against.

``auto`` (:mod:`ferry.runtime._auto`) and the pays check (:mod:`ferry.runtime._pays`) both time
sessions against ONNX Runtime alone; they share everything here so that they time the same way
(DESIGN, Measuring: alternating blocks of calls, never single calls), keep their verdicts under the
same cache root as the engine cache (:func:`ferry.runtime.default_cache_dir`), and hand the
sessions they timed back to ``load`` instead of building them again.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK, get_backend, known_backends
from ferry.errors import FerryError, InvalidInputError
from ferry.plan import Plan
from ferry.runtime._cache import default_cache_dir
from ferry.runtime._feeds import random_feeds
from ferry.runtime._session import Session
from ferry.runtime._specs import TensorSpec

__all__ = [
    "NOISE_FLOOR",
    "BlockStats",
    "Timed",
    "alone_session",
    "artifact_shapes",
    "block_medians",
    "block_stats",
    "machine_fingerprint",
    "tie_tolerance",
    "time_in_blocks",
    "timing_feeds",
    "verdicts_dir",
    "wait_quiet",
]

logger = logging.getLogger(__name__)

#: How long a timed block lasts (at least one call): short calls get many of them.
_BLOCK_S = 0.05


#: The smallest difference counted as real whatever the noise measured: two medians closer than
#: this are a tie even on a run whose blocks agreed to the microsecond.
NOISE_FLOOR = 0.01
#: Quiet wait before a block: poll in steps this long until this process burns under
#: :data:`_QUIET_CPU` of a core, at most :data:`_QUIET_MAX_S`.
_QUIET_STEP_S = 0.005
_QUIET_CPU = 0.15
_QUIET_MAX_S = 0.15
#: Rounds before the ranking is checked, rounds between checks, checks it must stay the same.
_MIN_ROUNDS = 6
_CHECK_EVERY = 3
_STABLE_CHECKS = 3


class Timed(Protocol):
    """What :func:`time_in_blocks` writes its figures on (``auto``'s candidates, the pays check's
    two contenders)."""

    label: str
    latency_ms: float
    noise: float


@dataclasses.dataclass(frozen=True)
class BlockStats:
    """One run's figures from :func:`block_stats`.

    Attributes:
        median_s: the median per call over all its blocks, in seconds.
        noise: how far that figure moves within the run: the half-width of the medians of the
            rounds' thirds (in time order), relative to ``median_s``. Two runs whose medians
            differ by less than their noise (:func:`tie_tolerance`) are not told apart.
        rounds: the blocks it made.
    """

    median_s: float
    noise: float
    rounds: int


def time_in_blocks(
    sessions: Sequence[tuple[Timed, Any]], feeds: Mapping[str, np.ndarray], budget_s: float
) -> None:
    """Set each entry's ``latency_ms`` to its session's median per call on ``feeds`` and its
    ``noise`` to that figure's relative spread (see :func:`block_stats`)."""
    runs = [(lambda s=session: s.run(dict(feeds))) for _, session in sessions]
    for (timed, _), stats in zip(sessions, block_stats(runs, budget_s), strict=True):
        timed.latency_ms = stats.median_s * 1000
        timed.noise = stats.noise


def tie_tolerance(*noises: float) -> float:
    """The relative difference two medians must exceed to count as different: their noises
    combined (root of the sum of squares), never under :data:`NOISE_FLOOR`."""
    return max(NOISE_FLOOR, math.sqrt(sum(n * n for n in noises)))


def block_medians(runs: Sequence[Callable[[], Any]], budget_s: float) -> list[float]:
    """Each call's median time in seconds (:func:`block_stats`' ``median_s``)."""
    return [s.median_s for s in block_stats(runs, budget_s)]


def block_stats(runs: Sequence[Callable[[], Any]], budget_s: float) -> list[BlockStats]:
    """Each call's median time and noise, over rounds in which every ``run`` makes a block of
    calls in turn (the order reversing each round), until the ranking of the medians has held
    over :data:`_STABLE_CHECKS` checks, every step in it wider than the two runs' noise
    (:func:`_ranking`), or about ``budget_s`` is spent (at least :data:`_MIN_ROUNDS` rounds).

    Each block waits first until no engine thread of this process is still running
    (:func:`wait_quiet`): measured on two cores, ONNX Runtime's intra-op threads spin for about
    40 ms after its last call (a whole core), and OpenVINO timed right after it ran 18% slower
    on a 224x224 orientation classifier (4.58 ms against 3.88 ms alone); waiting, 3.89 ms. A
    block lasts about :data:`_BLOCK_S` (at least one call) and starts with a tenth as many
    untimed calls (at least one): an engine called after a pause first wakes its worker threads
    and refills its caches (measured: OpenVINO at 0.7 ms right after ONNX Runtime, 0.16 ms when
    warm, on a 0.14 ms model).
    """
    calls: list[tuple[int, int]] = []
    for run in runs:  # warm up (first calls allocate), then size the block
        for _ in range(2):
            run()
        start = time.perf_counter()
        for _ in range(3):
            run()
        each = max((time.perf_counter() - start) / 3, 1e-6)
        n = max(1, min(1000, int(_BLOCK_S / each)))
        calls.append((n, max(1, n // 10)))
    blocks: list[list[float]] = [[] for _ in runs]
    deadline = time.perf_counter() + budget_s
    order = list(range(len(runs)))
    rounds = 0
    rankings: list[list[int] | None] = []
    while rounds < _MIN_ROUNDS or (time.perf_counter() < deadline and rounds < 200):
        for i in order:
            n, lead = calls[i]
            wait_quiet()
            for _ in range(lead):
                runs[i]()
            start = time.perf_counter()
            for _ in range(n):
                runs[i]()
            blocks[i].append((time.perf_counter() - start) / n)
        order.reverse()
        rounds += 1
        if rounds >= _MIN_ROUNDS and rounds % _CHECK_EVERY == 0:
            rankings.append(_ranking(_round_stats(blocks)))
            recent = rankings[-_STABLE_CHECKS:]
            if len(recent) == _STABLE_CHECKS and recent[0] and all(r == recent[0] for r in recent):
                break
    return _round_stats(blocks)


def _round_stats(blocks: Sequence[Sequence[float]]) -> list[BlockStats]:
    """Each run's median, with its noise measured against the rounds' common pace.

    A shared machine speeds up and slows down as a whole (another tenant, a turbo step): every
    run's blocks of one round move together, which a run's own spread counts as noise. Two
    candidates 16% apart on a table-structure model were a tie at 6% noise each, while their
    ratio round by round held within 2%. So each block is divided by its round's geometric mean
    over all runs, and both the median and the spread are taken of those ratios: runs compare
    round by round, as pairs. The median is given back in seconds at the rounds' median pace.
    (Unpaired, a machine that halved its speed for a stretch of rounds put each run's median
    wherever its own blocks' halves met.)"""
    if len(blocks) < 2:
        return [_stats(b) for b in blocks]
    rounds = min(len(b) for b in blocks)
    pace = [
        math.exp(statistics.fmean(math.log(max(b[r], 1e-12)) for b in blocks))
        for r in range(rounds)
    ]
    usual = statistics.median(pace)
    out = []
    for run in blocks:
        relative = _stats([run[r] / pace[r] for r in range(rounds)])
        out.append(BlockStats(relative.median_s * usual, relative.noise, len(run)))
    return out


def _ranking(stats: Sequence[BlockStats]) -> list[int] | None:
    """The runs fastest first, or None while two neighbours are within their noise of each
    other (:func:`tie_tolerance`): an order that chance may turn round is no ranking yet."""
    order = sorted(range(len(stats)), key=lambda i: stats[i].median_s)
    for faster, slower in itertools.pairwise(order):
        a, b = stats[faster], stats[slower]
        if b.median_s <= a.median_s * (1 + tie_tolerance(a.noise, b.noise)):
            return None
    return order


def _stats(blocks: Sequence[float]) -> BlockStats:
    """A run's median and noise from its blocks in time order."""
    median = statistics.median(blocks)
    third = max(1, len(blocks) // 3)
    parts = [blocks[i : i + third] for i in range(0, len(blocks) - third + 1, third)]
    medians = [statistics.median(p) for p in parts]
    noise = (max(medians) - min(medians)) / 2 / median if median > 0 else 0.0
    return BlockStats(median, noise, len(blocks))


def wait_quiet() -> None:
    """Wait until this process's threads are idle (an engine's pool that spins after its calls
    has stopped), at most :data:`_QUIET_MAX_S`: other processes' load is not ours to wait for."""
    end = time.perf_counter() + _QUIET_MAX_S
    while time.perf_counter() < end:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(_QUIET_STEP_S)
        if time.process_time() - cpu < _QUIET_CPU * (time.perf_counter() - wall):
            return


def alone_session(
    model: ir.Model,
    *,
    threads: int | None = None,
    source_path: Path | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
) -> Session:
    """ONNX Runtime running the whole of ``model`` (prepared): the baseline ``auto`` judges and
    times against and the contender of the pays check, built as ``load`` builds it, so that the
    session timed is the session returned when it wins."""
    return Session(
        model,
        Plan.whole_graph(model, FALLBACK),
        threads=threads,
        source_path=source_path,
        cache_dir=cache_dir,
    )


def timing_feeds(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    seed: int = 0,
    model: ir.Model | None = None,
) -> dict[str, np.ndarray]:
    """Inputs at the sizes the model will run: ``shapes`` where given, else the model's fixed
    dims; a symbolic first dim (the batch) becomes 1. With ``model``, sizes not given are found
    (:func:`ferry.runtime.found_inputs`: sizes the model runs at, ids within their tables).

    Raises:
        InvalidInputError: without ``model``, a symbolic dim past the first has no size: auto
            must not time a detector at a few pixels; the message names the dims and the
            ``--shape`` to give. With it, no sizes tried run.
    """
    shapes = dict(shapes or {})
    if model is not None:
        from ferry.runtime._found import found_inputs

        names = {s.name for s in specs}
        found = found_inputs(model, {k: v for k, v in shapes.items() if k in names}, seed=seed)
        return {s.name: found.feeds[s.name] for s in specs}
    missing = []
    for spec in specs:
        if spec.name in shapes:
            continue
        if spec.shape is None:
            missing.append(f"{spec.name} (unknown rank)")
            continue
        open_dims = [str(i) for i, d in enumerate(spec.shape) if not isinstance(d, int) and i > 0]
        if open_dims:
            missing.append(f"{spec.name} dims {', '.join(open_dims)} ({spec.describe()})")
    if missing:
        example = next(s for s in specs if s.name not in shapes)
        raise InvalidInputError(
            "timing needs the sizes the model will run at, and these are not known "
            "(timing a detector at a few pixels says nothing about it): "
            + "; ".join(missing)
            + f". Give them with --shape (e.g. --shape {example.name}=1,3,640,640), example "
            "inputs (--input, or ferry.load(..., example_inputs=...)) or "
            "ferry.load(..., shapes=...)"
        )
    return random_feeds(specs, shapes, seed=seed)


def artifact_shapes(model_file: Path | None) -> dict[str, tuple[int, ...]] | None:
    """Input sizes saved in the artifact ``model_file`` belongs to (``ferry.json`` beside it): its
    ``"shapes"`` object, else the inputs of the latest ``ferry bench`` run saved there (its
    baseline at the smallest batch). None when there is none."""
    if model_file is None:
        return None
    report = model_file.parent / "ferry.json"
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        if isinstance(data.get("shapes"), dict):
            return {str(k): tuple(int(d) for d in v) for k, v in data["shapes"].items()}
        runs = [r for r in data.get("benchmarks", []) if isinstance(r, dict)]
        if runs:
            configs = [c for c in runs[-1].get("configurations", []) if c.get("inputs")]
            if configs:
                first = min(configs, key=lambda c: (not c.get("baseline"), c.get("batch") or 0))
                return {str(k): tuple(int(d) for d in v) for k, v in first["inputs"].items()}
    except (TypeError, ValueError, AttributeError):
        logger.warning("auto: ignoring the malformed input shapes in %s", report)
    return None


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


def save_verdict(path: Path, data: Any, what: str) -> bool:
    """Write a measured choice or verdict as JSON, whole or not at all (``atomic_path``); a
    folder that cannot be written (a read-only home) logs a warning naming ``what`` and returns
    False: it must never break loading a model."""
    from ferry.graph import atomic_path

    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    except OSError as e:
        logger.warning("cannot cache %s in %s: %s", what, path, e)
        return False
    return True


def verdicts_dir() -> Path:
    """Where auto's choices and the pays check's verdicts are kept: ``auto/`` under the cache root
    the engine cache uses (:func:`ferry.runtime.default_cache_dir`)."""
    return default_cache_dir() / "auto"
