"""Pipelines of models: a repository model of kind ``pipeline`` that chains other models and
Python steps (see :mod:`ferry.serving._pipeline_spec` for its file).

A pipeline is served like a model: metadata, ``/config``, ``/ready``, statistics and ``/infer``.
One request in, one response out: the request's inputs are checked against the pipeline's
declared inputs, then each step runs once, in waves (steps whose inputs are ready run
concurrently). A model step goes through that model's own request path (its checks, its
dynamic batcher, its statistics: the same path an HTTP request to the model takes), so a
pipeline's requests batch with the model's other traffic; a step whose batch is above the
model's ``max_batch_size`` is cut into pieces that batch side by side. A Python step runs in
the pipeline's thread pool, never on the event loop. A step that fails fails the request with
an error naming it: ``step 2 'rec' (model ppocr_rec): ...``.

The steps' models are looked up on each request, so a step follows its model's reloads; the
pipeline is ready while every step's model is (``/ready`` and the index say which is not).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import (
    EngineBusyError,
    EngineClosedError,
    ExecutionError,
    FerryError,
    InvalidInputError,
)
from ferry.runtime import TensorSpec
from ferry.serving._batcher import BatchOutcome
from ferry.serving._codec import DATATYPES, InferRequest, RequestedOutput, datatype_of
from ferry.serving._config import ModelConfig, resolve_config
from ferry.serving._http import HTTPError, status_of
from ferry.serving._metrics import VersionRecorder
from ferry.serving._pipeline_spec import (
    PipelineSpec,
    Step,
    TensorDecl,
    as_json,
    find_pipeline_file,
    read_pipeline,
)
from ferry.serving._repository_files import (
    ModelNotFoundError,
    ModelNotReadyError,
    VersionFiles,
    fingerprint,
)
from ferry.serving._scheduler import LoadedModel, ModelVersion, available_cores

__all__ = [
    "PipelineVersion",
    "is_pipeline_file",
    "load_pipeline",
    "pipeline_down",
    "pipeline_files",
]

logger = logging.getLogger(__name__)


class _Specs:
    """What :class:`ModelVersion` reads of a session: the input and output specs."""

    def __init__(self, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self.inputs = inputs
        self.outputs = outputs


def _spec(tensor: TensorDecl, lead: int) -> TensorSpec:
    shape = ("batch",) * lead + tuple(None if d == -1 else d for d in tensor.dims)
    onnx_type = "STRING" if tensor.datatype == "BYTES" else tensor.datatype
    return TensorSpec(tensor.name, shape, DATATYPES[tensor.datatype], onnx_type)


class PipelineVersion(ModelVersion):
    """A loaded pipeline (create and use it on the event loop).

    Args:
        spec: the pipeline's file, read.
        repository: where its steps' models are looked up, on each request.
        recorder: where its statistics and metrics go.
        version: its version number (1).
    """

    def __init__(
        self,
        spec: PipelineSpec,
        repository: Any,
        recorder: VersionRecorder,
        version: int = 1,
    ) -> None:
        lead = 1 if spec.max_batch_size > 0 else 0
        inputs = [_spec(t, lead) for t in spec.inputs]
        outputs = [_spec(t, lead) for t in spec.outputs]
        config = ModelConfig(max_batch_size=spec.max_batch_size, dynamic_batching=False)
        loaded = LoadedModel(
            sessions=[_Specs(inputs, outputs)],
            resolved=resolve_config(config, spec.name, inputs, outputs),
            backends=["pipeline"],
            threads=0,
            model_file=spec.source,
            input_types={t.name: t.datatype for t in spec.inputs},
            output_types={t.name: t.datatype for t in spec.outputs},
        )
        super().__init__(spec.name, version, loaded, recorder, config)
        self.spec = spec
        self._repository = repository
        self._lead = lead
        self._declared = {t.name: t for t in spec.outputs}
        self._writer = {t: s for s in spec.steps for t in s.outputs.values()}
        python_steps = sum(1 for s in spec.steps if s.python is not None)
        self._python = (
            ThreadPoolExecutor(
                max(1, min(4, available_cores())), thread_name_prefix=f"ferry-{spec.name}-py"
            )
            if python_steps
            else None
        )

    @property
    def platform(self) -> str:
        """Triton's platform name for a pipeline of models."""
        return "ensemble"

    def unready_reason(self) -> str | None:
        """Why the pipeline cannot serve now: the first step whose model is not ready, and
        why (None: every step's model is ready)."""
        for step in self.spec.steps:
            if step.model is None:
                continue
            try:
                self._repository.get(step.model, step.version)
            except FerryError as e:
                return f"{step.label}: {e}"
        return None

    def triton_config(self) -> dict[str, Any]:
        """The configuration as Triton's ``/config`` gives an ensemble's."""

        def tensors(group: tuple[TensorDecl, ...]) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                    "dims": list(t.dims),
                }
                for t in group
            ]

        return {
            "name": self.name,
            "platform": "ensemble",
            "max_batch_size": self.spec.max_batch_size,
            "input": tensors(self.spec.inputs),
            "output": tensors(self.spec.outputs),
            "ensemble_scheduling": as_json(self.spec),
            "parameters": {"ferry_pipeline_file": {"string_value": self.spec.source.name}},
        }

    async def infer(
        self,
        feeds: dict[str, np.ndarray],
        outputs: list[str] | None,
        batch: int,
        parameters: Mapping[str, Any] | None = None,
    ) -> BatchOutcome:
        """Run the steps on one request's (checked) inputs; the request's ``parameters`` go
        with each model step's request (a timeout, a sequence's id), as Triton's ensembles do.

        Raises:
            FerryError: a step failed (the message names it), or the pipeline's outputs do not
                fit what it declares.
        """
        tensors: dict[str, np.ndarray] = dict(feeds)
        params = dict(parameters or {})
        queue_ns = infer_ns = 0
        for wave in self.spec.waves:
            if len(wave) == 1:
                results: list[Any] = [await self._step(wave[0], tensors, params)]
            else:
                results = await asyncio.gather(
                    *(self._step(s, tensors, params) for s in wave), return_exceptions=True
                )
            for result in results:  # the first failure in file order
                if isinstance(result, BaseException):
                    raise result
            for written, step_queue, step_infer in results:
                tensors.update(written)
                queue_ns += step_queue
                infer_ns += step_infer
        wanted = outputs if outputs is not None else list(self._declared)
        answer = {name: self._checked_output(name, tensors[name]) for name in wanted}
        self.recorder.execution(batch_size=batch, input_ns=0, infer_ns=infer_ns, output_ns=0)
        return BatchOutcome(answer, queue_ns, infer_ns, batch)

    async def close(self) -> None:
        await super().close()
        if self._python is not None:
            self._python.shutdown(wait=False)

    # -- steps -------------------------------------------------------------------------------------

    async def _step(
        self, step: Step, tensors: dict[str, np.ndarray], params: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], int, int]:
        """Run one step: what it writes (pipeline tensor names), its queue and compute time."""
        given = {own: tensors[source] for own, source in step.inputs.items()}
        try:
            if step.model is not None:
                got, queue_ns, infer_ns = await self._model_step(step, given, params)
            else:
                start = time.perf_counter_ns()
                assert self._python is not None and step.function is not None
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self._python, step.function, given)
                got, queue_ns, infer_ns = result, 0, time.perf_counter_ns() - start
            return self._written(step, got), queue_ns, infer_ns
        except Exception as e:
            raise _step_error(step, e) from None

    async def _model_step(
        self, step: Step, given: dict[str, np.ndarray], params: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], int, int]:
        """Send a step's inputs through its model's request path (checks, batcher, statistics)."""
        assert step.model is not None
        version = self._repository.get(step.model, step.version)
        wanted = list(step.outputs)
        version.output_plan([RequestedOutput(n, None) for n in wanted], True)  # names checked
        max_batch = version.resolved.max_batch_size
        rows = _rows(given)
        if max_batch > 0 and rows is not None and rows > max_batch:
            # More rows than one execution takes: pieces that the model's batcher runs side by
            # side, then joined back (rows are independent in a batching model).
            pieces = [
                {k: v[i : i + max_batch] for k, v in given.items()}
                for i in range(0, rows, max_batch)
            ]
            outcomes = await asyncio.gather(*(_request(version, p, wanted, params) for p in pieces))
            joined = {n: np.concatenate([o.outputs[n] for o in outcomes]) for n in wanted}
            return joined, max(o.queue_ns for o in outcomes), sum(o.infer_ns for o in outcomes)
        outcome = await _request(version, given, wanted, params)
        return outcome.outputs, outcome.queue_ns, outcome.infer_ns

    def _written(self, step: Step, got: Any) -> dict[str, np.ndarray]:
        """A step's outputs under their pipeline names, checked to be all there."""
        if not isinstance(got, dict):
            raise ExecutionError(
                f"returned {type(got).__name__}; a step returns a dict of its outputs "
                f"({', '.join(map(repr, step.outputs))})"
            )
        missing = [n for n in step.outputs if n not in got]
        if missing:
            raise ExecutionError(
                f"gave no {', '.join(map(repr, missing))} output; it gave "
                f"{', '.join(map(repr, got)) or 'none'}"
            )
        return {tensor: np.asarray(got[own]) for own, tensor in step.outputs.items()}

    def _checked_output(self, name: str, array: np.ndarray) -> np.ndarray:
        """A pipeline output, checked against its declared datatype and dims."""
        declared = self._declared[name]
        got = "BYTES" if array.dtype.kind in "OUS" else datatype_of(array.dtype)
        step = self._writer[name]
        if got != declared.datatype:
            raise ExecutionError(
                f"pipeline {self.name!r}: output {name!r} from {step.label} is {got}, but the "
                f"pipeline declares {declared.datatype}; make the step give "
                f"{declared.datatype} or fix the declaration"
            )
        if array.dtype.kind in "US":
            array = array.astype(object)
        dims = array.shape[self._lead :]
        if len(array.shape) != self._lead + len(declared.dims) or not all(
            want in (-1, size) for want, size in zip(declared.dims, dims)
        ):
            raise ExecutionError(
                f"pipeline {self.name!r}: output {name!r} from {step.label} has shape "
                f"{list(array.shape)}, but the pipeline declares dims {list(declared.dims)}"
                + (" after the batch dim" if self._lead else "")
            )
        return array


async def _request(
    version: ModelVersion, given: dict[str, np.ndarray], wanted: list[str], params: dict[str, Any]
) -> BatchOutcome:
    """One request to a model version, as ``/infer`` makes it (in-flight count, checks,
    batcher, the version's statistics)."""
    start = time.perf_counter_ns()
    datatypes = {
        n: "BYTES" if a.dtype.kind in "OUS" else datatype_of(a.dtype) for n, a in given.items()
    }
    request = InferRequest(None, dict(given), datatypes, None, True, params)
    version.enter()
    try:
        try:
            feeds, batch = version.prepare(request)
            prepared = time.perf_counter_ns()
            outcome = await version.infer(feeds, wanted, batch, params)
        except Exception as e:
            version.recorder.failure(total_ns=time.perf_counter_ns() - start, status=status_of(e))
            raise
        version.recorder.success(
            total_ns=time.perf_counter_ns() - start,
            queue_ns=outcome.queue_ns,
            input_ns=prepared - start,
            infer_ns=outcome.infer_ns,
            output_ns=0,
        )
        return outcome
    finally:
        version.exit()


def _rows(given: dict[str, np.ndarray]) -> int | None:
    """The rows (dim 0) the inputs share, or None when they do not all have the same."""
    sizes = {a.shape[0] if a.ndim else None for a in given.values()}
    size = sizes.pop() if len(sizes) == 1 else None
    return size


def _step_error(step: Step, error: Exception) -> FerryError:
    """The error a failed step fails its request with: its message led by the step's name,
    keeping the status (and a refusal's ``Retry-After``): bad input 400, busy 429, not ready
    503, an engine's or a Python step's failure 500."""

    if not isinstance(error, FerryError):
        logger.error("%s failed", step.label, exc_info=error)
        return ExecutionError(f"{step.label}: {type(error).__name__}: {error}")
    message = f"{step.label}: {error}"
    if isinstance(error, EngineBusyError):  # a full queue, a queued request's timeout
        return type(error)(message, error.retry_after)
    if isinstance(error, HTTPError):
        return HTTPError(error.status, message, error.headers)
    if isinstance(error, ModelNotFoundError):
        return ModelNotReadyError(message)  # the pipeline is there; a step's model is not
    for kind in (ModelNotReadyError, EngineClosedError, InvalidInputError, ExecutionError):
        if isinstance(error, kind):
            return kind(message)
    return HTTPError(status_of(error), message)


# -- what the repository calls ---------------------------------------------------------------------


def pipeline_files(model_dir: Path) -> dict[int, VersionFiles] | None:
    """The repository's scan of a pipeline folder: one version, 1, whose file is the pipeline's
    (its fingerprint covers the whole folder: a Python step's edit reloads it); None when the
    folder holds a plain model."""
    path = find_pipeline_file(model_dir)
    if path is None:
        return None
    return {1: VersionFiles(1, path, fingerprint(model_dir))}


def is_pipeline_file(path: Path) -> bool:
    """Whether a version's file (from :func:`pipeline_files`) is a pipeline's."""
    return path.is_file() and find_pipeline_file(path.parent) == path


async def load_pipeline(
    repository: Any, name: str, files: VersionFiles, recorder: VersionRecorder
) -> PipelineVersion | str:
    """Read a pipeline's file and make its version; the error message when it cannot load."""
    assert files.path is not None
    root = repository.root

    def exists(model: str) -> bool:
        return root is not None and (root / model).is_dir()

    try:
        spec = await asyncio.to_thread(read_pipeline, name, files.path, exists)
    except FerryError as e:
        level = logging.WARNING if repository.started else logging.INFO
        logger.log(level, "pipeline %r failed to load: %s", name, e)
        return str(e)
    version = PipelineVersion(spec, repository, recorder, files.version)
    logger.info("pipeline %r is ready to run (%d steps)", name, len(spec.steps))
    return version


def pipeline_down(version: ModelVersion) -> str | None:
    """Why a serving version is a pipeline that cannot serve now (a step's model is not
    ready); None for a ready pipeline and for any other model."""
    return version.unready_reason() if isinstance(version, PipelineVersion) else None
