"""Distillation: train a student ONNX model to match a teacher ONNX model, on unlabeled data.

Before -> After::

    teacher (ONNX, run in ONNX Runtime) + student (ONNX) + samples
        -> the student with new weights (same graph, names and opset), judged against the
           teacher on held-back samples, and its export checked against the trained torch module

The teacher runs once per sample and its outputs are cached; the student becomes a torch module
(``_onnx_to_torch``), trains with Adam on the distillation loss (``_train`` states the rule per
output), and the best epoch on the held-back split is kept. Unless given, the learning rate comes
from a short range test and training runs until the held-back judge stops improving, within a
time budget (``_schedule`` states the rule). A student that no epoch improved is handed back
unchanged, and the report says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import atomic_path, load_model, save_model
from ferry.optimizer.distill._torch import require_torch
from ferry.optimizer.quantize._data import ImagePreprocessing, load_samples, split

__all__ = ["DistillReport", "DistillResult", "distill"]

logger = logging.getLogger("ferry.optimizer.distill")

#: The exported ONNX must match the trained torch module this closely (max abs, relative to the
#: largest output magnitude), or the student is handed back unchanged.
PARITY_TOLERANCE = 1e-4
#: Teacher features cached above this many bytes are worth a warning.
_FEATURE_CACHE_WARNING = 1 << 30


@dataclasses.dataclass(frozen=True)
class DistillReport:
    """What distillation did, measured on the held-back split.

    Attributes:
        samples: the data, in words (training + held-back counts, source).
        outputs: per output, how it was distilled (``kl-probs``, ``kl-logits``, ``mse``).
        features: student tensor -> teacher tensor pairs matched with MSE.
        epochs / epochs_run / best_epoch: asked (None: until the held-back judge stops
            improving), run, and the one kept (0: the input student).
        loss_per_epoch: mean training loss of each epoch run.
        agreement_per_epoch / cosine_per_epoch: on the held-back split, the input first.
        agreement_before / agreement_after: top-1 agreement with the teacher (class outputs;
            None when the model has none), before training and of the returned student.
        cosine_before / cosine_after: per-sample cosine similarity with the teacher (the worst
            output).
        accuracy_before / accuracy_after / accuracy_teacher: top-1 accuracy on the held-back
            labels, when labels were given.
        seconds / seconds_per_epoch: wall time of the whole call and of one epoch on average.
        parity_max_abs: max abs difference between the exported ONNX (ONNX Runtime) and the
            trained torch module on the held-back inputs.
        stopped: why training stopped early (no held-back gain for ``patience`` epochs, the
            time budget, a diverging loss), or None.
        unchanged: why the input student was handed back, or None.
        settings: lr, batch size, temperature, alpha, seed, threads, schedule, patience, budget.
        plan: the learning rate, schedule, epochs and stopping rule, each with how it was
            chosen (``given`` where the caller gave it), in one line.
    """

    samples: str
    outputs: Mapping[str, str]
    features: Mapping[str, str]
    epochs: int | None
    epochs_run: int
    best_epoch: int
    loss_per_epoch: tuple[float, ...]
    agreement_per_epoch: tuple[float | None, ...]
    cosine_per_epoch: tuple[float, ...]
    agreement_before: float | None
    agreement_after: float | None
    cosine_before: float
    cosine_after: float
    accuracy_before: float | None
    accuracy_after: float | None
    accuracy_teacher: float | None
    seconds: float
    seconds_per_epoch: float
    parity_max_abs: float | None
    stopped: str | None
    unchanged: str | None
    settings: Mapping[str, Any]
    plan: str = ""

    @property
    def improved(self) -> bool:
        return self.unchanged is None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["improved"] = self.improved
        return d

    def lines(self) -> list[str]:
        """The report in words, for the CLI."""

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:.2f}%"

        most = self.settings.get("planned_epochs", self.epochs)
        out = [
            f"data: {self.samples}",
            "outputs: " + ", ".join(f"{k} ({v})" for k, v in self.outputs.items()),
            *([f"plan: {self.plan}"] if self.plan else []),
            *(
                [f"threads: {self.settings['threads']} ({self.settings['threads_chosen_by']})"]
                if "threads_chosen_by" in self.settings
                else []
            ),
            f"epochs: {self.epochs_run} of {'at most ' if self.epochs is None else ''}{most} run, "
            f"kept epoch {self.best_epoch}"
            + (" (the input)" if self.best_epoch == 0 else "")
            + f"; {self.seconds:.1f} s ({self.seconds_per_epoch:.2f} s per epoch)",
            "loss per epoch: " + _series([f"{v:.4f}" for v in self.loss_per_epoch], 1),
            "held-back "
            + ("agreement" if self.agreement_per_epoch[0] is not None else "cosine")
            + " per epoch (0: the input): "
            + _series(
                [
                    pct(a) if a is not None else f"{c:.4f}"
                    for a, c in zip(self.agreement_per_epoch, self.cosine_per_epoch, strict=True)
                ],
                0,
                self.best_epoch,
            ),
            f"held-back agreement with the teacher: {pct(self.agreement_before)} -> "
            f"{pct(self.agreement_after)}; cosine {self.cosine_before:.4f} -> "
            f"{self.cosine_after:.4f}",
        ]
        if self.accuracy_after is not None:
            out.append(
                f"held-back accuracy: {pct(self.accuracy_before)} -> {pct(self.accuracy_after)} "
                f"(teacher {pct(self.accuracy_teacher)})"
            )
        if self.parity_max_abs is not None:
            out.append(f"export parity (ONNX Runtime vs torch): max abs {self.parity_max_abs:.2e}")
        if self.stopped:
            out.append(self.stopped)
        if self.unchanged:
            out.append(f"student returned unchanged: {self.unchanged}")
        return out


def _series(values: Sequence[str], first: int, best: int | None = None) -> str:
    """``values`` (numbered from ``first``) as ``n: v`` pairs; a long series keeps its first
    three, every few in between, the best and the last."""
    count = len(values)
    if count <= 12:
        keep = set(range(count))
    else:
        stride = max(count // 6, 1)
        keep = {0, 1, 2, count - 1, *range(0, count, stride)}
    if best is not None and 0 <= best - first < count:
        keep.add(best - first)
    parts, last = [], -1
    for i in sorted(keep):
        if last >= 0 and i > last + 1:
            parts.append("...")
        mark = " (best)" if best is not None and i + first == best else ""
        parts.append(f"{i + first}: {values[i]}{mark}")
        last = i
    return ", ".join(parts)


@dataclasses.dataclass
class DistillResult:
    """The outcome of :func:`distill`: ``model`` (the input student when nothing improved) and
    ``report``."""

    model: ir.Model
    report: DistillReport

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model atomically, and the report beside it (``OUT.distill.json``)."""
        out = save_model(self.model, path)
        with atomic_path(out.with_suffix(".distill.json")) as tmp:
            tmp.write_text(json.dumps(self.report.to_dict(), indent=2) + "\n", encoding="utf-8")
        return out


@contextlib.contextmanager
def _deterministic(seed: int, threads: int | None) -> Iterator[int]:
    """Seeded, deterministic torch for the block; the caller's settings are restored after."""
    torch = require_torch()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        # One thread count for the whole run: a reduction's order (and so its rounding) follows it.
        torch.set_num_threads(threads or was_threads)
        try:
            yield torch.get_num_threads()
        finally:
            torch.set_num_threads(was_threads)
            torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)


def distill(
    teacher: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    student: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    data: Any,
    epochs: int | None = None,
    batch_size: int = 16,
    lr: float | None = None,
    temperature: float = 4.0,
    alpha: float = 1.0,
    feature_pairs: Mapping[str, str] | None = None,
    feature_weight: float = 1.0,
    labels: Sequence[int] | np.ndarray | str | os.PathLike[str] | None = None,
    seed: int = 0,
    max_seconds: float | None = None,
    holdout: float = 0.25,
    preprocessing: ImagePreprocessing | None = None,
    threads: int | None = None,
    progress: bool = True,
    patience: int | None = None,
    schedule: str = "cosine",
) -> DistillResult:
    """Train ``student`` to reproduce ``teacher``'s outputs on ``data`` (no labels needed).

    The teacher runs in ONNX Runtime once per sample. The student becomes a torch module and
    trains with Adam on ``alpha * output loss + feature_weight * feature loss``: KL divergence of
    the temperature-softened outputs (times ``T^2``) for class outputs, MSE for the rest (the
    rule: ``ferry.optimizer.distill._train``), and MSE between ``feature_pairs``. After each epoch
    the student is judged on the held-back samples; the best epoch is kept, and if none beat the
    input the input is returned unchanged. The trained weights are written into a copy of the
    student's graph, which is run in ONNX Runtime and compared with the torch module.

    With no options, the learning rate comes from a short range test on the student and the
    data, the rate warms up and then decays on a cosine, and training stops once the held-back
    judge has not improved for 8 epochs, after at most 60 epochs or 300 s (the rule:
    ``ferry.optimizer.distill._schedule``). The report's ``plan`` says what was chosen and why.

    Args:
        teacher: the reference model (file, ``ir.Model`` or ``ModelProto``); never modified.
        student: the model to train (e.g. a pruned copy of the teacher): same input names and
            output names as the teacher; never modified.
        data: the samples: a ``.npz``/``.npy`` file, a folder of images (with
            ``preprocessing``), or an iterable of feed dicts (what ``ferry quantize`` takes).
        epochs: passes over the training split, all run (no early stop unless ``patience`` is
            given). None: until the held-back judge stops improving (``patience``), at most as
            many as fit ``max_seconds`` and 60.
        batch_size: samples per step.
        lr: Adam's peak learning rate. None: a tenth of the rate where the loss was lowest in a
            short range test (kept within [1e-5, 1e-2]); the held-back split still guards a
            rate too high for a trained student (the best epoch is kept, or the input).
        temperature: softens both distributions in the KL term.
        alpha: weight of the output term.
        feature_pairs: student tensor name -> teacher tensor name, matched with MSE (through a
            trained 1x1 projection where only the channel counts differ).
        feature_weight: weight of the feature terms.
        labels: class labels of the samples in data order (an array or a ``.npy`` file); only
            reported (held-back accuracy), never trained on.
        seed: seeds the shuffling and any projection's initial weights; the same seed, data and
            thread count give the same weights, with ``epochs`` and ``lr`` given. Chosen, they
            follow timings only where the time budget binds (a timed step sizes the range test
            and the schedule's length): the report's plan says which.
        max_seconds: the time budget of the training (the range test included): stop before an
            epoch that would end past it (judged by the last epoch's time); at least one epoch
            runs. None: 300 s when ``epochs`` is not given, else no limit.
        holdout: fraction of the samples held back for judging (never trained on).
        preprocessing: how a folder of images becomes the input.
        threads: torch's intra-op threads during training. None: one, or torch's current count
            where a training step timed here runs over 20% faster on it.
        progress: a progress bar on a terminal (log lines at INFO otherwise).
        patience: stop after this many epochs without a gain on the held-back split (a higher
            top-1 agreement, or cosine by over 1e-4). None: 8 when ``epochs`` is not given,
            else never.
        schedule: ``cosine`` (linear warm-up over 5% of the steps, at most an epoch, then a
            cosine decay to a hundredth of the rate) or ``constant``.

    Raises:
        InvalidInputError: bad options, data that does not fit the models, teacher and student
            whose inputs, outputs or output shapes differ, labels of the wrong length.
        UnsupportedOpError: the student has ops the ONNX -> torch conversion lacks (all listed).
        BackendUnavailableError: torch is not installed.
    """
    started = time.perf_counter()
    _check_options(epochs, batch_size, lr, temperature, alpha, feature_weight, max_seconds)
    _check_schedule(patience, schedule)
    torch = require_torch()
    from ferry.optimizer.distill import _onnx_to_torch as o2t
    from ferry.optimizer.distill import _schedule as sc
    from ferry.optimizer.distill import _train as tr
    from ferry.runtime import load

    teacher_model, student_model = load_model(teacher), load_model(student)
    features = dict(feature_pairs or {})
    module = o2t.to_torch(student_model)
    _check_pair(teacher_model, module)
    reference = load(_with_outputs(teacher_model, features.values()))
    samples = load_samples(data, reference.inputs, preprocessing=preprocessing, held_back=holdout)
    feeds = [*samples.calibration, *samples.held_back]
    if not samples.calibration:
        raise InvalidInputError(f"no samples to train on in {samples.source}")
    # The split is by feed position; the same rule on positions finds which rows hold which labels.
    rows = [len(next(iter(f.values()))) for f in feeds]
    order = split([{"i": np.asarray(i)} for i in range(len(feeds))], samples.source, holdout)
    train_idx = [int(f["i"]) for f in order.calibration]
    held_idx = [int(f["i"]) for f in order.held_back]
    by_position = dict(zip([*train_idx, *held_idx], feeds, strict=True))

    names = [*module.output_names, *features.values()]
    teacher_out = {i: _teacher(reference, by_position[i], names) for i in by_position}
    train = tr.join([by_position[i] for i in train_idx])
    held = tr.join([by_position[i] for i in held_idx])
    teacher_train = tr.join([teacher_out[i] for i in train_idx])
    teacher_held = tr.join([teacher_out[i] for i in held_idx])
    cached = sum(teacher_train[n].nbytes for n in features.values())
    if cached > _FEATURE_CACHE_WARNING:
        logger.warning("the teacher's cached features take %.1f GiB", cached / (1 << 30))
    labels_held = _labels(labels, rows, held_idx)

    kinds = {n: tr.loss_kind(teacher_train[n]) for n in module.output_names}
    scales = {
        n: max(float(np.var(teacher_train[n])), 1e-12)
        for n in [*module.output_names, *features.values()]
        if teacher_train[n].dtype.kind == "f"
    }
    for n in kinds:
        if teacher_train[n].dtype.kind != "f":
            raise InvalidInputError(
                f"output {n!r} is {teacher_train[n].dtype}: only float outputs can be distilled; "
                "cut the model before it (ferry.plan.cut) or distill a model whose outputs are "
                "scores"
            )
    batch = _batch_size(reference.inputs, batch_size)
    task = tr.Task(
        module=module,
        train=train,
        held=held,
        teacher_train=teacher_train,
        teacher_held=teacher_held,
        kinds=kinds,
        features=features,
        scales=scales,
        labels_held=labels_held,
        logits={
            n: logit
            for n, logit in tr.softmax_inputs(student_model, list(kinds)).items()
            if kinds[n] == "kl-probs"
        },
    )
    with _deterministic(seed, threads) as used_threads:
        _check_shapes(task, batch)
        task.projections = tr.projections(task, tr._rows(train, slice(0, batch)))
        threads_why, step_seconds = "given", None
        if threads is None:
            used_threads, threads_why, step_seconds = sc.choose_threads(task, batch)
            torch.set_num_threads(used_threads)
        planning = time.perf_counter()
        judged = tr.judge(task, batch, temperature, alpha, feature_weight)
        plan = sc.plan(
            task=task,
            epochs=epochs,
            lr=lr,
            patience=patience,
            max_seconds=max_seconds,
            schedule=schedule,
            batch_size=batch,
            temperature=temperature,
            alpha=alpha,
            feature_weight=feature_weight,
            seed=seed,
            judge_seconds=time.perf_counter() - planning,
            step_seconds=step_seconds,
        )
        logger.info("distill plan: %s", plan.line())
        trained = tr.train(
            task,
            plan=plan,
            batch_size=batch,
            temperature=temperature,
            alpha=alpha,
            feature_weight=feature_weight,
            seed=seed,
            progress=progress,
            judged=judged,
            started=planning,
        )
        before, best = trained.judged[0], trained.judged[trained.best_epoch]
        unchanged: str | None = None
        parity: float | None = None
        result = student_model
        if trained.best_epoch == 0:
            unchanged = _no_gain(before, trained.judged[1:])
        else:
            exported = o2t.write_back(student_model, module)
            want = tr.predict(module, held, batch)
            parity = _parity(load(exported), held, want, reference.inputs)
            scale = max(float(np.abs(v).max()) for v in want.values()) or 1.0
            if parity > PARITY_TOLERANCE * max(1.0, scale):
                unchanged = (
                    f"the exported ONNX differs from the trained torch module by {parity:.2e} "
                    "(max abs) on the held-back inputs; this is a bug in ferry's ONNX -> torch "
                    "conversion: please report it with the student model"
                )
                best = before
            else:
                result = exported
    accuracy_teacher = None
    if labels_held is not None:
        first = next((n for n, k in kinds.items() if k != "mse"), None)
        if first is not None:
            accuracy_teacher = tr.top1_accuracy(teacher_held[first], labels_held)
    run = len(trained.losses)
    report = DistillReport(
        samples=f"{len(train_idx)} training + {len(held_idx)} held-back samples from "
        f"{samples.source}",
        outputs=kinds,
        features=features,
        epochs=epochs,
        epochs_run=run,
        best_epoch=trained.best_epoch if unchanged is None else 0,
        loss_per_epoch=tuple(trained.losses),
        agreement_per_epoch=tuple(j.agreement for j in trained.judged),
        cosine_per_epoch=tuple(j.cosine for j in trained.judged),
        agreement_before=before.agreement,
        agreement_after=best.agreement,
        cosine_before=before.cosine,
        cosine_after=best.cosine,
        accuracy_before=before.accuracy,
        accuracy_after=best.accuracy,
        accuracy_teacher=accuracy_teacher,
        seconds=time.perf_counter() - started,
        seconds_per_epoch=trained.seconds / max(run, 1),
        parity_max_abs=parity,
        stopped=trained.stopped,
        unchanged=unchanged,
        settings={
            "lr": plan.lr,
            "lr_chosen_by": plan.lr_why,
            "planned_epochs": plan.epochs,
            "patience": plan.patience,
            "schedule": plan.schedule,
            "batch_size": batch,
            "temperature": temperature,
            "alpha": alpha,
            "feature_weight": feature_weight,
            "seed": seed,
            "threads": used_threads,
            "threads_chosen_by": threads_why,
            "holdout": holdout,
            "max_seconds": plan.max_seconds,
        },
        plan=plan.line(),
    )
    for line in report.lines():
        logger.info("%s", line)
    return DistillResult(result, report)


def _check_options(
    epochs: int | None,
    batch_size: int,
    lr: float | None,
    temperature: float,
    alpha: float,
    feature_weight: float,
    max_seconds: float | None,
) -> None:
    problems = []
    if epochs is not None and epochs < 1:
        problems.append(f"epochs must be >= 1, got {epochs}")
    if batch_size < 1:
        problems.append(f"batch_size must be >= 1, got {batch_size}")
    if lr is not None and not lr > 0:
        problems.append(f"lr must be > 0, got {lr}")
    if not temperature > 0:
        problems.append(f"temperature must be > 0, got {temperature}")
    if alpha < 0 or feature_weight < 0 or alpha + feature_weight == 0:
        problems.append(
            f"alpha ({alpha}) and feature_weight ({feature_weight}) must be >= 0, not both 0"
        )
    if max_seconds is not None and not max_seconds > 0:
        problems.append(f"max_seconds must be > 0, got {max_seconds}")
    if problems:
        raise InvalidInputError("distill: " + "; ".join(problems))


def _check_schedule(patience: int | None, schedule: str) -> None:
    from ferry.optimizer.distill._schedule import SCHEDULES

    if patience is not None and patience < 1:
        raise InvalidInputError(f"distill: patience must be >= 1 epoch, got {patience}")
    if schedule not in SCHEDULES:
        raise InvalidInputError(
            f"distill: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
        )


def _check_pair(teacher: ir.Model, module: Any) -> None:
    """Teacher and student must take the same inputs and give the same outputs, by name."""
    t_inputs = [
        v.name or "" for v in teacher.graph.inputs if v.name not in teacher.graph.initializers
    ]
    t_outputs = [v.name or "" for v in teacher.graph.outputs]
    if sorted(t_inputs) != sorted(module.input_names):
        raise InvalidInputError(
            f"the teacher takes inputs {t_inputs} and the student {module.input_names}: "
            "distillation feeds both the same samples, so their input names must match"
        )
    if sorted(t_outputs) != sorted(module.output_names):
        raise InvalidInputError(
            f"the teacher's outputs are {t_outputs} and the student's {module.output_names}: "
            "each student output is trained towards the teacher output of the same name; "
            "rename them to match (a pruned copy of the teacher keeps its names)"
        )


def _with_outputs(model: ir.Model, names: Any) -> ir.Model:
    """``model``, with the named intermediate tensors added as outputs (a copy, when any)."""
    wanted = [n for n in names if n not in {v.name for v in model.graph.outputs}]
    if not wanted:
        return model
    copy = model.clone()
    values = {v.name: v for node in copy.graph for v in node.outputs}
    values.update({v.name: v for v in copy.graph.inputs})
    missing = [n for n in wanted if n not in values]
    if missing:
        raise InvalidInputError(
            f"feature_pairs name teacher tensors {missing} that the teacher does not have: "
            "name node outputs of the teacher (ferry info --nodes lists them)"
        )
    copy.graph.outputs.extend(values[n] for n in wanted)
    return copy


def _teacher(reference: Any, feed: Mapping[str, np.ndarray], names: list[str]) -> dict[str, Any]:
    out = reference.run(dict(feed))
    return {n: np.asarray(out[n]) for n in names}


def _labels(
    labels: Sequence[int] | np.ndarray | str | os.PathLike[str] | None,
    rows: list[int],
    held_idx: list[int],
) -> np.ndarray | None:
    if labels is None:
        return None
    if isinstance(labels, (str, os.PathLike)):
        try:
            array = np.load(labels, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InvalidInputError(f"cannot read labels {labels}: {e}") from e
    else:
        array = np.asarray(labels)
    array = array.reshape(-1)
    if array.dtype.kind not in "iu":
        raise InvalidInputError(f"labels must be integers (class indices), got {array.dtype}")
    if len(array) != sum(rows):
        raise InvalidInputError(
            f"there are {len(array)} labels for {sum(rows)} samples: give one label per sample, "
            "in the data's order"
        )
    starts = np.concatenate([[0], np.cumsum(rows)])
    return np.concatenate([array[starts[i] : starts[i + 1]] for i in held_idx]).astype(np.int64)


def _batch_size(inputs: Sequence[Any], asked: int) -> int:
    """``asked``, or 1 where an input's batch axis is fixed at 1 (a Reshape may pin it)."""
    for spec in inputs:
        if spec.shape and isinstance(spec.shape[0], int) and spec.shape[0] == 1 and asked != 1:
            logger.info("input %r has batch size 1 fixed: training with batch size 1", spec.name)
            return 1
    return asked


def _check_shapes(task: Any, batch: int) -> None:
    """The student's outputs must have the teacher's shapes (per sample)."""
    torch = require_torch()
    from ferry.optimizer.distill._train import _rows, _tensors

    with torch.no_grad():
        got = task.module.run(_tensors(_rows(task.train, slice(0, batch))))
    for name in task.module.output_names:
        have, want = tuple(got[name].shape[1:]), tuple(task.teacher_train[name].shape[1:])
        if have != want:
            raise InvalidInputError(
                f"output {name!r} is {list(have)} per sample in the student and {list(want)} in "
                "the teacher: distillation matches them element by element, so the shapes must "
                "agree (was the output layer pruned?)"
            )


def _parity(
    session: Any,
    held: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    inputs: Sequence[Any],
) -> float:
    """Max abs difference of ``session`` (the exported model) and the torch module's outputs."""
    count = len(next(iter(held.values())))
    fixed = any(s.shape and s.shape[0] == 1 for s in inputs)
    step = 1 if fixed else count
    worst = 0.0
    for start in range(0, count, step):
        out = session.run({k: v[start : start + step] for k, v in held.items()})
        for name, value in want.items():
            got = np.asarray(out[name], np.float64)
            worst = max(worst, float(np.abs(got - value[start : start + step]).max()))
    return worst


def _no_gain(before: Any, epochs: Sequence[Any]) -> str:
    if not epochs:
        return "no epoch finished"
    best = max(epochs, key=lambda j: j.key())
    what = "agreement" if before.agreement is not None else "cosine"
    return (
        f"no epoch beat the input student on the held-back split ({what} "
        f"{before.key()[0]:.4f} before, best epoch {best.key()[0]:.4f}); try a lower lr, more "
        "data or more epochs"
    )
