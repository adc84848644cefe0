"""``quantize``: int8 (static QDQ or dynamic) or fp16 for a target engine, judged at the task and
timed there, or refused with the figures.

Before -> After::

    float model + calibration data (real samples; a quarter held back for judging)
        -> QuantizeResult: the quantized model (or the input, when it misses the budget even with
           its most sensitive nodes kept float, or runs slower), and a report: size, latency and the
           metric before and after, the nodes quantized and those kept float, the method

The accuracy loop: quantize everything the target quantizes; judge on the held-back samples
against the float model; while over budget, rank the quantized nodes by the error each adds
(its output's error against float, less the worst of its inputs') and return the worst to float,
doubling how many each round.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import BackendUnavailableError, InvalidInputError
from ferry.graph import load_model, reduced_precision, without_randomness
from ferry.optimizer._task import (
    METRICS,
    budget_fraction,
    latency_before_after,
    metric_spec,
    model_bytes,
    task_score,
    timing_engine,
)
from ferry.optimizer.quantize._bf16 import to_bf16, upgrade_opset
from ferry.optimizer.quantize._check import quantize_residual_inputs
from ferry.optimizer.quantize._data import ImagePreprocessing, Samples, load_samples, split
from ferry.optimizer.quantize._dequantize import dequantized
from ferry.optimizer.quantize._mse import write_mse_ranges
from ferry.optimizer.quantize._report import QuantizeReport, QuantizeResult
from ferry.optimizer.quantize._targets import (
    TARGETS,
    Scheme,
    drop_graph_output_qdq,
    ort_arguments,
    scheme,
)

__all__ = ["METHODS", "METRICS", "QuantizeReport", "QuantizeResult", "quantize"]

logger = logging.getLogger(__name__)

METHODS = ("auto", "minmax", "percentile", "entropy", "mse")
PRECISIONS = ("int8", "fp16", "bf16")
#: Targets whose engines run a bf16 graph: OpenVINO's CPU plugin (bf16 kernels on AVX512-BF16
#: and AMX, emulated elsewhere) and TensorRT. ONNX Runtime's CPU provider has no bf16 Conv,
#: pooling or activations, and TFLite no bf16 at all.
_BF16_TARGETS = ("openvino", "tensorrt")
#: Ops static quantization touches (ONNX Runtime's QDQ quantizer places the rest by them).
_WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
#: Ops dynamic quantization touches: MatMulInteger and the recurrent ops; ConvInteger has no
#: fast kernel on most CPUs.
_DYNAMIC_OPS = {"MatMul", "Gemm", "LSTM", "GRU", "Attention"}
#: Rounds of the accuracy loop (1, 2, 4, ... nodes kept float).
_MAX_ROUNDS = 7
#: Ops fp16 and bf16 keep in fp32: reductions and exponentials whose sums overflow half or lose
#: bf16's 8 bits of mantissa, normalizations, coordinates.
_FP16_KEEP = [
    "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceLogSumExp",
    "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Div", "LayerNormalization", "InstanceNormalization",
    "Resize", "Range", "CumSum", "TopK", "NonMaxSuppression", "Erf",
]  # fmt: skip


def quantize(
    model: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    data: Any = None,
    target: str = "onnxruntime",
    method: str = "auto",
    precision: str = "int8",
    per_channel: bool | None = None,
    dynamic: bool = False,
    budget: float | str = "1%",
    metric: str | Callable[..., Any] | None = None,
    random: bool = False,
    preprocessing: ImagePreprocessing | None = None,
    force: bool = False,
    requantize: bool = False,
) -> QuantizeResult:
    """Quantize ``model`` for ``target``, keep its most sensitive nodes float until it is within
    ``budget`` on held-back data, and time it on the target engine.

    Args:
        model: an ``.onnx`` file, an artifact, an ``onnx_ir.Model`` or a ``ModelProto``; never
            modified.
        data: calibration samples: a ``.npz``/``.npy`` file, a folder of images (with
            ``preprocessing``), or an iterable of feed dicts. A quarter is held back for judging.
        target: ``onnxruntime``, ``openvino``, ``tensorrt``, ``tflite`` or ``portable`` (what
            every target accepts): decides the scheme (signedness, symmetry, per-channel) and
            where latency is measured (ONNX Runtime for tflite/portable here).
        method: calibration: ``minmax``, ``percentile``, ``entropy``, ``mse``, or ``auto``
            (minmax and mse both tried, the more accurate kept).
        precision: ``int8``, ``fp16`` or ``bf16`` (numerically sensitive ops stay fp32; bf16
            for ``openvino`` and ``tensorrt``, judged on OpenVINO).
        per_channel: per-channel weights; None: the target's choice.
        dynamic: dynamic int8 (weights int8, activations quantized per call): for MatMul-,
            LSTM- and GRU-heavy models; needs no calibration data beyond judging.
        budget: how much of the metric may be lost: ``"1%"`` or ``0.01`` (score >= 0.99).
        metric: ``top1``, ``cosine``, ``mask`` (or ``mask@0.3``), ``seq``, ``"module:function"``
            (``(got, want) -> score``) or a callable; None: the judge the model's task
            calls for (:func:`ferry.parity.infer_judge`), named in the report.
        random: calibrate on random data (only with no ``data``): the result means nothing, and
            the report says so.
        preprocessing: how a folder of images becomes the input.
        force: keep the quantized model even when refused.
        requantize: for a source already quantized (QDQ, dynamic int8, weight-only int8):
            quantize its dequantized float graph (weights dequantized, activation Q/DQ dropped),
            judged and timed against the source as given. Without it such a source is refused:
            quantizing quantized ops again would round twice or make a model ONNX Runtime
            cannot run.

    Raises:
        InvalidInputError: unknown option values, no data, data that does not fit the model.
    """
    from ferry.runtime import load

    if target not in TARGETS:
        raise InvalidInputError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    if method not in METHODS:
        raise InvalidInputError(
            f"unknown calibration method {method!r}; use one of {', '.join(METHODS)}"
        )
    if precision not in PRECISIONS:
        raise InvalidInputError(
            f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}"
        )
    if precision == "bf16" and target not in _BF16_TARGETS:
        raise InvalidInputError(
            f"bf16 runs on {' and '.join(_BF16_TARGETS)}, not {target}: ONNX Runtime's CPU "
            "provider has no bf16 Conv, pooling or activations and TFLite has no bf16; use "
            "--target openvino (or tensorrt), or --precision fp16"
        )
    least = 1.0 - budget_fraction(budget)
    original = load_model(model)
    held = reduced_precision(original)
    source_words = held.describe() if held else ""
    if held and not requantize:
        spec = metric_spec(metric, least)
        return _refused_source(original, held.describe(), target, precision, spec, least)
    reference = load(original)
    samples = _samples(data, random, original, reference.inputs, preprocessing)
    # Random ops (a voice's noise) draw anew on every run: the source and each candidate are
    # judged with their draws at the expected value (graph.without_randomness).
    held_still = _steady(original)
    steady = reference if held_still is original else load(held_still)
    want = [steady.run(feed) for feed in samples.held_back]
    spec = metric_spec(metric, least, original, want[0])  # no metric: the task's, inferred
    # What is quantized: the source's float computation (the source itself when it is float);
    # judged and timed against the source as the user has it.
    floating = original
    if held:
        floating, how = dequantized(original)
        source_words += f"; {how}"

    quantized_nodes: tuple[str, ...] = ()
    kept: list[str] = []
    rounds = 0
    chosen = ""
    if precision == "fp16":
        work, description = _fp16(floating), "fp16, sensitive ops fp32"
        score = task_score(_steady(work), samples.held_back, want, spec)
        quantized_nodes = _computing_in(work, ir.DataType.FLOAT16)
    elif precision == "bf16":
        work, count = to_bf16(_prepared(floating), _FP16_KEEP)
        description = f"bf16 ({count} nodes), sensitive ops fp32"
        # ONNX Runtime cannot run it: judged where it runs (OpenVINO stands in for TensorRT).
        score = task_score(_steady(work), samples.held_back, want, spec, engine="openvino")
        quantized_nodes = _computing_in(work, ir.DataType.BFLOAT16)
    else:
        the_scheme = scheme(target, per_channel=per_channel)
        description = ("dynamic " if dynamic else "") + the_scheme.describe()
        with tempfile.TemporaryDirectory(prefix="ferry-quantize-") as tmp:
            source = Path(tmp) / "float.onnx"
            prepared = _prepared(floating)  # node names as the quantizer sees them
            onnx.save(ir.to_proto(prepared), source)
            quantizer = _Quantizer(
                source,
                Path(tmp),
                the_scheme,
                "minmax" if method == "auto" else method,
                dynamic,
                samples.calibration,
            )
            if dynamic:
                work = quantizer.run([])
                score = task_score(_steady(work), samples.held_back, want, spec)
            else:
                methods = ("minmax", "mse") if method == "auto" else (method,)
                work, score, chosen = _choose(
                    quantizer, methods, target, samples, want, spec, least
                )
            ranking: list[str] | None = None
            keep = 0
            while score < least and rounds < _MAX_ROUNDS:
                if ranking is None:
                    ranking = _sensitivity(_steady(prepared), _steady(work), samples.held_back[0])
                    if not ranking:
                        break
                keep = max(1, keep * 2)
                kept = ranking[:keep]
                work = quantizer.run(kept)
                score = task_score(_steady(work), samples.held_back, want, spec)
                rounds += 1
                if keep >= len(ranking):
                    break
        quantized_nodes = tuple(_quantized_nodes(work))
        method = quantizer.method

    quantizable = _quantizable(floating, precision, dynamic)
    timed = samples.held_back[0]
    if quantized_nodes:
        engine, before, after, skipped = latency_before_after(original, work, target, timed)
    else:  # nothing to time: the result computes as the float model does
        engine, before, after = timing_engine(target), None, None
        skipped = "nothing was quantized"
    refused = None
    if samples.random:
        refused = "calibrated on random data: the accuracy figures mean nothing (give real data)"
    elif not quantized_nodes:
        refused = (
            f"nothing was quantized (nodes quantized: 0 of {quantizable}; kept float: "
            f"{len(kept)}; {spec['kind']} {score:.4f}, budget {least:.4f}): the result would be "
            f"the float model labelled {precision}"
            + (
                "; every node was kept float to stay within the budget: a wider --budget, "
                "another --metric or --method, or more --data may leave some quantized"
                if kept
                else ""
            )
        )
    elif score < least:
        refused = (
            f"{spec['kind']} {score:.4f} is under the budget's {least:.4f} even with "
            f"{len(kept)} node(s) kept float"
        )
    elif before is not None and after is not None and after > before * 1.02:
        refused = f"slower on {engine}: {before:.3f} ms -> {after:.3f} ms"
    report = QuantizeReport(
        target=target,
        precision=precision,
        method=method if precision == "int8" and not dynamic else "-",
        scheme=description,
        samples=samples.describe(),
        metric=spec,
        budget=least,
        score_before=1.0,
        score_after=score,
        engine=engine,
        latency_before_ms=before,
        latency_after_ms=after,
        latency_skipped=skipped,
        bytes_before=model_bytes(original),
        bytes_after=model_bytes(work),
        quantized=quantized_nodes,
        kept_float=tuple(kept),
        rounds=rounds,
        chosen=chosen,
        refused=refused,
        forced=force and refused is not None,
        source=source_words,
        quantizable=quantizable,
        timed_at=_sizes(timed) + " (the data's sizes)",
    )
    if refused is not None and not force:
        return QuantizeResult(original, report)
    return QuantizeResult(work, report)


def _refused_source(
    original: ir.Model,
    held: str,
    target: str,
    precision: str,
    spec: Mapping[str, Any],
    least: float,
) -> QuantizeResult:
    """The refusal of a source already quantized, before any data is read."""
    refused = (
        f"the model is already quantized: {held}. Quantizing it again would quantize "
        "quantized ops (rounding twice, or a model ONNX Runtime cannot run). Give "
        "--requantize to quantize its dequantized float graph instead (judged and timed "
        "against this model; in a compress recipe, quantize:int8:requantize), or quantize "
        "its float original"
    )
    report = QuantizeReport(
        target=target,
        precision=precision,
        method="-",
        scheme="-",
        samples="not read",
        metric=spec,
        budget=least,
        score_before=1.0,
        score_after=float("nan"),
        engine=timing_engine(target),
        latency_before_ms=None,
        latency_after_ms=None,
        latency_skipped="refused before quantizing",
        bytes_before=model_bytes(original),
        bytes_after=model_bytes(original),
        quantized=(),
        kept_float=(),
        rounds=0,
        refused=refused,
        source=held,
    )
    # Not forced even with --force: nothing was made to write.
    return QuantizeResult(original, report)


def _steady(model: ir.Model) -> ir.Model:
    """``model`` with its random draws at their expected value (itself when it has none)."""
    return without_randomness(model)[0]


def _quantizable(model: ir.Model, precision: str, dynamic: bool) -> int:
    """Nodes ``precision`` could quantize in ``model``: weighted ops for int8 (the dynamic
    quantizer's for dynamic), every computing node for fp16/bf16."""
    if precision != "int8":
        return sum(node.op_type != "Cast" for node in model.graph)
    ops = _DYNAMIC_OPS if dynamic else _WEIGHTED
    return sum(node.op_type in ops for node in model.graph)


def _sizes(feed: Mapping[str, np.ndarray]) -> str:
    """``x 1x3x48x320, mask 1x32``: the sizes a feed times the model at."""
    return ", ".join(f"{k} {'x'.join(map(str, np.shape(v))) or 'scalar'}" for k, v in feed.items())


def _samples(
    data: Any,
    random: bool,
    model: ir.Model,
    inputs: Sequence[Any],
    preprocessing: ImagePreprocessing | None,
) -> Samples:
    if data is not None:
        if random:
            raise InvalidInputError("give calibration data or random, not both")
        return load_samples(data, inputs, preprocessing=preprocessing)
    if not random:
        raise InvalidInputError(
            "quantization needs calibration data (--data: a .npz, .npy or a folder of images): "
            "ranges calibrated on anything else mean nothing. --random only tries the pipeline"
        )
    from ferry.runtime import found_inputs

    logger.warning("calibrating on RANDOM data: the quantized model's accuracy means nothing")
    # At sizes the model runs at (found by running it), with ids inside the tables they index.
    found = found_inputs(model)
    rng = np.random.default_rng(0)
    # Eight samples from one probe: float tensors drawn again; ids, masks and the scalars or
    # vectors found by use (a voice's noise scales) kept as found.
    feeds = [
        {
            k: rng.standard_normal(v.shape).astype(v.dtype)
            if v.dtype.kind == "f" and v.ndim >= 2
            else v
            for k, v in found.feeds.items()
        }
        for _ in range(8)
    ]
    return split(feeds, f"random data at {found.how}", random=True)


def _choose(
    quantizer: _Quantizer,
    methods: Sequence[str],
    target: str,
    samples: Samples,
    want: Sequence[Mapping[str, np.ndarray]],
    spec: Mapping[str, Any],
    least: float,
) -> tuple[ir.Model, float, str]:
    """Quantize with each of the scheme's placements and each calibration method, and keep one
    for the accuracy loop (the model, its score, the choice in words; ``quantizer`` keeps it).

    Ranges do not change the graph, so a placement keeps its most accurate method (timing
    them would only measure noise: minmax won on the kit's CTC recognizers, MSE on its
    detectors, captcha_det cosine 0.9990 against 0.9968). Placements change what the engine
    fuses: of those within budget the fastest on the target engine is kept, or the more
    accurate of two within 3% of each other (this machine's timing noise); none within
    budget: the most accurate.
    """
    from ferry.runtime import block_medians, load

    candidates = [(p, m) for p in quantizer.scheme.placements for m in methods]
    models: dict[tuple[str, str], ir.Model] = {}
    failed: dict[str, str] = {}
    for c in candidates:
        if c[1] in failed:
            continue
        try:
            models[c] = quantizer.run([], *c)
        except ValueError as e:
            # Histogram calibrators (mse, percentile, entropy) cannot bin a tensor holding inf
            # or a constant integer range (the kit's DETR tiles: "range [0.0, inf] is not
            # finite"): that method is out, the others stay.
            failed[c[1]] = str(e)
    if not models:
        raise InvalidInputError(
            "calibration failed on this model's values with "
            + "; ".join(f"{m}: {e}" for m, e in failed.items())
            + ": try --method minmax"
        )
    candidates = [c for c in candidates if c in models]
    methods = [m for m in methods if m not in failed]
    scores = {c: task_score(_steady(m), samples.held_back, want, spec) for c, m in models.items()}
    best = {  # each placement's most accurate method (the first on a tie)
        p: max((c for c in candidates if c[0] == p), key=lambda c: scores[c])
        for p in quantizer.scheme.placements
    }
    finalists = list(best.values())
    within = [c for c in finalists if scores[c] >= least]
    chosen = max(within or finalists, key=lambda c: scores[c])
    words = f"{chosen[0]}, {chosen[1]} calibration"
    if len(methods) > 1:
        words += (
            " ("
            + ", ".join(f"{m} {spec['kind']} {scores[(chosen[0], m)]:.4f}" for m in methods)
            + ")"
        )
    words += "".join(f"; {m} calibration failed ({e})" for m, e in failed.items())
    if len(finalists) > 1:
        engine = timing_engine(target)
        try:
            sessions = [load(models[c], backends=engine) for c in finalists]
        except BackendUnavailableError as e:
            words += (
                f"; the most accurate placement: {engine} is not available here to time them ({e})"
            )
        else:
            feed = dict(samples.held_back[0])
            runs: list[Callable[[], object]] = [
                functools.partial(session.run, feed) for session in sessions
            ]
            ms = {c: t * 1000 for c, t in zip(finalists, block_medians(runs, 1.0), strict=True)}
            if within:
                fastest = min(ms[c] for c in within)
                close = [c for c in within if ms[c] <= fastest * 1.03]
                chosen = max(close, key=lambda c: scores[c])
            words = f"{chosen[0]}, {chosen[1]} calibration, chosen on {engine}: " + "; ".join(
                f"{p}/{m} {ms[(p, m)]:.3f} ms, {spec['kind']} {scores[(p, m)]:.4f}"
                for p, m in finalists
            )
    quantizer.placement, quantizer.method = chosen
    return models[chosen], scores[chosen], words


class _Quantizer:
    """ONNX Runtime's quantizer for one model and scheme, re-run with nodes kept float."""

    def __init__(
        self,
        source: Path,
        folder: Path,
        the_scheme: Any,
        method: str,
        dynamic: bool,
        calibration: list[dict[str, np.ndarray]],
    ) -> None:
        self.source, self.folder, self.scheme = source, folder, the_scheme
        self.method, self.dynamic, self.calibration = method, dynamic, calibration
        self.placement = the_scheme.placements[0]
        self.count = 0

    def run(
        self, keep_float: list[str], placement: str | None = None, method: str | None = None
    ) -> ir.Model:
        """The model quantized with ``keep_float`` nodes left float, activations quantized at
        ``placement`` with ranges from ``method`` (None: :attr:`placement`, :attr:`method`)."""
        self.count += 1
        out = self.folder / f"q{self.count}.onnx"
        import onnxruntime

        quiet = _QuietAdvice()
        logging.getLogger().addFilter(quiet)
        # The calibrator's own sessions log the engine's warnings (a model's wrong declared
        # output shape, say) straight to the terminal; ferry's sessions keep them quiet too.
        onnxruntime.set_default_logger_severity(3)
        try:
            return self._run(
                out,
                keep_float,
                self.scheme.with_placement(placement or self.placement),
                method or self.method,
            )
        finally:
            logging.getLogger().removeFilter(quiet)
            onnxruntime.set_default_logger_severity(2)

    def _run(self, out: Path, keep_float: list[str], the_scheme: Scheme, method: str) -> ir.Model:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            quantize_dynamic,
            quantize_static,
        )

        arguments = ort_arguments(the_scheme)
        if self.dynamic:
            quantize_dynamic(  # needs no calibration
                self.source,
                out,
                weight_type=arguments["weight_type"],
                per_channel=arguments.get("per_channel", False),
                nodes_to_exclude=keep_float,
                op_types_to_quantize=sorted(_DYNAMIC_OPS),
            )
            return ir.load(out)

        calibration = self.calibration

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.items = iter(calibration)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.items, None)

        # MSE ranges are ours, saved as the cache of the histogram calibrator that collects them.
        methods = {
            "minmax": CalibrationMethod.MinMax,
            "percentile": CalibrationMethod.Percentile,
            "entropy": CalibrationMethod.Entropy,
            "mse": CalibrationMethod.Percentile,
        }
        cache = self.folder / f"ranges-{method}.json"
        if method == "mse" and not cache.exists():
            write_mse_ranges(self.source, Reader(), self.folder, cache)
        with contextlib.redirect_stdout(io.StringIO()):  # ONNX Runtime's calibrators print
            quantize_static(
                self.source,
                out,
                Reader(),
                # Only the ops with weights (and their inputs/outputs): quantizing elementwise
                # ops too (Add, Mul, Sigmoid...) cost the kit's text recognizer most of its
                # accuracy, which keeping every Conv float could not win back.
                op_types_to_quantize=sorted(_WEIGHTED),
                nodes_to_exclude=keep_float,
                calibrate_method=methods[method],
                # Ranges once, reused as the accuracy loop re-quantizes with nodes kept float.
                calibration_cache_path=cache,
                **arguments,
            )
        model = ir.load(out)
        if the_scheme.residual_qdq:
            quantize_residual_inputs(model)
        if not the_scheme.qdq_on_graph_outputs:
            # ONNX Runtime cannot leave just the graph outputs float (its switch is per op type,
            # which would also stop the engines fusing DQ -> Conv -> Q inside the graph).
            drop_graph_output_qdq(model)
        return model


def _prepared(model: ir.Model) -> ir.Model:
    """The float model as the quantizer should see it: ferry's basic optimization (BatchNorms and
    biases folded into their Convs, shape arithmetic constant) and inferred types, which is the
    pre-processing ONNX Runtime's quantizer asks for."""
    from ferry.graph import prepare
    from ferry.optimizer._pipeline import pipeline, rule_context

    work = prepare(model)
    # Per-channel QuantizeLinear/DequantizeLinear (their axis) are opset 13; ONNX Runtime's
    # quantizer writes them at the model's opset, and ONNX Runtime then refuses the model.
    upgrade_opset(work, 13)
    pipeline(rule_context(work, "basic", None))(work)
    return prepare(work)


class _QuietAdvice(logging.Filter):
    """Keeps ONNX Runtime's quantizer's advice off the user's terminal: it logs to the root
    logger on every call (pre-process, which :func:`_prepared` does; "Bias of Gemm node ... is
    not constant. Please exclude this node"). Below ERROR it goes to ferry's debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        logger.debug("onnxruntime's quantizer: %s", record.getMessage())
        return False


def _quantized_nodes(model: ir.Model) -> list[str]:
    """Weighted nodes reading a dequantized (or integer) input: those that run quantized."""
    found = []
    for node in model.graph:
        if node.op_type in (
            "MatMulInteger",
            "ConvInteger",
            "DynamicQuantizeLSTM",
            "QLinearConv",
            "QLinearMatMul",
        ):
            found.append(node.name or node.op_type)
            continue
        if node.op_type not in _WEIGHTED:
            continue
        producers = [v.producer() for v in node.inputs if v is not None]
        if any(p is not None and p.op_type == "DequantizeLinear" for p in producers):
            found.append(node.name or node.op_type)
    return found


def _computing_in(model: ir.Model, dtype: ir.DataType) -> tuple[str, ...]:
    """Nodes (Casts aside) with an output in ``dtype``: those that compute in fp16/bf16."""
    return tuple(
        node.name or node.op_type
        for node in model.graph
        if node.op_type != "Cast" and any(v.dtype == dtype for v in node.outputs)
    )


def _sensitivity(
    original: ir.Model, quantized: ir.Model, feed: Mapping[str, np.ndarray]
) -> list[str]:
    """Quantized weighted nodes, the most harmful first: the relative error of each one's output
    against the float model, less the worst of its inputs' (what it adds, not what it inherits)."""
    from ferry.runtime import all_values

    want = all_values(original, feed)
    got = all_values(quantized, feed)
    by_name = {n.name: n for n in original.graph}

    def error(name: str | None) -> float:
        if not name or name not in want or name not in got:
            return 0.0
        w, g = np.asarray(want[name], np.float64), np.asarray(got[name], np.float64)
        if w.shape != g.shape or w.dtype.kind != "f":
            return 0.0
        return float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-12))

    added: list[tuple[float, str]] = []
    for name in _quantized_nodes(quantized):
        node = by_name.get(name)
        if node is None:
            continue
        own = max((error(v.name) for v in node.outputs), default=0.0)
        inherited = max((error(v.name) for v in node.inputs if v is not None), default=0.0)
        added.append((own - inherited, name))
    return [name for _, name in sorted(added, reverse=True)]


def _fp16(model: ir.Model) -> ir.Model:
    """Float16 weights and compute, inputs and outputs kept float32, sensitive ops in fp32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = convert_float_to_float16(
        ir.to_proto(model), keep_io_types=True, op_block_list=_FP16_KEEP
    )
    return ir.from_proto(proto)
