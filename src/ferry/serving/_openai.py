"""The OpenAI API for generative models: ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions``, on the app of ``ferry serve`` (the ``openai`` Python client works unchanged).

- ``GET /v1/models``, ``GET /v1/models/{model}``: the generative models serving (a repository's
  tensor models are served by KServe v2 at ``/v2/models/{m}/infer``, not listed here).
- ``POST /v1/chat/completions``: messages through the model's chat template.
- ``POST /v1/completions``: a text prompt (or token ids) as it is.

Answers are OpenAI's shapes; with ``"stream": true``, server-sent events (``data: {chunk}``, one
per token that adds text; chat's first chunk carries the role, the last the finish reason, then
the usage chunk with ``stream_options.include_usage``), ending with ``data: [DONE]``. A client
that disconnects has its sequence cancelled (freed at the engine's next step).

``finish_reason`` is ``"stop"`` (an end token or a stop string) or ``"length"`` (``max_tokens`` or
the context reached), as OpenAI's; and ``"abort"`` when the server shut down before the answer
finished (its drain timeout ran out): the text so far is answered, with a last chunk and
``[DONE]`` when streaming, never a silently cut socket. ``"abort"`` is not one of OpenAI's values
(vLLM's engine uses it too): it is kept visible rather than disguised as ``"length"``, which
would read as "ask for more tokens". The ``openai`` Python client accepts it (its models are
built without validating enumerations; tested).

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``: 400
``invalid_request_error`` for a bad or unsupported field (``param`` names it; a prompt that fills
the context has code ``context_length_exceeded``), 401 without the server's API key
(``Authorization: Bearer``, as OpenAI clients send it; every ``/v1`` route needs it when one is
set), 404 ``model_not_found``, 429 when the engine's queue is full (with ``Retry-After``), 503
while the model loads or the server shuts down, 500 when the engine fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ferry.errors import (
    EngineBusyError,
    EngineClosedError,
    ExecutionError,
    FerryError,
    InvalidInputError,
)
from ferry.serving._admission import retry_after_header
from ferry.serving._http import HTTPError
from ferry.serving._openai_requests import (
    GenerateParams,
    OpenAIError,
    ReplyShape,
    chat_request,
    check_prompt_ids,
    completion_request,
    generation_request,
    invalid,
)
from ferry.serving._repository import ModelNotFoundError, ModelNotReadyError
from ferry.serving._state import ServingState, _small_json_body, _state, status_of

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import Receive, Scope, Send

    from ferry.generate import GenerationRequest, GenerationStream
    from ferry.serving._generative import GenerativeVersion

__all__ = [
    "EventStream",
    "Finish",
    "admit",
    "follow",
    "generative_version",
    "openai_error",
    "openai_routes",
    "retry_after",
    "sse",
    "submit",
]

logger = logging.getLogger(__name__)

_SHUTTING_DOWN = "the server is shutting down and takes no new requests; send it to another server"


def openai_routes() -> list[Route]:
    """The OpenAI API's routes, for the app's route table."""
    from starlette.routing import Route

    return [
        Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/v1/models", _list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", _model, methods=["GET"]),
    ]


# -- shared with Triton's generate routes ---------------------------------------------------------


def admit(state: ServingState, request: Request) -> None:
    """Refuse a generation request while the server shuts down (503) or without the API key (401)."""
    if state.draining:
        raise EngineClosedError(_SHUTTING_DOWN)
    state.authorize(request)


def generative_version(
    state: ServingState, name: str, elsewhere: str, version: str | None = None
) -> GenerativeVersion:
    """The generative version serving ``name`` (its highest, or ``version``).

    Args:
        state: the app's state.
        name: the model's name.
        elsewhere: what to say of a tensor model of that name (where it is served instead).
        version: the version asked for; None: the highest serving.

    Raises:
        ModelNotFoundError: no such model (404).
        ModelNotReadyError: it is loading or failed (503).
        HTTPError: 400, a tensor model (``elsewhere`` says where to send it).
    """
    from ferry.serving._generative import GenerativeVersion

    try:
        found = state.repository.get(name, version)
    except InvalidInputError:
        if version is not None:
            raise
        # A name no model can have ("org/model"): unknown, as OpenAI answers.
        raise ModelNotFoundError(f"unknown model {name!r}") from None
    if not isinstance(found, GenerativeVersion):
        raise HTTPError(400, f"model {name!r} is a tensor model, not a generative one: {elsewhere}")
    return found


def submit(version: GenerativeVersion, request: GenerationRequest) -> GenerationStream:
    """Submit a request to the version's engine, counted in flight (``version.enter()``) until
    the caller's ``version.exit()``: a version retiring (an unload, a reload) waits for it.

    Raises:
        EngineBusyError, EngineClosedError, InvalidInputError: the engine's refusals (nothing
            is then in flight).
    """
    version.enter()
    try:
        return version.engine.submit(request)
    except BaseException:
        version.exit()
        raise


#: The ``Retry-After`` header for a full queue (whole seconds, at least 1): every 429's.
retry_after = retry_after_header


def sse(data: Any) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return (
        b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


@dataclass(frozen=True)
class Finish:
    """How a generation ended, as the answers report it.

    Attributes:
        text: the whole new text.
        finish_reason: "stop", "length" or "abort".
        prompt_tokens: the prompt's tokens.
        completion_tokens: the new tokens.
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


async def follow(
    state: ServingState,
    stream: GenerationStream,
    receive: Receive,
    on_text: Callable[[str], Awaitable[None]] | None = None,
) -> Finish | None:
    """Run a generation to its end, passing each new piece of text to ``on_text``.

    The client's connection is watched meanwhile: when it goes away, the stream is cancelled
    (its sequence freed at the engine's next step) and None is returned. When the server's drain
    timeout cuts the request off (the task is cancelled), the stream is cancelled too and the
    text so far is returned with finish_reason "abort", for the caller to answer.

    Raises:
        ExecutionError: the engine failed, or its stream ended without a final answer.
    """
    from ferry.generate import Generation

    said: list[str] = []
    tokens = 0

    async def pump() -> Generation:
        nonlocal tokens
        async for item in stream:
            if isinstance(item, Generation):
                return item
            tokens += 1
            if item.text:
                said.append(item.text)
                if on_text is not None:
                    await on_text(item.text)
        raise ExecutionError("the engine's stream ended without its final answer")

    pumping = asyncio.ensure_future(pump())
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await _stop(stream, pumping, watching)
        if not state.cut_off:
            raise
        task = asyncio.current_task()
        if sys.version_info >= (3, 11) and task is not None:
            task.uncancel()  # answered by the caller, not cancelled
        return Finish("".join(said), "abort", stream.prompt_tokens, tokens)
    if not pumping.done():
        await _stop(stream, pumping, watching)
        return None  # the client went away
    watching.cancel()
    generation = pumping.result()
    so_far = "".join(said)
    # Text the engine held back to the end (a partial stop string that was not one) goes out now.
    if on_text is not None and generation.text.startswith(so_far) and generation.text != so_far:
        await on_text(generation.text[len(so_far) :])
    return Finish(
        generation.text, generation.finish_reason, generation.prompt_tokens, len(generation.ids)
    )


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        # A host whose receive fails once the body is read cannot say: the answer runs on.
        logger.debug("cannot watch the client's connection", exc_info=True)
        await asyncio.Event().wait()


async def _stop(stream: GenerationStream, *tasks: asyncio.Future[Any]) -> None:
    stream.cancel()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task


class EventStream:
    """A ``text/event-stream`` answer written by ``produce(write, receive)``, as an ASGI app;
    ``done()`` is called once it ended, however it ended.

    Starlette's ``StreamingResponse`` is not used: on a disconnect it cancels the writer in an
    anyio scope that cancels every later await too, and the writer must still end its stream
    (the last chunk, ``[DONE]``) when the server's drain cuts it off.
    """

    media_type = "text/event-stream; charset=utf-8"

    def __init__(
        self,
        produce: Callable[[Callable[[bytes], Awaitable[None]], Receive], Awaitable[None]],
        done: Callable[[], None] | None = None,
    ) -> None:
        self._produce = produce
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", self.media_type.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # proxies (nginx) must not hold events back
        ]

        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._produce(write, receive)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if self._done is not None:
                self._done()


def openai_error(error: BaseException) -> Response:
    """An error in OpenAI's shape, with its status (and ``Retry-After`` for a full queue)."""
    from starlette.responses import JSONResponse

    found = as_openai_error(error)
    return JSONResponse(found.body(), status_code=found.status, headers=found.headers or None)


def as_openai_error(error: BaseException) -> OpenAIError:
    """Any error raised while serving an OpenAI request, as an :class:`OpenAIError`."""
    if isinstance(error, OpenAIError):
        return error
    message = str(error)
    if isinstance(error, EngineBusyError):
        return OpenAIError(
            429,
            message,
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers=retry_after(error),
        )
    if isinstance(error, (EngineClosedError, ModelNotReadyError)):
        return OpenAIError(503, message, type="server_error", code="service_unavailable")
    if isinstance(error, ModelNotFoundError):
        return OpenAIError(404, message, param="model", code="model_not_found")
    status = status_of(error)
    headers = error.headers if isinstance(error, HTTPError) else None
    if status == 401:
        return OpenAIError(
            401, message, type="authentication_error", code="invalid_api_key", headers=headers
        )
    if status >= 500:
        if not isinstance(error, FerryError):
            logger.error("internal error serving a request", exc_info=error)
            message = f"internal error: {type(error).__name__}: {error}"
        return OpenAIError(status, message, type="server_error", headers=headers)
    return OpenAIError(status, message, headers=headers)


# -- the routes ------------------------------------------------------------------------------------

_TENSOR_MODEL = "send its tensors to /v2/models/{}/infer (KServe v2)"


async def _list_models(request: Request) -> Response:
    from starlette.responses import JSONResponse

    from ferry.serving._generative import GenerativeVersion

    state = _state(request)
    try:
        state.authorize(request)
    except Exception as e:
        return openai_error(e)
    newest: dict[str, GenerativeVersion] = {}
    for version in state.repository.all_serving():
        if isinstance(version, GenerativeVersion):
            newest[version.name] = version  # oldest first: the highest version stays
    return JSONResponse({"object": "list", "data": [_model_card(v) for v in newest.values()]})


async def _model(request: Request) -> Response:
    from starlette.responses import JSONResponse

    state = _state(request)
    name = request.path_params["model"]
    try:
        state.authorize(request)
        version = _openai_version(state, name)
    except Exception as e:
        return openai_error(e)
    return JSONResponse(_model_card(version))


def _openai_version(state: ServingState, name: str) -> GenerativeVersion:
    """:func:`generative_version`, where a tensor model is not found (404), as it is not one of
    this API's models."""
    try:
        return generative_version(state, name, _TENSOR_MODEL.format(name))
    except HTTPError as e:
        if e.status != 400:
            raise
        raise ModelNotFoundError(str(e)) from None


def _model_card(version: GenerativeVersion) -> dict[str, Any]:
    return {"id": version.name, "object": "model", "created": version.created, "owned_by": "ferry"}


async def _chat_completions(request: Request) -> Response | EventStream:
    return await _generate(request, chat=True)


async def _completions(request: Request) -> Response | EventStream:
    return await _generate(request, chat=False)


async def _generate(request: Request, *, chat: bool) -> Response | EventStream:
    from starlette.responses import JSONResponse

    state = _state(request)
    try:
        admit(state, request)
        body = await _small_json_body(request, state)
        params, prompt_ids, version = _prepare(state, body, chat)
        where = "messages" if chat else "prompt"
        stream = submit(
            version, generation_request(params, prompt_ids, version.engine.context_length, where)
        )
    except Exception as e:
        return openai_error(e)
    shape = ReplyShape.new(chat, version.name)
    if params.stream:
        return _events(state, stream, shape, params, version.exit)
    try:
        finish = await follow(state, stream, request.receive)
    except Exception as e:
        return openai_error(e)
    finally:
        version.exit()
    if finish is None:  # the client went away: nobody reads this
        return JSONResponse({}, status_code=499)
    return JSONResponse(
        shape.complete(
            finish.text, finish.finish_reason, finish.prompt_tokens, finish.completion_tokens
        )
    )


def _prepare(
    state: ServingState, body: dict[str, Any], chat: bool
) -> tuple[GenerateParams, list[int], GenerativeVersion]:
    if chat:
        params, messages = chat_request(body)
    else:
        params, prompt = completion_request(body)
    version = _openai_version(state, params.model)
    try:
        if chat:
            return params, version.chat_prompt_ids(messages), version
        if isinstance(prompt, str):
            return params, version.text_prompt_ids(prompt), version
    except InvalidInputError as e:
        raise invalid("messages" if chat else "prompt", str(e)) from None
    vocab = version.decoder.tokenizer.get_vocab_size(with_added_tokens=True)
    return params, check_prompt_ids(prompt, vocab), version


def _events(
    state: ServingState,
    stream: GenerationStream,
    shape: ReplyShape,
    params: GenerateParams,
    done: Callable[[], None],
) -> EventStream:
    usage = params.include_usage

    async def produce(write: Callable[[bytes], Awaitable[None]], receive: Receive) -> None:
        async def on_text(text: str) -> None:
            await write(sse(shape.chunk(text, with_usage=usage)))

        if shape.chat:
            await write(sse(shape.chunk(first=True, with_usage=usage)))
        try:
            finish = await follow(state, stream, receive, on_text)
        except Exception as e:
            # The status went out already: the error is an event (the openai client raises it).
            await write(sse(as_openai_error(e).body()))
            await write(b"data: [DONE]\n\n")
            return
        if finish is None:
            return  # the client went away
        await write(sse(shape.chunk(finish_reason=finish.finish_reason, with_usage=usage)))
        if usage:
            await write(sse(shape.usage_chunk(finish.prompt_tokens, finish.completion_tokens)))
        await write(b"data: [DONE]\n\n")

    return EventStream(produce, done)
