"""The OpenAI API at ``/v1`` on Ray Serve, for every generative model deployed by ferry.

Ray Serve's proxy routes by path prefix, so ``/v1/chat/completions`` cannot reach a model's own
application (``/v2/models/<model>``). :class:`FerryOpenAI`, one small application at ``/v1``
(``ferry_openai``: no CPU reserved, no model loaded), reads the request's ``"model"`` and hands the
request to that model's replicas through Ray Serve's handle (``ferry-<model>``), streaming the
answer back as it comes: the base URL a user of Ray Serve LLM expects, ``http://HOST:PORT/v1``,
with the model chosen by name. The replica answers with the app ``ferry serve`` runs
(:func:`run_asgi`), so the answers, errors, streaming and a disconnect cancelling the sequence
are ``ferry serve``'s own. Each model's own base URL, ``/v2/models/<model>/v1``, skips this hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ferry.deploy._ray_serve import APP_PREFIX, serve_module

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["OPENAI_APP", "OPENAI_ROUTE", "FerryOpenAI", "run_asgi"]

#: The application's name (not ``ferry-<model>``: no model is called that) and route prefix.
OPENAI_APP = "ferry_openai"
OPENAI_ROUTE = "/v1"
#: Requests the router holds at once: it only waits on replicas, which bound their own load.
ROUTER_MAX_ONGOING = 4096
# Request headers the replica needs: the API key and the body's type.
_FORWARDED = (b"authorization", b"content-type", b"accept")
# Response headers the router's own response sets again (its body is streamed in chunks).
_DROPPED = (b"content-length", b"transfer-encoding", b"connection", b"date", b"server")
# Seconds a replica's app has to end once its client went away.
_END_TIMEOUT = 10.0
# Seconds the router trusts its list of deployed models for a model found in it.
_KNOWN_FOR_S = 5.0


async def run_asgi(
    app: Callable[..., Any],
    method: str,
    path: str,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> AsyncIterator[dict[str, Any] | bytes]:
    """Run one HTTP request through the ASGI ``app`` here: yields ``{"status", "headers"}`` and
    then the body's chunks as the app sends them. Closing the iterator early (the client went
    away) tells the app ``http.disconnect``, which cancels a generation in flight."""
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    read = False

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()  # a streaming response listens for the client leaving
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while True:
            message = await messages.get()
            if message is None:  # the app ended without (all of) its answer
                error = None if task.cancelled() else task.exception()
                if error is not None:
                    raise error
                return
            if message["type"] == "http.response.start":
                raw = message.get("headers", [])
                yield {"status": message["status"], "headers": [(k, v) for k, v in raw]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    return
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, _END_TIMEOUT)


class FerryOpenAI:
    """The ``/v1`` router: each request to the model its body (or path) names, through that
    model's Ray Serve application; ``GET /v1/models`` lists every deployed generative model."""

    def __init__(self, deployed: Callable[[], list[str]]) -> None:
        #: The models RUNNING on the cluster (``ferry.deploy.ray.running_models``, given by
        #: the deployment so that this module need not import the one that deploys it).
        self._deployed = deployed
        self._handles: dict[str, Any] = {}
        self._known: list[str] = []
        self._known_at = -math.inf

    async def _models(self, wanted: str | None) -> list[str]:
        """The deployed models: Ray Serve's status asked again unless ``wanted`` was among them
        a moment ago (a status call to the controller for every token stream would cost)."""
        now = time.monotonic()
        if wanted is None or wanted not in self._known or now - self._known_at > _KNOWN_FOR_S:
            self._known = await asyncio.to_thread(self._deployed)
            self._known_at = now
        return self._known

    async def __call__(self, request: Request) -> Response:
        from ferry.serving._openai import openai_error
        from ferry.serving._openai_requests import OpenAIError

        path = request.scope["path"]
        if not path.startswith(OPENAI_ROUTE):  # a proxy that strips the route prefix
            path = OPENAI_ROUTE + path
        body = await request.body()
        headers = [(k, v) for k, v in request.scope["headers"] if k.lower() in _FORWARDED]
        call = (request.method, path, request.scope.get("query_string", b""), headers, body)
        try:
            if path.rstrip("/") == f"{OPENAI_ROUTE}/models" and request.method == "GET":
                return await self._list(call)
            model = _model_named(path, body)
            models = await self._models(model)
            if model not in models:
                served = ", ".join(repr(m) for m in models) or "none"
                raise OpenAIError(
                    404,
                    f"model {model!r} is not deployed on this Ray Serve cluster; its models: "
                    f"{served} (`ferry deploy ray --status`)",
                    param="model",
                    code="model_not_found",
                )
            return await self._forward(model, call)
        except Exception as e:
            return openai_error(e)

    def _handle(self, model: str) -> Any:
        if model not in self._handles:
            app = f"{APP_PREFIX}{model}"
            self._handles[model] = serve_module().get_app_handle(app).options(stream=True)
        return self._handles[model]

    async def _forward(self, model: str, call: tuple[Any, ...]) -> Response:
        from starlette.responses import StreamingResponse

        chunks = self._handle(model).openai_call.remote(*call).__aiter__()
        head = await chunks.__anext__()  # the replica's status and headers
        kept = [(k, v) for k, v in head["headers"] if k.lower() not in _DROPPED]

        async def body() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                yield chunk

        response = StreamingResponse(body(), status_code=head["status"])
        response.raw_headers = kept  # the replica's content type, Retry-After...
        return response

    async def _list(self, call: tuple[Any, ...]) -> Response:
        """Every model application's ``/v1/models`` (a tensor model's is empty), merged; an
        answer that is not 200 (a wrong API key) is the answer."""
        from starlette.responses import JSONResponse, Response

        data: list[Any] = []
        for model in await self._models(None):
            parts = [part async for part in self._handle(model).openai_call.remote(*call)]
            head, content = parts[0], b"".join(parts[1:])
            if head["status"] != 200:
                return Response(content, head["status"], media_type="application/json")
            data += json.loads(content).get("data", [])
        return JSONResponse({"object": "list", "data": data})


def _model_named(path: str, body: bytes) -> str:
    """The model a request is for: ``/v1/models/<model>``'s, else the JSON body's ``model``."""
    from ferry.serving._openai_requests import OpenAIError

    prefix = f"{OPENAI_ROUTE}/models/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    try:
        model = json.loads(body).get("model") if body else None
    except (ValueError, AttributeError):
        raise OpenAIError(400, "the request body is not a JSON object") from None
    if not isinstance(model, str) or not model:
        raise OpenAIError(
            400, "say which model: the request's 'model' field names one", param="model"
        )
    return model
