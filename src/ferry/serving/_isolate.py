"""Isolated models: each instance of a model version runs in a worker process of its own.

By default a model runs in the server's process, and a crash in its engine's native code (a
segfault) takes the server down with every model it serves. ``ferry serve --isolate`` (or
``"isolate": true`` in a model's config.json) runs each instance in a worker process, spawned
(never forked: engines' thread pools do not survive a fork), that loads the model with the options
the in-process path uses. To the batcher a worker is a session (:class:`WorkerSession`): its run
sends the tensors down a pipe (:mod:`ferry.serving._isolate_worker`) and waits for the outputs.

When a worker dies, the calls it held fail with :class:`WorkerDiedError` (503), naming the model
and the signal; the version is UNAVAILABLE (``down``, shown by the index and readiness) while a
new worker loads and warms up, then READY again. Restarts back off (1 s, 2 s, 4 s... up to
:data:`BACKOFF_CAP_S`); after :data:`MAX_CRASHES` crashes within :data:`CRASH_WINDOW_S` the
version stays UNAVAILABLE, saying why, until it is reloaded. Workers exit with the server: it
stops them when the version closes, and a worker whose parent dies exits by itself.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferry._signals import signal_name
from ferry.errors import EngineClosedError, ModelLoadError
from ferry.serving._config import ModelConfig
from ferry.serving._isolate_wire import Wire
from ferry.serving._isolate_worker import WorkerSpec, worker_main
from ferry.serving._scheduler import LoadedModel, load_version, warm_up

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_S",
    "CRASH_WINDOW_S",
    "MAX_CRASHES",
    "Isolation",
    "WorkerDiedError",
    "WorkerSession",
    "down_reason",
    "exit_text",
    "gave_up",
    "load_isolated",
]

logger = logging.getLogger(__name__)

#: The first restart's delay; each crash within the window doubles it.
BACKOFF_S = 1.0
#: The longest delay between restarts.
BACKOFF_CAP_S = 30.0
#: Crashes within :data:`CRASH_WINDOW_S` after which a version is not restarted any more.
MAX_CRASHES = 5
#: The window crashes are counted in, in seconds.
CRASH_WINDOW_S = 300.0
#: Seconds a worker may take to load its model and report ready.
STARTUP_TIMEOUT_S = 600.0
#: Seconds a stopping worker is given to exit before it is terminated.
STOP_GRACE_S = 3.0


class WorkerDiedError(EngineClosedError):
    """An isolated model's worker process died with the call in it, or is being restarted
    (HTTP 503: retry once the model is READY again)."""


def exit_text(code: int | None) -> str:
    """A process's exit, in words: ``SIGSEGV``, ``exit code 3``."""
    if code is None:
        return "still running"
    if code < 0:
        return signal_name(-code)
    return f"exit code {code}"


class WorkerSession:
    """One instance of a model in a worker process, used as a session: ``run``, ``inputs``,
    ``outputs``, ``plan``. Its process can be restarted (:meth:`start` again) after it died.

    Args:
        spec: what to load.
        label: the process's name (``ferry-NAME-worker-I``).
    """

    def __init__(self, spec: WorkerSpec, label: str) -> None:
        self.spec = spec
        self.label = label
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        self.plan: Any = None
        self.process: Any = None
        self._wire: Wire | None = None
        self._lock = threading.Lock()  # one call on the pipe at a time
        #: Why calls are refused now (None: the worker runs them).
        self.refusal: str | None = "not started"
        #: Whether a worker that dies is restarted (once its version serves).
        self.restarts = False
        #: Called with the reason when a call finds the worker dead (before it fails).
        self.on_death: Callable[[str], None] | None = None

    # -- the process -------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the worker and wait until it has loaded the model (blocking).

        Raises:
            ModelLoadError: the load failed in the worker, or the worker died or hung loading.
        """
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=worker_main, args=(theirs, self.spec), name=self.label, daemon=True
        )
        process.start()
        theirs.close()
        wire = Wire(ours, owner=True)
        name = self.spec.name
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while not ours.poll(0.2):
                if not process.is_alive():
                    process.join()
                    raise ModelLoadError(
                        f"model {name!r}: its worker died while loading "
                        f"({exit_text(process.exitcode)})"
                    )
                if time.monotonic() > deadline:
                    raise ModelLoadError(
                        f"model {name!r}: its worker did not load in {STARTUP_TIMEOUT_S:g} s"
                    )
            message = wire.receive()
        except BaseException:
            _end(process)
            wire.close()
            raise
        if message[0] != "ready":
            _end(process)
            wire.close()
            raise ModelLoadError(f"model {name!r}: {message[1]}")
        _, self.inputs, self.outputs, self.plan = message
        with self._lock:
            self.process, self._wire = process, wire
            self.refusal = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def sentinel(self) -> int | None:
        return None if self.process is None else self.process.sentinel

    def serve(self) -> None:
        """From now on the calls are traffic: a live session learns from them (until now they
        were the load's probes and warm-up)."""
        with self._lock:
            if self._wire is not None:
                self._wire.send(("serve",))

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Ask the worker to exit, terminate it after ``grace`` seconds, reap it.

        A call in flight (a drain cut short) is not waited for: the worker is terminated.
        """
        process, wire = self.process, self._wire
        self.refusal = "stopped"
        if process is None:
            return
        if self._lock.acquire(timeout=0.05):
            try:
                if wire is not None:
                    wire.send(("stop",))
            except (OSError, ValueError):
                pass  # already gone
            finally:
                self._lock.release()
        _end(process, grace)
        if wire is not None:
            wire.close()
        self._wire = None

    # -- the session's face ------------------------------------------------------------------

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one call in the worker.

        Raises:
            WorkerDiedError: the worker died during the call, or is down (being restarted).
            FerryError: what the engine raised (ExecutionError...), as in-process.
        """
        result: dict[str, np.ndarray] = self._exchange(
            ("run", dict(inputs), None if outputs is None else list(outputs))
        )
        return result

    def remote(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(session, *args)`` run in the worker, on the session the load's probes run on
        (found inputs, the rows probe, a call's time: they run the engine, so not here).
        ``fn``: a module-level function (pickled by name)."""
        return self._exchange(("call", fn, args))

    def _exchange(self, message: Any) -> Any:
        name = self.spec.name
        with self._lock:
            wire = self._wire
            if self.refusal is not None or wire is None:
                raise WorkerDiedError(f"model {name!r} is unavailable: {self.refusal}")
            try:
                wire.send(message)
                reply = wire.receive()
            except (EOFError, OSError):
                why = exit_text(_exit_code(self.process))
                then = "; restarting" if self.restarts else ""
                self.refusal = f"worker died ({why}){then}"
                if self.on_death is not None:
                    self.on_death(self.refusal)
                raise WorkerDiedError(f"model {name!r} worker died ({why}){then}") from None
        if reply[0] == "error":
            raise reply[1]
        return reply[1]


def _exit_code(process: Any, timeout: float = 2.0) -> int | None:
    """``process``'s exit code, once it has exited (None: still running after ``timeout``).

    The watcher thread may reap it first (its join): the code is then read from what it set.
    """
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            process.join(0.05)
        if process.exitcode is not None or time.monotonic() > deadline:
            code: int | None = process.exitcode
            return code


def _end(process: Any, grace: float = STOP_GRACE_S) -> None:
    """Wait ``grace`` seconds for ``process`` to exit, then terminate it, then kill it."""
    process.join(grace)
    if process.is_alive():
        process.terminate()
        process.join(grace)
    if process.is_alive():
        process.kill()
        process.join()


class Isolation:
    """The worker processes of one model version, and their restarts.

    Args:
        name: the model's name.
        backoff_s: the first restart's delay (doubles with each crash in the window).
        backoff_cap_s: the longest delay.
        max_crashes: crashes within ``window_s`` after which restarts stop.
        window_s: the window, in seconds.
    """

    def __init__(
        self,
        name: str,
        *,
        backoff_s: float | None = None,
        backoff_cap_s: float | None = None,
        max_crashes: int | None = None,
        window_s: float | None = None,
    ) -> None:
        self.name = name
        self.backoff_s = BACKOFF_S if backoff_s is None else backoff_s
        self.backoff_cap_s = BACKOFF_CAP_S if backoff_cap_s is None else backoff_cap_s
        self.max_crashes = MAX_CRASHES if max_crashes is None else max_crashes
        self.window_s = CRASH_WINDOW_S if window_s is None else window_s
        self.workers: list[WorkerSession] = []
        #: Why the version is not serving now (None: it is).
        self.down: str | None = None
        #: Crashed too often: not restarted any more.
        self.gave_up = False
        self.crashes: collections.deque[float] = collections.deque()
        self.warm: Callable[[WorkerSession], str | None] | None = None
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    def spawn(
        self,
        source: Any,
        *,
        backends: Sequence[str],
        threads: int,
        precision: str | None,
        placement: str,
    ) -> WorkerSession:
        """Start one more worker loading ``source`` (``load_version``'s instance factory)."""
        from ferry.backends._registry import _registry  # the targets: see WorkerSpec.registry

        known = _registry()
        spec = WorkerSpec(
            name=self.name,
            source=source,
            backends=tuple(backends),
            threads=threads,
            precision=precision,
            placement=placement,
            registry={b: known[b] for b in backends if b in known},
        )
        worker = WorkerSession(spec, f"ferry-{self.name}-worker-{len(self.workers)}")
        self.workers.append(worker)
        worker.start()
        return worker

    def keep(self, sessions: Sequence[Any]) -> None:
        """Stop the workers the loaded version does not use (a first instance replaced when
        the load chose more instances)."""
        for worker in [w for w in self.workers if w not in sessions]:
            worker.stop()
            self.workers.remove(worker)

    def watch(self, warm: Callable[[WorkerSession], str | None]) -> None:
        """Serve: let live sessions learn, and restart workers that die (warming each up with
        ``warm``, which returns why it failed or None)."""
        self.warm = warm
        for worker in self.workers:
            worker.restarts = True
            worker.on_death = self._died
            worker.serve()
        self._watcher = threading.Thread(
            target=self._watch, name=f"ferry-{self.name}-isolation", daemon=True
        )
        self._watcher.start()

    def close(self) -> None:
        """Stop every worker (blocking, a few seconds at most) and the restarts."""
        self._closed.set()
        for worker in self.workers:
            worker.refusal = "stopped"
        for worker in self.workers:
            worker.stop()

    # -- restarts ----------------------------------------------------------------------------

    def _died(self, reason: str) -> None:
        """Down at once, when a call finds its worker dead: the next request must not wait
        for the watcher to notice."""
        if self.down is None:
            self.down = reason

    def _watch(self) -> None:
        while not self._closed.is_set():
            sentinels = {
                w.sentinel: w
                for w in self.workers
                if w.sentinel is not None and w.refusal != "stopped"
            }
            if not sentinels:
                self._closed.wait(0.5)
                continue
            ready = multiprocessing.connection.wait(list(sentinels), timeout=0.5)
            if self._closed.is_set():
                return
            for sentinel in ready:
                worker = sentinels[sentinel]  # type: ignore[index]
                self._recover(worker, exit_text(_exit_code(worker.process)))
                if self.down is not None:
                    return  # given up: stays down until the version is reloaded

    def _recover(self, worker: WorkerSession, why: str) -> None:
        """Restart a dead worker with back-off; the version is down until it is warm."""
        while not self._closed.is_set():
            worker.refusal = f"worker died ({why}); restarting"
            now = time.monotonic()
            self.crashes.append(now)
            while self.crashes and now - self.crashes[0] > self.window_s:
                self.crashes.popleft()
            count = len(self.crashes)
            if count >= self.max_crashes:
                self.down = (
                    f"worker died ({why}), {count} crashes within {self.window_s:g} s; not "
                    "restarted: fix the model or its engine, then load it again"
                )
                worker.refusal = self.down
                self.gave_up = True
                logger.error("model %r: %s", self.name, self.down)
                return
            self.down = worker.refusal
            delay = min(self.backoff_cap_s, self.backoff_s * 2 ** (count - 1))
            logger.error("model %r worker died (%s); restarting in %.3g s", self.name, why, delay)
            if self._closed.wait(delay):
                return
            try:
                worker.start()
                if self._closed.is_set():  # closed while it loaded: it must not outlive us
                    worker.stop()
                    return
                error = self.warm(worker) if self.warm is not None else None
            except Exception as e:
                error = str(e)
            if error is None and worker.alive:
                worker.serve()
                break
            logger.error("model %r: its restarted worker failed: %s", self.name, error)
            why = error or exit_text(worker.process.exitcode if worker.process else None)
            worker.stop()
        if not self._closed.is_set() and all(w.refusal is None for w in self.workers):
            self.down = None
            logger.warning("model %r is serving again (its worker restarted)", self.name)


def load_isolated(name: str, model_file: Path, config: ModelConfig, **options: Any) -> LoadedModel:
    """:func:`load_version` with each instance in a worker process (blocking).

    Raises:
        FerryError: as :func:`load_version`; no worker is left running.
    """
    isolation = Isolation(name)
    try:
        loaded = load_version(name, model_file, config, spawn=isolation.spawn, **options)
    except BaseException:
        isolation.close()
        raise
    isolation.keep(loaded.sessions)
    loaded.isolation = isolation
    warmup = options.get("warmup", True)

    def warm(worker: WorkerSession) -> str | None:
        return warm_up(dataclasses.replace(loaded, sessions=[worker])) if warmup else None

    isolation.watch(warm)
    return loaded


def gave_up(version: Any) -> bool:
    """Whether an isolated version's workers crashed too often to be restarted (a load
    request then loads it again)."""
    isolation = getattr(getattr(version, "loaded", None), "isolation", None)
    return isolation is not None and isolation.gave_up


def down_reason(version: Any) -> str | None:
    """Why a serving version's workers cannot take calls now (None: they can, or it is not
    isolated)."""
    isolation = getattr(getattr(version, "loaded", None), "isolation", None)
    return None if isolation is None else isolation.down
