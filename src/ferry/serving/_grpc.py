"""Triton's gRPC service (``inference.GRPCInferenceService``) beside the HTTP app, from the same
state: one repository, one batcher per model version.

::

    app = create_app("models/")
    with ServerThread(app, port=8000) as http, GrpcServer(app, port=8001) as grpc_server:
        ...  # tritonclient.grpc.InferenceServerClient("127.0.0.1:8001")

The server runs on the HTTP server's event loop (``grpc.aio``), so a gRPC request reaches its
model's batcher exactly as an HTTP one does (:func:`~ferry.serving._app.infer_decoded`, with the
request's parameters: sequence id and flags, priority, timeout), and one drain stops both: the
gRPC server registers itself on the state (``state.listeners``), and the HTTP server's drain stops
it with the same timeout (RPCs still running then are cancelled: UNAVAILABLE).

The messages are Triton's own (``tritonclient.grpc.service_pb2``, shipped by ``tritonclient``).
Errors map through the HTTP app's classification (:func:`status_of`): 400 -> INVALID_ARGUMENT,
401 -> UNAUTHENTICATED, 404 -> NOT_FOUND, 413 and 429 -> RESOURCE_EXHAUSTED, 503 -> UNAVAILABLE,
500 -> INTERNAL. With an API key, inference and repository RPCs need the metadata
``authorization: Bearer KEY``. Shared memory, trace and log settings answer UNIMPLEMENTED. gRPC's
standard health service (``grpc.health.v1.Health/Check``, for Kubernetes' probes) is served beside
it (:mod:`ferry.serving._grpc_health`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from ferry._version import __version__
from ferry.errors import BackendUnavailableError, EngineBusyError, FerryError
from ferry.serving._admission import retry_after_header
from ferry.serving._app import (
    EXTENSIONS,
    infer_decoded,
    load_model,
    model_config,
    model_metadata,
    ready_reasons,
)
from ferry.serving._grpc_codec import decode_grpc_request, encode_grpc_response, parameters_of
from ferry.serving._grpc_health import health_handler
from ferry.serving._http import HTTPError
from ferry.serving._repository import ModelNotReadyError
from ferry.serving._server import bind
from ferry.serving._state import ServingState, status_of

__all__ = ["DEFAULT_GRPC_PORT", "GrpcServer", "grpc_code"]

logger = logging.getLogger(__name__)

#: Triton's gRPC port.
DEFAULT_GRPC_PORT = 8001

_SHUTTING_DOWN = "the server is shutting down and takes no new requests; send it to another server"
_SHARED_MEMORY = (
    "the {} shared memory extension: send the tensors in the request (raw_input_contents or "
    "typed contents)"
)
_CUT_OFF = (
    "the server shut down before this request finished: it was still running when the drain "
    "timeout ran out"
)


def _modules() -> tuple[Any, Any, Any, Any, Any]:
    try:
        import grpc
        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
    except ImportError as e:
        raise BackendUnavailableError(
            f"serving gRPC needs grpcio and tritonclient ({e}); pip install 'ferry[serve]'"
        ) from None
    return grpc, json_format, service_pb2, service_pb2_grpc, model_config_pb2


def grpc_code(status: int) -> Any:
    """The ``grpc.StatusCode`` for an HTTP status of :func:`status_of`."""
    import grpc

    return {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        401: grpc.StatusCode.UNAUTHENTICATED,
        404: grpc.StatusCode.NOT_FOUND,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        429: grpc.StatusCode.RESOURCE_EXHAUSTED,
        503: grpc.StatusCode.UNAVAILABLE,
    }.get(status, grpc.StatusCode.INTERNAL)


def _message(error: BaseException, status: int) -> str:
    if status == 500 and not isinstance(error, FerryError):
        logger.error("internal error serving a gRPC request", exc_info=error)
        return f"internal error: {type(error).__name__}: {error}"
    return str(error)


class GrpcServer:
    """Serve an app's state over Triton's gRPC protocol on the app's event loop.

    Start it once the HTTP server runs (``ServerThread``: its loop serves both); ``port=0`` picks
    a free port (read :attr:`port`). Stopping it (or the HTTP server's drain) lets the RPCs in
    flight finish up to ``drain_timeout`` seconds; new ones get UNAVAILABLE meanwhile.

    Args:
        app: an app made by :func:`~ferry.serving.create_app` (or its :class:`ServingState`).
        host: the address to bind; 127.0.0.1 keeps the server local.
        port: the port; 0 picks a free one.
        drain_timeout: seconds the RPCs in flight get to finish when the server stops (None: no
            limit) unless the HTTP server's drain gives its own.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = DEFAULT_GRPC_PORT,
        *,
        drain_timeout: float | None = 30.0,
    ) -> None:
        state = app if isinstance(app, ServingState) else getattr(app.state, "ferry", None)
        if not isinstance(state, ServingState):
            raise FerryError("GrpcServer serves an app made by ferry.serving.create_app")
        self.state = state
        self.host = host
        self.port = port
        self.drain_timeout = drain_timeout
        #: RPCs that finished during the drain, and those cut off at its timeout.
        self.drained = 0
        self.cut_off = 0
        self._server: Any = None
        self._servicer: _Servicer | None = None
        self._stopped: asyncio.Future[None] | None = None

    @property
    def address(self) -> str:
        """``host:port`` as a client dials it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "[::]") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> GrpcServer:
        """Bind and start serving (on the app's running event loop).

        Raises:
            FerryError: the app's server has not started, or the address cannot be bound.
            BackendUnavailableError: grpcio or tritonclient is not installed.
        """
        _modules()
        loop = self.state.loop
        if loop is None or loop.is_closed():
            raise FerryError("start the HTTP server first: the gRPC server runs on its event loop")
        if self.port:
            # Bound here first: a port in use is then our one line, not grpc's log and ours.
            try:
                bind(self.host, self.port).close()
            except FerryError as e:
                raise FerryError(
                    f"{str(e).partition('; ')[0]}: choose another --grpc-port (0 picks a free one)"
                ) from None
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout)
        return self

    async def _start(self) -> None:
        grpc, _, _, service_pb2_grpc, _ = _modules()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.state.max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
            ]
        )
        self._servicer = _Servicer(self.state)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self._servicer, server)
        server.add_generic_rpc_handlers((health_handler(self.state, grpc),))
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        try:
            port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError as e:
            raise FerryError(
                f"cannot listen for gRPC on {self.host}:{self.port} ({e}); choose another "
                "--grpc-port (0 picks a free one)"
            ) from None
        if not port:
            raise FerryError(
                f"cannot listen for gRPC on {self.host}:{self.port}: the address is in use or "
                "cannot be bound; choose another --grpc-port (0 picks a free one)"
            )
        self.port = port
        await server.start()
        self._server = server
        self.state.listeners.append(self)

    async def drain(self, deadline: float | None) -> None:
        """Stop taking RPCs and let those in flight finish until ``deadline`` (``time.monotonic``;
        None: no limit); then cancel the rest. On the app's event loop; once."""
        server, servicer = self._server, self._servicer
        if server is None or servicer is None:
            return
        self._server = None
        servicer.draining = True
        in_flight = servicer.in_flight
        started = time.monotonic()
        while servicer.in_flight and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(0.02)
        self.cut_off = servicer.in_flight
        self.drained = max(0, in_flight - self.cut_off)
        if self.cut_off:
            logger.warning(
                "gRPC drain: %d RPC%s still running after %.1f s cut off",
                self.cut_off,
                "" if self.cut_off == 1 else "s",
                time.monotonic() - started,
            )
        servicer.cut = True
        await server.stop(0)  # cancels what still runs; each is answered UNAVAILABLE

    def stop(self, timeout: float | None = None) -> None:
        """Drain and stop (from another thread than the loop's), up to ``drain_timeout``."""
        loop = self.state.loop
        if self._server is None or loop is None or loop.is_closed():
            return
        deadline = None if self.drain_timeout is None else time.monotonic() + self.drain_timeout
        future = asyncio.run_coroutine_threadsafe(self.drain(deadline), loop)
        future.result(timeout)

    def __enter__(self) -> GrpcServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _Servicer:
    """The RPCs (``GRPCInferenceServiceServicer``'s methods, duck-typed: grpc looks them up by
    name)."""

    def __init__(self, state: ServingState) -> None:
        self.state = state
        grpc, self._json_format, self._pb, _, self._config_pb = _modules()
        self._grpc = grpc
        self.in_flight = 0
        self.draining = False
        self.cut = False

    # -- plumbing ----------------------------------------------------------------------------

    async def _fail(self, context: Any, error: BaseException) -> None:
        status = status_of(error)
        headers = error.headers if isinstance(error, HTTPError) else None
        if isinstance(error, EngineBusyError):  # a full queue: when to retry, as HTTP says
            headers = retry_after_header(error)
        if headers:
            context.set_trailing_metadata(tuple((k.lower(), str(v)) for k, v in headers.items()))
        context.set_code(grpc_code(status))
        context.set_details(_message(error, status))

    def _authorize(self, context: Any) -> None:
        if self.state.api_key is None:
            return
        value = None
        for key, item in context.invocation_metadata() or ():
            if key == "authorization":
                value = item if isinstance(item, str) else item.decode("latin-1")
                break
        try:
            self.state.authorize_header(value)
        except HTTPError:
            raise HTTPError(
                401, "missing or wrong API key: send the metadata 'authorization: Bearer <key>'"
            ) from None

    def _guarded(self, context: Any) -> None:
        """Inference and repository RPCs: refused while draining, and without the API key."""
        if self.draining or self.state.draining:
            raise HTTPError(503, _SHUTTING_DOWN)
        self._authorize(context)

    def _parse(self, data: dict[str, Any], message: Any) -> Any:
        return self._json_format.ParseDict(data, message, ignore_unknown_fields=True)

    # -- health and metadata -------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return self._pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return self._pb.ServerReadyResponse(ready=not ready_reasons(self.state))

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self.state.repository.get(request.name, request.version or None)
        except ModelNotReadyError:
            return self._pb.ModelReadyResponse(ready=False)
        except Exception as e:
            await self._fail(context, e)
            return self._pb.ModelReadyResponse()
        return self._pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self._pb.ServerMetadataResponse(
            name="ferry", version=__version__, extensions=list(EXTENSIONS)
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            data = model_metadata(self.state, request.name, request.version or None)
            return self._parse(data, self._pb.ModelMetadataResponse())
        except Exception as e:
            await self._fail(context, e)
            return self._pb.ModelMetadataResponse()

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            data = model_config(self.state, request.name, request.version or None)
            config = self._parse(data, self._config_pb.ModelConfig())
            return self._pb.ModelConfigResponse(config=config)
        except Exception as e:
            await self._fail(context, e)
            return self._pb.ModelConfigResponse()

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        repository = self.state.repository
        try:
            if not request.name:
                versions = repository.all_serving()
            elif request.version:
                versions = [repository.get(request.name, request.version)]
            else:
                versions = repository.serving(request.name) or [repository.get(request.name)]
            data = {
                "model_stats": [v.recorder.stats.to_json(v.name, v.version_str) for v in versions]
            }
            return self._parse(data, self._pb.ModelStatisticsResponse())
        except Exception as e:
            await self._fail(context, e)
            return self._pb.ModelStatisticsResponse()

    # -- repository ----------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        try:
            self._guarded(context)
            rows = await self.state.repository.index(ready_only=request.ready)
            response = self._pb.RepositoryIndexResponse()
            for row in rows:
                response.models.add(
                    name=row["name"],
                    version=row.get("version", ""),
                    state=row.get("state", ""),
                    reason=row.get("reason", ""),
                )
            return response
        except Exception as e:
            await self._fail(context, e)
            return self._pb.RepositoryIndexResponse()

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        try:
            self._guarded(context)
            params = parameters_of(request.parameters)
            for key, value in params.items():
                if isinstance(value, bytes) and key == "config":
                    params[key] = value.decode("utf-8", "replace")
            await load_model(self.state, request.model_name, params)
        except Exception as e:
            await self._fail(context, e)
        return self._pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            self._guarded(context)
            await self.state.repository.unload(request.model_name)
        except Exception as e:
            await self._fail(context, e)
        return self._pb.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------------

    async def _infer(self, request: Any) -> Any:
        """One inference: its ``ModelInferResponse``, or the error to answer."""
        start = time.perf_counter_ns()
        version = self.state.repository.get(request.model_name, request.model_version or None)
        version.enter()
        try:
            try:
                decoded = decode_grpc_request(request)
                outcome, sends, prepared = await infer_decoded(self.state, version, decoded)
                computed = time.perf_counter_ns()
                response = encode_grpc_response(
                    self._pb.ModelInferResponse(),
                    model_name=version.name,
                    model_version=version.version_str,
                    outputs=[(name, outcome.outputs[name]) for name, _ in sends],
                    request_id=decoded.id,
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                version.recorder.failure(
                    total_ns=time.perf_counter_ns() - start, status=status_of(e)
                )
                raise
            done = time.perf_counter_ns()
            version.recorder.success(
                total_ns=done - start,
                queue_ns=outcome.queue_ns,
                input_ns=prepared - start,
                infer_ns=outcome.infer_ns,
                output_ns=done - computed,
            )
            return response
        finally:
            version.exit()

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.in_flight += 1
        try:
            self._guarded(context)
            return await self._infer(request)
        except asyncio.CancelledError:
            if self.cut:
                context.set_code(self._grpc.StatusCode.UNAVAILABLE)
                context.set_details(_CUT_OFF)
            raise
        except Exception as e:
            await self._fail(context, e)
            return self._pb.ModelInferResponse()
        finally:
            self.in_flight -= 1

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """Each request of the stream runs as it arrives; responses come back as they finish
        (each carries its request's id). Requests of one sequence (``sequence_id``) run in the
        order they were sent. A drain waits for the requests, not for the stream to end."""
        try:
            self._guarded(context)
        except Exception as e:
            await self._fail(context, e)
            return
        answers: asyncio.Queue[Any] = asyncio.Queue()
        last: dict[Any, asyncio.Task[None]] = {}
        running: set[asyncio.Task[None]] = set()

        async def one(request: Any, after: asyncio.Task[None] | None) -> None:
            self.in_flight += 1
            try:
                if after is not None:
                    await asyncio.wait([after])
                response = await self._infer(request)
                answer = self._pb.ModelStreamInferResponse(infer_response=response)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                status = status_of(e)
                answer = self._pb.ModelStreamInferResponse(
                    error_message=_message(e, status),
                    infer_response=self._pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    ),
                )
            finally:
                self.in_flight -= 1
            await answers.put(answer)

        async def read() -> None:
            async for request in request_iterator:
                if self.draining or self.state.draining:
                    await answers.put(
                        self._pb.ModelStreamInferResponse(error_message=_SHUTTING_DOWN)
                    )
                    continue
                key = _sequence_key(request)
                task = asyncio.ensure_future(one(request, last.get(key)))
                running.add(task)
                task.add_done_callback(running.discard)
                if key is not None:
                    last[key] = task
                    end = request.parameters.get("sequence_end")
                    if end is not None and end.bool_param:
                        task.add_done_callback(functools.partial(_forget, last, key))

        reader = asyncio.ensure_future(read())
        try:
            while True:
                getter = asyncio.ensure_future(answers.get())
                await asyncio.wait([getter, reader], return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                    continue
                getter.cancel()
                if reader.exception() is not None:
                    raise reader.exception()  # type: ignore[misc]
                if running:
                    await asyncio.wait(list(running))
                while not answers.empty():
                    yield answers.get_nowait()
                return
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    # -- what this server does not offer ---------------------------------------------------------

    async def _unimplemented(self, context: Any, what: str) -> None:
        await context.abort(
            self._grpc.StatusCode.UNIMPLEMENTED, f"this server does not support {what}"
        )

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("system"))

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("system"))

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("system"))

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("CUDA"))

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("CUDA"))

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, _SHARED_MEMORY.format("CUDA"))

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "trace settings (see /metrics for timings)")

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "log settings")


def _sequence_key(request: Any) -> Any:
    """The request's sequence id (int or string), or None outside a sequence."""
    if "sequence_id" not in request.parameters:
        return None
    value = parameters_of({"sequence_id": request.parameters["sequence_id"]})["sequence_id"]
    return value if value not in (0, "", None) else None


def _forget(last: dict[Any, Any], key: Any, task: Any) -> None:
    if last.get(key) is task:
        del last[key]
