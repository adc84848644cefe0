"""HTTP pieces every ferry server shares (the KServe app and the bench agent): errors that carry
their status, ``{"error": ...}`` answers, bearer-token checks, and request bodies read under a size
cap.

Only the standard library is imported here (Starlette's ``JSONResponse`` when an answer is made),
so ``import ferry.serving`` and the CLI stay light.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from ferry.errors import EngineBusyError, EngineClosedError, ExecutionError, FerryError
from ferry.serving._repository_files import ModelNotFoundError, ModelNotReadyError

if TYPE_CHECKING:
    from starlette.responses import JSONResponse
    from starlette.types import Receive

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "HTTPError",
    "TooLarge",
    "check_bearer",
    "error_response",
    "read_body",
    "save_body",
    "status_of",
]

#: ``ferry serve``'s default body limit (``--max-request-bytes``).
DEFAULT_MAX_REQUEST_BYTES = 64 * 2**20

#: What a 413 answer says: ``(size, counted) -> message``. ``counted`` is true when the body was
#: cut off after ``size`` bytes as it streamed in (so it is larger still), false when its
#: ``Content-Length`` announced ``size``.
TooLarge = Callable[[int, bool], str]


class HTTPError(FerryError):
    """An error with its own HTTP status (401, 413...) and response headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The answer ``{"error": message}`` with ``status``."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def check_bearer(value: str | None, secret: str, message: str) -> None:
    """Check an ``Authorization`` header's value (None: absent) against ``Bearer <secret>``.

    Raises:
        HTTPError: 401 with ``message`` and ``WWW-Authenticate: Bearer``, when it does not match.
    """
    scheme, _, given = (value or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), secret.encode()
    ):
        raise HTTPError(401, message, {"WWW-Authenticate": "Bearer"})


def _too_large(limit: int) -> TooLarge:
    def message(size: int, counted: bool) -> str:
        return f"the request body is {size} bytes, above this server's limit of {limit} bytes"

    return message


async def read_body(
    headers: Mapping[str, str], receive: Receive, limit: int, *, too_large: TooLarge | None = None
) -> bytearray:
    """The request body, in memory; refused with 413 past ``limit`` bytes (announced or counted).

    Args:
        headers: the request's headers, names in lower case.
        receive: the ASGI ``receive`` (``request.receive`` in Starlette).
        limit: the most bytes the body may have.
        too_large: the 413 message (default: the body's size and the server's limit).

    Raises:
        HTTPError: 413 over the limit; 400 for a bad ``Content-Length``, a body longer or shorter
            than it, or a client that went away.
    """
    expected = _expected_length(headers, limit, too_large)
    chunks = _chunks(receive, expected, limit, too_large)
    if expected is None:
        body = bytearray()
        async for chunk in chunks:
            body += chunk
        return body
    # The size is known: fill one buffer instead of growing one (large tensors).
    body = bytearray(expected)
    view = memoryview(body)
    pos = 0
    try:
        async for chunk in chunks:
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
    finally:
        view.release()
    return body


async def save_body(
    headers: Mapping[str, str],
    receive: Receive,
    out: IO[bytes],
    limit: int,
    *,
    too_large: TooLarge | None = None,
) -> int:
    """:func:`read_body`, written to ``out`` as it arrives; returns its size."""
    total = 0
    async for chunk in _chunks(
        receive, _expected_length(headers, limit, too_large), limit, too_large
    ):
        out.write(chunk)
        total += len(chunk)
    return total


def _expected_length(
    headers: Mapping[str, str], limit: int, too_large: TooLarge | None
) -> int | None:
    declared = headers.get("content-length")
    if declared is None:
        return None
    try:
        expected = int(declared)
    except ValueError:
        raise HTTPError(400, f"invalid Content-Length {declared!r}") from None
    if expected > limit:
        raise HTTPError(413, (too_large or _too_large(limit))(expected, False))
    return expected


async def _chunks(
    receive: Receive, expected: int | None, limit: int, too_large: TooLarge | None
) -> AsyncIterator[bytes]:
    """The body's chunks as Starlette's ``Request.stream`` gives them, counted against the
    ``Content-Length`` (``expected``) or, without one, against ``limit``."""
    total = 0
    while True:
        message: Any = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                total += len(chunk)
                if expected is not None and total > expected:
                    raise HTTPError(400, "the body is longer than its Content-Length")
                if total > limit:
                    raise HTTPError(413, (too_large or _too_large(limit))(total, True))
                yield chunk
            if not message.get("more_body", False):
                break
        elif message["type"] == "http.disconnect":
            raise HTTPError(400, "the client disconnected before sending the whole body")
    if expected is not None and total != expected:
        raise HTTPError(400, f"the body ended after {total} of {expected} bytes")


def status_of(error: BaseException) -> int:
    """The HTTP status for an error raised while serving a request."""
    if isinstance(error, HTTPError):
        return error.status
    if isinstance(error, ModelNotFoundError):
        return 404
    if isinstance(error, ModelNotReadyError):
        return 503
    if isinstance(error, ExecutionError):
        return 500
    if isinstance(error, EngineBusyError):
        return 429
    if isinstance(error, EngineClosedError):
        return 503
    if isinstance(error, FerryError):
        return 400
    return 500
