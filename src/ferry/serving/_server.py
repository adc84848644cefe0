"""Running an ASGI app: uvicorn in a background thread (:class:`ServerThread`), with graceful
shutdown; ``ferry serve`` and ``ferry agent`` both run this way.

The socket is bound before uvicorn starts (:func:`bind`), so a port in use is a clear error rather
than a thread that quietly exits, and ``port=0`` gives a free port known at once.

Shutting down drains: the listening socket closes (no new connections), the requests in flight run
to the end, up to ``drain_timeout`` seconds (what still runs then is cut off, and logged with a
count), and only then does uvicorn close the idle connections and the app's lifespan release what
it holds (the models' queues, threads and engines; the agent's jobs). A ferry app (its
``app.state.ferry``) answers requests that arrive during the drain on connections already open with
503 and ``Connection: close``, and the ones cut off with 503.

The end of the server thread is an :class:`threading.Event`, never ``Thread.join``: on Python 3.11 a
``join`` interrupted by Ctrl-C marks the thread finished while it still runs (the interpreter then
exits under a live server: dropped connections, engines torn down mid-run).
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

__all__ = ["DEFAULT_DRAIN_TIMEOUT", "ServerThread", "bind", "sigterm_interrupts"]

logger = logging.getLogger(__name__)

#: Seconds the requests in flight get to finish at shutdown, by default.
DEFAULT_DRAIN_TIMEOUT = 30.0


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
    ``server.url`` is where it listens. Leaving the block shuts it down gracefully: see the module's
    description of the drain; :attr:`drained` and :attr:`cut_off` then say how it went.

    Args:
        app: the ASGI app.
        host: the address to bind; 127.0.0.1 keeps the server local.
        port: the port; 0 picks a free one.
        ready_timeout: seconds to wait for start-up.
        log_level: uvicorn's log level.
        drain_timeout: seconds the requests in flight get to finish at shutdown (None: no limit);
            what still runs then is cut off.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        ready_timeout: float = 600.0,
        log_level: str = "warning",
        drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT,
    ) -> None:
        if drain_timeout is not None and not drain_timeout >= 0:
            raise FerryError(f"the drain timeout must be 0 or more seconds, got {drain_timeout}")
        self.app = app
        self.host = host
        self.port = port
        self.ready_timeout = ready_timeout
        self.log_level = log_level
        self.drain_timeout = drain_timeout
        #: Requests in flight when the drain began that finished (set once the server stopped).
        self.drained = 0
        #: Requests still running at the drain timeout, cut off.
        self.cut_off = 0
        #: Seconds the drain took.
        self.drain_seconds = 0.0
        #: True once a second interrupt (or :meth:`force_stop`) stopped the server at once.
        self.forced = False
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
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
            # The drain runs before uvicorn's own shutdown, which then only closes connections
            # (this is set to what is left of the drain timeout when it starts).
            timeout_graceful_shutdown=None,
        )
        self._server = _draining_server_class()(config, self)

        def run() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as e:  # SystemExit from uvicorn's start-up failure included
                self._error = e
            finally:
                sock.close()
                self._done.set()

        self._done.clear()
        self._thread = threading.Thread(target=run, name="ferry-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.ready_timeout
        while not self._server.started:
            if self._done.is_set():
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
        """Shut down gracefully: drain the requests in flight, then release the models.

        Waits for the server to stop (at most ``timeout`` seconds when given).
        """
        if self._server is None or self._thread is None:
            return
        state = getattr(getattr(self.app, "state", None), "ferry", None)
        if state is not None:
            state.draining = True  # readiness turns false; new requests get 503
        self._server.should_exit = True
        self.join(timeout)

    def force_stop(self) -> None:
        """Stop without waiting for in-flight requests."""
        if self._server is not None:
            self.forced = True
            self._server.force_exit = True
            self._server.should_exit = True

    def wait(self, on_interrupt: Callable[[], None] | None = None) -> None:
        """Block until the server stops or Ctrl-C: then shut down gracefully (``on_interrupt`` is
        called first, to say so); a second Ctrl-C stops at once.

        For a server run in the foreground of the main thread (``ferry serve``, ``ferry agent``);
        with :func:`sigterm_interrupts`, SIGTERM drains it the same way.
        """
        try:
            while not self._done.wait(0.5):
                pass
            return
        except KeyboardInterrupt:
            pass
        try:
            if on_interrupt is not None:
                on_interrupt()
            self.stop()
        except KeyboardInterrupt:
            self.force_stop()
            self._done.wait(5)

    def is_alive(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the server thread to end (at most ``timeout`` seconds when given)."""
        if self._thread is None or not self._done.wait(timeout):
            return
        # The thread has left its work; this join returns at once (and is never the one a
        # Ctrl-C interrupts while the thread still serves).
        self._thread.join(5)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_DRAIN_POLL_S = 0.02


async def _drain(server: Any, owner: ServerThread) -> None:
    """Stop accepting connections and let the requests in flight finish (on the server's loop).

    The requests still running at ``owner.drain_timeout`` are cancelled: a ferry app answers them
    503. Then uvicorn's shutdown closes the connections (idle ones at once, the others once their
    response is out) within what is left of the timeout, at least a second.
    """
    import asyncio

    started = time.monotonic()
    timeout = owner.drain_timeout
    deadline = None if timeout is None else started + timeout
    for listener in getattr(server, "servers", []):
        listener.close()  # new connections are refused from here on
    # Other servers on the app's state (gRPC) drain alongside, to the same deadline.
    state = getattr(getattr(owner.app, "state", None), "ferry", None)
    others = [asyncio.ensure_future(o.drain(deadline)) for o in getattr(state, "listeners", [])]
    tasks: set[Any] = server.server_state.tasks  # uvicorn's: one per request being answered
    in_flight = len(tasks)
    while tasks and not server.force_exit:
        if deadline is not None and time.monotonic() >= deadline:
            break
        await asyncio.sleep(_DRAIN_POLL_S)
    if others and not server.force_exit:
        await asyncio.wait(others)
    owner.drain_seconds = time.monotonic() - started
    if server.force_exit:
        return
    running = [t for t in tasks if not t.done()]
    if running:
        owner.cut_off = len(running)
        state = getattr(getattr(owner.app, "state", None), "ferry", None)
        if state is not None:
            state.cut_off = True  # the app answers them 503
        logger.warning(
            "drain: %d request%s still running after %s s %s cut off",
            len(running),
            "" if len(running) == 1 else "s",
            f"{timeout:g}",
            "was" if len(running) == 1 else "were",
        )
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=1.0)
    owner.drained = max(0, in_flight - owner.cut_off)
    if not running:
        logger.info(
            "drain: %d request%s in flight finished in %.2f s",
            in_flight,
            "" if in_flight == 1 else "s",
            owner.drain_seconds,
        )
    if deadline is not None:
        server.config.timeout_graceful_shutdown = max(1.0, deadline - time.monotonic())


_SERVER_CLASS: Any = None


def _draining_server_class() -> Any:
    """uvicorn's ``Server`` with the drain between its main loop and its shutdown."""
    global _SERVER_CLASS
    if _SERVER_CLASS is None:
        import uvicorn

        class DrainingServer(uvicorn.Server):
            def __init__(self, config: Any, owner: ServerThread) -> None:
                super().__init__(config)
                self._owner = owner

            async def main_loop(self) -> None:
                await super().main_loop()
                await _drain(self, self._owner)

        _SERVER_CLASS = DrainingServer
    return _SERVER_CLASS


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
