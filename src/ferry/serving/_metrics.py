"""What the server measured: Prometheus metrics (``/metrics``) and Triton-style statistics (``/stats``).

Each app has its own ``CollectorRegistry`` (never the process-wide one), so two servers in one
process, or one per test, keep separate counts. Every series is labelled by model and version.
Triton's ``model_stats`` are kept per loaded version by :class:`VersionStats`; both are updated by one
:class:`VersionRecorder`, on the event loop only, so the plain counters need no locks. A request's
Prometheus updates cost several microseconds, as much as the rest of its bookkeeping on the batched
path, so the recorder queues them and applies them in bulk: every :data:`FLUSH_EVERY` requests and
before every rendering of ``/metrics``, so a scrape always sees every request answered before it.

A version whose first instance learns its placement (:class:`ferry.runtime.LiveSession`) is read
at each scrape too: its switches count in ``ferry_placement_switches_total{plan}``, and each
bucket of input sizes (``x=1x8x512``) shows the speedup over ONNX Runtime alone of the plan it
runs on (``ferry_placement_speedup``, 1 while on ONNX Runtime) and of the plan measured there
(``ferry_placement_measured_speedup``: below 1, the bucket stayed on ONNX Runtime).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "FLUSH_EVERY",
    "LATENCY_BUCKETS",
    "Metrics",
    "VersionRecorder",
    "VersionStats",
]

#: Requests a recorder queues before it applies their Prometheus updates.
FLUSH_EVERY = 64

#: Latency histogram buckets, in seconds: 100 us to 10 s.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """The Prometheus metrics of one server, in their own registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model", "version"]
        self.success = Counter(
            "ferry_inference_request_success",
            "Inference requests that succeeded.",
            labels,
            registry=self.registry,
        )
        self.failure = Counter(
            "ferry_inference_request_failure",
            "Inference requests that failed, by HTTP status.",
            [*labels, "code"],
            registry=self.registry,
        )
        self.inferences = Counter(
            "ferry_inference_count",
            "Inferences performed (a batch of N counts N).",
            labels,
            registry=self.registry,
        )
        self.executions = Counter(
            "ferry_inference_exec_count",
            "Model executions (a batch counts once).",
            labels,
            registry=self.registry,
        )
        self.request_duration = Histogram(
            "ferry_inference_request_duration_seconds",
            "Time from receiving a request to its response being ready.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_duration = Histogram(
            "ferry_inference_queue_duration_seconds",
            "Time a request waited for an instance (and for the batcher).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.compute_duration = Histogram(
            "ferry_inference_compute_duration_seconds",
            "Time the engine ran, per execution.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "ferry_inference_batch_size",
            "Batch size of each execution.",
            labels,
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self.placement_switches = Counter(
            "ferry_placement_switches",
            "Live placement's switches of a bucket of input sizes to a plan, by the plan's label.",
            [*labels, "plan"],
            registry=self.registry,
        )
        self.placement_speedup = Gauge(
            "ferry_placement_speedup",
            "Speedup over ONNX Runtime alone of the plan a bucket of input sizes runs on "
            "(1: ONNX Runtime alone).",
            [*labels, "bucket"],
            registry=self.registry,
        )
        self.placement_measured = Gauge(
            "ferry_placement_measured_speedup",
            "Speedup over ONNX Runtime alone live placement measured for the plan it tried at a "
            "bucket of input sizes (below 1: the bucket stayed on ONNX Runtime).",
            [*labels, "bucket"],
            registry=self.registry,
        )
        self.sequences = Gauge(
            "ferry_sequences_active",
            "Sequences of a stateful model whose state the server holds (sequence batching).",
            labels,
            registry=self.registry,
        )
        # Overload (ferry.serving._admission): Triton's nv_inference_pending_request_count too.
        self.rejected = Counter(
            "ferry_inference_rejected",
            "Inference requests refused at once because the model's queue was full (429).",
            labels,
            registry=self.registry,
        )
        self.timeouts = Counter(
            "ferry_inference_queue_timeout",
            "Inference requests answered unrun because they waited past their timeout.",
            labels,
            registry=self.registry,
        )
        self.pending = Gauge(
            "ferry_inference_pending_request_count",
            "Inference requests waiting in the model's queue (not yet running).",
            labels,
            registry=self.registry,
        )
        #: The recorders whose queued updates :meth:`flush` applies.
        self._recorders: list[VersionRecorder] = []

    def flush(self) -> None:
        """Apply the updates the recorders have queued (call it on the event loop)."""
        for recorder in self._recorders:
            recorder.flush()

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type (on the event loop: it flushes, and
        reads live placement's reports)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.flush()
        for recorder in self._recorders:
            recorder.read_placement()
            recorder.read_pending()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _bucket_label(bucket: Mapping[str, Sequence[int]]) -> str:
    """A bucket of input sizes as a label: ``input1=1x1x64x200,mask=1x200``."""
    return ",".join(f"{name}={'x'.join(map(str, dims))}" for name, dims in bucket.items())


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class VersionStats:
    """Triton's ``model_stats`` entry for one model version."""

    def __init__(self) -> None:
        self.success = _Duration()
        self.fail = _Duration()
        self.queue = _Duration()
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, tuple[_Duration, _Duration, _Duration]] = {}

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.to_json(),
                "fail": self.fail.to_json(),
                "queue": self.queue.to_json(),
                "compute_input": self.compute_input.to_json(),
                "compute_infer": self.compute_infer.to_json(),
                "compute_output": self.compute_output.to_json(),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": ci.to_json(),
                    "compute_infer": cf.to_json(),
                    "compute_output": co.to_json(),
                }
                for size, (ci, cf, co) in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }


class VersionRecorder:
    """Records one model version's requests and executions into its stats and the metrics.

    Call it from the event loop only.
    """

    def __init__(self, metrics: Metrics | None, model: str, version: str) -> None:
        self.stats = VersionStats()
        self._metrics = metrics
        self._labels = (model, version)
        if metrics is not None:
            # Bound children: .labels() looks the series up each call, which costs more.
            self._success = metrics.success.labels(*self._labels)
            self._inferences = metrics.inferences.labels(*self._labels)
            self._executions = metrics.executions.labels(*self._labels)
            self._request = metrics.request_duration.labels(*self._labels)
            self._queue = metrics.queue_duration.labels(*self._labels)
            self._compute = metrics.compute_duration.labels(*self._labels)
            self._batch = metrics.batch_size.labels(*self._labels)
            metrics._recorders.append(self)
        #: (total_ns, queue_ns) of the successful requests whose Prometheus updates are queued.
        self._queued: list[tuple[int, int]] = []
        # The session whose placement report the metrics show (weak: a retired version's
        # engines are released, never kept alive by its metrics), and its switches counted.
        self._placement: weakref.ref[Any] | None = None
        self._switches_counted = 0
        #: Requests waiting in the version's queue, read at each scrape (None: not known).
        self.pending: Callable[[], int] | None = None

    def watch_placement(self, session: Any) -> None:
        """Show ``session``'s live placement (its ``placement_report()``) in the metrics, read
        at each scrape."""
        self._placement = weakref.ref(session)
        self._switches_counted = 0

    def read_placement(self) -> None:
        """Bring the placement metrics up to the watched session's report (event loop)."""
        session = self._placement() if self._placement is not None else None
        metrics = self._metrics
        if session is None or metrics is None:
            return
        report = session.placement_report()
        switches = report["switches"]
        for switch in switches[self._switches_counted :]:
            metrics.placement_switches.labels(*self._labels, str(switch["plan"])).inc()
        self._switches_counted = len(switches)
        for bucket in report["buckets"]:
            label = _bucket_label(bucket["bucket"])
            measured = bucket.get("speedup")
            switched = str(bucket.get("state", "")).startswith("switched")
            on = measured if switched and measured else 1.0
            metrics.placement_speedup.labels(*self._labels, label).set(on)
            if measured is not None:
                metrics.placement_measured.labels(*self._labels, label).set(measured)

    def success(
        self, *, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """A request answered with its outputs."""
        s = self.stats
        s.success.add(total_ns)
        s.queue.add(queue_ns)
        s.compute_input.add(input_ns)
        s.compute_infer.add(infer_ns)
        s.compute_output.add(output_ns)
        s.last_inference_ms = time.time_ns() // 1_000_000
        if self._metrics is not None:
            self._queued.append((total_ns, queue_ns))
            if len(self._queued) >= FLUSH_EVERY:
                self.flush()

    def flush(self) -> None:
        """Apply the queued requests' Prometheus updates."""
        queued = self._queued
        if not queued:
            return
        self._queued = []
        self._success.inc(len(queued))
        request, queue = self._request.observe, self._queue.observe
        for total_ns, queue_ns in queued:
            request(total_ns / 1e9)
            queue(queue_ns / 1e9)

    def sequences(self, active: int) -> None:
        """A stateful model version now holds ``active`` sequences."""
        if self._metrics is not None:
            self._metrics.sequences.labels(*self._labels).set(active)

    def read_pending(self) -> None:
        """Bring the pending-requests gauge up to the version's queue (event loop)."""
        if self._metrics is not None and self.pending is not None:
            self._metrics.pending.labels(*self._labels).set(self.pending())

    def rejected(self) -> None:
        """A request refused because the queue was full (its failure is recorded apart)."""
        if self._metrics is not None:
            self._metrics.rejected.labels(*self._labels).inc()

    def timed_out(self, *, queue_ns: int) -> None:
        """A request that waited ``queue_ns`` in the queue, past its timeout, and did not run."""
        self.stats.queue.add(queue_ns)
        if self._metrics is not None:
            self._metrics.timeouts.labels(*self._labels).inc()
            self._queue.observe(queue_ns / 1e9)

    def failure(self, *, total_ns: int, status: int) -> None:
        """A request answered with an error."""
        self.stats.fail.add(total_ns)
        if self._metrics is not None:
            self._metrics.failure.labels(*self._labels, str(status)).inc()

    def execution(self, *, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One run of the model on a batch of ``batch_size`` (1 for an unbatched request)."""
        s = self.stats
        s.execution_count += 1
        s.inference_count += batch_size
        entry = s.batches.get(batch_size)
        if entry is None:
            entry = s.batches[batch_size] = (_Duration(), _Duration(), _Duration())
        entry[0].add(input_ns)
        entry[1].add(infer_ns)
        entry[2].add(output_ns)
        if self._metrics is not None:
            self._inferences.inc(batch_size)
            self._executions.inc()
            self._compute.observe(infer_ns / 1e9)
            self._batch.observe(batch_size)
