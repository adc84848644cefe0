"""``ferry bench``: every engine and precision asked for, at every batch, measured in one run.

A *target* is an engine setup (backend + precision, or ``auto``), a *configuration* is a target at
one batch size. Plain ONNX Runtime fp32 is always measured as well, as the baseline every figure
is also given as a ratio to (at the same batch).

How it measures (see DESIGN.md, Measuring):

* Cold start, warm start and peak memory: each target runs in a fresh child process
  (``python -m ferry.bench._worker measure``), one after the other. Cold start is the wall time
  of ``ferry.load`` with the engine cache disabled, once the engine's Python modules are imported
  (Python's import time is the same for every model); warm start is ``ferry.load`` again with the
  compiled engine in a cache, for engines that store one (null for ONNX Runtime, which does not).
  Peak RSS is the child's ``ru_maxrss`` after running each batch, smallest first, and includes
  the interpreter and the engine libraries (``rss_before_load_mb`` says how much of it they are).
  A child costs about one second of Python start-up and imports; ``isolate=False`` skips it (cold
  start then measured in-process, peak RSS and warm start null).
* Latency: in this process, all configurations alternate in blocks of calls
  (:func:`ferry.bench.interleave`), so a drift in the machine's load hits them all alike.

The results document (``schema`` ``"ferry.bench/1"``)::

    {
      "schema": "ferry.bench/1",
      "created": "2026-01-01T12:00:00+00:00",           # UTC
      "model": {"name", "path", "sha256", "inputs": [{"name", "shape", "dtype"}]},
      "device": {...},                                   # ferry.bench.device_info()
      "settings": {"backends", "precisions", "batches", "threads", "warmup", "iterations",
                   "duration_s", "block", "isolated", "seed", "force_cpu", "inputs_from",
                   "accuracy": {"budget": [judge specs], "batch": n, "reference": "onnxruntime fp32"}},
      "configurations": [{
        "label": "openvino bf16",       # backend + precision ("auto" for auto)
        "backend", "precision", "batch", "threads",
        "baseline": bool,               # plain ONNX Runtime fp32
        "requested": bool,              # false for a baseline measured without being asked for
        "fastest": bool,                # lowest p50 at this batch
        "fastest_within_budget": bool,  # lowest p50 at this batch among those within the budget
        "accuracy": {"passed", "worst", "judgements": [{"kind", "output", "score", "threshold",
                     "passed", "detail"}]} | null,  # against ONNX Runtime fp32 (see below)
        "inputs": {"name": [dims]},
        "plan": {"partitions": n, "backends": [...], "chosen": "openvino bf16" | null (auto)},
        "cold_start_s", "first_run_ms", "warm_start_s", "rss_before_load_mb", "peak_rss_mb",
        "iterations", "throughput",     # samples/s = batch / mean latency
        "latency_ms": {"p50", "p90", "p99", "mean", "std", "min", "max"},
        "latency_percentiles_ms": [p0, p1, ..., p100],
        "partitions": [{"index", "backend", "nodes", "mean_ms"}] | null,   # when the plan has > 1
        "ratio_to_ort_fp32": {"p50", "p90", "p99", "mean", "throughput", "cold_start",
                              "peak_rss"} | null,
        "note": str | null,
        "error": str | null             # this configuration failed; its figures are null
      }]
    }

Figures that were not measured are null, never absent.

Accuracy: before timing, every target runs once on the inputs of the first batch (``settings.
accuracy.batch``) and its outputs are judged against plain ONNX Runtime fp32's on the same inputs
with :func:`ferry.parity.within_budget` and the budget in ``settings.accuracy.budget`` (judge specs,
:func:`ferry.parity.judge`; default :data:`ferry.parity.DEFAULT_BUDGET`). ``accuracy`` is that
verdict (``BudgetVerdict.to_dict()``; the same at every batch of the target; null when it could not
be judged, ``note`` says why); the baseline is the reference and always passes. The fastest
configuration within budget at each batch (the baseline counts) has ``fastest_within_budget``; one
outside the budget never has it. ``accuracy``, ``fastest_within_budget`` and ``settings.accuracy``
were added within schema 1: a document written before them reads as not judged
(:func:`ferry.bench.check_results` fills them in as null / false).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.bench._latency import DEFAULT_BLOCK, Contender, interleave, summarize_ms
from ferry.bench._spec import _AUTO, BenchSpec, Progress, Target, resolve_targets
from ferry.errors import FerryError, InvalidInputError
from ferry.parity import DEFAULT_BUDGET, within_budget

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.runtime import Session, TensorSpec

__all__ = ["SCHEMA", "batch_feeds", "file_sha256", "run_bench"]

logger = logging.getLogger(__name__)

SCHEMA = "ferry.bench/1"

# Budget for ``auto``'s own candidate timing (its choice is cached per model and machine).
_AUTO_BUDGET_S = 5.0
# A child measuring one target is killed after this long.
_CHILD_TIMEOUT_S = 1800.0


def run_bench(
    model: str | os.PathLike[str],
    spec: BenchSpec | None = None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure ``model`` as ``spec`` says and return the results document (module docstring).

    Args:
        model: an ``.onnx`` file or an artifact folder holding ``model.onnx``.
        spec: what to measure; None: ONNX Runtime fp32, 100 calls.
        inputs: input arrays by name (the rest are generated from the input specs); with
            ``spec.batches``, their first dim is cut or repeated to each batch.
        progress: called as the run goes (see :data:`Progress`).

    Raises:
        FerryError: the model cannot be read or run by plain ONNX Runtime, or the spec or inputs
            do not fit it. A configuration that fails on its own is reported in the results.
    """
    from ferry.bench._device import device_info
    from ferry.graph import load_model, prepare, resolve_model_file
    from ferry.plan import Plan
    from ferry.runtime import load

    spec = spec or BenchSpec()
    report = progress or (lambda stage, done, total: None)
    path = Path(model)
    model_file = resolve_model_file(path)
    targets = resolve_targets(spec)
    report("reading the model", 0, 1)
    named = prepare(load_model(path))
    base = targets[0]
    base.plan = Plan.whole_graph(named, "onnxruntime")
    start = time.perf_counter()
    base.session = load(path, plan=base.plan, threads=spec.threads, cache_dir=False)
    base_load_s = time.perf_counter() - start
    given = dict(inputs or {})
    feeds = batch_feeds(
        base.session.inputs, given, spec.shapes, spec.batches, spec.seed, model=base.session
    )
    judged_batch = next(iter(feeds))
    # The model must at least run on ORT; its outputs are the reference accuracy is judged by.
    reference = dict(base.session.run(feeds[judged_batch]))
    for target in targets[1:]:
        if target.error is None:
            report(f"planning {target.label}", 0, 1)
            _plan(target, named, spec, next(iter(feeds.values())))
    live = [t for t in targets if t.error is None]
    if spec.isolate:
        with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:
            feeds_file = Path(tmp) / "feeds.npz"
            arrays: dict[str, Any] = {
                f"{b}/{name}": arr for b, f in feeds.items() for name, arr in f.items()
            }
            np.savez(feeds_file, **arrays)
            for i, target in enumerate(live):
                report(f"cold start and memory: {target.label}", i, len(live))
                _measure_in_child(target, model_file, spec, feeds_file, Path(tmp))
    else:
        base.cold_start_s = base_load_s
    report("loading", 0, len(live))
    for i, target in enumerate(live):
        if target.error is not None or target.session is not None:
            continue
        report(f"loading {target.label}", i, len(live))
        assert target.plan is not None
        start = time.perf_counter()
        try:
            target.session = load(
                path,
                plan=target.plan,
                threads=spec.threads,
                cache_dir=None if spec.isolate else False,
            )
        except Exception as e:  # reported per configuration, never fatal to the others
            target.error = _describe(e)
            continue
        if not spec.isolate:
            target.cold_start_s = time.perf_counter() - start
    budget = [dict(b) for b in (spec.accuracy if spec.accuracy is not None else DEFAULT_BUDGET)]
    report("judging accuracy", 0, len(live))
    for i, target in enumerate(live):
        if target.error is None and target.session is not None:
            report(f"judging accuracy: {target.label}", i, len(live))
            _judge(target, feeds[judged_batch], reference, budget)
    configs = _time_all(targets, feeds, spec, report)
    _add_ratios(configs)
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "name": path.name if path.is_dir() else model_file.name,
            "path": str(path),
            "sha256": file_sha256(model_file),
            "inputs": [s.to_dict() for s in base.session.inputs],
        },
        "device": device_info(),
        "settings": {
            "backends": list(spec.backends),
            "precisions": None if spec.precisions is None else list(spec.precisions),
            "batches": sorted(feeds),
            "threads": spec.threads,
            "warmup": spec.warmup,
            "iterations": spec.iterations,
            "duration_s": spec.duration_s,
            "block": DEFAULT_BLOCK,
            "isolated": spec.isolate,
            "seed": spec.seed,
            "force_cpu": list(spec.force_cpu),
            "inputs_from": {
                s.name: "file" if s.name in given else "random" for s in base.session.inputs
            },
            "accuracy": {
                "budget": budget,
                "batch": judged_batch,
                "reference": base.label,
            },
        },
        "configurations": configs,
    }


def _plan(target: Target, named: ir.Model, spec: BenchSpec, feeds: dict[str, np.ndarray]) -> None:
    """The plan of ``target``: its engine alone (ONNX Runtime taking what it cannot run), at its
    precision, or what auto chooses."""
    from ferry.runtime import make_plan

    start = time.perf_counter()
    try:
        if target.backend == _AUTO:
            made = make_plan(
                named,
                _AUTO,
                threads=spec.threads,
                feeds=feeds,
                accuracy=spec.accuracy,
                budget_s=_AUTO_BUDGET_S,
            )
        else:
            made = make_plan(
                named,
                [target.backend],
                force_cpu=spec.force_cpu,
                options={target.backend: {"precision": target.precision}},
            )
    except Exception as e:  # reported per configuration, never fatal to the others
        target.error = _describe(e)
        return
    target.plan = made.plan
    if made.auto is not None:
        target.chosen = made.auto.label
        how = (
            "from its cache"
            if made.auto.from_cache
            else f"in {time.perf_counter() - start:.1f} s (not part of its cold start)"
        )
        target.note = f"auto chose {made.auto.label} {how}"
    elif target.backend not in target.plan.backends:
        target.note = f"{target.backend} took no node; ONNX Runtime runs the whole model"


def _judge(
    target: Target,
    feeds: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    budget: list[dict[str, Any]],
) -> None:
    """Run ``target`` once on ``feeds`` and judge its outputs against ``reference`` (ONNX Runtime
    fp32's on the same feeds): ``target.accuracy``. A run that fails fails the target; a verdict
    that cannot be reached (outputs that do not match up) leaves it null with a note."""
    if target.baseline:
        got = reference  # the reference itself
    else:
        try:
            got = dict(target.session.run(feeds)) if target.session is not None else {}
        except Exception as e:  # reported per configuration, never fatal to the others
            target.error = _describe(e)
            return
    missing = sorted(set(reference) - set(got))
    if missing:
        target.note = _join(target.note, f"accuracy not judged: no output {', '.join(missing)}")
        return
    try:
        verdict = within_budget({k: got[k] for k in reference}, reference, budget)
    except FerryError as e:
        target.note = _join(target.note, f"accuracy not judged: {e}")
        return
    target.accuracy = verdict.to_dict()


def _join(note: str | None, more: str) -> str:
    return more if not note else f"{note}; {more}"


def _measure_in_child(
    target: Target, model_file: Path, spec: BenchSpec, feeds_file: Path, tmp: Path
) -> None:
    assert target.plan is not None
    job_file = tmp / "job.json"
    out_file = tmp / "out.json"
    out_file.unlink(missing_ok=True)
    job = {
        "model": str(model_file),
        "plan": target.plan.to_dict(),
        "threads": spec.threads,
        "feeds": str(feeds_file),
        # Enough calls for the engine to allocate what it keeps (arenas, scratch buffers).
        "calls": max(3, min(spec.warmup, 10)),
    }
    job_file.write_text(json.dumps(job), encoding="utf-8")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ferry.bench._worker", "measure", str(job_file), str(out_file)],
            capture_output=True,
            text=True,
            timeout=_CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        target.error = f"measuring cold start took over {_CHILD_TIMEOUT_S:.0f} s; gave up"
        return
    try:
        out = json.loads(out_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        target.error = f"the process measuring it died: {tail[0]}"
        return
    if proc.returncode != 0 or out.get("error"):
        target.error = out.get("error") or f"exit status {proc.returncode}"
        if proc.stderr.strip():
            logger.debug("child for %s: %s", target.label, proc.stderr.strip())
        return
    target.cold_start_s = out["cold_start_s"]
    target.first_run_ms = out.get("first_run_ms")
    target.warm_start_s = out.get("warm_start_s")
    target.rss_before_load_mb = out.get("rss_before_load_mb")
    target.peak_rss_mb = {int(k): v for k, v in (out.get("peak_rss_mb") or {}).items()}


class _PartitionClock:
    """Sums the seconds each partition takes, over the timed calls only."""

    def __init__(self, session: Session, count: int) -> None:
        self.session = session
        self.totals = [0.0] * count
        self.calls = [0] * count

    def __call__(self, index: int, seconds: float) -> None:
        self.totals[index] += seconds
        self.calls[index] += 1

    def timing(self, on: bool) -> None:
        self.session.partition_timer = self if on else None


@dataclasses.dataclass
class _Config:
    target: Target
    batch: int
    contender: Contender
    clock: _PartitionClock | None


def _time_all(
    targets: list[Target],
    feeds: dict[int, dict[str, np.ndarray]],
    spec: BenchSpec,
    report: Progress,
) -> list[dict[str, Any]]:
    configs: list[_Config] = []
    rows: list[tuple[Target, int]] = [(t, b) for b in sorted(feeds) for t in targets]
    for target, batch in rows:
        if target.error is not None or target.session is None:
            continue
        session, batch_feeds_ = target.session, feeds[batch]
        clock = None
        if target.plan is not None and len(target.plan.partitions) > 1:
            clock = _PartitionClock(session, len(target.plan.partitions))
        contender = Contender(
            fn=functools.partial(session.run, batch_feeds_),
            timing=clock.timing if clock is not None else None,
        )
        configs.append(_Config(target, batch, contender, clock))
    n = len(configs)
    report("timing", 0, n)
    interleave(
        [c.contender for c in configs],
        warmup=spec.warmup,
        iterations=spec.iterations,
        duration_s=spec.duration_s,
        on_progress=lambda done: report("timing", done, n),
    )
    report("timing", n, n)
    by_key = {(id(c.target), c.batch): c for c in configs}
    out = []
    for target, batch in rows:
        config = by_key.get((id(target), batch))
        out.append(_config_dict(target, batch, feeds[batch], spec, config))
    for batch in sorted(feeds):
        timed = [r for r in out if r["batch"] == batch and r["latency_ms"] is not None]
        if timed:
            min(timed, key=lambda r: r["latency_ms"]["p50"])["fastest"] = True
        within = [r for r in timed if r["accuracy"] is not None and r["accuracy"]["passed"]]
        if within:
            min(within, key=lambda r: r["latency_ms"]["p50"])["fastest_within_budget"] = True
    return out


def _config_dict(
    target: Target,
    batch: int,
    feeds: dict[str, np.ndarray],
    spec: BenchSpec,
    config: _Config | None,
) -> dict[str, Any]:
    error = target.error
    figures: dict[str, Any] = {
        "iterations": None,
        "latency_ms": None,
        "latency_percentiles_ms": None,
        "throughput": None,
    }
    partitions = None
    if config is not None:
        contender = config.contender
        if contender.error is not None:
            error = _describe(contender.error)
        elif contender.samples_ns:
            figures = summarize_ms(contender.samples_ns, batch)
        if config.clock is not None and target.plan is not None and error is None:
            clock, runs = config.clock, max(1, len(contender.samples_ns))
            partitions = [
                {
                    "index": i,
                    "backend": p.backend,
                    "nodes": len(p.nodes),
                    "mean_ms": clock.totals[i] / runs * 1000 if clock.calls[i] else None,
                }
                for i, p in enumerate(target.plan.partitions)
            ]
    plan = target.plan
    return {
        "label": target.label,
        "backend": target.backend,
        "precision": target.precision,
        "batch": batch,
        "threads": spec.threads,
        "baseline": target.baseline,
        "requested": target.requested,
        "fastest": False,
        "fastest_within_budget": False,
        "accuracy": target.accuracy,
        "inputs": {name: list(arr.shape) for name, arr in feeds.items()},
        "plan": None
        if plan is None
        else {
            "partitions": len(plan.partitions),
            "backends": plan.backends,
            "chosen": target.chosen,
        },
        "cold_start_s": target.cold_start_s,
        "first_run_ms": target.first_run_ms,
        "warm_start_s": target.warm_start_s,
        "rss_before_load_mb": target.rss_before_load_mb,
        "peak_rss_mb": target.peak_rss_mb.get(batch),
        **figures,
        "partitions": partitions,
        "ratio_to_ort_fp32": None,
        "note": target.note,
        "error": error,
    }


def _add_ratios(configs: list[dict[str, Any]]) -> None:
    """``ratio_to_ort_fp32``: each figure over the baseline's at the same batch.

    Latency, cold start and memory ratios below 1 and a throughput ratio above 1 are better.
    """
    for row in configs:
        base = next(
            (r for r in configs if r["baseline"] and r["batch"] == row["batch"]),
            None,
        )
        if base is None or row["latency_ms"] is None or base["latency_ms"] is None:
            continue
        lat, base_lat = row["latency_ms"], base["latency_ms"]
        row["ratio_to_ort_fp32"] = {
            **{k: _ratio(lat[k], base_lat[k]) for k in ("p50", "p90", "p99", "mean")},
            "throughput": _ratio(row["throughput"], base["throughput"]),
            "cold_start": _ratio(row["cold_start_s"], base["cold_start_s"]),
            "peak_rss": _ratio(row["peak_rss_mb"], base["peak_rss_mb"]),
        }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def batch_feeds(
    specs: Sequence[TensorSpec],
    given: Mapping[str, np.ndarray],
    shapes: Mapping[str, Sequence[int]],
    batches: Sequence[int] | None,
    seed: int,
    *,
    model: Any = None,
) -> dict[int, dict[str, np.ndarray]]:
    """Inputs for each batch size: given arrays and generated ones (found with ``model``, a
    Session or ``onnx_ir`` model: :func:`ferry.runtime.found_inputs`, sizes that run and ids
    within their tables; else random at the shapes given, symbolic dims as 1).

    Without ``batches``, one set: the given arrays, the rest generated at the ``shapes`` given
    (symbolic dims as 1), keyed by its batch (the first input's first dim). With ``batches``, the
    first dim of every input whose first dim is symbolic becomes the batch: generated inputs are
    made at that size, given arrays are cut to it or repeated until they fill it.

    Raises:
        InvalidInputError: an unknown input name, a shape that does not fit, or batches for a
            model with no input whose first dim may change.
    """
    from ferry.runtime import concrete_shape, random_feeds

    names = [s.name for s in specs]
    for kind, named in (("--input", given), ("--shape", shapes)):
        unknown = sorted(set(named) - set(names))
        if unknown:
            raise InvalidInputError(
                f"{kind} names unknown input {', '.join(map(repr, unknown))}; the model takes "
                + ", ".join(f"{s.name!r} ({s.describe()})" for s in specs)
            )
    rest = [s for s in specs if s.name not in given]
    base_shapes = {k: tuple(v) for k, v in shapes.items() if k not in given}
    if model is not None and rest:
        from ferry.runtime import found_inputs

        arrays = {k: np.asarray(v) for k, v in given.items()}
        found = found_inputs(model, base_shapes, given=arrays, seed=seed)
        # Found once, then cut or repeated to each batch as given arrays are.
        given = {s.name: arrays.get(s.name, found.feeds[s.name]) for s in specs}
        rest, base_shapes = [], {}
    if batches is None:
        feeds = {name: np.asarray(arr) for name, arr in given.items()}
        feeds.update(random_feeds(rest, base_shapes, seed=seed))
        feeds = {s.name: feeds[s.name] for s in specs}
        return {_batch_of(feeds): feeds}
    batched = [s for s in specs if s.shape and not isinstance(s.shape[0], int)]
    if not batched:
        natural = batch_feeds(specs, given, shapes, None, seed)
        if set(batches) == set(natural):  # asking for the one batch it has is fine
            return natural
        raise InvalidInputError(
            "--batch: no input of this model has a symbolic first dim ("
            + ", ".join(f"{s.name} {s.describe()}" for s in specs)
            + "), so it runs at one batch size only; export it with a dynamic batch dim"
        )
    out: dict[int, dict[str, np.ndarray]] = {}
    for batch in dict.fromkeys(batches):
        feeds = {}
        for spec in specs:
            if spec.name in given:
                arr = np.asarray(given[spec.name])
                if spec in batched and arr.ndim >= 1 and arr.shape[0] > 0:
                    arr = np.take(arr, np.arange(batch) % arr.shape[0], axis=0)
                feeds[spec.name] = arr
        shape_map: dict[str, tuple[int, ...]] = {}
        for spec in rest:
            if spec in batched:
                dims = concrete_shape(spec, base_shapes.get(spec.name))
                shape_map[spec.name] = (batch, *dims[1:])
            elif spec.name in base_shapes:
                shape_map[spec.name] = base_shapes[spec.name]
        feeds.update(random_feeds(rest, shape_map, seed=seed))
        out[batch] = {s.name: feeds[s.name] for s in specs}
    return out


def _batch_of(feeds: Mapping[str, np.ndarray]) -> int:
    for value in feeds.values():
        shape = getattr(value, "shape", ())
        if shape:
            return int(shape[0])
    return 1


def _describe(e: BaseException) -> str:
    if isinstance(e, FerryError):
        return str(e)
    logger.debug("configuration failed", exc_info=e)
    return f"{type(e).__name__}: {e}"


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
