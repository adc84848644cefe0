"""``compress``: pruning, distillation and quantization chained by a recipe, each stage measured.

Before -> After::

    model + recipe "prune:channel=0.3,distill:epochs=5,quantize:int8" + data
        -> CompressResult: the last stage's model, and a report with one row per stage (the
           original first): size, MACs, latency on the target engine against the original,
           the metric at the task against the original on held-back samples, and each stage's
           own report

The data is split once: a quarter is held back and judges every stage against the original
model; distillation trains and quantization calibrates on the rest only, so no stage is judged
on what it saw. Distillation's teacher is always the original model. A quantization stage that
refuses its result (over its budget, or slower) hands its input on, and the row says so. The
whole chain is refused, like a quantization, when the end result loses more than ``budget`` or
runs slower than the original.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import atomic_path, load_model, save_model
from ferry.optimizer._task import (
    budget_fraction,
    judge_line,
    latency_before_after,
    metric_spec,
    model_bytes,
    task_score,
)

__all__ = ["STAGES", "CompressReport", "CompressResult", "Stage", "StageRow", "compress", "parse"]

logger = logging.getLogger(__name__)

STAGES = ("prune", "distill", "quantize")

#: Each stage's options as the recipe spells them, and the type each value takes.
_OPTIONS: dict[str, dict[str, type]] = {
    "prune": {
        "method": str,
        "sparsity": float,
        "criterion": str,
        "exclude": str,
        "multiple": int,
    },
    "distill": {
        "epochs": int,
        "lr": float,
        "batch_size": int,
        "temperature": float,
        "alpha": float,
        "max_seconds": float,
    },
    "quantize": {
        "precision": str,
        "method": str,
        "budget": str,
        "dynamic": bool,
        "per_channel": bool,
        "requantize": bool,  # a source already quantized: quantize its float graph
    },
}
_PRUNE_METHODS = ("channel", "magnitude", "2:4")
_PRECISIONS = ("int8", "fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of a recipe: ``name`` (prune, distill, quantize) and its options."""

    name: str
    options: Mapping[str, Any]

    def __str__(self) -> str:
        words = [f"{k}={v}" for k, v in self.options.items()]
        return self.name + (":" + ":".join(words) if words else "")


def parse(recipe: str) -> list[Stage]:
    """``"prune:channel=0.3,distill:epochs=5,quantize:int8"`` -> the stages, checked.

    Stages are separated by commas; a stage's options follow its name after colons, as
    ``key=value`` or a bare word: ``prune:channel=0.3`` (method channel, sparsity 0.3),
    ``prune:2:4``, ``prune:magnitude=0.5:criterion=l2:exclude=conv1+conv2``,
    ``prune:channel=0.5:multiple=1`` (exact counts, not the CPU's channel block),
    ``distill:epochs=5:lr=0.0005``, ``quantize:int8``, ``quantize:fp16``,
    ``quantize:int8:method=mse:budget=2%``, ``quantize:int8:requantize`` (a quantized source).

    Raises:
        InvalidInputError: an unknown stage, option or value, named with the known ones.
    """
    if not recipe or not recipe.strip():
        raise InvalidInputError(
            "the recipe is empty; give stages such as prune:channel=0.3,distill:epochs=5,quantize:int8"
        )
    stages = []
    # "2:4" is a method, not two options: kept whole while splitting on colons.
    for text in recipe.replace("2:4", "2\x004").split(","):
        name, *words = (w.strip().replace("\x00", ":") for w in text.split(":"))
        if name not in STAGES:
            raise InvalidInputError(
                f"unknown recipe stage {name!r} in {recipe!r}; use {', '.join(STAGES)}"
            )
        stages.append(Stage(name, _stage_options(name, words, recipe)))
    return stages


def _stage_options(name: str, words: Sequence[str], recipe: str) -> dict[str, Any]:
    known = _OPTIONS[name]
    options: dict[str, Any] = {}
    for word in words:
        if not word:
            continue
        key, has_value, value = word.partition("=")
        key = key.replace("-", "_")
        if name == "prune" and key in _PRUNE_METHODS:
            options["method"] = key
            if has_value:
                options["sparsity"] = _typed(name, "sparsity", value, float)
            continue
        if name == "quantize" and key in _PRECISIONS and not has_value:
            options["precision"] = key
            continue
        if key not in known:
            hint = {
                "prune": f"a method ({', '.join(_PRUNE_METHODS)})[=sparsity] or ",
                "quantize": f"a precision ({', '.join(_PRECISIONS)}) or ",
                "distill": "",
            }[name]
            raise InvalidInputError(
                f"unknown option {word!r} for the {name} stage in {recipe!r}; use {hint}"
                f"{', '.join(f'{k}=...' for k in known)}"
            )
        kind = known[key]
        options[key] = True if kind is bool and not has_value else _typed(name, key, value, kind)
    if name == "prune" and "exclude" in options:
        options["exclude"] = tuple(n for n in str(options["exclude"]).split("+") if n)
    return options


def _typed(stage: str, key: str, value: str, kind: type) -> Any:
    if kind is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
    else:
        try:
            return kind(value)
        except ValueError:
            pass
    words = {int: "an integer", float: "a number", bool: "true or false"}.get(kind, "text")
    raise InvalidInputError(f"{stage}:{key} takes {words}, got {value!r}")


@dataclasses.dataclass
class StageRow:
    """What one stage left: the model's size, MACs, latency and score against the original."""

    stage: str
    bytes: int
    macs: int | None
    #: Milliseconds per call on the target engine: the original's, measured in the same blocks.
    latency_ms: float | None
    original_latency_ms: float | None
    #: The metric against the original model on the held-back samples (1.0: the same).
    score: float
    #: Why the stage handed its input on unchanged (quantization refused, distillation did not
    #: help), or None.
    skipped: str | None = None
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        if not self.latency_ms or not self.original_latency_ms:
            return None
        return self.original_latency_ms / self.latency_ms


@dataclasses.dataclass
class CompressReport:
    recipe: str
    target: str
    engine: str
    metric: str
    budget: float
    samples: int
    held_back: int
    rows: list[StageRow]
    #: How far apart two timings of the original fell (0.05: 5%); slower means beyond twice it.
    timing_noise: float = 0.0
    #: The judge in words (``judge: top1 on 'prob' (...)``).
    judge: str = ""
    #: Why the end result is refused (over budget or slower), or None.
    refused: str | None = None
    forced: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for row, out in zip(self.rows, data["rows"]):
            out["speedup"] = row.speedup
        return json.loads(json.dumps(data, default=_plain))

    def lines(self) -> list[str]:
        """The stage table and the verdict, as printed by ``ferry compress``."""
        width = max(len(row.stage) for row in self.rows) + 2
        out = [
            f"recipe {self.recipe}; judged by {self.metric} on {self.held_back} held-back of "
            f"{self.samples} samples; timed on {self.engine}",
            *([self.judge] if self.judge else []),
            f"{'stage':<{width}}{'size':>10}{'MMACs':>10}{'ms':>9}{'orig ms':>9}{'speedup':>9}"
            f"{'score':>8}",
        ]
        for row in self.rows:
            macs = f"{row.macs / 1e6:.1f}" if row.macs is not None else "-"
            ms = f"{row.latency_ms:.3f}" if row.latency_ms is not None else "-"
            # The original, timed in the same blocks as this stage's model.
            orig = f"{row.original_latency_ms:.3f}" if row.original_latency_ms is not None else "-"
            speedup = f"{row.speedup:.2f}x" if row.speedup is not None else "-"
            out.append(
                f"{row.stage:<{width}}{_megabytes(row.bytes):>10}{macs:>10}{ms:>9}{orig:>9}"
                f"{speedup:>9}{row.score:>8.4f}"
            )
            if row.skipped:
                out.append(f"  handed on unchanged: {row.skipped}")
        if self.refused:
            out.append(f"refused: {self.refused}" + (" (written: --force)" if self.forced else ""))
        return out


@dataclasses.dataclass
class CompressResult:
    """The outcome of :func:`compress`: ``model`` (the input itself when refused and not
    forced) and ``report``."""

    model: ir.Model
    report: CompressReport

    @property
    def accepted(self) -> bool:
        return self.report.refused is None or self.report.forced

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model atomically, and the report beside it (``OUT.compress.json``)."""
        out = save_model(self.model, path)
        report = out.with_suffix(".compress.json")
        with atomic_path(report) as tmp:
            tmp.write_text(json.dumps(self.report.to_dict(), indent=2) + "\n", encoding="utf-8")
        return out


def compress(
    model: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    recipe: str | Sequence[Stage],
    data: Any,
    target: str = "onnxruntime",
    metric: str | None = None,
    budget: float | str = "1%",
    seed: int = 0,
    preprocessing: Any = None,
    force: bool = False,
    progress: bool = False,
) -> CompressResult:
    """Run ``recipe``'s stages on ``model`` in order and measure each against the original.

    Args:
        model: an ``.onnx`` file, an artifact, an ``onnx_ir.Model`` or a ``ModelProto``; never
            modified.
        recipe: a recipe string (see :func:`parse`) or stages.
        data: real samples (a ``.npz``/``.npy``, a folder of images with ``preprocessing``, or
            feed dicts); a quarter judges, the rest trains and calibrates. Unlabeled is enough.
        target: the engine the result is for: quantization follows its rules and every stage
            is timed on it (``onnxruntime``, ``openvino``, ``tensorrt``, ``tflite``,
            ``portable``; ONNX Runtime stands in for the last two).
        metric: ``top1``, ``cosine``, ``mask``, ``seq`` or ``module:function``; None: the judge
            the model's task calls for (:func:`ferry.parity.infer_judge`), named in the report.
        budget: how much of the metric the end result may lose against the original.
        seed: makes distillation repeatable.
        force: keep the end result even when refused.
        progress: show distillation's progress bar.

    Raises:
        InvalidInputError: a bad recipe, data that does not fit the model, unknown options.
    """
    from ferry.optimizer.quantize import load_samples
    from ferry.runtime import load

    stages = parse(recipe) if isinstance(recipe, str) else list(recipe)
    if not stages:
        raise InvalidInputError("the recipe has no stages")
    least = 1.0 - budget_fraction(budget)
    original = load_model(model)  # a path, an artifact, an ir.Model (as is) or a ModelProto
    reference = load(original)
    samples = load_samples(data, reference.inputs, preprocessing=preprocessing)
    want = [reference.run(dict(feed)) for feed in samples.held_back]
    spec = metric_spec(metric, least, original, want[0])  # no metric: the task's, inferred
    feed = samples.held_back[0]

    # The original against itself: how far apart two timings of one model fall here, now. A
    # stage is called slower only beyond that (a busy machine must not refuse a small model).
    engine, before_ms, again_ms, why_not = latency_before_after(original, original, target, feed)
    if why_not:
        logger.warning("latency not measured: %s", why_not)
    noise = abs(1.0 - again_ms / before_ms) if before_ms and again_ms else 0.0
    rows = [
        StageRow(
            "original",
            model_bytes(original),
            _macs(original),
            before_ms,
            before_ms,
            1.0,
        )
    ]
    current = original
    for stage in stages:
        logger.info("compress: %s", stage)
        current, skipped, details = _run_stage(
            stage, current, original, samples, target, seed, progress
        )
        _, before, after, _ = latency_before_after(original, current, target, feed)
        rows.append(
            StageRow(
                str(stage),
                model_bytes(current),
                _macs(current),
                after,
                before,
                task_score(current, samples.held_back, want, spec),
                skipped,
                details,
            )
        )
    report = CompressReport(
        recipe=",".join(str(s) for s in stages),
        target=target,
        engine=engine,
        metric=str(metric or spec["kind"]),
        judge=judge_line(spec),
        budget=1.0 - least,
        samples=len(samples.calibration) + len(samples.held_back),
        held_back=len(samples.held_back),
        rows=rows,
        timing_noise=noise,
        forced=force,
    )
    last = rows[-1]
    if all(row.skipped for row in rows[1:]):
        # Every stage handed its input on: writing it would label the input compressed.
        report.refused = "no stage changed the model: " + "; ".join(
            f"{row.stage}: {row.skipped}" for row in rows[1:]
        )
    elif last.score < least:
        report.refused = (
            f"the result scores {last.score:.4f} against the original, under {least:.4f} "
            f"(budget {report.budget:.1%})"
        )
    elif last.speedup is not None and last.speedup < 1.0 - max(0.02, 2 * noise):
        report.refused = (
            f"the result runs slower than the original ({last.speedup:.2f}x; two timings of the "
            f"original differ by {noise:.0%} here)"
        )
    if report.refused and not force:
        return CompressResult(original, report)
    return CompressResult(current, report)


def _run_stage(
    stage: Stage,
    current: ir.Model,
    original: ir.Model,
    samples: Any,
    target: str,
    seed: int,
    progress: bool,
) -> tuple[ir.Model, str | None, dict[str, Any]]:
    """Run one stage: (its model, why it handed its input on or None, its own report)."""
    options = dict(stage.options)
    if stage.name == "prune":
        from ferry.optimizer.prune import prune

        # With data at hand, channels are ranked by what they carry on it (unless the recipe
        # names a criterion), and the next layers are re-centred after the cut: on the kit's
        # PP-LCNet at 30%, l1 left a model that answered one class for every image.
        options.setdefault("criterion", "activation")
        result = prune(current, data=samples.calibration, **options)
        return result.model, None, result.report.to_dict()
    if stage.name == "distill":
        from ferry.optimizer.distill import distill

        distilled = distill(
            original, current, data=samples.calibration, seed=seed, progress=progress, **options
        )
        report = distilled.report.to_dict()
        return distilled.model, distilled.report.unchanged, report
    from ferry.optimizer.quantize import quantize

    quantized = quantize(current, data=samples.calibration, target=target, **options)
    report = quantized.report.to_dict()
    if not quantized.accepted:
        return current, f"quantization refused: {quantized.report.refused}", report
    return quantized.model, None, report


def _macs(model: ir.Model) -> int | None:
    from ferry.optimizer.prune import macs

    try:
        return int(macs(model))
    except Exception as e:  # a count is a nicety: a model it cannot size still compresses
        logger.debug("MACs not counted: %s", e)
        return None


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 1e5 else f"{size / 1e3:.1f} KB"


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)
