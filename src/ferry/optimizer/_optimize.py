"""``optimize``: run the pipeline, then prove the result is no worse, or keep the input.

Before -> After::

    model (any ONNX: a file, an artifact, an ir.Model or a ModelProto; never modified)
        -> OptimizeResult: the optimized copy (or the input, when the copy computes something else
           or runs slower), and a report: ops before/after, parameters, size, latency, parity
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import BackendUnavailableError, FerryError, InvalidInputError
from ferry.graph import (
    external_files,
    load_model,
    model_source_path,
    save_model,
    tensors,
    without_randomness,
)
from ferry.optimizer._pipeline import FixInputShapesPass, pipeline, rule_context
from ferry.optimizer.rules import TARGETS
from ferry.parity import ParityReport, compare_outputs

__all__ = ["LatencyCheck", "OptimizeReport", "OptimizeResult", "optimize", "optimized_for_load"]

logger = logging.getLogger(__name__)

#: Seconds spent timing the model before and after, in alternating blocks.
TIMING_BUDGET_S = 2.0
#: Slower by more than this fraction (and by :data:`SLOWER_MIN_MS`) counts as slower: below it,
#: alternating blocks on one machine cannot tell two models apart.
SLOWER_FRACTION = 0.05
SLOWER_MIN_MS = 0.02


@dataclasses.dataclass(frozen=True)
class LatencyCheck:
    """The model timed before and after on one engine, in one process, in alternating blocks,
    at ``inputs``' sizes (``how``: which, found how, when they were not given)."""

    engine: str
    before_ms: float | None = None
    after_ms: float | None = None
    inputs: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    skipped: str | None = None
    how: str = ""

    @property
    def slower(self) -> bool:
        if self.before_ms is None or self.after_ms is None:
            return False
        extra = self.after_ms - self.before_ms
        return extra > SLOWER_MIN_MS and extra > SLOWER_FRACTION * self.before_ms

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = {k: list(v) for k, v in self.inputs.items()}
        return d

    def summary(self) -> str:
        if self.skipped:
            return f"latency not measured: {self.skipped}"
        assert self.before_ms is not None and self.after_ms is not None
        ratio = self.before_ms / self.after_ms if self.after_ms else float("inf")
        sizes = ", ".join(
            f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in self.inputs.items()
        )
        return (
            f"latency on {self.engine}: {self.before_ms:.3f} ms -> {self.after_ms:.3f} ms "
            f"({ratio:.2f}x) at {self.how or sizes}"
        )


@dataclasses.dataclass(frozen=True)
class OptimizeReport:
    """What optimizing did to a model.

    Attributes:
        level / target / fixed_shapes: what was asked.
        ops_before / ops_after: node counts by op type (subgraphs included).
        parameters_before / parameters_after: weight elements.
        bytes_before / bytes_after: the serialized model's size.
        parity: the optimized model's outputs against the input's, on the same inputs (ONNX
            Runtime, the tolerance contract of :mod:`ferry.parity`).
        latency: the two timed on the target engine (ONNX Runtime by default).
        refused: why the optimized model was not kept (it failed parity, ran slower, or the
            pipeline failed); None when it was kept.
        forced: kept although refused (``force=True``).
    """

    level: str
    target: str | None
    fixed_shapes: Mapping[str, tuple[int, ...]]
    ops_before: Mapping[str, int]
    ops_after: Mapping[str, int]
    parameters_before: int
    parameters_after: int
    bytes_before: int
    bytes_after: int
    parity: ParityReport
    latency: LatencyCheck | None
    refused: str | None = None
    forced: bool = False

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    def changed_ops(self) -> list[tuple[str, int, int]]:
        """``(op, before, after)`` for every op whose count changed, most removed first."""
        ops = set(self.ops_before) | set(self.ops_after)
        rows = [(op, self.ops_before.get(op, 0), self.ops_after.get(op, 0)) for op in ops]
        return sorted((r for r in rows if r[1] != r[2]), key=lambda r: (r[2] - r[1], r[0]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "target": self.target,
            "fixed_shapes": {k: list(v) for k, v in self.fixed_shapes.items()},
            "nodes": {"before": self.nodes_before, "after": self.nodes_after},
            "ops": {"before": dict(self.ops_before), "after": dict(self.ops_after)},
            "parameters": {"before": self.parameters_before, "after": self.parameters_after},
            "bytes": {"before": self.bytes_before, "after": self.bytes_after},
            "parity": self.parity.to_dict(),
            "latency": None if self.latency is None else self.latency.to_dict(),
            "refused": self.refused,
            "forced": self.forced,
        }


@dataclasses.dataclass
class OptimizeResult:
    """The outcome of :func:`optimize`.

    Attributes:
        model: the optimized model; the input itself (unchanged) when the optimization was refused
            and not forced.
        report: what changed, and the checks.
    """

    model: ir.Model
    report: OptimizeReport

    @property
    def accepted(self) -> bool:
        """Whether :attr:`model` is the optimized model."""
        return self.report.refused is None or self.report.forced

    def save(self, path: str | os.PathLike[str], *, external_data: bool | None = None) -> Path:
        """Write :attr:`model` atomically (a reader never sees a half-written file)."""
        return save_model(self.model, path, external_data=external_data)


def optimize(
    model: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    level: str = "basic",
    target: str | None = None,
    fix_shapes: Mapping[str, Sequence[int]] | None = None,
    verify: bool = True,
    measure: bool = True,
    example_inputs: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    force: bool = False,
) -> OptimizeResult:
    """Optimize ``model``'s graph, then check the result computes the same and runs no slower.

    Args:
        model: an ``.onnx`` file, an artifact folder, an ``onnx_ir.Model`` or a ``ModelProto``;
            never modified.
        level: ``"basic"`` (folding, dead code, CSE, cancelling pairs, fusing BatchNorm, biases,
            pads and affine ops into their neighbours, static shape arithmetic) or
            ``"extended"`` (also fusions into bigger ops: Gelu, HardSwish, LayerNormalization,
            and the target's fused kernels).
        target: the engine the model is for (``onnxruntime``, ``openvino``, ``tensorrt``): adds
            its own rules, and the latency check runs there. None: rules valid on every engine,
            timed on ONNX Runtime.
        fix_shapes: fix these inputs' sizes (``{"x": (1, 3, 224, 224)}``) so shape arithmetic
            folds to constants; the optimized model then takes only these sizes.
        verify: compare outputs with the input model's on ``example_inputs`` (else inputs at
            ``shapes``/``fix_shapes``, or found by running the model:
            :func:`ferry.runtime.found_inputs`); a failure refuses the result.
        measure: time both models on the target engine on the same inputs (about 2 s); slower
            by more than 5% refuses the result. The report names the sizes timed and how they
            were found; skipped, with the reason, only when no size the model runs at is found.
        example_inputs: real inputs to verify and time with.
        shapes: the input sizes to verify and time at, when no example inputs are given.
        force: keep the optimized model even when refused (the report still says why).

    Returns:
        An :class:`OptimizeResult`; ``result.save(path)`` writes the model.

    Raises:
        ModelLoadError: the model cannot be read.
        InvalidInputError: an unknown level or target, or ``fix_shapes`` that do not fit.
    """
    original = load_model(model)
    work = _copy(original)
    fixed = {k: tuple(int(d) for d in v) for k, v in (fix_shapes or {}).items()}
    ctx = rule_context(work, level, target, bool(fixed))
    refused: str | None = None
    try:
        if fixed:
            FixInputShapesPass(fixed)(work)
        pipeline(ctx)(work)
    except FerryError:
        raise
    except Exception as e:  # a pass failing on an unusual graph must not lose the user's model
        logger.debug("the optimization pipeline failed", exc_info=True)
        refused = f"the optimization pipeline failed ({type(e).__name__}: {e}); the input is kept"
        work = _copy(original)

    run_shapes = {**{k: tuple(v) for k, v in (shapes or {}).items()}, **fixed}
    parity = ParityReport(skipped="not asked (verify=False)")
    latency: LatencyCheck | None = None
    if refused is None and (verify or measure):
        parity, latency = _check(
            original, work, target, example_inputs, run_shapes, verify, measure
        )
        if not parity.passed and parity.skipped is None:
            refused = f"the optimized model computes something else: {parity.summary()}"
        elif latency is not None and latency.slower:
            refused = f"the optimized model runs slower: {latency.summary()}"
    report = OptimizeReport(
        level=level,
        target=target,
        fixed_shapes=fixed,
        ops_before=_ops(original),
        ops_after=_ops(work),
        parameters_before=_parameters(original),
        parameters_after=_parameters(work),
        bytes_before=_size(original),
        bytes_after=_size(work),
        parity=parity,
        latency=latency,
        refused=refused,
        forced=force and refused is not None,
    )
    if refused is not None and not force:
        return OptimizeResult(original, report)
    return OptimizeResult(work, report)


def _copy(model: ir.Model) -> ir.Model:
    """A copy to optimize (weights shared until a pass replaces them)."""
    try:
        copy = model.clone()
    except RuntimeError:  # onnx_ir clones only sorted graphs; the proto takes any order
        copy = ir.from_proto(ir.to_proto(model))
    copy.meta.pop("ferry.source_path", None)
    return copy


def _ops(model: ir.Model) -> dict[str, int]:
    counts = Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        for node in ir.traversal.RecursiveGraphIterator(model.graph)
    )
    return dict(counts)


def _parameters(model: ir.Model) -> int:
    """Weight elements: initializers and ``Constant`` nodes (Paddle's weights) alike."""
    return sum(tensor.size for tensor in tensors(model, weights_only=True))


def _size(model: ir.Model) -> int:
    """Bytes of the serialized model (the file's size when it is unchanged from one)."""
    path = model_source_path(model)
    if path is not None and path.is_file():
        files = (path.parent / location for location in external_files(model))
        return path.stat().st_size + sum(f.stat().st_size for f in files if f.is_file())
    weights = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if weights > (1 << 30):
        return weights  # protobuf cannot hold it in one message; the weights dominate anyway
    return ir.to_proto(model).ByteSize()


def _check(
    original: ir.Model,
    optimized: ir.Model,
    target: str | None,
    example_inputs: Mapping[str, np.ndarray] | None,
    shapes: Mapping[str, tuple[int, ...]],
    verify: bool,
    measure: bool,
) -> tuple[ParityReport, LatencyCheck | None]:
    """Parity on ONNX Runtime (what the graph computes), latency on the target engine, both at
    the given inputs or sizes, else at inputs found by running the model (never a guess: a
    detector timed at a size it does not run at says nothing about it)."""
    from ferry.runtime import block_medians, found_inputs, load, random_feeds

    reference = load(original)
    candidate = load(optimized)
    how = ""  # the inputs given: their sizes say it
    if example_inputs is not None:
        feeds = dict(example_inputs)
        timed: dict[str, np.ndarray] | None = feeds
        why_not_timed = None
    else:
        try:
            found = found_inputs(original, shapes or None)
        except InvalidInputError as e:
            feeds = random_feeds(reference.inputs, shapes or None)
            timed, why_not_timed = None, str(e)
        else:
            feeds = timed = found.feeds
            why_not_timed = None
            how = f"{found.how}, found by running the model" if found.how else ""
    parity = ParityReport(skipped="not asked (verify=False)")
    if verify:
        # Random ops (a voice's noise) draw differently in each run: both are compared with
        # their draws at the expected value (graph.without_randomness), and timed as they are.
        steady, fixed = without_randomness(original)
        if fixed:
            want = load(steady).run(feeds)
            got = load(without_randomness(optimized)[0]).run(feeds)
        else:
            want, got = reference.run(feeds), candidate.run(feeds)
        parity = compare_outputs(got, want, inputs=feeds)
    if not measure:
        return parity, None
    engine = target or "onnxruntime"
    if timed is None:
        return parity, LatencyCheck(engine, skipped=why_not_timed)
    if _ops(original) == _ops(optimized):
        # Same ops, same counts: nothing was removed or fused that timing could tell apart
        # (measured: an unchanged 0.3 ms graph timed 0.82x "slower" on a busy 2-core machine).
        return parity, LatencyCheck(engine, skipped="the graph keeps every op; nothing to time")
    if engine != "onnxruntime":
        try:
            reference, candidate = load(original, backends=engine), load(optimized, backends=engine)
        except BackendUnavailableError as e:
            # The rules still apply (a model optimized here for a TensorRT box); the timing
            # belongs on that box: `ferry bench` there.
            return parity, LatencyCheck(engine, skipped=f"{engine} is not available here ({e})")
    runs = [lambda: reference.run(timed), lambda: candidate.run(timed)]
    inputs = {k: tuple(np.shape(v)) for k, v in timed.items()}

    def timed_check() -> LatencyCheck:
        before, after = block_medians(runs, TIMING_BUDGET_S)
        return LatencyCheck(engine, before * 1000, after * 1000, inputs, how=how)

    check = timed_check()
    if check.slower:
        # One slow verdict may be another process's burst: the second measurement decides.
        check = timed_check()
    return parity, check


def optimized_for_load(
    source: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    optimize_option: bool | str,
    *,
    backends: str | Sequence[str] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    example_inputs: Mapping[str, np.ndarray] | None = None,
) -> ir.Model:
    """What ``ferry.load(..., optimize=...)`` and ``ferry serve`` run: the model optimized for the
    first engine named (``True``: level basic; or a level's name), verified and timed as
    :func:`optimize` does; the input itself, with a warning naming why, when that is refused."""
    if optimize_option is True:
        level = "basic"
    elif isinstance(optimize_option, str) and optimize_option in ("basic", "extended"):
        level = optimize_option
    else:
        raise InvalidInputError(
            f"optimize must be True, False, 'basic' or 'extended', got {optimize_option!r}"
        )
    from ferry.backends import parse_backends

    names = [n for n in parse_backends(backends) if n != "auto"]
    target = names[0] if names and names[0] in TARGETS else None
    result = optimize(
        source, level=level, target=target, example_inputs=example_inputs, shapes=shapes
    )
    if not result.accepted:
        logger.warning("optimization not applied: %s", result.report.refused)
    return result.model
