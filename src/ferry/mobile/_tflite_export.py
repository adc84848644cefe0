"""``export_tflite``: an ONNX model as a verified ``.tflite`` file, and its report.

The model is lowered (:mod:`._lower`), serialized by :func:`ferry.tflite.write_tflite`, and run
in LiteRT twice per sample (XNNPACK as a phone runs it, then LiteRT's reference kernels) against
ONNX Runtime on the source model. fp32 must meet :mod:`ferry.parity`'s tolerance contract;
fp16, whose weights round by design, the default accuracy budget (cosine 0.999, argmax agreement
99%); int8 a cosine of 0.99 against ONNX Runtime on the same quantized model
(:data:`INT8_BUDGET`). A failed check writes nothing (``verify=False`` skips it).
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

from ferry.errors import ConversionError, InvalidInputError
from ferry.graph import atomic_path, graph_inputs, load_model, model_source_path, shape_of
from ferry.mobile._litert import KERNELS, LiteRT, Placement
from ferry.mobile._tflite_lower import (
    IOInfo,
    Lowered,
    ModelSource,
    is_dynamic_int8,
    lower_model,
    optional_inputs,
    source_precision,
)
from ferry.parity import (
    BudgetVerdict,
    ParityReport,
    compare_outputs,
    task_judge_at,
    within_budget,
)

__all__ = ["TFLiteExport", "TFLiteReport", "Verification", "export_tflite"]

logger = logging.getLogger(__name__)

#: Samples generated when the caller gives none.
GENERATED_SAMPLES = 2

#: What an int8 export must keep against ONNX Runtime on the same quantized model. Integer
#: kernels round differently from one engine to the next (ONNX Runtime's optimized and
#: unoptimized runs of one QDQ kit model differ by 0.25% cosine), and argmax agreement on raw
#: regression maps measures that noise; ``ferry quantize`` accepts 1% at the task.
INT8_BUDGET: tuple[dict[str, Any], ...] = ({"kind": "cosine", "min": 0.99},)


@dataclasses.dataclass(frozen=True)
class Verification:
    """How the export ran with one kernel set against ONNX Runtime.

    Attributes:
        placement: which ops the delegate took.
        parity: per output, the largest absolute and relative error over all samples.
        budget: for fp16 and int8, the accuracy budget's verdict (the parity figures are then
            reported, not required).
    """

    placement: Placement
    parity: ParityReport
    budget: BudgetVerdict | None = None

    @property
    def passed(self) -> bool:
        return self.budget.passed if self.budget is not None else self.parity.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": self.placement.kernels,
            "passed": self.passed,
            "placement": self.placement.to_dict(),
            "parity": self.parity.to_dict(),
            "budget": None if self.budget is None else self.budget.to_dict(),
        }


@dataclasses.dataclass
class TFLiteReport:
    """What an export wrote and how it was checked."""

    source: str
    output: str
    precision: str
    size_bytes: int
    tensors: int
    ops: dict[str, int]
    #: Each TRANSPOSE left: the tensor it reorders and what reads the result.
    transposes: list[str]
    inputs: list[IOInfo]
    outputs: list[IOInfo]
    fixed_shapes: dict[str, tuple[int, ...]]
    batch_fixed: list[str]
    fused_activations: int
    fp16_weights: int
    notes: list[str]
    verification: list[Verification]
    verify_skipped: str | None
    samples: int

    @property
    def passed(self) -> bool:
        return self.verify_skipped is not None or all(v.passed for v in self.verification)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = [i.to_dict() for i in self.inputs]
        d["outputs"] = [o.to_dict() for o in self.outputs]
        d["fixed_shapes"] = {k: list(v) for k, v in self.fixed_shapes.items()}
        d["verification"] = [v.to_dict() for v in self.verification]
        d["passed"] = self.passed
        return d

    def lines(self) -> list[str]:
        """The report as lines of text (the CLI prints them)."""
        out = [
            f"{self.output}: {self.size_bytes / 1024:.1f} KiB, {self.precision}, "
            f"{sum(self.ops.values())} ops, {self.tensors} tensors",
            "ops: "
            + ", ".join(
                f"{op} x{n}" for op, n in sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0]))
            ),
        ]
        for kind, items in (("input", self.inputs), ("output", self.outputs)):
            for io in items:
                out.append(f"{kind} {io.name}: {io.dtype}{list(io.shape)} {io.layout}")
        if self.fixed_shapes:
            fixed = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.fixed_shapes.items())
            out.append(f"sizes fixed at export: {fixed}" + (
                f" (symbolic batch of {', '.join(self.batch_fixed)} set to 1)" if self.batch_fixed else ""
            ))  # fmt: skip
        out.append(f"transposes left: {len(self.transposes)}")
        out += [f"  {t}" for t in self.transposes]
        if self.fused_activations:
            out.append(f"activations fused into the op before them: {self.fused_activations}")
        if self.fp16_weights:
            out.append(f"float16 weights (DEQUANTIZE at load): {self.fp16_weights}")
        out += self.notes
        if self.verify_skipped is not None:
            out.append(f"not verified: {self.verify_skipped}")
        for v in self.verification:
            worst = ", ".join(
                f"{o.name} abs {o.max_abs_error:.2g} rel {o.max_rel_error:.2g}"
                for o in v.parity.outputs
            )
            verdict = "ok" if v.passed else "FAILED"
            line = f"LiteRT {v.placement.kernels} vs ONNX Runtime ({self.samples} samples): {verdict}; {worst}"
            out.append(line)
            if v.budget is not None:
                out.append(f"  accuracy: {v.budget.summary()}")
            elif not v.parity.passed:
                out.append(f"  {v.parity.summary()}")
            out.append(f"  {v.placement.describe()}")
        return out


@dataclasses.dataclass
class TFLiteExport:
    """A written ``.tflite`` file and its report."""

    path: Path
    report: TFLiteReport

    def lines(self) -> list[str]:
        return self.report.lines()


def export_tflite(
    model: ModelSource,
    output: str | os.PathLike[str],
    *,
    precision: str | None = None,
    nhwc_io: bool = False,
    verify: bool = True,
    samples: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> TFLiteExport:
    """Export an ONNX model to a ``.tflite`` file, verified in LiteRT.

    Args:
        model: a path, an ``onnx_ir.Model`` or an ``onnx.ModelProto``; never modified.
        output: the ``.tflite`` file to write (atomically: never half written).
        precision: ``fp32``, ``fp16`` (float16 weights), or ``int8`` (from a QDQ model made by
            ``ferry quantize --target tflite`` or another static quantizer); None: ``int8`` for
            a QDQ model, else ``fp32``.
        nhwc_io: the 4-D inputs and outputs the model has in NCHW are channels-last (NHWC) in
            the file; samples and results stay in the model's layout here.
        verify: run the export in LiteRT against ONNX Runtime on the source model; a failure
            writes nothing.
        samples: inputs to verify on, in ONNX's layout (one feed dict or several); their sizes
            fix the model's dynamic dims unless ``shapes`` does. None: random inputs. An input
            with a default in the model (a streaming model's ``state:*``, which the file takes
            as an input) left out of a sample takes its default.
        shapes: input sizes to export at, e.g. ``{"x": (1, 3, 224, 224)}``.

    Raises:
        InvalidInputError: a bad option, an input size left dynamic, output is the input file.
        UnsupportedOpError: every node TFLite cannot run, listed at once.
        ConversionError: the export computes something else in LiteRT (``.report`` holds the
            figures); nothing was written.
        BackendUnavailableError: LiteRT is not installed (pass ``verify=False``).
    """
    source = load_model(model)
    precision = precision or source_precision(source)
    where = model_source_path(source)
    dest = Path(output)
    if where is not None and dest.exists() and dest.resolve() == where.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {where}; choose another output"
        )
    # Inputs with a default (a streaming model's state) are inputs of the file: a sample that
    # leaves one out runs from the default, as ONNX Runtime would.
    defaults = optional_inputs(source)
    feeds_list = [{**defaults, **feeds} for feeds in _samples(samples)]
    given = dict(shapes or {})
    if feeds_list:
        for value in graph_inputs(source):
            name = value.name or ""
            declared = shape_of(value)
            if (
                name in feeds_list[0]
                and name not in given
                and (declared is None or not all(isinstance(d, int) for d in declared))
            ):
                given[name] = tuple(np.shape(feeds_list[0][name]))
    found_how = None
    if not feeds_list and (verify or _open_dims(source, given)):
        # No samples: inputs that run the model (sizes the graph allows, ids within its
        # tables, masks of 0 and 1), found on ONNX Runtime; they fix the open sizes too.
        feeds_list, found_how = _found_samples(source, given, defaults)
        if feeds_list:
            given.update(_sizes_to_fix(source, given, feeds_list[0]))
    lowered = lower_model(source, shapes=given or None, precision=precision, nhwc_io=nhwc_io)
    if found_how:
        lowered.notes.append(f"inputs found (no samples given): {found_how}")
    from ferry.tflite import write_tflite

    data = write_tflite(lowered.model)
    report = _report(lowered, data, str(where or "the model"), str(dest), precision)
    if verify:
        if not feeds_list:
            feeds_list = _generated(lowered, GENERATED_SAMPLES, defaults)
        _check_samples(lowered, feeds_list)
        report.samples = len(feeds_list)
        # A dynamic int8 source is exported as its float computation: held to the int8 budget
        # against the int8 model itself, as an int8 export is.
        judged_as = "int8" if is_dynamic_int8(source) else precision
        report.verification = _verify(source, data, lowered, feeds_list, judged_as)
        if not report.passed:
            failed = [v for v in report.verification if not v.passed]
            detail = "; ".join(
                f"{v.placement.kernels}: "
                + (v.budget.summary() if v.budget is not None else v.parity.summary())
                for v in failed
            )
            error = ConversionError(
                f"the .tflite export computes something else than the ONNX model ({detail}); "
                f"{dest} was not written (verify=False / --no-verify writes it unchecked)"
            )
            error.report = report  # type: ignore[attr-defined]
            raise error
    else:
        report.verify_skipped = "not asked (verify=False)"
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
    return TFLiteExport(dest, report)


def _samples(
    samples: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None,
) -> list[dict[str, np.ndarray]]:
    if samples is None:
        return []
    if isinstance(samples, Mapping):
        return [{k: np.asarray(v) for k, v in samples.items()}]
    found = [{k: np.asarray(v) for k, v in s.items()} for s in samples]
    if not found:
        raise InvalidInputError("samples is empty; give one feed dict or more, or None")
    return found


def _open_dims(source: Any, given: Mapping[str, Sequence[int]]) -> bool:
    """Whether an input not sized in ``given`` has a symbolic dim after its first (the batch)."""
    for value in graph_inputs(source):
        declared = shape_of(value)
        if (value.name or "") in given or declared is None:
            continue
        if any(not isinstance(d, int) for d in declared[1:]):
            return True
    return False


def _found_samples(
    source: Any, given: Mapping[str, Sequence[int]], defaults: Mapping[str, np.ndarray]
) -> tuple[list[dict[str, np.ndarray]], str | None]:
    """:data:`GENERATED_SAMPLES` samples that run the model (``ferry.runtime.found_inputs``),
    at one set of sizes, and how they were found; none when nothing was found and every size
    is fixed already (random samples at the export's sizes are made later). Inputs with a
    default take it.

    Raises:
        InvalidInputError: an input's size is open and no size tried runs the model (the
            message names the dims and the ``--shape`` that fixes them).
    """
    from ferry.runtime import found_inputs

    try:
        first = found_inputs(source, given or None)
    except InvalidInputError:
        if _open_dims(source, given):
            raise
        return [], None
    samples = [first.feeds]
    for seed in range(1, GENERATED_SAMPLES):
        samples.append(found_inputs(source, first.shapes, seed=seed).feeds)
    return [{**defaults, **feeds} for feeds in samples], first.how


def _sizes_to_fix(
    source: Any, given: Mapping[str, Sequence[int]], sample: Mapping[str, np.ndarray]
) -> dict[str, tuple[int, ...]]:
    """The sample's sizes of the inputs with symbolic dims that ``given`` leaves open; an input
    whose only symbolic dim is a batch of 1 is left to the lowering (which reports it)."""
    sizes = {}
    for value in graph_inputs(source):
        name = value.name or ""
        declared = shape_of(value)
        if name in given or name not in sample or declared is None:
            continue
        shape = tuple(int(d) for d in np.shape(sample[name]))
        if all(isinstance(d, int) for d in declared[1:]) and shape[:1] == (1,):
            continue
        if any(not isinstance(d, int) for d in declared):
            sizes[name] = shape
    return sizes


def _check_samples(lowered: Lowered, feeds_list: list[dict[str, np.ndarray]]) -> None:
    """Every sample gives every input at the export's sizes (in ONNX's layout)."""
    for io in lowered.inputs:
        want = [io.shape[i] for i in np.argsort(io.perm)]
        for k, sample in enumerate(feeds_list):
            if io.name not in sample:
                raise InvalidInputError(
                    f"sample {k} has no input {io.name!r}; the model takes "
                    f"{', '.join(repr(i.name) for i in lowered.inputs)}"
                )
            if list(np.shape(sample[io.name])) != want:
                raise InvalidInputError(
                    f"sample {io.name!r} has shape {list(np.shape(sample[io.name]))}; the export "
                    f"takes {want} (give the sizes to export at with shapes= / --shape)"
                )


def _generated(
    lowered: Lowered, count: int, defaults: Mapping[str, np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """Random inputs at the export's sizes: standard normal floats, small integers, bools;
    inputs with a default (a state) take it."""
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(count):
        sample = {}
        for io in lowered.inputs:
            shape = tuple(io.shape[i] for i in np.argsort(io.perm))  # back to ONNX's order
            dtype = np.dtype(io.dtype)
            if io.name in defaults:
                sample[io.name] = np.asarray(defaults[io.name])
            elif dtype.kind == "f":
                sample[io.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                sample[io.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                sample[io.name] = rng.integers(0, 10, shape).astype(dtype)
        feeds.append(sample)
    return feeds


def _int8_budget(source: Any, want: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """An int8 export's budget: :data:`INT8_BUDGET` and the task's judge at the same 1% loss (a
    recognizer's per-position argmax, a classifier's top-1), so a CTC line whose cosine holds
    but whose characters change is refused."""
    task, _ = task_judge_at(source, want, INT8_BUDGET[0]["min"])
    return [*INT8_BUDGET, *task]


def _verify(
    source: Any,
    data: bytes,
    lowered: Lowered,
    feeds_list: list[dict[str, np.ndarray]],
    precision: str,
) -> list[Verification]:
    from ferry.runtime import load

    session = load(source, cache_dir=False)
    names = [o.name for o in lowered.outputs]
    want_all: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feeds in feeds_list:
        want = session.run(feeds)
        for n in names:
            want_all[n].append(np.asarray(want[n]))
    inputs = [(io.name, io.perm) for io in lowered.inputs]
    outputs = [(io.name, io.perm) for io in lowered.outputs]
    results = []
    for kernels in KERNELS:
        runtime = LiteRT(data, kernels, inputs, outputs)
        got_all: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feeds in feeds_list:
            got = runtime.run(feeds)
            for n in names:
                got_all[n].append(got[n])
        got_stacked = {n: np.stack(v) for n, v in got_all.items()}
        want_stacked = {n: np.stack(v) for n, v in want_all.items()}
        parity = compare_outputs(got_stacked, want_stacked, inputs=feeds_list[0])
        budget = None
        if precision != "fp32":
            one = {
                n: v[0] for n, v in want_all.items()
            }  # the judge is read from one sample's shapes
            spec = _int8_budget(source, one) if precision == "int8" else None
            budget = within_budget(got_stacked, want_stacked, spec)
        results.append(Verification(runtime.placement(), parity, budget))
    return results


def _report(
    lowered: Lowered, data: bytes, source: str, output: str, precision: str
) -> TFLiteReport:
    sg = lowered.model.subgraphs[0]
    ops = Counter(op.opcode for op in sg.operators)
    readers: dict[int, list[str]] = {}
    for op in sg.operators:
        for i in op.inputs:
            readers.setdefault(i, []).append(op.opcode)
    outputs = set(sg.outputs)
    transposes = []
    for op in sg.operators:
        if op.opcode != "TRANSPOSE":
            continue
        t = sg.tensors[op.inputs[0]]
        result = op.outputs[0]
        users = sorted(set(readers.get(result, [])))
        into = ", ".join(users) if users else ""
        if result in outputs:
            into = (into + ", " if into else "") + f"model output {sg.tensors[result].name!r}"
        where = "model input " if op.inputs[0] in sg.inputs else ""
        transposes.append(f"{where}{t.name} {list(t.shape)} -> {into or 'nothing'}")
    return TFLiteReport(
        source=source,
        output=output,
        precision=precision,
        size_bytes=len(data),
        tensors=len(sg.tensors),
        ops=dict(ops),
        transposes=transposes,
        inputs=lowered.inputs,
        outputs=lowered.outputs,
        fixed_shapes=lowered.fixed_shapes,
        batch_fixed=lowered.batch_fixed,
        fused_activations=lowered.fused_activations,
        fp16_weights=lowered.fp16_weights,
        notes=list(lowered.notes),
        verification=[],
        verify_skipped=None,
        samples=0,
    )
