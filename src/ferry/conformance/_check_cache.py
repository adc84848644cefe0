"""The caching check: a compiled partition survives ``serialize()`` and ``load(blob)`` in a fresh
adapter instance, and ``ferry.load`` a second time with the same engine cache compiles nothing.

A hit is observable: ``Session.engine_origins`` says, per partition, whether its engine was
``compiled`` (and stored), ``loaded`` from the cache, or ``uncached`` (the backend stores
nothing). An engine that builds from the model every time (``engine_cache = False``, ONNX
Runtime) has nothing to cache: the check says so and passes on the answers alone.
"""

from __future__ import annotations

import tempfile
import time
from typing import TYPE_CHECKING

from ferry.conformance._checks import CheckResult
from ferry.conformance._probe import compile_whole, differs, probe_feeds, probe_model, reference
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from ferry.backends import Backend

__all__ = ["check_cache", "fresh_instance", "registered"]


def fresh_instance(backend: Backend) -> tuple[Backend, bool]:
    """A new instance of ``backend``'s class (what another process would have), and whether it
    is new: an adapter whose constructor takes arguments is reused."""
    try:
        return type(backend)(), True
    except TypeError:
        return backend, False


def registered(backend: Backend) -> bool:
    """Whether ``ferry.load`` reaches ``backend`` by its name (the registry's instance is one of
    its class): the session-level checks need it."""
    from ferry.backends import get_backend
    from ferry.errors import FerryError

    try:
        return type(get_backend(backend.name)) is type(backend)
    except FerryError:
        return False


def check_cache(backend: Backend) -> CheckResult:
    """Run the caching check on ``backend`` (see the module's docstring)."""
    details: list[str] = []
    model = probe_model()
    feeds = probe_feeds(3, seed=1)
    want = reference(model, feeds)
    compiled, spec = compile_whole(backend, model)
    first = compiled.run(dict(feeds))
    wrong = differs(first, want)
    if wrong is not None:
        return CheckResult("cache", "fail", f"the compiled probe model answers wrongly: {wrong}")
    blob = compiled.serialize()
    if not blob:
        if backend.engine_cache:
            return CheckResult(
                "cache",
                "fail",
                "engine_cache is True but serialize() gives no bytes: nothing would be stored",
            )
        details.append(
            f"serialize() gives no bytes (engine_cache={backend.engine_cache}): the engine "
            "builds from the model at each load, so there is no blob to reload"
        )
    else:
        fresh, new = fresh_instance(backend)
        again = fresh.load(blob, spec).run(dict(feeds))
        wrong = differs(again, first, exact=True) and differs(again, want)
        if wrong is not None:
            return CheckResult(
                "cache", "fail", f"load(serialize()) answers differently from compile(): {wrong}"
            )
        who = "a fresh adapter instance" if new else "the same instance (its class takes arguments)"
        details.append(
            f"serialize() gives {len(blob):,} bytes; load(blob) in {who} answers as compile() did"
        )
    if not registered(backend):
        line = (
            f"ferry.load cannot reach {backend.name!r} by name (not registered): the engine "
            "cache through ferry.load was not checked"
        )
        details.append(line)
        return CheckResult("cache", "pass", line, details=details)
    status, line = _through_load(backend.name, model, feeds, want, details)
    return CheckResult("cache", status, line, details=details)


def _through_load(
    name: str,
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    want: dict[str, np.ndarray],
    details: list[str],
) -> tuple[str, str]:
    """Load the probe model twice with one temporary engine cache; ``(status, summary)``."""
    from ferry.runtime import load

    with tempfile.TemporaryDirectory(prefix="ferry-conformance-cache-") as tmp:
        timed = []
        for _ in range(2):
            start = time.perf_counter()
            session = load(model, backends=[name], cache_dir=tmp)
            seconds = time.perf_counter() - start
            origins = [
                origin
                for part, origin in zip(session.plan.partitions, session.engine_origins)
                if part.backend == name
            ]
            try:
                got = session.run(dict(feeds))
            except Exception as e:
                return "fail", f"a session loaded from the engine cache fails: {one_line(e)}"
            timed.append((seconds, origins, differs(got, want)))
    (t1, first, wrong1), (t2, second, wrong2) = timed
    details.append(
        f"ferry.load twice with one engine cache: {', '.join(first) or 'no partition'} in "
        f"{t1:.2f} s, then {', '.join(second) or 'no partition'} in {t2:.2f} s"
    )
    if not first:
        return "fail", f"ferry.load(backends=[{name!r}]) placed no partition on it"
    if wrong1 or wrong2:
        return "fail", f"a session answers wrongly: {wrong1 or wrong2}"
    if all(o == "uncached" for o in first + second):
        return "pass", (
            "nothing to cache (the engine builds from the model at each load); answers match "
            "ONNX Runtime"
        )
    if "compiled" not in first:
        return "fail", f"the first load with an empty cache did not compile: {first}"
    if any(o != "loaded" for o in second):
        return "fail", f"the second load compiled again ({second}): the cache missed"
    return "pass", (
        f"a second ferry.load compiles nothing (loaded from the engine cache in {t2:.2f} s, "
        f"first compile {t1:.2f} s); load(serialize()) answers as compile() did"
    )
