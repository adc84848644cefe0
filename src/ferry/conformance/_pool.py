"""A crash-isolated pool: tasks run one at a time in spawned worker processes.

A worker that crashes (an engine's segfault) or runs past the per-task timeout (a deadlock) is
killed and replaced; its task comes back as :class:`Lost` and the other tasks go on. The
conformance runner and the OpenVINO rule generator both run their cases through it.

Workers are spawned, not forked: an engine's thread pools in this process (ONNX Runtime,
OpenVINO's TBB) would not survive a fork. What a worker needs goes to it pickled: the task
function and the setup function by reference (module level), their arguments by value.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ferry.errors import FerryError

__all__ = ["STARTUP_TIMEOUT", "Lost", "WorkerPool"]

#: Seconds a worker process may take to set up (import its engine) and report ready.
STARTUP_TIMEOUT = 300.0

TaskT = TypeVar("TaskT")
ResultT = TypeVar("ResultT")


@dataclasses.dataclass(frozen=True)
class Lost:
    """A task that produced no result: its worker died or ran past the timeout.

    Attributes:
        kind: ``crash`` (the process exited) or ``timeout`` (it was killed).
        exit_code: the process's exit code, for a crash.
        seconds: how long the task had run.
    """

    kind: str
    exit_code: int | None = None
    seconds: float = 0.0


@dataclasses.dataclass
class _Worker:
    process: Any
    conn: multiprocessing.connection.Connection
    ready: bool = False
    task: int | None = None
    since: float = 0.0


class WorkerPool(Generic[TaskT, ResultT]):
    """Runs ``work(state, task)`` for each task, in up to ``size`` worker processes.

    Each worker first calls ``state = setup(setup_arg)`` (an engine adapter, say; None without a
    ``setup``); a setup that raises fails the whole run (:class:`FerryError`), as it would fail
    every task. ``work`` should turn its own errors into results: one that raises kills its
    worker, which counts as a crash.

    With ``size`` 0 the tasks run in this process, in order, without a timeout or isolation (for
    debugging: a crash takes the caller down).

    Args:
        work: module-level function ``(state, task) -> result``; results must pickle.
        setup: module-level function ``(setup_arg) -> state``, run once per worker; None: the
            state is None.
        setup_arg: its argument (pickled for workers).
        size: worker processes.
        timeout: seconds one task may take before its worker is killed.
        label: what a worker is, for errors (``conformance worker for openvino``).
        quiet: workers also disable logging (warnings are always off in workers).
    """

    def __init__(
        self,
        work: Callable[[Any, TaskT], ResultT],
        setup: Callable[[Any], Any] | None = None,
        setup_arg: Any = None,
        *,
        size: int = 1,
        timeout: float = 120.0,
        label: str = "worker",
        quiet: bool = False,
    ) -> None:
        self.work = work
        self.setup = setup
        self.setup_arg = setup_arg
        self.size = size
        self.timeout = timeout
        self.label = label
        self.quiet = quiet
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []

    def run(self, tasks: Sequence[TaskT]) -> Iterator[tuple[int, ResultT | Lost]]:
        """Run every task; yield ``(index in tasks, result or Lost)`` as each finishes.

        Raises:
            FerryError: a worker could not set up, or exited or overran before taking a task.
        """
        if self.size <= 0:
            state = self.setup(self.setup_arg) if self.setup is not None else None
            for index, task in enumerate(tasks):
                yield index, self.work(state, task)
            return
        queue = collections.deque(enumerate(tasks))
        outstanding = len(queue)
        try:
            while outstanding:
                while len(self._workers) < min(self.size, outstanding):
                    self._start()
                for worker in self._workers:
                    if worker.ready and worker.task is None and queue:
                        index, task = queue.popleft()
                        worker.conn.send(task)
                        worker.task, worker.since = index, time.monotonic()
                for index, result in self._collect():
                    outstanding -= 1
                    yield index, result
        finally:
            for worker in list(self._workers):
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
                self._retire(worker)

    def _start(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main,
            args=(child, self.work, self.setup, self.setup_arg, self.quiet),
            daemon=True,
            name="ferry-conformance",
        )
        process.start()
        child.close()
        worker = _Worker(process, parent, since=time.monotonic())
        self._workers.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        self._workers.remove(worker)
        try:
            worker.conn.close()
        finally:
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(5)

    def _collect(self) -> list[tuple[int, ResultT | Lost]]:
        """Wait for the next message or deadline; return the tasks finished or lost."""
        now = time.monotonic()
        deadlines = [
            w.since + (self.timeout if w.ready else STARTUP_TIMEOUT) for w in self._workers
        ]
        wait = max(0.0, min(deadlines) - now) if deadlines else 0.0
        ready = multiprocessing.connection.wait([w.conn for w in self._workers], timeout=wait)
        finished: list[tuple[int, ResultT | Lost]] = []
        for worker in [w for w in self._workers if w.conn in ready]:
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                worker.process.join(5)
                code = worker.process.exitcode
                task = worker.task
                self._retire(worker)
                if task is None:
                    raise FerryError(
                        f"a {self.label} exited (code {code}) before it took a task; run in "
                        "this process (0 workers) to see the error"
                    ) from None
                finished.append((task, Lost("crash", exit_code=code)))
                continue
            if kind == "ready":
                worker.ready, worker.since = True, time.monotonic()
            elif kind == "setup-error":
                self._retire(worker)
                raise FerryError(f"a {self.label} could not set up: {payload}")
            elif kind == "result" and worker.task is not None:
                finished.append((worker.task, payload))
                worker.task = None
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.conn in ready:
                continue
            if worker.task is not None and now - worker.since > self.timeout:
                finished.append((worker.task, Lost("timeout", seconds=now - worker.since)))
                self._retire(worker)
            elif not worker.ready and now - worker.since > STARTUP_TIMEOUT:
                self._retire(worker)
                raise FerryError(f"a {self.label} did not start in {STARTUP_TIMEOUT:g} s")
        return finished


def _worker_main(
    conn: multiprocessing.connection.Connection,
    work: Callable[[Any, Any], Any],
    setup: Callable[[Any], Any] | None,
    setup_arg: Any,
    quiet: bool,
) -> None:
    """A worker process: set up, then run tasks until told to stop."""
    try:
        warnings.simplefilter("ignore")
        if quiet:
            logging.disable(logging.CRITICAL)
        state = setup(setup_arg) if setup is not None else None
        conn.send(("ready", None))
    except Exception:
        conn.send(("setup-error", traceback.format_exc(limit=5)))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(("result", work(state, task)))
