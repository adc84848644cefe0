"""What :func:`ferry.optimizer.quantize.quantize` hands back: the model and its report, in words
and as JSON (saved beside the model, or into an artifact's ``ferry.json``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from ferry.graph import atomic_path, save_model
from ferry.optimizer._task import judge_line

__all__ = ["QuantizeReport", "QuantizeResult"]


@dataclasses.dataclass(frozen=True)
class QuantizeReport:
    """What quantizing did, measured.

    Attributes:
        target / precision / method / scheme: what was asked and how the target wants it.
        samples: the calibration data, in words.
        metric: the judge (spec) and ``score_before`` (1: the float model against itself) /
            ``score_after`` on the held-back samples; ``budget``: the least score allowed.
        latency_before_ms / latency_after_ms / engine: timed on the target engine at the
            samples' sizes (None with ``latency_skipped`` saying why).
        bytes_before / bytes_after: the serialized models.
        quantized: nodes that run quantized (int8, or fp16/bf16); ``kept_float``: nodes the loop returned to float.
        chosen: where activations were quantized (``inputs`` or ``inputs+outputs``) with which
            calibration and, where candidates were compared on the target engine, each one's
            latency and score.
        refused: why the input was kept (nothing quantized, already quantized, over budget,
            slower); ``forced``: kept anyway.
        source: what the source already held (``static QDQ (...)``) and, re-quantized, how its
            float graph was recovered; empty for a float source.
        quantizable: the nodes the precision could have quantized.
        timed_at: the sizes the two were timed at, and where they came from.
    """

    target: str
    precision: str
    method: str
    scheme: str
    samples: str
    metric: Mapping[str, Any]
    budget: float
    score_before: float
    score_after: float
    engine: str
    latency_before_ms: float | None
    latency_after_ms: float | None
    latency_skipped: str | None
    bytes_before: int
    bytes_after: int
    quantized: tuple[str, ...]
    kept_float: tuple[str, ...]
    rounds: int
    chosen: str = ""
    refused: str | None = None
    forced: bool = False
    source: str = ""
    quantizable: int = 0
    timed_at: str = ""

    @property
    def speedup(self) -> float | None:
        if not self.latency_before_ms or not self.latency_after_ms:
            return None
        return self.latency_before_ms / self.latency_after_ms

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["metric"] = {k: v for k, v in self.metric.items() if k != "function"}
        d["speedup"] = self.speedup
        if math.isnan(self.score_after):  # not judged (refused before quantizing): JSON null
            d["score_after"] = None
        return d

    def lines(self) -> list[str]:
        """The report in words, for the CLI."""
        if math.isnan(self.score_after):  # refused before anything was made: the source
            return [f"{self.precision} for {self.target}", f"source: {self.source}"]
        out = [
            f"{self.precision} for {self.target} ({self.scheme}"
            + (f"; {self.method} calibration)" if self.method != "-" else ")"),
            f"data: {self.samples}",
            judge_line(self.metric),
        ]
        if self.source:
            out.append(f"source: {self.source}")
        out.append(
            f"{self.metric.get('kind')}: {self.score_before:.4f} -> {self.score_after:.4f} "
            f"(budget: at least {self.budget:.4f})"
        )
        if self.latency_skipped:
            out.append(f"latency not measured: {self.latency_skipped}")
        elif self.latency_before_ms is not None and self.latency_after_ms is not None:
            out.append(
                f"latency on {self.engine}: {self.latency_before_ms:.3f} ms -> "
                f"{self.latency_after_ms:.3f} ms ({self.speedup:.2f}x)"
                + (f" at {self.timed_at}" if self.timed_at else "")
            )
        out.append(f"size: {self.bytes_before / 1e6:.2f} MB -> {self.bytes_after / 1e6:.2f} MB")
        if self.chosen:
            out.append(f"Q/DQ placement: {self.chosen}")
        out.append(
            f"nodes quantized: {len(self.quantized)} of {self.quantizable}; "
            f"kept float: {len(self.kept_float)}"
        )
        if self.kept_float:
            out.append(
                "kept float: "
                + ", ".join(self.kept_float[:12])
                + (" ..." if len(self.kept_float) > 12 else "")
            )
        return out


@dataclasses.dataclass
class QuantizeResult:
    """The outcome of :func:`quantize`: ``model`` (the input itself when refused and not forced)
    and ``report``."""

    model: ir.Model
    report: QuantizeReport

    @property
    def accepted(self) -> bool:
        return self.report.refused is None or self.report.forced

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model atomically, and the report as JSON beside it (``OUT.quantize.json``;
        in an artifact folder, ``ferry.json``'s ``"quantization"``)."""
        out = save_model(self.model, path)
        report = self.report.to_dict()
        artifact = out.parent / "ferry.json"
        if out.name == "model.onnx" and artifact.is_file():
            try:
                data = json.loads(artifact.read_text(encoding="utf-8"))
            except ValueError:
                data = {}
            data["quantization"] = report
            target = artifact
        else:
            data, target = report, out.with_suffix(".quantize.json")
        with atomic_path(target) as tmp:
            tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        return out
