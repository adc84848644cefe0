"""The worker process of an isolated model instance, and the wire both ends speak.

A worker loads one instance of a model with :func:`ferry.runtime.load` (the options the server
would load it with in-process), reports its input and output specs and its plan, then runs the
calls its parent sends until told to stop, or until its parent dies (it then exits: no orphan).

Messages travel by :class:`ferry.serving._isolate_wire.Wire` (a pipe, and shared memory for
large tensors).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ferry.serving._isolate_wire import Wire

__all__ = ["WorkerSpec", "worker_main"]


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker loads and how (pickled to it).

    Attributes:
        name: the model's name (for messages).
        source: the model file, or the optimized model ``load_version`` made of it.
        backends: the engines, in priority order.
        threads: intra-op threads of the engine.
        precision: the precision asked for (None: each engine's default).
        placement: ``"live"`` or ``"fixed"``.
        registry: ``{backend name: "module:Class"}`` for the backends named: a backend registered
            in the server process by hand, not by an entry point, is then known to its workers.
    """

    name: str
    source: Any
    backends: tuple[str, ...]
    threads: int
    precision: str | None
    placement: str
    registry: dict[str, str]


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """A worker process: load the instance, report ready, run calls until told to stop.

    Messages in: ``("run", feeds, outputs)``, ``("call", fn, args)`` (a load's probe:
    ``fn(session, *args)`` on the session probes run on), ``("serve",)`` (from now on a live
    session learns from the calls: until then they are the load's probes and warm-up, which must
    take no bucket), ``("stop",)``. Out: ``("ready", inputs, outputs, plan)`` or ``("failed",
    message)`` once, then ``("ok", result)`` or ``("error", exception)`` per call.
    """
    wire = Wire(conn, owner=False)
    # Ctrl-C reaches the whole process group: the server drains and then stops its workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    import warnings

    warnings.simplefilter("ignore")
    try:
        session = _load(spec)
    except Exception as e:
        text = str(e) if type(e).__module__.startswith("ferry") else f"{type(e).__name__}: {e}"
        wire.send(("failed", text))
        return
    from ferry.runtime import LiveSession, Session

    wire.send(("ready", list(session.inputs), list(session.outputs), session.plan))
    from ferry.serving._scheduler import _probe_session

    learning = False
    probe: Any = None
    while True:
        try:
            message = wire.receive()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "stop":
            return
        if kind == "serve":
            learning = True
            continue
        try:
            if kind == "call":
                probe = probe or _probe_session(session)
                result = message[1](probe, *message[2])
                wire.send(("ok", result))
                continue
            _, feeds, outputs = message
            if isinstance(session, LiveSession) and not learning:
                result = Session.run(session, feeds, outputs)
            else:
                result = session.run(feeds, outputs)
        except Exception as e:
            wire.send(("error", _picklable(e)))
            continue
        wire.send(("ok", result))


def _load(spec: WorkerSpec) -> Any:
    import ferry.backends._registry as registry  # the registry has no public way to add one
    from ferry.runtime import load

    for name, target in spec.registry.items():
        registry._BUILTIN.setdefault(name, target)
    source = spec.source
    if isinstance(source, str):
        source = Path(source)
    return load(
        source,
        backends=list(spec.backends),
        threads=spec.threads,
        precision=spec.precision,
        placement=spec.placement,
    )


def _picklable(error: Exception) -> Exception:
    """``error`` when it survives pickling, else an ExecutionError saying what it was."""
    from ferry.errors import ExecutionError

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return ExecutionError(f"{type(error).__name__}: {error}")


def _exit_with_parent() -> None:
    """Exit as soon as the parent process dies (killed: it had no chance to stop us), even in
    the middle of a call."""
    import multiprocessing
    import multiprocessing.connection

    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="ferry-worker-parent-watch", daemon=True).start()
