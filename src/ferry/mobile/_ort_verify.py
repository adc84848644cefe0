"""The ``.ort`` file run in ONNX Runtime against the source model on the same inputs.

Before -> After::

    model.ort, the source model file, verification inputs (given samples, else random inputs
    that fit the input specs)
        -> OrtVerification: per input and way of loading the file, its outputs against the source
           run with the same graph optimizations (judged within ferry.parity's tolerance), and
           against the source as written (how far those optimizations moved them; reported)

The ``.ort`` file is loaded as an app loads it (and, for the ``runtime`` style, with its saved
optimizations replayed); the source model runs in ONNX Runtime with the graph optimizations the
file carries, which the caller describes (:data:`GraphOptions`), so that both run the same graph.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import ORT_SILENT, ort_error_message
from ferry.errors import ConversionError, ExecutionError, InvalidInputError, ModelLoadError
from ferry.parity import ParityReport, Tolerance, compare_outputs
from ferry.runtime import InputChecker, TensorSpec, found_inputs, guessed_dims, random_feeds

logger = logging.getLogger(__name__)

__all__ = [
    "Feeds",
    "GraphOptions",
    "OrtRun",
    "OrtVerification",
    "ort_session",
    "verification_feeds",
    "verify_ort_file",
]

_CPU = ["CPUExecutionProvider"]

#: ``(level, minimal_build) -> (session options, disabled optimizers)``: how ONNX Runtime
#: optimizes the graph at ``level`` as the ORT format conversion does (``minimal_build``:
#: ``"apply"`` for the runtime optimizations a minimal build replays, else None).
GraphOptions = Callable[[str, str | None], tuple[Any, Sequence[str]]]


@dataclasses.dataclass(frozen=True)
class OrtRun:
    """One run of the ``.ort`` file on one input, against the source model on the same input.

    Attributes:
        what: how the ``.ort`` file was loaded (as a device loads it; with the ``runtime`` style's
            saved optimizations replayed).
        input_index: which verification input.
        reference: how ONNX Runtime ran the source model for ``parity``: with the graph
            optimizations this load of the ``.ort`` file carries, so both run the same graph.
        parity: the ``.ort`` outputs against that reference, within ferry's tolerance: judged.
        drift: the same outputs against the source run with no graph optimizations: how far
            ONNX Runtime's optimizations moved them (a fused QDQ op may round to the next
            quantization step). Reported, not judged.
    """

    what: str
    input_index: int
    reference: str
    parity: ParityReport
    drift: ParityReport

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.what,
            "input": self.input_index,
            "reference": self.reference,
            "parity": self.parity.to_dict(),
            "drift": {
                "max_abs_error": self.drift.max_abs_error,
                "within_tolerance": self.drift.passed,
                "summary": self.drift.summary(),
            },
        }


@dataclasses.dataclass(frozen=True)
class OrtVerification:
    """The ``.ort`` file run in ONNX Runtime against the source model on the same inputs.

    Attributes:
        inputs: where the inputs came from (``given`` or how they were generated).
        runs: one per input and way of loading the file.
    """

    inputs: str
    runs: tuple[OrtRun, ...]

    @property
    def passed(self) -> bool:
        return bool(self.runs) and all(run.parity.passed for run in self.runs)

    @property
    def max_abs_error(self) -> float:
        """The largest difference from the reference over all runs."""
        return max((run.parity.max_abs_error for run in self.runs), default=0.0)

    @property
    def max_drift(self) -> float:
        """The largest difference from the unoptimized source over all runs."""
        return max((run.drift.max_abs_error for run in self.runs), default=0.0)

    def summary(self) -> str:
        if not self.passed:
            failed = [
                f"{run.what} on input {run.input_index}: {run.parity.summary()}"
                for run in self.runs
                if not run.parity.passed
            ]
            return "verification FAILED: " + "; ".join(failed)
        drift = f"ONNX Runtime's graph optimizations moved outputs by up to {self.max_drift:.3g}"
        if not all(run.drift.passed for run in self.runs):
            drift += " (more than ferry's tolerance; the .onnx run in ONNX Runtime does the same)"
        return (
            f"verified in onnxruntime: {len(self.runs)} run(s) on {self.inputs} inputs match the "
            f"source, max abs error {self.max_abs_error:.3g}; {drift}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "inputs": self.inputs,
            "max_abs_error": self.max_abs_error,
            "max_drift": self.max_drift,
            "runs": [run.to_dict() for run in self.runs],
        }


@dataclasses.dataclass(frozen=True)
class Feeds:
    """The verification inputs; ``described``: where they came from; ``guessed``: the dims
    given no size by the user that generated inputs guessed (empty for given samples)."""

    arrays: list[dict[str, np.ndarray]]
    described: str
    guessed: str = ""


def verification_feeds(
    specs: Sequence[TensorSpec],
    samples: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    shapes: Mapping[str, Sequence[int]] | None,
    *,
    model: ir.Model | None = None,
) -> Feeds:
    """The given ``samples``, checked against the input specs; else inputs found to run
    ``model`` (:func:`ferry.runtime.found_inputs`: sizes that run, ids within their tables), or
    random ones that fit the specs when there is no model or none is found (``shapes`` sizes
    their symbolic dims either way).

    Raises:
        InvalidInputError: samples that are not ``{name: array}`` dicts or do not fit the specs.
    """
    if samples is None and model is not None:
        try:
            found = found_inputs(model, shapes)
        except InvalidInputError as e:
            logger.info("no inputs found to run the source model (%s); random ones instead", e)
        else:
            return Feeds([found.feeds], f"found ({found.how})")
    if samples is None:
        guessed = guessed_dims(specs, shapes)
        described = "random" + (f" (guessed sizes: {guessed})" if guessed else "")
        return Feeds([random_feeds(specs, shapes, seed=0)], described, guessed)
    given = [samples] if isinstance(samples, Mapping) else list(samples)
    if not given or not all(isinstance(s, Mapping) for s in given):
        raise InvalidInputError(
            "samples must be one {input name: array} dict or a non-empty list of them"
        )
    checker = InputChecker(list(specs))
    return Feeds([dict(checker.check(dict(s))) for s in given], "given")


def verify_ort_file(
    source: Path,
    ort_file: Path,
    *,
    style: str,
    level: str,
    graph_options: GraphOptions,
    feeds: Feeds,
    tolerance: Tolerance | None,
) -> OrtVerification:
    """Run the ``.ort`` file and the source model in ONNX Runtime on the same inputs.

    Each way of loading the file is compared with ONNX Runtime running the source with the same
    graph optimizations (what the file carries): the ``fixed`` file at its level; the ``runtime``
    file at the basic level as loaded, and at its level with the saved optimizations replayed
    (their ``apply`` mode). The outputs must match within ferry's tolerance. The source run with
    no optimizations measures how far the optimizations moved the outputs.

    Args:
        source: the source model file.
        ort_file: the ORT format model.
        style / level: the optimization style (``fixed``, ``runtime``) and level it was made with.
        graph_options: the conversion's session options at a level.
        feeds: the inputs.
        tolerance: ``(atol, rtol)`` for every output; None: :mod:`ferry.parity`'s per dtype.
    """
    # (what, the .ort session, the reference in words, the reference session)
    pairs: list[tuple[str, Any, str, Any]] = []
    if style == "fixed":
        loaded = ort_session(ort_file, replay=False)
        pairs.append(("ORT format model", loaded, *_reference(source, graph_options, level)))
    else:
        basic = "basic" if level != "disable" else "disable"
        loaded = ort_session(ort_file, replay=False)
        pairs.append(("ORT format model", loaded, *_reference(source, graph_options, basic)))
        replayed = ort_session(ort_file, replay=True)
        what = "ORT format model, saved runtime optimizations replayed"
        pairs.append((what, replayed, *_reference(source, graph_options, level, "apply")))
    as_written = _source_session(source, _quiet_options(optimize=False))
    runs = []
    for index, inputs in enumerate(feeds.arrays):
        plain = _run_source(as_written, inputs, index, feeds)
        for what, session, reference, reference_session in pairs:
            want = _run_source(reference_session, inputs, index, feeds)
            try:
                got = _run(session, inputs)
            except Exception as e:
                raise ConversionError(
                    f"onnxruntime loads the ORT format model but cannot run it on input {index}, "
                    f"which the source model runs: {ort_error_message(e)}"
                ) from e
            runs.append(
                OrtRun(
                    what=what,
                    input_index=index,
                    reference=reference,
                    parity=compare_outputs(got, want, tolerance=tolerance, inputs=inputs),
                    drift=compare_outputs(got, plain, tolerance=tolerance, inputs=inputs),
                )
            )
    return OrtVerification(inputs=feeds.described, runs=tuple(runs))


def ort_session(path: Path, *, replay: bool) -> Any:
    """The ``.ort`` file loaded as an app loads it (ORT's defaults), or with replay enabled."""
    import onnxruntime as ort

    so = _quiet_options(optimize=True)
    if replay:
        so.add_session_config_entry("session.enable_saved_runtime_optimizations", "1")
    try:
        return ort.InferenceSession(str(path), so, providers=_CPU)
    except Exception as e:
        raise ConversionError(
            f"onnxruntime {ort.__version__} cannot load the ORT format model it wrote: "
            f"{ort_error_message(e)}"
        ) from e


def _quiet_options(*, optimize: bool) -> Any:
    """ORT's default session options, its log silenced; ``optimize=False``: no graph optimization
    at all (the model as written)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = ORT_SILENT
    return so


def _reference(
    source: Path, graph_options: GraphOptions, level: str, minimal_build: str | None = None
) -> tuple[str, Any]:
    """The source in ONNX Runtime with the graph optimizations of one load of the ``.ort`` file."""
    import onnxruntime as ort

    so, disabled = graph_options(level, minimal_build)
    what = f"the source model in onnxruntime {ort.__version__}, optimization level {level}"
    if minimal_build:
        what += f" ({minimal_build} mode)"
    return what, _source_session(source, so, disabled)


def _source_session(source: Path, so: Any, disabled: Sequence[str] = ()) -> Any:
    import onnxruntime as ort

    try:
        return ort.InferenceSession(
            str(source), so, providers=_CPU, disabled_optimizers=list(disabled) or None
        )
    except Exception as e:
        raise ModelLoadError(
            f"onnxruntime cannot load the source model: {ort_error_message(e)}"
        ) from e


def _run_source(session: Any, inputs: Mapping[str, np.ndarray], index: int, feeds: Feeds) -> Any:
    try:
        return _run(session, inputs)
    except Exception as e:
        hint = ""
        if feeds.guessed:
            hint = f"; its inputs were random, with guessed sizes ({feeds.guessed}): give samples or shapes"
        raise ExecutionError(
            f"onnxruntime cannot run the source model on verification input {index}: "
            f"{ort_error_message(e)}{hint}"
        ) from e


def _run(session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs))))
