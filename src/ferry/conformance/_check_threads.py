"""The thread-safety check: ``THREADS`` threads call one session (or, for a backend ferry's
registry does not reach, one compiled partition) at once, each on its own inputs, ``CALLS``
times each; every answer must equal the one the same input gets when called alone.

A ferry Session is documented thread-safe, and its one-partition fast path calls the compiled
partition directly, so an adapter that shares state between calls (an output buffer, a bound
request) answers one thread with another's result here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ferry.conformance._checks import CheckResult
from ferry.conformance._probe import compile_whole, differs, probe_feeds, probe_model
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    from ferry.backends import Backend

__all__ = ["CALLS", "THREADS", "check_threads"]

THREADS = 4
#: Calls per thread (bounded: the check takes well under a second on a small model).
CALLS = 25
_BATCH = 2


def check_threads(backend: Backend) -> CheckResult:
    """Run the thread-safety check on ``backend`` (see the module's docstring)."""
    from ferry.conformance._check_cache import registered
    from ferry.runtime import load

    model = probe_model("batch" if backend.dynamic_shapes else _BATCH)
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    if registered(backend):
        session = load(model, backends=[backend.name], cache_dir=False)
        run, what = session.run, "one ferry session"
    else:
        compiled, _ = compile_whole(backend, model)
        run, what = compiled.run, "one compiled partition (not registered: no session)"
    inputs = [
        [probe_feeds(_BATCH, seed=1000 * t + i) for i in range(CALLS)] for t in range(THREADS)
    ]
    # Alone first; copied, as an engine may hand back a buffer it reuses.
    alone = [[{k: np.array(v) for k, v in run(dict(f)).items()} for f in row] for row in inputs]
    problems: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def work(t: int) -> None:
        barrier.wait()
        for i, feeds in enumerate(inputs[t]):
            try:
                got = run(dict(feeds))
                wrong = differs(got, alone[t][i], exact=True) and differs(got, alone[t][i])
            except Exception as e:
                wrong = f"raised {one_line(e, 160)}"
            if wrong is not None:
                with lock:
                    problems.append(f"thread {t} call {i}: {wrong}")

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if any(thread.is_alive() for thread in threads):
        return CheckResult(
            "threads", "fail", f"{THREADS} threads calling {what} at once did not finish in 120 s"
        )
    total = THREADS * CALLS
    details = [f"{THREADS} threads x {CALLS} calls on {what}, each on its own inputs"]
    if problems:
        details += problems[:5]
        return CheckResult(
            "threads",
            "fail",
            f"{len(problems)} of {total} concurrent answers differ from the serial ones; first: "
            f"{problems[0]}",
            details=details,
        )
    return CheckResult(
        "threads",
        "pass",
        f"{total} concurrent calls ({THREADS} threads) on {what} each equal the serial answer",
        details=details,
    )
