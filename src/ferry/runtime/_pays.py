"""Does a split pay? A plan cut across engines against ONNX Runtime running the whole model.

Each cut costs a copy of the boundary tensors and an engine call; a plan cut into pieces can run
slower than either engine alone (a PP-OCR detector in 10 pieces ran at 0.61x of ONNX Runtime).
``split_pays`` times the split plan and ONNX Runtime alone in alternating blocks at the sizes the
model will run, and says which is faster. ``ferry.load`` asks it when it placed a model across
several engines itself (ONNX Runtime among those listed) and runs ONNX Runtime alone when the
split is slower. The verdict is cached per model, plan, input sizes and machine.

Before -> After::

    [openvino: 20 nodes] -> [onnxruntime: DynamicQuantizeLinear] -> [openvino: ...] x 43
    (43 partitions, 9.1 ms)    vs   [onnxruntime: the whole model] (4.2 ms)
    -> onnxruntime alone, with a warning saying so
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK
from ferry.graph import atomic_path
from ferry.plan import Plan

__all__ = ["PAYS_BUDGET_S", "SplitVerdict", "cached_verdict", "split_pays"]

logger = logging.getLogger(__name__)

#: Seconds spent timing the two (compiling comes on top); the verdict is then cached.
PAYS_BUDGET_S = 1.5


@dataclasses.dataclass(frozen=True)
class SplitVerdict:
    """The split plan's and ONNX Runtime's median latency at ``inputs``, and which is faster."""

    split_ms: float
    alone_ms: float
    inputs: dict[str, list[int]]

    @property
    def pays(self) -> bool:
        """The split is at least as fast as ONNX Runtime alone."""
        return self.split_ms <= self.alone_ms

    def describe(self) -> str:
        at = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.inputs.items())
        return (
            f"the split plan runs in {self.split_ms:.3g} ms, ONNX Runtime alone in "
            f"{self.alone_ms:.3g} ms (at {at})"
        )


def cached_verdict(
    model: ir.Model, plan: Plan, feeds: Mapping[str, np.ndarray], threads: int | None = None
) -> SplitVerdict | None:
    """The verdict :func:`split_pays` stored for ``plan`` at these input sizes, if any."""
    inputs = {name: list(np.shape(a)) for name, a in feeds.items()}
    try:
        data = json.loads(_path(model, plan, inputs, threads).read_text(encoding="utf-8"))
        return SplitVerdict(float(data["split_ms"]), float(data["alone_ms"]), inputs)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def split_pays(
    model: ir.Model,
    split: Any,
    feeds: Mapping[str, np.ndarray],
    *,
    threads: int | None = None,
    cache: bool = True,
) -> SplitVerdict:
    """Time the Session ``split`` (a plan across engines of ``model``, prepared) against ONNX
    Runtime alone on ``feeds``; with ``cache``, store the verdict (:func:`cached_verdict`).

    Raises:
        FerryError: either fails to run on ``feeds``.
    """
    from ferry.runtime._auto import Candidate, time_in_blocks
    from ferry.runtime._session import Session

    inputs = {name: list(np.shape(a)) for name, a in feeds.items()}
    path = _path(model, split.plan, inputs, threads)
    alone = Session(model, Plan.whole_graph(model, FALLBACK), threads=threads)
    runs = [(Candidate("split", split.plan), split), (Candidate(FALLBACK, alone.plan), alone)]
    for _, session in runs:
        session.run(dict(feeds))  # fails here, before timing, on inputs it cannot take
    time_in_blocks(runs, feeds, PAYS_BUDGET_S)
    verdict = SplitVerdict(runs[0][0].latency_ms, runs[1][0].latency_ms, inputs)
    if cache:
        try:
            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps(dataclasses.asdict(verdict)), encoding="utf-8")
        except OSError as e:
            logger.info("cannot cache the split's timing in %s: %s", path, e)
    return verdict


def _path(model: ir.Model, plan: Plan, inputs: Any, threads: Any) -> Path:
    from ferry.runtime._auto import cache_dir, machine_fingerprint

    digest = hashlib.sha256()
    digest.update(ir.to_proto(model).SerializeToString(deterministic=True))
    settings = [plan.to_dict(), inputs, threads, machine_fingerprint()]
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return cache_dir() / f"pays-{digest.hexdigest()[:32]}.json"
