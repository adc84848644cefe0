"""gRPC's standard health service (``grpc.health.v1.Health/Check``) on ferry's gRPC port, for
what probes a gRPC server without knowing Triton's RPCs: Kubernetes' ``grpc`` probes (the
InferenceService ``ferry deploy kserve --protocol grpc`` writes), ``grpc_health_probe``, load
balancers. Triton answers it too.

::

    Check(service="")       SERVING while the server is ready (every model that should be is
    Check(service="ready")  READY, as ``/v2/health/ready``), NOT_SERVING while loading or draining
    Check(service="live")   SERVING while the process answers (``/v2/health/live``)
    Check(service="NAME")   SERVING while model NAME is ready; NOT_FOUND for an unknown model

The two messages have one field each (``HealthCheckRequest.service = 1``,
``HealthCheckResponse.status = 1``), so they are read and written here from protobuf's wire
format instead of adding a package for them. ``Watch`` (streaming) is not served: UNIMPLEMENTED,
which probes do not call.
"""

from __future__ import annotations

from typing import Any

from ferry.serving._app import ready_reasons
from ferry.serving._repository import ModelNotFoundError, ModelNotReadyError
from ferry.serving._state import ServingState

__all__ = ["HEALTH_SERVICE", "health_handler", "health_status", "parse_service"]

HEALTH_SERVICE = "grpc.health.v1.Health"
#: ``HealthCheckResponse.ServingStatus``.
SERVING, NOT_SERVING = 1, 2
_LIVE_NAMES = ("live", "liveness")
_READY_NAMES = ("", "ready", "readiness", "inference.GRPCInferenceService")


def parse_service(data: bytes) -> str:
    """``HealthCheckRequest.service`` from the request's bytes ("" when absent).

    Raises:
        ValueError: the bytes are not a HealthCheckRequest.
    """
    service, i = "", 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 2:  # length-delimited: a string
            size, i = _varint(data, i)
            if i + size > len(data):
                raise ValueError("truncated string")
            if field == 1:
                service = data[i : i + size].decode("utf-8")
            i += size
        elif wire == 0:
            _, i = _varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    if i != len(data):
        raise ValueError("truncated field")
    return service


def health_status(state: ServingState, service: str) -> int | None:
    """The status to answer for ``service``; None for a model name the server does not know."""
    if service in _LIVE_NAMES:
        return SERVING
    if state.draining:
        return NOT_SERVING
    if service in _READY_NAMES:
        return NOT_SERVING if ready_reasons(state) else SERVING
    try:
        state.repository.get(service, None)
    except ModelNotReadyError:
        return NOT_SERVING
    except ModelNotFoundError:
        return None
    return SERVING


def health_handler(state: ServingState, grpc: Any) -> Any:
    """The generic handler that serves ``Check`` on ``state`` (``grpc``: the grpc module)."""

    async def check(request: bytes, context: Any) -> bytes:
        try:
            service = parse_service(request)
        except (ValueError, UnicodeDecodeError) as e:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"not a grpc.health.v1.HealthCheckRequest ({e})"
            )
        status = health_status(state, service)
        if status is None:  # context.abort raises
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no model {service!r}: ask for '' (the server ready), 'live', or a model's name",
            )
        return bytes((0x08, status or NOT_SERVING))  # field 1, varint: the status

    method = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=None, response_serializer=None
    )
    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": method})


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7
