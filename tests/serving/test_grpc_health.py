"""grpc.health.v1 read from the wire by hand: what a probe sends, and what each state answers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ferry.serving._grpc_health import NOT_SERVING, SERVING, health_status, parse_service


def test_requests_as_protobuf_writes_them() -> None:
    assert parse_service(b"") == ""
    assert parse_service(b"\x0a\x04live") == "live"
    # Unknown fields of every wire type are skipped, as protobuf does.
    assert parse_service(b"\x10\x96\x01\x0a\x03add\x19" + bytes(8) + b"\x25" + bytes(4)) == "add"
    for bad in (b"\x0a\x05ab", b"\x0a", b"\x80", b"\x0b"):
        with pytest.raises(ValueError):
            parse_service(bad)


def test_a_draining_server_is_live_but_not_serving() -> None:
    state = SimpleNamespace(draining=True)
    assert health_status(state, "live") == SERVING  # type: ignore[arg-type]
    assert health_status(state, "") == NOT_SERVING  # type: ignore[arg-type]
    assert health_status(state, "add") == NOT_SERVING  # type: ignore[arg-type]
