"""Running an ASGI app: uvicorn in a background thread (:class:`ServerThread`), with graceful
shutdown; ``ferry serve`` and ``ferry agent`` both run this way.

The socket is bound before uvicorn starts (:func:`bind`), so a port in use is a clear error rather
than a thread that quietly exits, and ``port=0`` gives a free port known at once. Shutting down
stops accepting connections, lets the requests in flight finish (uvicorn waits for them), then the
app's lifespan releases what it holds (the models' queues and threads, the agent's jobs).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

from ferry.errors import BackendUnavailableError, FerryError

__all__ = ["ServerThread", "bind", "sigterm_interrupts"]

logger = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` for a server to listen on (port 0: a free one; read it
    from the socket). IPv6 addresses take IPv4 connections too.

    Raises:
        FerryError: the host cannot be resolved, or the address is in use or cannot be bound.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise FerryError(f"cannot listen on {host!r}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise FerryError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port "
            "(0 picks a free one)"
        ) from None
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Serve an ASGI app with uvicorn on a background thread.

    ``with ServerThread(app, port=0) as server:`` returns once the server accepts connections and,
    for an app made by :func:`~ferry.serving.create_app`, its start-up models have been tried;
    ``server.url`` is where it listens. Leaving the block shuts it down gracefully.

    Args:
        app: the ASGI app.
        host: the address to bind; 127.0.0.1 keeps the server local.
        port: the port; 0 picks a free one.
        ready_timeout: seconds to wait for start-up.
        log_level: uvicorn's log level.
        graceful_timeout: seconds in-flight requests get to finish at shutdown (None: no limit).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        ready_timeout: float = 600.0,
        log_level: str = "warning",
        graceful_timeout: float | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.ready_timeout = ready_timeout
        self.log_level = log_level
        self.graceful_timeout = graceful_timeout
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        """Start serving; return once ready.

        Raises:
            FerryError: the address cannot be bound, or the server did not start in time.
        """
        try:
            import uvicorn
        except ImportError as e:
            raise BackendUnavailableError(
                f"serving over HTTP needs uvicorn ({e}); pip install 'ferry[serve]'"
            ) from None

        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level=self.log_level,
            lifespan="on",
            access_log=False,
            # No proxy in front by default; its per-request header rewriting costs for nothing.
            proxy_headers=False,
            timeout_graceful_shutdown=(
                None if self.graceful_timeout is None else max(1, round(self.graceful_timeout))
            ),
        )
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as e:  # SystemExit from uvicorn's start-up failure included
                self._error = e
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="ferry-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.ready_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise FerryError(f"the server failed to start: {self._error or 'see the log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise FerryError(f"the server did not start within {self.ready_timeout:.0f} s")
            time.sleep(0.01)
        state = getattr(getattr(self.app, "state", None), "ferry", None)
        if state is not None:
            remaining = max(0.0, deadline - time.monotonic())
            if not state.started.wait(remaining):
                self.stop()
                raise FerryError(
                    f"the models did not finish loading within {self.ready_timeout:.0f} s"
                )
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Shut down gracefully: in-flight requests finish, then the models are released."""
        if self._server is None or self._thread is None:
            return
        state = getattr(getattr(self.app, "state", None), "ferry", None)
        if state is not None:
            state.draining = True  # readiness turns false while requests drain
        self._server.should_exit = True
        self._thread.join(timeout)

    def force_stop(self) -> None:
        """Stop without waiting for in-flight requests."""
        if self._server is not None:
            self._server.force_exit = True
            self._server.should_exit = True

    def wait(self, on_interrupt: Callable[[], None] | None = None) -> None:
        """Block until the server stops or Ctrl-C: then shut down gracefully (``on_interrupt`` is
        called first, to say so); a second Ctrl-C stops at once.

        For a server run in the foreground of the main thread (``ferry serve``, ``ferry agent``);
        with :func:`sigterm_interrupts`, SIGTERM drains it the same way.
        """
        try:
            while self.is_alive():
                self.join(0.5)
        except KeyboardInterrupt:
            if on_interrupt is not None:
                on_interrupt()
            try:
                self.stop()
            except KeyboardInterrupt:
                self.force_stop()
                self.join(5)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does (call it on the main
    thread), so that a service manager's stop drains a server as Ctrl-C does."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
