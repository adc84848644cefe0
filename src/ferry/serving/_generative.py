"""A generative artifact served: its decoder behind a continuous-batching engine.

The repository loads an artifact folder that ``ferry convert`` wrote for a decoder (model.onnx,
tokenizer, chat template) as a :class:`GenerativeVersion`: a model version like any other for
the KServe routes that describe it (metadata, config, statistics, readiness), whose requests
come through the OpenAI routes and Triton's generate extension instead of ``/infer``. Each
version runs one :class:`~ferry.generate.BatchEngine`; what it measures goes to Prometheus as
it happens (the engine's worker thread records, prometheus-client's series are thread-safe).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.errors import InvalidInputError
from ferry.serving._config import ModelConfig, resolve_config
from ferry.serving._metrics import LATENCY_BUCKETS, Metrics, VersionRecorder
from ferry.serving._scheduler import LoadedModel, ModelVersion, _kserve_type

if TYPE_CHECKING:
    from ferry.generate import BatchEngine, DecoderSession

__all__ = ["GenerationMetrics", "GenerationSettings", "GenerativeVersion", "load_generative"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How generative models are served (``ferry serve`` options).

    Attributes:
        max_num_seqs: sequences decoded at once per model.
        max_model_len: a sequence's prompt + new tokens at most (None: the model's context).
        kv_cache_mib: the KV cache budget per model (None: ``max_num_seqs`` full-length rows).
        max_queue: requests waiting beyond this get 429.
        prefill_chunk: prompt tokens read per step between decode steps.
    """

    max_num_seqs: int = 16
    max_model_len: int | None = None
    kv_cache_mib: float | None = None
    max_queue: int = 256
    prefill_chunk: int = 512

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_queue", "prefill_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_model_len is not None and (
            isinstance(self.max_model_len, bool)
            or not isinstance(self.max_model_len, int)
            or self.max_model_len < 2
        ):
            raise InvalidInputError(
                f"max_model_len must be an integer >= 2, got {self.max_model_len!r}"
            )
        if self.kv_cache_mib is not None and not self.kv_cache_mib > 0:
            raise InvalidInputError(f"kv_cache_mib must be > 0, got {self.kv_cache_mib!r}")


class GenerationMetrics:
    """Prometheus series of generative models, in the server's registry (made once)."""

    def __init__(self, metrics: Metrics) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = ["model", "version"]
        registry = metrics.registry
        token_buckets = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
        self.ttft = Histogram(
            "ferry_generation_time_to_first_token_seconds",
            "Time from a request's arrival to its first new token.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "ferry_generation_inter_token_latency_seconds",
            "Time between two new tokens of one sequence.",
            labels,
            buckets=token_buckets,
            registry=registry,
        )
        self.queue = Histogram(
            "ferry_generation_queue_duration_seconds",
            "Time a request waited before its sequence was admitted to the batch.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "ferry_generation_prompt_tokens",
            "Prompt tokens read.",
            labels,
            registry=registry,
        )
        self.new_tokens = Counter(
            "ferry_generation_tokens",
            "New tokens generated (rate() gives tokens/s).",
            labels,
            registry=registry,
        )
        self.requests = Counter(
            "ferry_generation_requests",
            "Generation requests finished, by finish reason.",
            [*labels, "finish_reason"],
            registry=registry,
        )
        self.running = Gauge(
            "ferry_generation_running_sequences",
            "Sequences in the running batch.",
            labels,
            registry=registry,
        )
        self.waiting = Gauge(
            "ferry_generation_waiting_sequences",
            "Requests waiting to be admitted.",
            labels,
            registry=registry,
        )
        self.kv_usage = Gauge(
            "ferry_generation_kv_cache_usage_ratio",
            "Share of the KV cache budget reserved by running sequences.",
            labels,
            registry=registry,
        )


def generation_metrics(metrics: Metrics) -> GenerationMetrics:
    """The server's generative series, made on first use."""
    existing = getattr(metrics, "generation", None)
    if existing is None:
        existing = GenerationMetrics(metrics)
        metrics.generation = existing  # type: ignore[attr-defined]
    return existing


class _Observer:
    """The engine's observer writing one version's series."""

    def __init__(self, series: GenerationMetrics, model: str, version: str) -> None:
        labels = (model, version)
        self._ttft = series.ttft.labels(*labels)
        self._itl = series.itl.labels(*labels)
        self._queue = series.queue.labels(*labels)
        self._prompt = series.prompt_tokens.labels(*labels)
        self._new = series.new_tokens.labels(*labels)
        self._requests = series.requests
        self._labels = labels

    def admitted(self, queued_seconds: float) -> None:
        self._queue.observe(queued_seconds)

    def token(self, first: bool, seconds: float) -> None:
        (self._ttft if first else self._itl).observe(seconds)
        self._new.inc()

    def finished(self, prompt_tokens: int, new_tokens: int, reason: str) -> None:
        self._prompt.inc(prompt_tokens)
        self._requests.labels(*self._labels, reason).inc()


class GenerativeVersion(ModelVersion):
    """A loaded generative artifact: its :class:`~ferry.generate.DecoderSession` and the
    :class:`~ferry.generate.BatchEngine` that runs its requests.

    Attributes:
        decoder: the decoder (tokenizer, chat template, eos ids).
        engine: the continuous-batching engine.
        created: when it loaded (Unix seconds; OpenAI's ``created``).
    """

    def __init__(
        self,
        name: str,
        version: int,
        loaded: LoadedModel,
        recorder: VersionRecorder,
        config: ModelConfig,
        decoder: DecoderSession,
        engine: BatchEngine,
    ) -> None:
        super().__init__(name, version, loaded, recorder, config)
        self.decoder = decoder
        self.engine = engine
        self.created = int(time.time())

    @property
    def platform(self) -> str:
        return "ferry_generative"

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Chat messages through the model's template, tokenized.

        Raises:
            InvalidInputError: the model has no chat template, or the template refuses them.
        """
        decoder = self.decoder
        if decoder.template is None:
            raise InvalidInputError(
                f"model {self.name!r} has no chat template: use /v1/completions with a prompt"
            )
        text = decoder.template.render(list(messages), add_generation_prompt=True)
        return list(decoder.tokenizer.encode(text, add_special_tokens=False).ids)

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """A prompt text tokenized with the tokenizer's special tokens."""
        return list(self.decoder.tokenizer.encode(prompt, add_special_tokens=True).ids)

    def prepare(self, request: Any) -> Any:
        raise InvalidInputError(
            f"model {self.name!r} is a generative model: send POST /v1/chat/completions, "
            f"/v1/completions or /v2/models/{self.name}/generate, not /infer"
        )

    async def close(self) -> None:
        self.engine.close()
        await super().close()


def load_generative(
    name: str,
    version: int,
    folder: Path,
    config: ModelConfig,
    settings: GenerationSettings,
    metrics: Metrics | None,
    *,
    backends: str | Sequence[str] | None = None,
    threads: int | None = None,
    warmup: bool = True,
) -> tuple[LoadedModel, DecoderSession, BatchEngine]:
    """Load an artifact folder's decoder and start its engine (blocking: on a loader thread);
    :class:`GenerativeVersion` takes what it returns, on the event loop.

    ``warmup`` generates one token first, so the first request pays no engine set-up.

    Raises:
        FerryError: the artifact cannot be loaded, or a setting does not fit the model.
    """
    from ferry.backends import parse_backends
    from ferry.generate import BatchEngine, DecoderSession

    names = list(config.backends) if config.backends else parse_backends(backends)
    options: dict[str, Any] = {"backends": names}
    if threads is not None:
        options["threads"] = threads
    decoder = DecoderSession.from_folder(folder, **options)
    if warmup:
        decoder.generate(ids=[0], max_new_tokens=1)
    observer = None
    if metrics is not None:
        observer = _Observer(generation_metrics(metrics), name, str(version))
    engine = BatchEngine(
        decoder,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        kv_cache_mib=settings.kv_cache_mib,
        max_queue=settings.max_queue,
        prefill_chunk=settings.prefill_chunk,
        observer=observer,
    )
    if engine.min_batch > 1:
        logger.warning(
            "model %r: a lone sequence decodes beside an idle row (its 4-bit kernels round one "
            "row differently from several, and a sequence's tokens must not depend on what "
            "else runs); convert with --accuracy-level 4 for kernels that do not",
            name,
        )
    if metrics is not None:
        series = generation_metrics(metrics)
        labels = (name, str(version))
        series.running.labels(*labels).set_function(lambda: engine.stats()["running"])
        series.waiting.labels(*labels).set_function(lambda: engine.stats()["waiting"])
        series.kv_usage.labels(*labels).set_function(lambda: engine.stats()["kv_cache_usage"])
    session = decoder.session
    resolved = resolve_config(config, name, session.inputs, session.outputs)
    loaded = LoadedModel(
        sessions=[session],
        resolved=resolved,
        backends=names,
        threads=threads or 0,
        model_file=folder / "model.onnx",
        input_types={s.name: _kserve_type(s, name, "input") for s in session.inputs},
        output_types={s.name: _kserve_type(s, name, "output") for s in session.outputs},
        precisions={n: "fp32" for n in names[:1]},
    )
    return loaded, decoder, engine
