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
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.bench._latency import DEFAULT_BLOCK, Contender, interleave, summarize_ms
from ferry.errors import BackendUnavailableError, FerryError, InvalidInputError
from ferry.parity import DEFAULT_BUDGET, within_budget

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.plan import Plan
    from ferry.runtime import Session, TensorSpec

__all__ = [
    "BASELINE",
    "SCHEMA",
    "BenchSpec",
    "Progress",
    "Target",
    "batch_feeds",
    "file_sha256",
    "resolve_targets",
    "run_bench",
]

logger = logging.getLogger(__name__)

SCHEMA = "ferry.bench/1"
#: The configuration every other one is compared with.
BASELINE = ("onnxruntime", "fp32")
_AUTO = "auto"
# Budget for ``auto``'s own candidate timing (its choice is cached per model and machine).
_AUTO_BUDGET_S = 5.0
# A child measuring one target is killed after this long.
_CHILD_TIMEOUT_S = 1800.0

#: Progress callback: ``(stage, done, total)``; stage is a short description of what runs now.
Progress = Callable[[str, float, float], None]


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """What to measure. Everything but the input arrays: it travels to an agent as JSON.

    Attributes:
        backends: engines to compare (``"auto"`` too); ONNX Runtime fp32 is added as the baseline.
        precisions: precisions to run each engine in; None: every precision it offers.
        batches: batch sizes; None: the batch the inputs have.
        threads: intra-op threads for every engine; None: the engine's default (all cores).
        warmup: untimed calls per configuration before timing.
        iterations: timed calls per configuration.
        duration_s: seconds of timed calls per configuration (with ``iterations``: whichever
            comes first).
        shapes: shapes of generated inputs, for symbolic dims (the batch dim is set by
            ``batches`` when given).
        seed: seed of generated inputs.
        isolate: measure cold start and peak memory in a fresh process per target.
        force_cpu: op types or node names kept on ONNX Runtime when partitioning.
        accuracy: the accuracy budget every configuration is judged by against ONNX Runtime
            fp32: judge specs (:func:`ferry.parity.judge`, e.g. from
            :func:`ferry.parity.parse_budget`; ``custom`` cannot travel as JSON); None:
            :data:`ferry.parity.DEFAULT_BUDGET`.
    """

    backends: tuple[str, ...] = ("onnxruntime",)
    precisions: tuple[str, ...] | None = None
    batches: tuple[int, ...] | None = None
    threads: int | None = None
    warmup: int = 10
    iterations: int | None = 100
    duration_s: float | None = None
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    isolate: bool = True
    force_cpu: tuple[str, ...] = ()
    accuracy: tuple[Mapping[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise InvalidInputError naming the first field that is wrong."""
        if not self.backends or not all(isinstance(b, str) and b.strip() for b in self.backends):
            raise InvalidInputError("backends: name at least one engine, e.g. onnxruntime")
        if self.precisions is not None and (
            not self.precisions or not all(isinstance(p, str) and p for p in self.precisions)
        ):
            raise InvalidInputError("precisions: give at least one, e.g. fp32")
        if self.batches is not None and (
            not self.batches or not all(_is_int(b) and b >= 1 for b in self.batches)
        ):
            raise InvalidInputError(
                f"batches must be positive integers, e.g. 1,8; got {self.batches!r}"
            )
        if self.threads is not None and not (_is_int(self.threads) and self.threads >= 1):
            raise InvalidInputError(f"threads must be a positive integer, got {self.threads!r}")
        if not (_is_int(self.warmup) and self.warmup >= 0):
            raise InvalidInputError(f"warmup must be 0 or more, got {self.warmup!r}")
        if self.iterations is None and self.duration_s is None:
            raise InvalidInputError("give iterations, duration_s or both")
        if self.iterations is not None and not (_is_int(self.iterations) and self.iterations >= 1):
            raise InvalidInputError(f"iterations must be 1 or more, got {self.iterations!r}")
        if self.duration_s is not None and not (
            isinstance(self.duration_s, (int, float))
            and not isinstance(self.duration_s, bool)
            and math.isfinite(self.duration_s)
            and self.duration_s > 0
        ):
            raise InvalidInputError(f"duration_s must be positive, got {self.duration_s!r}")
        for name, dims in self.shapes.items():
            if not isinstance(name, str) or not all(_is_int(d) and d >= 0 for d in dims):
                raise InvalidInputError(f"shapes: bad shape {dims!r} for input {name!r}")
        if not _is_int(self.seed):
            raise InvalidInputError(f"seed must be an integer, got {self.seed!r}")
        if self.accuracy is not None:
            _check_budget(self.accuracy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": list(self.backends),
            "precisions": None if self.precisions is None else list(self.precisions),
            "batches": None if self.batches is None else list(self.batches),
            "threads": self.threads,
            "warmup": self.warmup,
            "iterations": self.iterations,
            "duration_s": self.duration_s,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "seed": self.seed,
            "isolate": self.isolate,
            "force_cpu": list(self.force_cpu),
            # Only when given: an agent of an older ferry refuses keys it does not know.
            **({} if self.accuracy is None else {"accuracy": [dict(a) for a in self.accuracy]}),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BenchSpec:
        """The spec a JSON object describes (keys as :meth:`to_dict` writes; all optional).

        Raises:
            InvalidInputError: not an object, an unknown key, or a value of the wrong type.
        """
        if not isinstance(data, dict):
            raise InvalidInputError("the bench spec must be a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InvalidInputError(
                f"unknown bench spec key {', '.join(map(repr, unknown))}; "
                f"known keys: {', '.join(sorted(fields))}"
            )
        kw: dict[str, Any] = {}
        try:
            for key in ("backends", "precisions", "force_cpu"):
                if data.get(key) is not None:
                    value = data[key]
                    if isinstance(value, str) or not isinstance(value, list):
                        raise TypeError(f"{key} must be a list of strings")
                    kw[key] = tuple(str(v) for v in value)
            if data.get("batches") is not None:
                if not isinstance(data["batches"], list):
                    raise TypeError("batches must be a list of integers")
                kw["batches"] = tuple(data["batches"])
            if "shapes" in data:
                if not isinstance(data["shapes"], dict):
                    raise TypeError("shapes must map input names to lists of dims")
                kw["shapes"] = {str(k): tuple(v) for k, v in data["shapes"].items()}
            if data.get("accuracy") is not None:
                value = data["accuracy"]
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    raise TypeError(
                        'accuracy must be a list of judge specs, e.g. [{"kind": "cosine", '
                        '"min": 0.999}]'
                    )
                kw["accuracy"] = tuple(dict(v) for v in value)
            for key in ("threads", "warmup", "iterations", "duration_s", "seed", "isolate"):
                if key in data:
                    kw[key] = data[key]
        except TypeError as e:
            raise InvalidInputError(f"bad bench spec: {e}") from e
        if "isolate" in kw and not isinstance(kw["isolate"], bool):
            raise InvalidInputError("isolate must be true or false")
        if "iterations" not in kw and kw.get("duration_s") is not None:
            kw["iterations"] = None
        return cls(**kw)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_budget(specs: Any) -> None:
    """Refuse a budget that is not judge specs that travel as JSON, naming what is wrong."""
    from ferry.parity import judge

    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence) or not specs:
        raise InvalidInputError(
            "accuracy: give judge specs, e.g. ({'kind': 'cosine', 'min': 0.999},), or None for "
            "the default budget"
        )
    for spec in specs:
        if not isinstance(spec, Mapping):
            raise InvalidInputError(f"accuracy: each judge spec must be a mapping, got {spec!r}")
        if spec.get("kind") == "custom":
            raise InvalidInputError(
                "accuracy: a 'custom' judge (a function) cannot travel as JSON; use cosine, "
                "top1, argmax_seq or mask"
            )
        judge(spec)  # an unknown kind or setting names the known ones
        try:
            json.dumps(dict(spec), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"accuracy: judge spec {spec!r} is not plain JSON: {e}") from e


@dataclasses.dataclass
class Target:
    """An engine setup to measure: backend and precision, its plan, or why it cannot run."""

    backend: str
    precision: str
    baseline: bool = False
    requested: bool = True
    plan: Plan | None = None
    chosen: str | None = None
    note: str | None = None
    error: str | None = None
    cold_start_s: float | None = None
    first_run_ms: float | None = None
    warm_start_s: float | None = None
    rss_before_load_mb: float | None = None
    peak_rss_mb: dict[int, float | None] = dataclasses.field(default_factory=dict)
    accuracy: dict[str, Any] | None = None
    session: Session | None = None

    @property
    def label(self) -> str:
        return _AUTO if self.backend == _AUTO else f"{self.backend} {self.precision}"


def resolve_targets(spec: BenchSpec) -> list[Target]:
    """The targets ``spec`` asks for, baseline first, without building anything.

    An engine that is known but not installed here becomes a target with ``error`` set (reported,
    not fatal).

    Raises:
        InvalidInputError: an unknown backend, or a precision that none of the engines asked for
            offers (naming what each offers).
    """
    from ferry.backends import get_backend, known_backends

    targets: list[Target] = []
    offered: dict[str, tuple[str, ...]] = {}
    known = known_backends()
    for name in dict.fromkeys(b.strip() for b in spec.backends):
        if name == _AUTO:
            targets.append(Target(_AUTO, _AUTO))
            continue
        if name not in known:
            raise InvalidInputError(
                f"unknown backend {name!r}; known backends: {', '.join(known)} (or auto)"
            )
        try:
            backend = get_backend(name)
        except BackendUnavailableError as e:
            for precision in spec.precisions or ("fp32",):
                targets.append(Target(name, precision, error=str(e)))
            continue
        offered[name] = tuple(backend.precisions)
        for precision in spec.precisions or backend.precisions:
            if precision in backend.precisions:
                targets.append(Target(name, precision))
    for precision in spec.precisions or ():
        if offered and not any(precision in p for p in offered.values()):
            what = "; ".join(f"{n} offers {', '.join(p)}" for n, p in offered.items())
            raise InvalidInputError(
                f"precision {precision!r} is not offered by "
                f"{'the engine' if len(offered) == 1 else 'any engine'} asked for ({what})"
            )
    baseline = [t for t in targets if (t.backend, t.precision) == BASELINE]
    if baseline:
        baseline[0].baseline = True
        targets.remove(baseline[0])
        targets.insert(0, baseline[0])
    else:
        targets.insert(0, Target(*BASELINE, baseline=True, requested=False))
    return targets


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
    feeds = batch_feeds(base.session.inputs, given, spec.shapes, spec.batches, spec.seed)
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
) -> dict[int, dict[str, np.ndarray]]:
    """Inputs for each batch size: given arrays and generated ones.

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
