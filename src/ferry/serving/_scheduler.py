"""Running a served model version: its instances, their threads, warm-up, and the request path.

A model version has ``instance_count`` instances (Triton's instance group): each is its own ferry
``Session`` with a dedicated one-thread executor, so at most one run per instance is in flight and a
run never blocks the event loop. The engine's intra-op threads are sized so that the instances
together leave one core to the event loop: ``max(1, (cores - 1) // instances)``. A config that
names no instance count gets two instances when a call takes :data:`HEAVY_CALL_S` or more (the
loop then needs a small share of a core per request, and a reserved core sat idle: measured on a
Magika-like 1D CNN on 2 cores, 0.1 of the loop's core was busy), else one. Before a version reports
ready, every instance runs once on generated inputs (batch 1 and, when it batches, its
``max_batch_size``), so the first request does not pay for the engine's lazy set-up.

:func:`load_version` does the blocking part (loading, checking, warming up) on a loader thread;
:class:`ModelVersion` is what the event loop serves requests with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import FerryError, InvalidInputError, ModelLoadError
from ferry.serving._admission import (
    DEFAULT_MAX_QUEUE_SIZE,
    Admission,
    QueuePolicy,
    Ticket,
    request_timeout,
)
from ferry.serving._batcher import (
    BatchOutcome,
    DynamicBatcher,
    ExecutionRecord,
    run_items,
)
from ferry.serving._codec import InferRequest, RequestedOutput, datatype_of
from ferry.serving._config import ModelConfig, ResolvedConfig, batch_dim_problem, resolve_config
from ferry.serving._metrics import VersionRecorder
from ferry.serving._rows import rows_interact
from ferry.serving._sequence import SequenceBatcher, SequencePlan, sequence_plan, visible

__all__ = [
    "Instance",
    "InstancePool",
    "LoadedModel",
    "ModelVersion",
    "available_cores",
    "engine_threads",
    "load_version",
]

logger = logging.getLogger(__name__)


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS says, capped by its
    container's CPU quota (a pod limited to 2 CPUs on a 64-core node runs 2 engine threads, not
    64 throttled ones), rounded up."""
    if hasattr(os, "sched_getaffinity"):
        cores = max(1, len(os.sched_getaffinity(0)))
    else:
        cores = max(1, os.cpu_count() or 1)
    quota = _cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota - 1e-9)))


def _cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the cgroup allows (quota / period: cgroup v2's cpu.max, v1's cfs files); None: no
    limit, or not Linux."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


#: A call at least this long makes a model compute-bound: see the module doc.
HEAVY_CALL_S = 0.001


def engine_threads(instances: int, cores: int | None = None) -> int:
    """Intra-op threads per instance so that ``instances x threads <= cores - 1`` (at least 1).

    One core is left to the event loop (HTTP parsing, codec, batching): an engine whose threads
    take every core makes them spin against the loop, and the loop then starves the engine of
    requests. On 2 cores this is what lets dynamic batching pay (benchmarks/serving.py).
    """
    cores = available_cores() if cores is None else cores
    return max(1, (cores - 1) // max(1, instances))


@dataclasses.dataclass
class LoadedModel:
    """A model version loaded, checked and warmed up, not yet serving.

    Attributes:
        sessions: one per instance.
        resolved: the config it runs with.
        backends: the engines, in priority order.
        threads: intra-op threads of each instance's engine.
        precision: the precision asked for (None: each engine's default).
        precisions: what each engine of the plan runs in, in plan order (``{"openvino":
            "bf16", "onnxruntime": "fp32"}``).
        model_file: what was loaded.
        input_types: KServe datatype of each input, in the model's order.
        output_types: KServe datatype of each output, in the model's order.
    """

    sessions: list[Any]
    resolved: ResolvedConfig
    backends: list[str]
    threads: int
    model_file: Path
    input_types: dict[str, str]
    output_types: dict[str, str]
    precision: str | None = None
    precisions: dict[str, str] = dataclasses.field(default_factory=dict)
    #: A stateful model's state (:func:`ferry.serving._sequence.sequence_plan`); None: stateless.
    sequence: SequencePlan | None = None
    #: The worker processes of an isolated version (:class:`ferry.serving._isolate.Isolation`).
    isolation: Any = None

    @property
    def precision_text(self) -> str:
        """``bf16`` when every engine runs in it, else ``openvino=bf16,onnxruntime=fp32``."""
        values = set(self.precisions.values())
        if len(values) == 1:
            return values.pop()
        return ",".join(f"{name}={p}" for name, p in self.precisions.items())

    @property
    def engines_text(self) -> str:
        """The engines and what they run in: ``openvino bf16 + onnxruntime fp32``."""
        return " + ".join(f"{name} {p}" for name, p in self.precisions.items())

    @property
    def inputs(self) -> list[Any]:
        return list(self.sessions[0].inputs)

    @property
    def outputs(self) -> list[Any]:
        return list(self.sessions[0].outputs)


def _kserve_type(spec: Any, name: str, kind: str) -> str:
    if spec.onnx_type == "STRING":
        return "BYTES"
    if spec.dtype is None:
        raise ModelLoadError(
            f"model {name!r}: {kind} {spec.name!r} has type {spec.onnx_type}, which KServe v2 "
            "cannot carry"
        )
    try:
        return datatype_of(spec.dtype)
    except InvalidInputError:
        raise ModelLoadError(
            f"model {name!r}: {kind} {spec.name!r} has type {spec.onnx_type}, which KServe v2 "
            "cannot carry; convert the model to a supported type"
        ) from None


def load_version(
    name: str,
    model_file: Path,
    config: ModelConfig,
    *,
    backends: str | Sequence[str] | None = None,
    precision: str | None = None,
    optimize: str | None = None,
    warmup: bool = True,
    cores: int | None = None,
    threads: int | None = None,
    placement: str | None = None,
    spawn: Callable[..., Any] | None = None,
) -> LoadedModel:
    """Load ``instance_count`` sessions of a model version, check its config, and warm it up.

    Blocking: call it on a loader thread. ``backends``, ``precision``, ``optimize`` and
    ``placement`` are the server's, for a config that names none. An optimization that is refused (it computes
    something else or runs slower) leaves the model as it is, with a warning. ``threads``: the
    engine threads of each instance, and one instance unless the config says how many (a Ray
    Serve replica's share); None: the cores shared out (:func:`engine_threads`). ``spawn``:
    makes each instance in place of ``ferry.runtime.load``, given its options (a worker process:
    :func:`ferry.serving._isolate.load_isolated`).

    Raises:
        FerryError: the model cannot be loaded, a backend is missing, the config does not fit,
            or the warm-up failed (ModelLoadError: a version that cannot run is not READY).
    """
    from ferry.backends import parse_backends
    from ferry.runtime import load

    names = list(config.backends) if config.backends else parse_backends(backends)
    precision = config.precision or precision
    placement = config.placement or placement or "live"
    level = config.optimize or optimize or "none"
    source: Any = model_file
    if level != "none":
        from ferry.optimizer import optimized_for_load

        source = optimized_for_load(model_file, level, backends=names)
    fixed = threads is not None
    if threads is None:
        threads = engine_threads(config.instance_count or 1, cores)

    def instance() -> Any:
        return (spawn or load)(
            source, backends=names, threads=threads, precision=precision, placement=placement
        )

    first = instance()
    probe = _probe_session(first)
    config = _unbatched_if_rows_interact(config, name, probe, warmup)
    resolved = resolve_config(config, name, first.inputs, first.outputs)
    # Left to ferry, a compute-bound model gets two instances and every core (module doc).
    decide = (
        not fixed and config.instance_count is None and warmup and (cores or available_cores()) > 1
    )
    if decide and _probe_on(probe, _call_seconds, resolved) >= HEAVY_CALL_S:
        resolved = dataclasses.replace(resolved, instance_count=2)
        threads = max(1, (cores or available_cores()) // 2)
        first = instance()
        probe = _probe_session(first)
    input_types = {s.name: _kserve_type(s, name, "input") for s in first.inputs}
    output_types = {s.name: _kserve_type(s, name, "output") for s in first.outputs}
    sessions = [first]
    for _ in range(resolved.instance_count - 1):
        sibling = instance()
        _follow(first, sibling)
        sessions.append(sibling)
    loaded = LoadedModel(
        sessions=sessions,
        resolved=resolved,
        backends=names,
        threads=threads,
        model_file=model_file,
        input_types=input_types,
        output_types=output_types,
        precision=precision,
        precisions=_engine_precisions(first),
        sequence=_probe_on(first, sequence_plan, name, config, resolved.max_batch_size > 0),
    )
    if warmup:
        error = warm_up(loaded, probe)
        if error:
            raise ModelLoadError(f"model {name!r}: warm-up failed: {error}")
    return loaded


def _probe_session(session: Any) -> Any:
    """What the load's probes (found inputs, the rows probe, the call's time) run on: the session
    itself, or for a :class:`ferry.runtime.LiveSession` a plain ONNX Runtime session of the same
    prepared model, the engine it serves on until it learns. Probe sizes are made up, not
    traffic: run through the live session, each would take one of the few buckets it learns."""
    from ferry.runtime import LiveSession, Session

    if not isinstance(session, LiveSession):
        return session
    return Session(session.model, session.plan, threads=session.threads)


def _probe_on(session: Any, probe: Callable[..., Any], *args: Any) -> Any:
    """``probe(session, *args)``, run where the session lives: in its worker process for an
    isolated instance (:meth:`ferry.serving._isolate.WorkerSession.remote`), since probes run
    the engine."""
    remote = getattr(session, "remote", None)
    return remote(probe, *args) if remote is not None else probe(session, *args)


def _follow(learner: Any, sibling: Any) -> None:
    """Make ``sibling`` (another instance of the same version) take the plans ``learner``
    learns instead of learning on its own: two learners would time their candidates at once on
    the same cores, and each would overwrite the other's record of a bucket."""
    from ferry.runtime import LiveSession

    if isinstance(learner, LiveSession) and isinstance(sibling, LiveSession):
        sibling.follow(learner)


def _unbatched_if_rows_interact(
    config: ModelConfig, name: str, session: Any, warmup: bool
) -> ModelConfig:
    """``config`` with batching off when ferry would batch the model by default but its rows
    depend on each other (:func:`ferry.serving._rows.rows_interact`); a config that says how to
    batch is kept as it is."""
    if config.max_batch_size is not None or config.dynamic_batching is not None or not warmup:
        return config
    if batch_dim_problem([*session.inputs, *session.outputs]) is not None:
        return config  # not batched by default anyway
    why = _probe_on(session, rows_interact)
    if why is None:
        return config
    logger.warning(
        "model %r is served without batching: %s. Requests run as sent; a config's "
        "max_batch_size overrides this.",
        name,
        why,
    )
    return dataclasses.replace(config, max_batch_size=0, dynamic_batching=False)


def _call_seconds(session: Any, resolved: ResolvedConfig) -> float:
    """The fastest of three batch-1 calls on found inputs (:func:`ferry.runtime.found_inputs`);
    0 when they cannot be made or run (the warm-up then says why)."""
    from ferry.runtime import found_inputs

    try:
        feeds = found_inputs(session).feeds
        session.run(feeds)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            session.run(feeds)
            best = min(best, time.perf_counter() - start)
    except Exception:  # the warm-up reports it
        return 0.0
    return best


def _engine_precisions(session: Any) -> dict[str, str]:
    """What each engine of ``session``'s plan runs in: its ``precision`` option, else the
    engine's default (the first it offers)."""
    from ferry.backends import get_backend

    out: dict[str, str] = {}
    for partition in session.plan.partitions:
        if partition.backend in out:
            continue
        chosen = partition.options.get("precision")
        if chosen is None:
            offered = tuple(get_backend(partition.backend).precisions) or ("fp32",)
            chosen = offered[0]
        out[partition.backend] = str(chosen)
    return out


def warm_up(loaded: LoadedModel, probe: Any = None) -> str | None:
    """Run every instance on generated inputs; return why it failed, or None.

    ``probe``: the session found inputs are probed on (:func:`_probe_session`; default the
    first instance). An instance that learns its placement runs them on the engine it serves
    with until it learns (warm-up inputs are not traffic: they take no bucket).

    The inputs are found first (:func:`ferry.runtime.found_inputs`: sizes that run, ids within
    their tables), stacked to the largest batch too. Should none be found, the warm-up passes
    when one of three generated sets runs everywhere: random values with variable dims of 1;
    ones (index 1, shape [1, 1]...); random values with variable dims past the first of
    :data:`ferry.runtime.GUESSED_SIZE`. A model no set runs fails with the first set's error.
    Inputs that cannot be generated (unknown rank, a type ferry cannot make) skip the warm-up.
    """
    from ferry.runtime import GUESSED_SIZE, LiveSession, Session, found_inputs, random_feeds

    # Session.run on a LiveSession is its ONNX Runtime engine's run, without learning.
    runs = [
        functools.partial(Session.run, s) if isinstance(s, LiveSession) else s.run
        for s in loaded.sessions
    ]
    specs = loaded.inputs
    max_batch = loaded.resolved.max_batch_size
    sizes = [1, max_batch] if max_batch > 1 else [1]

    def feeds(size: int, guess: bool, ones: bool) -> dict[str, np.ndarray]:
        shapes = {
            s.name: tuple(
                size
                if axis == 0 and max_batch
                else (d if isinstance(d, int) else (GUESSED_SIZE if guess and axis else 1))
                for axis, d in enumerate(s.shape)
            )
            for s in specs
            if s.shape is not None
        }
        made = random_feeds(specs, shapes)
        if ones:
            made = {k: v if v.dtype == object else np.ones_like(v) for k, v in made.items()}
        return made

    try:
        found = _probe_on(probe or loaded.sessions[0], found_inputs).feeds
        batched = {s.name for s in specs if s.shape and not isinstance(s.shape[0], int)}
        stacked = [
            {k: np.concatenate([v] * size) if k in batched else v for k, v in found.items()}
            for size in sizes
        ]
        for made in stacked:
            for run in runs:
                run(made)
        return None
    except Exception as e:  # the engine's own errors too; the generated sets are tried next
        logger.debug("warm-up on found inputs failed (%s); trying generated ones", e)
    first: str | None = None
    for guess, ones in ((False, False), (False, True), (True, False)):
        try:
            sets = [feeds(size, guess, ones) for size in sizes]
        except FerryError as e:
            logger.warning("cannot make warm-up inputs (%s); the model loads without one", e)
            return None
        try:
            for made in sets:
                for run in runs:
                    run(made)
        except Exception as e:  # the engine's own errors too
            first = first or (str(e) if isinstance(e, FerryError) else f"{type(e).__name__}: {e}")
            continue
        return None
    return first


@dataclasses.dataclass
class Instance:
    """One copy of the model and the single thread it runs on."""

    session: Any
    executor: ThreadPoolExecutor


class InstancePool:
    """A version's instances; ``acquire`` waits for a free one (event loop only)."""

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        for instance in instances:
            self._free.put_nowait(instance)

    async def acquire(self) -> Instance:
        return await self._free.get()

    def release(self, instance: Instance) -> None:
        self._free.put_nowait(instance)

    def idle(self) -> int:
        """Instances free right now (the batcher shares queued rows among them)."""
        return self._free.qsize()

    def shutdown(self) -> None:
        """Stop the threads (each after the run it is in, if any) and drop the engines.

        The engines are released here, on the event loop's thread (one still running a request
        cut off by the drain timeout, by its own thread when that run ends), never left for the
        interpreter to tear down at exit.
        """
        for instance in self.instances:
            instance.executor.shutdown(wait=False)
            instance.session = None


class ModelVersion:
    """A loaded model version serving requests (create and use it on the event loop).

    Args:
        name: the model's name.
        version: its version number.
        loaded: what :func:`load_version` gave.
        recorder: where its statistics and metrics go.
        config: the config it was loaded with (for ``/config``).
        batcher: makes the batcher when the config batches (default :class:`DynamicBatcher`;
            Ray Serve's deployment gives one on ``@serve.batch``), called with the pool and
            :class:`DynamicBatcher`'s keyword arguments.
        max_queue_size: the server's queue limit, for a config without one (0: none).
    """

    def __init__(
        self,
        name: str,
        version: int,
        loaded: LoadedModel,
        recorder: VersionRecorder,
        config: ModelConfig,
        batcher: Callable[..., Any] | None = None,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
    ) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.loaded = loaded
        self.config = config
        self.resolved = loaded.resolved
        self.recorder = recorder
        self.inputs = loaded.inputs
        self.outputs = loaded.outputs
        self.input_types = loaded.input_types
        self.output_types = loaded.output_types
        # A stateful model's state stays on the server: clients neither send nor see it.
        self.sequence = loaded.sequence
        if self.sequence is not None:
            self.inputs, self.input_types = visible(self.sequence, self.inputs, self.input_types)
            self.outputs, self.output_types = visible(
                self.sequence, self.outputs, self.output_types
            )
        self._output_names = [s.name for s in self.outputs]
        self._output_set = frozenset(self._output_names)
        self._string_inputs = frozenset(n for n, t in self.input_types.items() if t == "BYTES")
        from ferry.runtime import InputChecker

        self._checker = InputChecker(self.inputs)
        self.pool = InstancePool(
            [
                Instance(
                    session,
                    ThreadPoolExecutor(1, thread_name_prefix=f"ferry-{name}-{version}-{i}"),
                )
                for i, session in enumerate(loaded.sessions)
            ]
        )
        self.batcher: Any = None
        if self.resolved.dynamic_batching:
            self.batcher = (batcher or DynamicBatcher)(
                self.pool,
                max_batch_size=self.resolved.max_batch_size,
                max_queue_delay_us=self.resolved.max_queue_delay_us,
                preferred_batch_sizes=self.resolved.preferred_batch_sizes,
                on_execution=self._record_execution,
            )
        policy = config.queue_policy or QueuePolicy()
        self.admission = Admission(name, self.version_str, policy, max_queue_size, recorder)
        self.sequencer: SequenceBatcher | None = None
        if self.sequence is not None:
            self.sequencer = SequenceBatcher(self.sequence, self._admitted, recorder.sequences)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.closed = False
        if self._live_sessions():
            recorder.watch_placement(loaded.sessions[0])

    @property
    def platform(self) -> str:
        """Triton's platform name: ``onnxruntime_onnx`` on ONNX Runtime, else ``ferry``."""
        return "onnxruntime_onnx" if self.loaded.backends[0] == "onnxruntime" else "ferry"

    def start(self) -> None:
        if self.sequencer is not None:
            self.sequencer.start()
        if self.batcher is not None:
            self.batcher.start()

    # -- in-flight tracking: an old version is closed only once its requests are done ---------

    def enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def exit(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def close(self) -> None:
        """Wait for in-flight requests, stop the batcher, release the threads and engines."""
        self.closed = True
        while self._in_flight:  # an Event wakes its waiter even when cleared again meanwhile
            await self._idle.wait()
        if self.sequencer is not None:
            await self.sequencer.close()
        if self.batcher is not None:
            await self.batcher.close()
        self.pool.shutdown()
        if self.loaded.isolation is not None:  # stopping workers blocks for a moment
            await asyncio.get_running_loop().run_in_executor(None, self.loaded.isolation.close)
        self.loaded.sessions = []

    # -- the request path ----------------------------------------------------------------------

    def prepare(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """Check a request's inputs against the model; return the feeds and the batch size.

        Raises:
            InvalidInputError: unknown or missing input, wrong datatype, shape or dims, inputs that
                disagree on the batch size, or a batch above ``max_batch_size``.
        """
        feeds = request.inputs
        for name, array in feeds.items():
            expected = self.input_types.get(name)
            if expected is None:
                raise InvalidInputError(
                    f"unknown input {name!r}; model {self.name!r} takes {self._describe_inputs()}"
                )
            sent = request.datatypes[name]
            if sent != expected:
                raise InvalidInputError(
                    f"input {name!r} is {expected} in model {self.name!r}, got {sent}"
                )
            if name in self._string_inputs:
                feeds[name] = _as_text(array, name)
        if len(feeds) != len(self.input_types):
            missing = [n for n in self.input_types if n not in feeds]
            raise InvalidInputError(
                f"missing input {', '.join(map(repr, missing))}; model {self.name!r} takes "
                f"{self._describe_inputs()}"
            )
        batch = 1
        max_batch = self.resolved.max_batch_size
        if max_batch > 0:
            sizes = {name: (a.shape[0] if a.ndim else None) for name, a in feeds.items()}
            if None in sizes.values():
                scalar = next(n for n, s in sizes.items() if s is None)
                raise InvalidInputError(
                    f"input {scalar!r} is a scalar, but model {self.name!r} batches "
                    f"(max_batch_size {max_batch}): its first dim is the batch dim"
                )
            distinct = set(sizes.values())
            if len(distinct) > 1:
                raise InvalidInputError(
                    "the inputs disagree on the batch size (dim 0): "
                    + ", ".join(f"{n!r} has {s}" for n, s in sizes.items())
                )
            batch = int(distinct.pop())  # type: ignore[arg-type]
            if batch > max_batch:
                raise InvalidInputError(
                    f"batch size {batch} is above the max_batch_size {max_batch} of model "
                    f"{self.name!r}; split the request"
                )
            if batch < 1:
                raise InvalidInputError(f"batch size is 0; model {self.name!r} needs at least 1")
        self._checker.check(feeds)
        return feeds, batch

    def output_plan(
        self, requested: list[RequestedOutput] | None, binary_default: bool
    ) -> tuple[list[str] | None, list[tuple[str, bool]]]:
        """The outputs to compute (None: all) and ``(name, binary)`` for each one to send.

        Raises:
            InvalidInputError: an unknown output name.
        """
        if requested is None:
            return None, [(name, binary_default) for name in self._output_names]
        unknown = [r.name for r in requested if r.name not in self._output_set]
        if unknown:
            raise InvalidInputError(
                f"unknown output {', '.join(map(repr, unknown))}; model {self.name!r} gives "
                f"{', '.join(map(repr, self._output_names))}"
            )
        sends = [(r.name, binary_default if r.binary is None else r.binary) for r in requested]
        return [r.name for r in requested], sends

    async def infer(
        self,
        feeds: dict[str, np.ndarray],
        outputs: list[str] | None,
        batch: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> BatchOutcome:
        """Run one request: through the batcher, or alone on the next free instance.

        ``parameters``: the request's (a stateful model's ``sequence_id``, ``sequence_start``,
        ``sequence_end``: :mod:`ferry.serving._sequence`).

        Raises:
            ExecutionError: the engine failed on this request.
            InvalidInputError: a stateful model's request names no active sequence.
        """
        if self.sequencer is not None:
            return await self.sequencer.submit(feeds, outputs, batch, parameters or {})
        return await self._admitted(feeds, outputs, batch, parameters or {})

    async def _admitted(
        self,
        feeds: dict[str, np.ndarray],
        outputs: Sequence[str] | None,
        batch: int,
        parameters: Mapping[str, Any],
    ) -> BatchOutcome:
        # Refused at once when the queue is full; answered unrun past its timeout.
        ticket = self.admission.admit(request_timeout(parameters))
        try:
            return await self._run(feeds, outputs, batch, ticket)
        finally:
            ticket.leave()

    async def _run(
        self,
        feeds: dict[str, np.ndarray],
        outputs: Sequence[str] | None,
        batch: int,
        ticket: Ticket | None = None,
    ) -> BatchOutcome:
        if self.batcher is not None:
            if ticket is not None and isinstance(self.batcher, DynamicBatcher):
                return await self.batcher.submit(feeds, outputs, batch, ticket)
            return await self.batcher.submit(feeds, outputs, batch)
        arrival = time.perf_counter_ns()
        instance = await (self.pool.acquire() if ticket is None else ticket.acquire(self.pool))
        try:
            execution = await asyncio.get_running_loop().run_in_executor(
                instance.executor, run_items, instance.session, [feeds], [batch], outputs, [None]
            )
        finally:
            self.pool.release(instance)
        for record in execution.records:
            self._record_execution(record)
        result = execution.results[0]
        if isinstance(result, BaseException):
            raise result
        return BatchOutcome(result, execution.start_ns - arrival, execution.infer_ns, batch)

    def _record_execution(self, record: ExecutionRecord) -> None:
        self.recorder.execution(
            batch_size=record.batch_size,
            input_ns=record.input_ns,
            infer_ns=record.infer_ns,
            output_ns=record.output_ns,
        )

    def _describe_inputs(self) -> str:
        return ", ".join(f"{n!r} ({t})" for n, t in self.input_types.items())

    # -- what the metadata endpoints show -----------------------------------------------------

    def _live_sessions(self) -> list[Any]:
        """The instances, when the first learns its placement (the others adopt what it
        learns); else none."""
        from ferry.runtime import LiveSession

        sessions = list(self.loaded.sessions)
        return sessions if sessions and isinstance(sessions[0], LiveSession) else []

    def placement_report(self) -> dict[str, Any] | None:
        """Live placement's report of the learning instance (``LiveSession.placement_report``),
        with ``"instances"``: each instance's buckets (plan, state, calls); None when the
        version's placement is fixed."""
        sessions = self._live_sessions()
        if not sessions:
            return None
        report = sessions[0].placement_report()
        keep = ("bucket", "plan", "state", "calls")
        report["instances"] = [
            [{k: b[k] for k in keep} for b in s.placement_report()["buckets"]] for s in sessions
        ]
        return report

    def tensor_metadata(self, outputs: bool = False) -> list[dict[str, Any]]:
        """``[{"name", "datatype", "shape"}]`` with -1 for variable dims."""
        specs = self.outputs if outputs else self.inputs
        types = self.output_types if outputs else self.input_types
        return [
            {"name": s.name, "datatype": types[s.name], "shape": _kserve_shape(s.shape)}
            for s in specs
        ]


def _kserve_shape(shape: tuple[Any, ...] | None) -> list[int]:
    if shape is None:
        return [-1]
    return [d if isinstance(d, int) else -1 for d in shape]


def _as_text(array: np.ndarray, name: str) -> np.ndarray:
    """BYTES elements as ``str`` (what ONNX Runtime's string tensors take)."""
    if array.size == 0 or not isinstance(array.flat[0], bytes):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    try:
        for i, item in enumerate(array.reshape(-1)):
            flat[i] = item.decode() if isinstance(item, bytes) else item
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"input {name!r}: element {i} is not UTF-8 text, which the model's string input needs"
        ) from None
    return out
