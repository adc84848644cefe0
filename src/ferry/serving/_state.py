"""What every route of the HTTP app shares: the serving state (repository, metrics, settings,
readiness), the status an error maps to, JSON and error responses, and reading a request's body
(size-limited, decompressed). The KServe v2 routes (``_app``), the OpenAI API (``_openai``) and
Triton's generate extension (``_triton_generate``) all build on it, so none imports another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ferry.errors import (
    EngineBusyError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
)
from ferry.serving._admission import retry_after_header
from ferry.serving._http import (
    DEFAULT_MAX_REQUEST_BYTES,
    HTTPError,
    check_bearer,
    error_response,
    read_body,
    status_of,
)
from ferry.serving._metrics import Metrics
from ferry.serving._repository import ModelRepository

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Receive

__all__ = ["ServingState", "status_of"]

# The routes' logger: its records keep the name they had before this module was cut out of _app.
logger = logging.getLogger("ferry.serving._app")


class ServingState:
    """What the routes share: the repository, metrics, settings and the server's readiness."""

    #: Triton's strict readiness: ``/v2/health/ready`` says ready only while every model that
    #: should be loaded is READY; False: while the server is up (``--no-strict-readiness``).
    strict_readiness: bool = True

    def __init__(
        self,
        repository: ModelRepository,
        metrics: Metrics,
        *,
        api_key: str | None,
        max_request_bytes: int,
    ) -> None:
        self.repository = repository
        self.metrics = metrics
        self.api_key = api_key
        self.max_request_bytes = max_request_bytes
        #: Set once the start-up models have been tried (loaded or failed), or start-up failed.
        self.started = threading.Event()
        self.startup_error: BaseException | None = None
        #: Set when the server begins to shut down: readiness turns false, requests in flight
        #: finish, new inference and repository requests get 503.
        self.draining = False
        #: Set when the drain timed out: the requests still running are cancelled, answered 503.
        self.cut_off = False
        #: The event loop serving the app (set when it starts).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Other servers on this state (gRPC): ``async drain(deadline)``, called by the HTTP
        #: server's drain with its deadline (``time.monotonic``; None: no limit).
        self.listeners: list[Any] = []
        self._startup: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.repository.started and not self.draining and self.startup_error is None

    def authorize(self, request: Request) -> None:
        self.authorize_header(request.headers.get("authorization"))

    def authorize_header(self, value: str | None) -> None:
        """Check an ``Authorization`` header's value (None: absent) against the API key."""
        if self.api_key is not None:
            check_bearer(
                value,
                self.api_key,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
            )

    def index(self, timeout: float = 60.0, engines: bool = False) -> list[dict[str, str]]:
        """The repository index, from another thread than the server's (the CLI's); with
        ``engines``, each row also says what its version runs on and in (``"engines"``)."""
        if self.loop is None:
            raise RuntimeError("the app has not started")
        future = asyncio.run_coroutine_threadsafe(self.repository.index(engines=engines), self.loop)
        return future.result(timeout)

    async def start(self, wait: bool = False) -> None:
        """Start loading the start-up models, once (the app's lifespan calls it).

        With ``wait``, return once they have been tried, and raise when one is not READY: for
        hosts that route to an app as soon as it has started, and must not (a Ray Serve
        replica, which calls it before the lifespan does).

        Raises:
            ModelLoadError: with ``wait``, the models that did not load and why.
        """
        if self._startup is None:
            self.loop = asyncio.get_running_loop()
            self._startup = self.loop.create_task(self._start())
        if not wait:
            return
        await asyncio.shield(self._startup)
        unready = self.repository.unready()
        if self.startup_error is not None or unready:
            await self.repository.stop()
            raise ModelLoadError(
                "; ".join(unready) or f"the models failed to start: {self.startup_error}"
            )

    async def _start(self) -> None:
        try:
            await self.repository.start()
        except Exception as e:
            logger.exception("the server failed to start its models")
            self.startup_error = e
        finally:
            self.started.set()


def _json(data: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(data, status_code=status)


def _error(error: BaseException, status: int | None = None) -> Response:
    status = status_of(error) if status is None else status
    if status == 500 and not isinstance(error, FerryError):
        logger.error("internal error serving a request", exc_info=error)
        message = f"internal error: {type(error).__name__}: {error}"
    else:
        message = str(error)
    headers = error.headers if isinstance(error, HTTPError) else None
    if isinstance(error, EngineBusyError):  # a full queue, a queued request's timeout
        headers = retry_after_header(error)
    return error_response(status, message, headers)


def _state(request: Request) -> ServingState:
    state: ServingState = request.app.state.ferry
    return state


async def _read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytearray:
    """The request body, refused with 413 past ``limit`` (announced, counted or decompressed),
    decompressed."""
    body = await read_body(headers, receive, limit)
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise HTTPError(
            400, f"unsupported Content-Encoding {encoding!r}; send gzip, deflate or none"
        )
    return _decompress(body, encoding, limit)


def _decompress(body: bytearray, encoding: str, limit: int) -> bytearray:
    # 32 + MAX_WBITS: detect a gzip or zlib header; a raw deflate stream is tried after that.
    for wbits in (32 + zlib.MAX_WBITS, -zlib.MAX_WBITS):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise HTTPError(
                413, f"the decompressed request body is above this server's limit of {limit} bytes"
            )
        return bytearray(out)
    raise HTTPError(400, f"the body is not valid {encoding} data")


async def _small_json_body(request: Request, state: ServingState) -> dict[str, Any]:
    body = await _read_body(
        request.headers, request.receive, min(state.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES)
    )
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except ValueError as e:
        raise InvalidInputError(f"the request is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return data
