"""The training loop of distillation: losses, batches, judging on the held-back split.

Imported only when :func:`ferry.optimizer.distill.distill` runs (it imports torch).

How each output is distilled (the rule, decided once from the teacher's outputs on the training
split):

* ``kl-probs``: float, rank >= 2, last axis >= 2, every value >= 0 and each row summing to 1
  (within 1e-3): the model ends in a softmax. The logs of both models' probabilities are taken as
  logits, and the loss is ``KL(softmax(t/T) || softmax(s/T)) * T^2`` over the last axis.
* ``kl-logits``: float, rank 2, last axis >= 2, not probabilities: class logits; the same loss.
* ``mse``: anything else (detector maps, boxes, embeddings, regression): mean squared error
  divided by the teacher's variance on the training split, so outputs of any scale weigh alike.

Top-1 agreement is judged on the ``kl-*`` outputs (argmax over the last axis); cosine similarity
(per sample, flattened) on every output.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ferry.errors import InvalidInputError
from ferry.optimizer.distill._onnx_to_torch import OnnxModule


class Schedule(Protocol):
    """What the training loop reads of a plan (``_schedule.Plan``, which imports this module)."""

    @property
    def epochs(self) -> int: ...
    @property
    def patience(self) -> int | None: ...
    @property
    def max_seconds(self) -> float | None: ...
    def lr_at(self, step: int) -> float: ...


logger = logging.getLogger("ferry.optimizer.distill")

Arrays = dict[str, np.ndarray]


def softmax_inputs(model: Any, outputs: Sequence[str]) -> dict[str, str]:
    """Per output of ``model`` (an ``onnx_ir.Model``) computed by a Softmax over its last axis,
    the name of the Softmax's input."""
    found = {}
    for value in model.graph.outputs:
        node = value.producer()
        if value.name not in outputs or node is None or node.op_type != "Softmax":
            continue
        source = node.inputs[0]
        axis = node.attributes.get_int("axis", -1)
        rank = len(source.shape) if source is not None and source.shape is not None else None
        if source is not None and source.name and (axis == -1 or (rank and axis == rank - 1)):
            found[value.name] = source.name
    return found


def loss_kind(teacher: np.ndarray) -> str:
    """``kl-probs``, ``kl-logits`` or ``mse`` for an output, from the teacher's values on it."""
    if teacher.dtype.kind != "f" or teacher.ndim < 2 or teacher.shape[-1] < 2:
        return "mse"
    sums = teacher.sum(axis=-1, dtype=np.float64)
    if teacher.min() >= 0 and np.all(np.abs(sums - 1) < 1e-3):
        return "kl-probs"
    return "kl-logits" if teacher.ndim == 2 else "mse"


def _as_logits(value: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "kl-probs":
        return torch.log(value.clamp_min(1e-8))
    return value


def _kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    s = F.log_softmax(student.reshape(-1, student.shape[-1]) / temperature, dim=-1)
    t = F.log_softmax(teacher.reshape(-1, teacher.shape[-1]) / temperature, dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature**2


@dataclasses.dataclass
class Task:
    """What the loop trains: the student module, the teacher's cached outputs, the split.

    Attributes:
        module: the student.
        train / held: inputs per name, samples along axis 0 (joined from the feeds).
        teacher_train / teacher_held: the teacher's outputs (and intermediate tensors) on them.
        kinds: per output name, its loss kind.
        features: student tensor -> teacher tensor, matched with MSE.
        scales: per output or feature, the teacher variance that divides its MSE.
        labels_held: labels of the held-back samples (accuracy only), or None.
    """

    module: OnnxModule
    train: Arrays
    held: Arrays
    teacher_train: Arrays
    teacher_held: Arrays
    kinds: dict[str, str]
    features: dict[str, str]
    scales: dict[str, float]
    labels_held: np.ndarray | None
    projections: nn.ModuleDict = dataclasses.field(default_factory=nn.ModuleDict)
    #: Per ``kl-probs`` output made by a Softmax over its last axis, the Softmax's input: the
    #: student's logits themselves. The log of its probabilities would do in value, but a
    #: pruned student starts far off, its probabilities for the teacher's class under the clamp,
    #: and the clamp passes no gradient there (measured: a 30%-pruned PP-LCNet stayed at 30%
    #: agreement through 30 epochs on log-probabilities).
    logits: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Judged:
    """The student on the held-back split."""

    agreement: float | None
    cosine: float
    accuracy: float | None
    loss: float

    def key(self) -> tuple[float, float]:
        """Ordering: agreement first (where there are class outputs), then cosine."""
        return (self.agreement if self.agreement is not None else self.cosine, self.cosine)


def projections(task: Task, sample: Arrays) -> nn.ModuleDict:
    """A 1x1 projection per feature pair whose channel counts differ (trained, not exported).

    Raises:
        InvalidInputError: the pair's tensors differ in rank or in their other dims.
    """
    out = nn.ModuleDict()
    if not task.features:
        return out
    with torch.no_grad():
        got = task.module.run(_tensors(sample), list(task.features))
    for i, (s_name, t_name) in enumerate(task.features.items()):
        s_shape = tuple(got[s_name].shape[1:])
        t_shape = tuple(task.teacher_train[t_name].shape[1:])
        if s_shape == t_shape:
            continue
        if len(s_shape) != len(t_shape) or len(s_shape) < 1 or s_shape[1:] != t_shape[1:]:
            raise InvalidInputError(
                f"feature pair {s_name!r} -> {t_name!r}: the student's tensor is "
                f"{list(s_shape)} per sample and the teacher's {list(t_shape)}; only the channel "
                "count (axis 1) may differ: pair tensors of the same spatial size"
            )
        channels = (s_shape[0], t_shape[0])
        layer: nn.Module
        if len(s_shape) == 1:
            layer = nn.Linear(*channels, bias=False)
        else:
            conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[min(len(s_shape) - 2, 2)]
            layer = conv(*channels, kernel_size=1, bias=False)
        out[f"p{i}"] = layer
    return out


def _tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def _rows(arrays: Arrays, index: np.ndarray | slice) -> Arrays:
    return {k: v[index] for k, v in arrays.items()}


def _loss(
    task: Task,
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    temperature: float,
    alpha: float,
    feature_weight: float,
) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32)
    for name, kind in task.kinds.items():
        s, t = got[name].float(), want[name].float()
        if kind == "mse":
            term = F.mse_loss(s, t) / task.scales[name]
        else:
            logits = task.logits.get(name) if kind == "kl-probs" else None
            s = got[logits].float() if logits is not None else _as_logits(s, kind)
            term = _kl(s, _as_logits(t, kind), temperature)
        total = total + alpha * term
    for i, (s_name, t_name) in enumerate(task.features.items()):
        s = got[s_name].float()
        key = f"p{i}"
        if key in task.projections:
            s = task.projections[key](s)
        term = F.mse_loss(s, want[t_name].float()) / task.scales[t_name]
        total = total + feature_weight * term
    return total


def _forward(task: Task, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return task.module.run(feeds, [*task.kinds, *task.features, *task.logits.values()])


def predict(module: OnnxModule, inputs: Arrays, batch_size: int) -> Arrays:
    """The module's graph outputs on ``inputs`` (no gradients), joined along axis 0."""
    count = len(next(iter(inputs.values())))
    parts: list[dict[str, torch.Tensor]] = []
    with torch.no_grad():
        for start in range(0, count, batch_size):
            parts.append(module.run(_tensors(_rows(inputs, slice(start, start + batch_size)))))
    return {k: torch.cat([p[k] for p in parts]).numpy() for k in module.output_names}


def judge(
    task: Task, batch_size: int, temperature: float, alpha: float, feature_weight: float
) -> Judged:
    """Agreement, cosine, accuracy and loss of the student on the held-back split."""
    count = len(next(iter(task.held.values())))
    outputs: dict[str, list[np.ndarray]] = {k: [] for k in task.kinds}
    losses: list[float] = []
    with torch.no_grad():
        for start in range(0, count, batch_size):
            rows = slice(start, start + batch_size)
            got = _forward(task, _tensors(_rows(task.held, rows)))
            want = _tensors(_rows(task.teacher_held, rows))
            n = len(next(iter(want.values())))
            losses.append(float(_loss(task, got, want, temperature, alpha, feature_weight)) * n)
            for k in outputs:
                outputs[k].append(got[k].numpy())
    joined = {k: np.concatenate(v) for k, v in outputs.items()}
    agreements, cosines = [], []
    accuracy = None
    for name, kind in task.kinds.items():
        s, t = joined[name], task.teacher_held[name]
        cosines.append(cosine(s, t))
        if kind != "mse":
            agreements.append(float(np.mean(s.argmax(-1) == t.argmax(-1))))
            if accuracy is None and task.labels_held is not None:
                accuracy = top1_accuracy(s, task.labels_held)
    return Judged(
        agreement=float(np.mean(agreements)) if agreements else None,
        cosine=float(min(cosines)),
        accuracy=accuracy,
        loss=float(np.sum(losses) / count),
    )


def cosine(got: np.ndarray, want: np.ndarray) -> float:
    """Mean over samples of the cosine similarity of each sample's flattened values."""
    g = got.reshape(len(got), -1).astype(np.float64)
    w = want.reshape(len(want), -1).astype(np.float64)
    norms = np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1)
    same = np.all(g == w, axis=1)
    values = np.where(norms > 0, (g * w).sum(axis=1) / np.maximum(norms, 1e-300), same * 1.0)
    return float(np.mean(values))


def top1_accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(scores.reshape(len(labels), -1).argmax(-1) == labels))


@dataclasses.dataclass
class Trained:
    """What the loop did."""

    losses: list[float]
    judged: list[Judged]  # [input, after epoch 1, ...]
    best_epoch: int  # 0: the input was best
    stopped: str | None
    seconds: float


def train(
    task: Task,
    *,
    plan: Schedule,
    batch_size: int,
    temperature: float,
    alpha: float,
    feature_weight: float,
    seed: int,
    progress: bool,
    judged: Judged,
    started: float,
) -> Trained:
    """Train ``task.module`` in place by ``plan``; it ends holding the best epoch's weights (the
    input's when no epoch beat it on the held-back split).

    ``judged`` is the input student on the held-back split; ``started`` the ``perf_counter``
    time the plan's time budget counts from (the range test is inside it).
    """
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in task.module.parameters()] + list(task.projections.parameters())
    optimizer = torch.optim.Adam(params, lr=plan.lr_at(0))
    count = len(next(iter(task.train.values())))
    history = [judged]
    best_state = copy.deepcopy(task.module.state_dict())
    best = 0
    # The epoch of the last gain that counts for patience, and the marks it beat: the cosine of
    # raw logits creeps up long after the student stops getting better, so patience follows the
    # top-1 agreement and the held-back distillation loss instead (measured on the digits CNN:
    # agreement flat from epoch 2 to 25 while cosine rose by over 1e-4 every epoch).
    gained, marks = 0, (judged.agreement, judged.loss)
    losses: list[float] = []
    stopped: str | None = None
    report = _Progress(plan.epochs, progress)
    step = 0
    try:
        for epoch in range(1, plan.epochs + 1):
            epoch_start = time.perf_counter()
            task.module.train()
            order = torch.randperm(count, generator=generator).numpy()
            total = 0.0
            for start in range(0, count, batch_size):
                rows = order[start : start + batch_size]
                got = _forward(task, _tensors(_rows(task.train, rows)))
                want = _tensors(_rows(task.teacher_train, rows))
                loss = _loss(task, got, want, temperature, alpha, feature_weight)
                value = float(loss.detach())
                if not math.isfinite(value):
                    stopped = f"the loss became {value} in epoch {epoch}; lower the lr"
                    break
                for group in optimizer.param_groups:
                    group["lr"] = plan.lr_at(step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                total += value * len(rows)
            task.module.eval()
            if stopped:
                break
            losses.append(total / count)
            history.append(judge(task, batch_size, temperature, alpha, feature_weight))
            if _gain(history[-1], *marks):
                gained = epoch
                marks = (
                    _most(history[-1].agreement, marks[0]),
                    min(history[-1].loss, marks[1]),
                )
            if history[-1].key() > history[best].key():
                best = epoch
                best_state = copy.deepcopy(task.module.state_dict())
            report.epoch(epoch, losses[-1], history[-1])
            if (
                plan.patience is not None
                and epoch < plan.epochs
                and epoch - gained >= plan.patience
            ):
                stopped = (
                    f"stopped early after epoch {epoch}: no gain on the held-back split for "
                    f"{plan.patience} epochs (best epoch {best})"
                )
                break
            elapsed = time.perf_counter() - started
            last = time.perf_counter() - epoch_start
            budget = plan.max_seconds
            if budget is not None and epoch < plan.epochs and elapsed + last > budget:
                stopped = (
                    f"stopped after {epoch} of {plan.epochs} epochs: another ({last:.1f} s) would "
                    f"pass the time budget of {budget:g} s ({elapsed:.1f} s spent)"
                )
                break
    finally:
        report.close()
    task.module.load_state_dict(best_state)
    return Trained(losses, history, best, stopped, time.perf_counter() - started)


#: A held-back loss this much below the best so far (relative) counts as a gain for patience.
LOSS_GAIN = 0.02


def _gain(new: Judged, agreement: float | None, loss: float) -> bool:
    """Whether ``new`` gains on the best marks so far enough to reset the patience: a higher top-1
    agreement, or a held-back loss lower by over :data:`LOSS_GAIN` of it."""
    if new.agreement is not None and agreement is not None and new.agreement > agreement:
        return True
    return new.loss < loss * (1 - LOSS_GAIN)


def _most(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


class _Progress:
    """A rich progress bar on a terminal; log lines otherwise."""

    def __init__(self, epochs: int, enabled: bool) -> None:
        self._bar: Any = None
        self._task: Any = None
        self._enabled = enabled
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("distilling"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("distill", total=epochs, status="")

    def epoch(self, epoch: int, loss: float, judged: Judged) -> None:
        status = f"loss {loss:.4f}, " + (
            f"agreement {judged.agreement:.4f}"
            if judged.agreement is not None
            else f"cosine {judged.cosine:.4f}"
        )
        if self._bar is not None:
            self._bar.update(self._task, advance=1, status=status)
        elif self._enabled:
            logger.info("distill epoch %d: %s", epoch, status)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def join(parts: Sequence[Mapping[str, np.ndarray]]) -> Arrays:
    """Feeds (or outputs) joined along axis 0.

    Raises:
        InvalidInputError: the samples differ in shape beyond the first axis.
    """
    out: Arrays = {}
    for name in parts[0]:
        shapes = {tuple(np.shape(p[name])[1:]) for p in parts}
        if len(shapes) > 1:
            raise InvalidInputError(
                f"the samples of {name!r} have different shapes ({sorted(shapes)[:4]}): "
                "distillation batches them, so give samples of one size (resize the images)"
            )
        out[name] = np.concatenate([np.asarray(p[name]) for p in parts])
    return out
