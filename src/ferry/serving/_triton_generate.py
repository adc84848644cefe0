"""Triton's generate extension for generative models: ``POST /v2/models/{m}[/versions/{v}]/generate``
and ``.../generate_stream``.

A request is ``{"text_input": "...", "parameters": {"max_tokens", "temperature", "top_p",
"top_k", "repetition_penalty", "stop", "seed", "exclude_input_in_output"}}`` (the parameters may
also sit at the top level, as TensorRT-LLM's ensembles take them). The answer is
``{"model_name", "model_version", "text_output", "finish_reason"}``; ``generate_stream`` sends
one server-sent event of that shape per piece of new text, as Triton does, the last one with
the finish reason (and no text), and no ``[DONE]`` (Triton sends none). ``text_output`` is the
new text only unless ``exclude_input_in_output`` is false (then the prompt comes first, as
Triton's vLLM backend answers by default).

Defaults and limits are the OpenAI routes' (see :mod:`ferry.serving._openai_requests`); errors
are Triton's ``{"error": "..."}`` with its statuses (429 with ``Retry-After`` for a full queue,
503 while loading or shutting down), and mid-stream, an ``{"error": ...}`` event. A tensor model
answers 400 naming its ``/infer`` route.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ferry.errors import EngineBusyError, EngineClosedError
from ferry.serving._http import HTTPError
from ferry.serving._openai import (
    EventStream,
    admit,
    follow,
    generative_version,
    retry_after,
    sse,
    submit,
)
from ferry.serving._openai_requests import generation_request, triton_request
from ferry.serving._state import _error, _small_json_body, _state

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import Receive

__all__ = ["generate_routes"]


def generate_routes() -> list[Route]:
    """Triton's generate routes, for the app's route table."""
    from starlette.routing import Route

    out = []
    for suffix, endpoint in (("/generate", _generate), ("/generate_stream", _generate_stream)):
        out.append(Route(f"/v2/models/{{model}}{suffix}", endpoint, methods=["POST"]))
        out.append(
            Route(f"/v2/models/{{model}}/versions/{{version}}{suffix}", endpoint, methods=["POST"])
        )
    return out


async def _generate(request: Request) -> Response | EventStream:
    return await _serve(request, stream=False)


async def _generate_stream(request: Request) -> Response | EventStream:
    return await _serve(request, stream=True)


async def _serve(request: Request, *, stream: bool) -> Response | EventStream:
    from starlette.responses import JSONResponse

    state = _state(request)
    name = request.path_params["model"]
    try:
        admit(state, request)
        body = await _small_json_body(request, state)
        params, text, exclude = triton_request(body, name, stream=stream)
        version = generative_version(
            state,
            name,
            f"send its tensors to /v2/models/{name}/infer",
            request.path_params.get("version"),
        )
        ids = version.text_prompt_ids(text)
        submitted = submit(
            version, generation_request(params, ids, version.engine.context_length, "text_input")
        )
    except Exception as e:
        return _triton_error(e)
    head = {"model_name": version.name, "model_version": version.version_str}
    prefix = "" if exclude else text
    if stream:

        async def produce(write: Callable[[bytes], Awaitable[None]], receive: Receive) -> None:
            first = True

            async def on_text(piece: str) -> None:
                nonlocal first
                await write(sse({**head, "text_output": (prefix if first else "") + piece}))
                first = False

            try:
                finish = await follow(state, submitted, receive, on_text)
            except Exception as e:
                await write(sse({"error": _message(e)}))
                return
            if finish is not None:
                last = {**head, "text_output": prefix if first else ""}
                await write(sse({**last, "finish_reason": finish.finish_reason}))

        return EventStream(produce, version.exit)
    try:
        finish = await follow(state, submitted, request.receive)
    except Exception as e:
        return _triton_error(e)
    finally:
        version.exit()
    if finish is None:  # the client went away: nobody reads this
        return JSONResponse({}, status_code=499)
    return JSONResponse(
        {**head, "text_output": prefix + finish.text, "finish_reason": finish.finish_reason}
    )


def _as_http(error: BaseException) -> BaseException:
    if isinstance(error, EngineBusyError):
        return HTTPError(429, str(error), retry_after(error))
    if isinstance(error, EngineClosedError):
        return HTTPError(503, str(error))
    return error


def _triton_error(error: BaseException) -> Response:
    return _error(_as_http(error))


def _message(error: BaseException) -> Any:
    """The message of Triton's error answer for ``error``."""
    return json.loads(bytes(_triton_error(error).body))["error"]
