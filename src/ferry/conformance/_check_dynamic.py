"""The dynamic-sizes check: one compiled partition with a symbolic batch runs at several sizes and
answers as ONNX Runtime does, when the backend claims it (``dynamic_shapes``); when it does not,
each size either answers right or is refused with ferry's error, never answered wrongly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.conformance._checks import CheckResult
from ferry.conformance._probe import compile_whole, differs, probe_feeds, probe_model, reference
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    from ferry.backends import Backend

__all__ = ["SIZES", "check_dynamic"]

#: The batch sizes one compiled partition is run at.
SIZES = (1, 3, 7)


def check_dynamic(backend: Backend) -> CheckResult:
    """Run the dynamic-sizes check on ``backend`` (see the module's docstring)."""
    from ferry.errors import FerryError

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
    answered: list[int] = []
    refused: list[int] = []
    for size in SIZES:
        feeds = probe_feeds(size, seed=size)
        want = reference(model, feeds)
        try:
            got = compiled.run(dict(feeds))
        except FerryError as e:
            details.append(f"batch {size}: refused: {one_line(e)}")
            refused.append(size)
            continue
        except Exception as e:
            return CheckResult(
                "dynamic",
                "fail",
                f"batch {size}: the engine's own error escaped (not ferry's): {one_line(e)}",
                details=details,
            )
        wrong = differs(got, want)
        if wrong is not None:
            return CheckResult(
                "dynamic", "fail", f"batch {size}: a wrong answer: {wrong}", details=details
            )
        details.append(f"batch {size}: matches ONNX Runtime")
        answered.append(size)
    sizes = ", ".join(map(str, SIZES))
    if claims and refused:
        return CheckResult(
            "dynamic",
            "fail",
            f"claims dynamic shapes but refused batch {', '.join(map(str, refused))}",
            details=details,
        )
    if claims:
        line = f"one compiled partition with a symbolic batch matches ONNX Runtime at batch {sizes}"
    else:
        line = (
            "does not claim dynamic shapes: "
            + (f"answered batch {', '.join(map(str, answered))} right" if answered else "")
            + ("; " if answered and refused else "")
            + (
                f"refused batch {', '.join(map(str, refused))} with ferry's error"
                if refused
                else ""
            )
            + "; no wrong answer"
        )
    return CheckResult("dynamic", "pass", line, details=details)
