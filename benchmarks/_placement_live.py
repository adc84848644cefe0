"""The placement benchmark's live column (``benchmarks/placement.py``): the model loaded with
``backends="openvino,onnxruntime"`` and no sizes, fed the kit's inputs call by call until live
placement has settled, and what it settled on.

The load runs against a cache folder of its own and a folder of links to the model without its
``ferry.json`` (:func:`linked_alone`), so nothing the benchmark's own loads measured (the pays
check's verdict at the same sizes) nor a saved size is found: it learns as a first load would.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import ferry
from _placement_models import linked_alone
from ferry.runtime import LiveSession
from ferry.runtime._live import wants_live

#: After ``max_s`` of calls without settling, how long to wait for the learner without calls
#: (its threads must be gone before the next model is timed).
SETTLE_WAIT_S = 300.0


@dataclasses.dataclass
class Live:
    """What live placement did on one model.

    Attributes:
        live: the load made a live session (False: ``state`` says why not).
        calls: calls served until it settled (or until ``max_s`` ran out).
        seconds: how long those calls took, first to last.
        settled: it settled while the calls ran.
        plan: the plan label the kit's bucket ended on (``onnxruntime``, ``openvino``,
            ``openvino+onnxruntime``...).
        state: the bucket's state as the report says it.
        plan_ms: what the learner measured for the placed plan (None: not measured).
        alone_ms: what it measured for ONNX Runtime alone.
        report: ``placement_report()`` as it ended.
        error: why the column could not be made.
    """

    live: bool = False
    calls: int = 0
    seconds: float = 0.0
    settled: bool = False
    plan: str = ""
    state: str = ""
    plan_ms: float | None = None
    alone_ms: float | None = None
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextmanager
def cache_folder(folder: Path) -> Iterator[None]:
    """``FERRY_CACHE_DIR`` pointed at ``folder`` for the block, then put back."""
    before = os.environ.get("FERRY_CACHE_DIR")
    os.environ["FERRY_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FERRY_CACHE_DIR", None)
        else:
            os.environ["FERRY_CACHE_DIR"] = before


def live_column(
    path: Path,
    feeds: Mapping[str, np.ndarray],
    scratch: Path,
    *,
    backends: str,
    threads: int | None,
    max_s: float,
    gap_s: float,
) -> Live:
    """Load ``path`` with ``backends`` and no sizes, call it on ``feeds`` (``gap_s`` apart)
    until ``placement_settled()``, at most ``max_s`` seconds of calls, then wait for the learner
    (:data:`SETTLE_WAIT_S`) so that nothing of it runs on into the next model's timing."""
    out = Live()
    with cache_folder(scratch / "cache"):
        session = ferry.load(
            linked_alone(path, scratch / "model"), backends=backends, threads=threads
        )
        if not isinstance(session, LiveSession):
            unknown = wants_live(
                "live",
                session.model,
                [b.strip() for b in backends.split(",")],
                shapes=None,
                example_inputs=None,
                check_pays=True,
            )
            out.plan = "+".join(session.plan.backends)
            out.state = (
                f"sizes unknown, but the plan placed without them runs on {out.plan} alone "
                "(nothing to learn)"
                if unknown
                else "fixed sizes (placed at load)"
            )
            return out
        out.live = True
        start = time.perf_counter()
        while time.perf_counter() - start < max_s:
            session.run(dict(feeds))
            out.calls += 1
            if session.placement_settled(0):
                out.settled = True
                break
            if gap_s:
                time.sleep(gap_s)
        out.seconds = time.perf_counter() - start
        if not out.settled and not session.placement_settled(SETTLE_WAIT_S):
            out.error = f"the learner had not settled {SETTLE_WAIT_S:.0f} s after the calls"
        out.report = session.placement_report()
    buckets = out.report.get("buckets") or []
    if buckets:
        bucket = buckets[0]
        out.plan, out.state = str(bucket.get("plan")), str(bucket.get("state"))
        out.plan_ms, out.alone_ms = bucket.get("plan_ms"), bucket.get("alone_ms")
    return out
