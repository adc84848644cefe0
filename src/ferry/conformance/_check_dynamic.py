"""The dynamic-sizes check: one compiled partition with a symbolic batch runs at several sizes and
answers as ONNX Runtime does, when the backend claims it (``dynamic_shapes``); when it does not,
each size either answers right or is refused with ferry's error, never answered wrongly. The same
then through one ``ferry.load(model, backends=[NAME])`` session, which is what a user calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ferry.conformance._checks import CheckResult
from ferry.conformance._probe import compile_whole, differs, probe_feeds, probe_model, reference
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from ferry.backends import Backend

__all__ = ["SIZES", "check_dynamic"]

#: The batch sizes one compiled partition is run at.
SIZES = (1, 3, 7)


def check_dynamic(backend: Backend) -> CheckResult:
    """Run the dynamic-sizes check on ``backend`` (see the module's docstring): on one compiled
    partition, then (when ``ferry.load`` reaches the backend by name) on one session."""
    from ferry.conformance._check_cache import registered
    from ferry.errors import FerryError
    from ferry.runtime import load

    claims = backend.dynamic_shapes
    model = probe_model("batch")
    try:
        compiled, _ = compile_whole(backend, model)
    except FerryError as e:
        if claims:
            return CheckResult(
                "dynamic",
                "fail",
                f"claims dynamic shapes but refuses a symbolic batch: {one_line(e)}",
            )
        line = f"does not claim dynamic shapes and refuses a symbolic batch cleanly: {one_line(e)}"
        return CheckResult("dynamic", "pass", line, details=[line])
    details: list[str] = []
    runs = [("one compiled partition", compiled.run)]
    if registered(backend):
        session = load(model, backends=[backend.name], cache_dir=False)
        runs.append(("one ferry session", session.run))
    lines = []
    for what, run in runs:
        problem, answered, refused = _sizes(run, model, what, details)
        if problem is None and claims and refused:
            problem = f"{what}: claims dynamic shapes but refused batch {_listed(refused)}"
        if problem is not None:
            return CheckResult("dynamic", "fail", problem, details=details)
        lines.append(
            f"{what} answered batch {_listed(answered)} right"
            + (f", refused batch {_listed(refused)} with ferry's error" if refused else "")
        )
    claim = "claims dynamic shapes" if claims else "does not claim dynamic shapes"
    return CheckResult("dynamic", "pass", f"{claim}: " + "; ".join(lines), details=details)


def _listed(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) or "none"


def _sizes(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    model: onnx.ModelProto,
    what: str,
    details: list[str],
) -> tuple[str | None, list[int], list[int]]:
    """Run ``run`` at every size of :data:`SIZES`: ``(what went wrong or None, the sizes
    answered right, the sizes refused with ferry's error)``."""
    from ferry.errors import FerryError

    answered: list[int] = []
    refused: list[int] = []
    for size in SIZES:
        feeds = probe_feeds(size, seed=size)
        want = reference(model, feeds)
        try:
            got = run(dict(feeds))
        except FerryError as e:
            details.append(f"{what}, batch {size}: refused: {one_line(e)}")
            refused.append(size)
            continue
        except Exception as e:
            problem = f"{what}, batch {size}: the engine's own error escaped (not ferry's): "
            return problem + one_line(e), answered, refused
        wrong = differs(got, want)
        if wrong is not None:
            return f"{what}, batch {size}: a wrong answer: {wrong}", answered, refused
        details.append(f"{what}, batch {size}: matches ONNX Runtime")
        answered.append(size)
    return None, answered, refused
