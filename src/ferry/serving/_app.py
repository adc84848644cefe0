"""The HTTP app: KServe v2 (Open Inference Protocol) routes with Triton's extensions, on Starlette.

Endpoints (``{v}``: an optional ``/versions/{v}`` after the model name):

- ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``: server metadata and health.
- ``GET /v2/models/{m}{v}``, ``.../ready``, ``.../config``, ``.../stats``, ``/v2/models/stats``:
  model metadata, readiness, Triton-style configuration, Triton-style statistics.
- ``POST /v2/models/{m}{v}/infer``: inference, JSON or binary tensors.
- ``POST /v2/repository/index``, ``/v2/repository/models/{m}/load``, ``.../unload``.
- ``GET /metrics``: Prometheus text.

Errors are ``{"error": "..."}`` with Triton's statuses: 400 for a bad request, 401 for a missing or
wrong API key, 404 for an unknown model or version, 413 for a body above the limit, 500 when the model
fails, 503 when the model (or server) is not ready. With an API key, inference and repository
endpoints need ``Authorization: Bearer <key>``; health, metadata, configuration, statistics and
metrics stay open (they carry no tensor data, and probes and scrapers need them without a secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ferry._version import __version__
from ferry.errors import (
    BackendUnavailableError,
    InvalidInputError,
)
from ferry.serving._admission import DEFAULT_MAX_QUEUE_SIZE
from ferry.serving._codec import decode_request, encode_response
from ferry.serving._config import triton_config
from ferry.serving._generative import GenerationSettings
from ferry.serving._http import (
    DEFAULT_MAX_REQUEST_BYTES,
    HTTPError,
    error_response,
)
from ferry.serving._metrics import Metrics
from ferry.serving._pipeline import PipelineVersion
from ferry.serving._repository import ModelNotReadyError, ModelRepository
from ferry.serving._state import (
    ServingState,
    _error,
    _json,
    _read_body,
    _small_json_body,
    _state,
    status_of,
)
from ferry.serving._web import WebBundles, parse_web_mounts

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

    from ferry.serving._batcher import BatchOutcome
    from ferry.serving._codec import InferRequest
    from ferry.serving._scheduler import ModelVersion

__all__ = ["EXTENSIONS", "ServingState", "create_app", "status_of"]

logger = logging.getLogger(__name__)

#: The protocol extensions advertised by ``GET /v2``.
EXTENSIONS = ("binary_tensor_data", "model_repository", "model_configuration", "statistics")
_HEADER_LENGTH = "inference-header-content-length"


def create_app(
    source: str | os.PathLike[str],
    *,
    backends: str | Sequence[str] | None = None,
    precision: str | None = None,
    optimize: str | None = None,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_interval: float | None = None,
    explicit: bool = False,
    load: Sequence[str] | None = None,
    warmup: bool = True,
    strict_readiness: bool = True,
    web: Mapping[str, str | os.PathLike[str]] | Sequence[str | os.PathLike[str]] | None = None,
    batcher: Callable[..., Any] | None = None,
    threads: int | None = None,
    generation: GenerationSettings | None = None,
    placement: str | None = None,
    isolate: bool = False,
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
) -> Starlette:
    """The ASGI app serving a model repository, a model file or an artifact folder.

    Models load in the background once the app starts (its lifespan): the server is live at once
    and ready (``/v2/health/ready``) when the start-up models have loaded; ``app.state.ferry``
    (a :class:`ServingState`) has the ``started`` event. An app runs once.

    Args:
        source: a repository folder (``REPO/<model>/<version>/model.onnx``), an ``.onnx`` file or an
            artifact folder (served as one model named after it, version 1).
        backends: engines for models whose config.json names none (default ONNX Runtime).
        precision: the precision for models whose config.json names none (``"bf16"``...;
            default: each engine's fp32): see ``ferry.load``.
        optimize: the optimization level (``"basic"``, ``"extended"``) run at load for models
            whose config names none (see ``ferry.optimize``); None: none.
        api_key: when set, inference and repository endpoints need ``Authorization: Bearer KEY``.
        max_request_bytes: the largest request body accepted (after decompression); larger: 413.
        poll_interval: rescan the repository every this many seconds and hot-reload changes.
        explicit: load only the models in ``load`` at start; the load API loads others.
        load: models to load at start (explicit mode).
        warmup: run every instance once before a version reports ready (a version whose warm-up
            fails does not load).
        strict_readiness: ``/v2/health/ready`` answers ready only while every model that should
            be loaded is READY (Triton's default); False: once the server is up.
        web: web bundles (``ferry export --target web``) to serve at ``/web/<name>/``:
            ``{name: folder}``, or ``[NAME=]DIR`` items (a bundle, or a folder of bundles).
            Bundles of served models (``REPO/<model>/web/``, or an artifact folder that is a
            bundle) are served without it (see :mod:`ferry.serving._web`).
        batcher: makes each batching version's batcher (default the dynamic batcher; Ray
            Serve's deployment gives one on ``@serve.batch``).
        threads: engine threads per model instance, one instance per version unless its config
            says (a Ray Serve replica's share); None: the machine's cores shared out.
        generation: how generative artifacts are served: continuous batching's sequences at
            once, model length, KV cache budget, queue (default :class:`GenerationSettings`).
        placement: ``"live"`` (default: with several engines and sizes unknown, a model learns
            its plan from the calls it serves) or ``"fixed"``, for models whose config names
            none.
        isolate: run each model's instances in worker processes that are restarted when they
            crash (a config.json ``"isolate"`` wins): see :mod:`ferry.serving._isolate`.
        max_queue_size: requests a model version may hold waiting when its config sets no
            limit; one more is answered 429 at once (0: no limit): see
            :mod:`ferry.serving._admission`.

    Raises:
        ModelLoadError: the source does not exist or is not a model, artifact or repository.
        InvalidInputError: contradictory or invalid options.
    """
    try:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route
    except ImportError as e:
        raise BackendUnavailableError(
            f"serving needs starlette, uvicorn and prometheus-client ({e}); "
            "pip install 'ferry[serve]'"
        ) from None

    if type(max_request_bytes) is not int or max_request_bytes < 1:
        raise InvalidInputError(
            f"max_request_bytes must be a positive integer, got {max_request_bytes!r}"
        )
    if api_key is not None and not api_key:
        raise InvalidInputError("the API key is empty; give a non-empty key or none")
    metrics = Metrics()
    repository = ModelRepository(
        source,
        backends=backends,
        precision=precision,
        optimize=optimize,
        placement=placement,
        isolate=isolate,
        max_queue_size=max_queue_size,
        poll_interval=poll_interval,
        explicit=explicit,
        load=load,
        warmup=warmup,
        metrics=metrics,
        batcher=batcher,
        threads=threads,
        generation=generation,
    )
    state = ServingState(repository, metrics, api_key=api_key, max_request_bytes=max_request_bytes)
    state.strict_readiness = strict_readiness
    if isinstance(web, (str, os.PathLike)):
        web = [web]
    if isinstance(web, Mapping):
        mounts = parse_web_mounts(f"{k}={os.fspath(v)}" for k, v in web.items())
    else:
        mounts = parse_web_mounts(web or [])
    bundles = WebBundles(repository, mounts)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            state.draining = True
            if state._startup is not None and not state._startup.done():
                state._startup.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await state._startup
            await repository.stop()

    def versioned(path: str, endpoint: Any, methods: list[str]) -> list[Route]:
        return [
            Route(f"/v2/models/{{model}}{path}", endpoint, methods=methods),
            Route(f"/v2/models/{{model}}/versions/{{version}}{path}", endpoint, methods=methods),
        ]

    from ferry.serving._openai import openai_routes
    from ferry.serving._triton_generate import generate_routes

    routes = [
        # Inference first: routes are tried in order, and it is the hot path.
        *versioned("/infer", _infer, ["POST"]),
        *openai_routes(),
        *generate_routes(),
        Route("/v2", _endpoint(_server_metadata), methods=["GET"]),
        Route("/v2/health/live", _endpoint(_live), methods=["GET"]),
        Route("/v2/health/ready", _endpoint(_ready), methods=["GET"]),
        Route("/v2/models/stats", _endpoint(_stats), methods=["GET"]),
        *versioned("", _endpoint(_model_metadata), ["GET"]),
        *versioned("/ready", _endpoint(_model_ready), ["GET"]),
        *versioned("/config", _endpoint(_model_config), ["GET"]),
        *versioned("/stats", _endpoint(_stats), ["GET"]),
        Route("/v2/repository/index", _endpoint(_repository_index), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", _endpoint(_load), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", _endpoint(_unload), methods=["POST"]),
        Route("/metrics", _endpoint(_metrics), methods=["GET"]),
        Route("/web/{model}", bundles.endpoint, methods=["GET", "HEAD"]),
        Route("/web/{model}/{path:path}", bundles.endpoint, methods=["GET", "HEAD"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    class FerryApp(Starlette):
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if state.draining and scope["type"] == "http":
                await _while_draining(super().__call__, state, scope, receive, send)
                return
            target = _infer_target(scope)
            if target is None:
                await super().__call__(scope, receive, send)
            else:
                await _fast_infer(state, target, scope, receive, send)

    app = FerryApp(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.ferry = state
    app.state.ferry_web = bundles
    return app


# -- helpers ------------------------------------------------------------------------------------


def _endpoint(
    fn: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """Answer any error the handler raises with ``{"error": ...}`` and its status."""

    async def handler(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as e:
            return _error(e)

    handler.__name__ = fn.__name__
    return handler


def _header_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get(_HEADER_LENGTH)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise HTTPError(400, f"invalid Inference-Header-Content-Length {value!r}") from None


def _compress(content: bytes, accept: str | None) -> tuple[bytes, str | None]:
    """Compress when the client asks for exactly one encoding we have (Triton's client does).

    Generic clients that list several encodings (httpx, browsers) get plain tensors: on the
    networks servers run on, compressing costs more than it saves.
    """
    if accept is None:
        return content, None
    choice = accept.strip().lower()
    if choice == "gzip":
        return gzip.compress(content, compresslevel=1), "gzip"
    if choice == "deflate":
        return zlib.compress(content, 1), "deflate"
    return content, None


# -- health and metadata ------------------------------------------------------------------------


async def _server_metadata(request: Request) -> Response:
    return _json({"name": "ferry", "version": __version__, "extensions": list(EXTENSIONS)})


async def _live(request: Request) -> Response:
    return _json({"live": True})


async def _ready(request: Request) -> Response:
    """Triton's answer: 200 when ready, 400 when not (with the reasons, which Triton leaves out).

    Ready: started, not draining, and with strict readiness every model that should be loaded
    READY (:meth:`ModelRepository.unready`)."""
    reasons = ready_reasons(_state(request))
    if not reasons:
        return _json({"ready": True})
    return _json({"ready": False, "reason": "; ".join(reasons)}, 400)


def ready_reasons(state: ServingState) -> list[str]:
    """Why the server is not ready (none: ready); HTTP's and gRPC's readiness."""
    if state.draining:
        return ["the server is shutting down"]
    if state.startup_error is not None:
        return [f"the server failed to start its models: {state.startup_error}"]
    if not state.ready:
        return ["the server is starting: its models are loading"]
    if state.strict_readiness:
        return state.repository.unready()
    return []


async def _model_metadata(request: Request) -> Response:
    state = _state(request)
    return _json(
        model_metadata(state, request.path_params["model"], request.path_params.get("version"))
    )


def model_metadata(state: ServingState, name: str, version_name: str | None) -> dict[str, Any]:
    """A model's KServe v2 metadata (HTTP answers it as JSON, gRPC as ModelMetadataResponse)."""
    repository = state.repository
    version = repository.get(name, version_name)
    return {
        "name": name,
        "versions": [v.version_str for v in repository.serving(name)],
        "platform": version.platform,
        "inputs": version.tensor_metadata(),
        "outputs": version.tensor_metadata(outputs=True),
    }


async def _model_ready(request: Request) -> Response:
    """200 when the model (version) is READY; 400 when it is known but not, as Triton answers
    (with the reason); 404 for an unknown model or version."""
    name = request.path_params["model"]
    try:
        _state(request).repository.get(name, request.path_params.get("version"))
    except ModelNotReadyError as e:
        return error_response(400, str(e))
    return _json({"name": name, "ready": True})


async def _model_config(request: Request) -> Response:
    state = _state(request)
    return _json(
        model_config(state, request.path_params["model"], request.path_params.get("version"))
    )


def model_config(state: ServingState, name: str, version_name: str | None) -> dict[str, Any]:
    """A model's Triton configuration as JSON (gRPC translates it to ``ModelConfig``)."""
    version = state.repository.get(name, version_name)
    if isinstance(version, PipelineVersion):  # an ensemble's: its steps, no engine
        return version.triton_config()
    loaded = version.loaded
    config = triton_config(
        name=name,
        resolved=version.resolved,
        policy=version.config.version_policy,
        backends=loaded.backends,
        threads=loaded.threads,
        precision=loaded.precision_text,
        platform=version.platform,
        model_filename=loaded.model_file.name,
        inputs=[(t["name"], t["datatype"], t["shape"]) for t in version.tensor_metadata()],
        outputs=[(t["name"], t["datatype"], t["shape"]) for t in version.tensor_metadata(True)],
        queue=version.admission.triton_policy(),
    )
    if version.sequence is not None:  # a stateful model (ferry.serving._sequence)
        config["sequence_batching"] = version.sequence.triton_config()
        # Triton's sequence batcher batches itself (dynamic_batching is the other of a oneof).
        batching = config.pop("dynamic_batching", None)
        if batching is not None:
            delay = batching.get("max_queue_delay_microseconds", 0)
            config["sequence_batching"]["oldest"] = {"max_queue_delay_microseconds": delay}
    return config


async def _stats(request: Request) -> Response:
    repository = _state(request).repository
    name = request.path_params.get("model")
    version = request.path_params.get("version")
    if name is None:
        versions = repository.all_serving()
    elif version is not None:
        versions = [repository.get(name, version)]
    else:
        versions = repository.serving(name) or [repository.get(name)]
    stats = []
    for v in versions:
        entry = v.recorder.stats.to_json(v.name, v.version_str)
        placement = v.placement_report()  # a version that learns its placement says what
        if placement is not None:
            entry["placement"] = placement
        stats.append(entry)
    return _json({"model_stats": stats})


async def _metrics(request: Request) -> Response:
    from starlette.responses import Response

    content, media_type = _state(request).metrics.render()
    return Response(content, headers={"Content-Type": media_type})


# -- repository -----------------------------------------------------------------------------------


async def _repository_index(request: Request) -> Response:
    state = _state(request)
    state.authorize(request)
    data = await _small_json_body(request, state)
    ready = data.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInputError(f"'ready' must be true or false, got {ready!r}")
    return _json(await state.repository.index(ready_only=ready))


async def _load(request: Request) -> Response:
    from starlette.responses import Response

    state = _state(request)
    state.authorize(request)
    data = await _small_json_body(request, state)
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInputError("'parameters' must be an object")
    await load_model(state, request.path_params["model"], params)
    return Response(status_code=200)


async def load_model(state: ServingState, name: str, params: dict[str, Any]) -> None:
    """Load (or reload) a model with the load API's parameters (HTTP's and gRPC's).

    Raises:
        InvalidInputError: model files sent in the request, or a 'config' that is not a JSON
            object.
    """
    files = sorted(k for k in params if k.startswith("file:"))
    if files:
        raise InvalidInputError(
            f"this server does not load models from files sent in the request ({files[0]}); "
            "put the files in the repository and load the model by name"
        )
    config = params.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as e:
            raise InvalidInputError(f"the 'config' parameter is not valid JSON: {e}") from None
    if config is not None and not isinstance(config, dict):
        raise InvalidInputError("the 'config' parameter must be a JSON object (or its text)")
    await state.repository.load(name, config)


async def _unload(request: Request) -> Response:
    from starlette.responses import Response

    state = _state(request)
    state.authorize(request)
    await _small_json_body(request, state)
    await state.repository.unload(request.path_params["model"])
    return Response(status_code=200)


# -- inference --------------------------------------------------------------------------------------


async def _infer(request: Request) -> Response:
    from starlette.responses import Response

    status, headers, content = await _infer_core(
        _state(request),
        request.path_params["model"],
        request.path_params.get("version"),
        request.headers,
        request.receive,
    )
    response = Response(content, status_code=status)
    response.raw_headers = headers
    return response


async def _infer_core(
    state: ServingState,
    model: str,
    version_name: str | None,
    headers: Mapping[str, str],
    receive: Receive,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Serve one inference request: its status, raw response headers and body.

    The headers are those Starlette's ``Response`` would have sent, in its order.
    """
    start = time.perf_counter_ns()
    try:
        state.authorize_header(headers.get("authorization"))
        version = state.repository.get(model, version_name)
    except Exception as e:
        return _raw_error(e)
    version.enter()
    try:
        try:
            body = await _read_body(headers, receive, state.max_request_bytes)
            version.admission.check()  # a full queue refuses before the body is decoded
            decoded = decode_request(body, _header_length(headers))
            outcome, sends, prepared = await infer_decoded(state, version, decoded)
            computed = time.perf_counter_ns()
            content, header_length = encode_response(
                model_name=version.name,
                model_version=version.version_str,
                outputs=[(name, outcome.outputs[name], binary) for name, binary in sends],
                request_id=decoded.id,
            )
            content, encoding = _compress(content, headers.get("accept-encoding"))
        except Exception as e:
            status = status_of(e)
            version.recorder.failure(total_ns=time.perf_counter_ns() - start, status=status)
            return _raw_error(e, status)
        raw: list[tuple[bytes, bytes]] = []
        if header_length is not None:
            raw.append((b"inference-header-content-length", str(header_length).encode()))
        if encoding is not None:
            raw.append((b"content-encoding", encoding.encode()))
        raw.append((b"content-length", str(len(content)).encode()))
        raw.append(
            (b"content-type", _JSON_TYPE if header_length is None else _OCTET_TYPE),
        )
        done = time.perf_counter_ns()
        version.recorder.success(
            total_ns=done - start,
            queue_ns=outcome.queue_ns,
            input_ns=prepared - start,
            infer_ns=outcome.infer_ns,
            output_ns=done - computed,
        )
        return 200, raw, content
    finally:
        version.exit()


async def infer_decoded(
    state: ServingState, version: ModelVersion, decoded: InferRequest
) -> tuple[BatchOutcome, list[tuple[str, bool]], int]:
    """Run a decoded request on its model version: the one path HTTP's and gRPC's inference
    share (a request's parameters, ``decoded.parameters``, are read on it).

    Returns:
        The outcome, ``(name, binary)`` for each output to send, and when the request was
        prepared (``perf_counter_ns``).
    """
    feeds, batch = version.prepare(decoded)
    outputs, sends = version.output_plan(decoded.outputs, decoded.binary_output)
    prepared = time.perf_counter_ns()
    outcome = await version.infer(feeds, outputs, batch, decoded.parameters)
    return outcome, sends, prepared


_JSON_TYPE = b"application/json"
_OCTET_TYPE = b"application/octet-stream"


def _raw_error(
    error: BaseException, status: int | None = None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """:func:`_error` as a status, raw headers and body."""
    response = _error(error, status)
    return response.status_code, response.raw_headers, bytes(response.body)


def _infer_target(scope: Scope) -> tuple[str, str | None] | None:
    """``(model, version)`` when the request is ``POST /v2/models/{m}[/versions/{v}]/infer``."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path != root and path[len(root)] == "/":
        path = path[len(root) :]  # what Starlette's router matches, as it strips it
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


async def _fast_infer(
    state: ServingState, target: tuple[str, str | None], scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer an inference request past Starlette's middleware and router.

    Inference is the hot path: Starlette's layers (error and exception middleware, routing,
    ``Request`` and ``Response`` objects) cost about as much per request as a batched engine run
    does. The answers are the routed handler's, byte for byte.
    """
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1").lower()
        if name not in headers:  # the first one wins, as in Starlette's Headers
            headers[name] = value.decode("latin-1")
    try:
        status, raw, content = await _infer_core(state, target[0], target[1], headers, receive)
    except asyncio.CancelledError:
        if not state.cut_off:
            raise
        # The drain timed out on this request: say so, rather than drop the connection.
        status, raw, content = _raw_error(HTTPError(503, _CUT_OFF))
    if state.draining:
        raw = [*raw, _CONNECTION_CLOSE]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


# -- shutdown -------------------------------------------------------------------------------------

_SHUTTING_DOWN = "the server is shutting down and takes no new requests; send it to another server"
_CUT_OFF = (
    "the server shut down before this request finished: it was still running when the drain "
    "timeout ran out"
)
_CONNECTION_CLOSE = (b"connection", b"close")


async def _while_draining(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    state: ServingState,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """A request that arrives while the server drains (on a connection already open): 503 for
    inference and the repository API, the usual answer for health, metadata, statistics and
    metrics; each with ``Connection: close``, so that the client opens no request on it again."""

    async def closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), _CONNECTION_CLOSE]}
        await send(message)

    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root + "/"):
        path = path[len(root) :]
    if _infer_target(scope) is None and not path.startswith("/v2/repository/"):
        await app(scope, receive, closing)
        return
    # Read the body first: a client still sending it would miss an answer sent before.
    seen = 0
    while seen <= state.max_request_bytes:
        message = await receive()
        if message["type"] != "http.request":
            break
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    status, raw, content = _raw_error(HTTPError(503, _SHUTTING_DOWN))
    await closing({"type": "http.response.start", "status": status, "headers": raw})
    await closing({"type": "http.response.body", "body": content})
