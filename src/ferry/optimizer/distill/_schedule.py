"""How long and how fast distillation trains, chosen from the student and the data.

Imported only when :func:`ferry.optimizer.distill.distill` runs (it imports torch).

The rule, where the caller did not say:

* **Learning rate**: a short range test (Smith, "Cyclical Learning Rates", 2017; fastai's
  ``lr_find``): Adam steps on training batches with the rate growing geometrically from
  ``1e-6`` to ``1``, the loss smoothed; the rate kept is a tenth of the one where the smoothed
  loss was lowest, clamped to ``[1e-5, 1e-2]``. The student's weights are restored after. It
  takes 80 steps, fewer (at least 20) where a timed step says 80 would pass a fifth of the time
  budget, and stops at that fifth in any case.
  Measured on the digits CNN pruned by half (``--multiple 1``): the fixed 1e-4 reached 97.2%
  test accuracy in 5 epochs; the range test picked about 3e-3 and reached the original's 98.6%.
* **Epochs**: as many as fit the time budget (timed from the range test's steps and the first
  judging), at most :data:`MAX_EPOCHS`; training stops earlier once the held-back judge has not
  improved for ``patience`` epochs.
* **Threads**: one for a short training step, torch's count where a step timed on both runs
  over 20% faster on it (:func:`choose_threads`).
* **Schedule**: linear warm-up over the first 5% of steps (at most one epoch), then cosine
  decay to a hundredth of the rate at the last planned step.

Given ``epochs`` and ``lr`` win: they are used as given, and the plan says so.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ferry.optimizer.distill._train import Task

#: The time budget when the caller gives neither ``epochs`` nor ``max_seconds`` (seconds).
DEFAULT_TIME_BUDGET = 300.0
#: The most epochs run when the caller does not give ``epochs``.
MAX_EPOCHS = 60
#: Epochs without a gain on the held-back split before training stops (``epochs`` not given).
DEFAULT_PATIENCE = 8
#: The range test's span and its most and fewest steps.
RANGE_START, RANGE_END, RANGE_STEPS, RANGE_FEWEST = 1e-6, 1.0, 80, 20
#: The share of the time budget the range test may take (sized from a timed step, and cut off).
RANGE_SHARE = 0.2
#: The chosen rate is kept inside these bounds (a range test on few samples is noisy).
LR_FLOOR, LR_CEILING = 1e-5, 1e-2
SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The training plan: rate, schedule, epochs and when to stop, each with its reason.

    Attributes:
        lr: the peak learning rate.
        lr_why: how it was chosen, in words.
        epochs: the most epochs that run (the schedule's length).
        epochs_why: how that number was chosen, in words.
        patience: epochs without a held-back gain before stopping; None: never stop early.
        max_seconds: the time budget of the training (range test included); None: none.
        schedule: ``cosine`` (warm-up, then cosine decay) or ``constant``.
        warmup_steps / steps_per_epoch: the warm-up's length and the steps in one epoch.
    """

    lr: float
    lr_why: str
    epochs: int
    epochs_why: str
    patience: int | None
    max_seconds: float | None
    schedule: str
    warmup_steps: int
    steps_per_epoch: int

    def lr_at(self, step: int) -> float:
        """The rate for optimizer step ``step`` (0-based)."""
        if self.schedule == "constant":
            return self.lr
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        total = max(self.epochs * self.steps_per_epoch - self.warmup_steps, 1)
        done = min((step - self.warmup_steps) / total, 1.0)
        floor = self.lr / 100
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * done))

    def line(self) -> str:
        """The plan in one line, for the report."""
        if self.schedule == "cosine":
            how = f"cosine schedule with {self.warmup_steps}-step warm-up"
        else:
            how = "constant rate"
        stop = (
            f"stop after {self.patience} epochs without a held-back gain"
            if self.patience
            else "no early stop"
        )
        budget = f", time budget {self.max_seconds:g} s" if self.max_seconds else ""
        return (
            f"lr {self.lr:.2g} ({self.lr_why}); {how}; at most {self.epochs} epochs "
            f"({self.epochs_why}); {stop}{budget}"
        )


@dataclasses.dataclass(frozen=True)
class RangeTest:
    """What the range test measured: the rate kept and why, and the seconds per step."""

    lr: float
    why: str
    seconds_per_step: float


def range_test(
    task: Task,
    batch_size: int,
    temperature: float,
    alpha: float,
    feature_weight: float,
    seed: int,
    steps: int = RANGE_STEPS,
    seconds: float | None = None,
) -> RangeTest:
    """The learning-rate range test on ``task`` over ``steps`` steps, cut off after ``seconds``;
    the module's weights are restored after."""
    from ferry.optimizer.distill._train import _forward, _loss, _rows, _tensors

    count = len(next(iter(task.train.values())))
    generator = torch.Generator().manual_seed(seed + 1)
    saved = copy.deepcopy(task.module.state_dict())
    saved_projections = copy.deepcopy(task.projections.state_dict())
    params = [*task.module.parameters(), *task.projections.parameters()]
    optimizer = torch.optim.Adam(params, lr=RANGE_START)
    factor = (RANGE_END / RANGE_START) ** (1 / (steps - 1))
    rates: list[float] = []
    smoothed: list[float] = []
    average, best = 0.0, math.inf
    order = torch.randperm(count, generator=generator).numpy()
    position = 0
    task.module.train()
    started = time.perf_counter()
    taken = 0
    try:
        for step in range(steps):
            if seconds is not None and step > 1 and time.perf_counter() - started > seconds:
                break  # out of its share of the budget: choose from the rates seen
            rate = RANGE_START * factor**step
            for group in optimizer.param_groups:
                group["lr"] = rate
            if position + batch_size > count:
                order = torch.randperm(count, generator=generator).numpy()
                position = 0
            rows = order[position : position + batch_size]
            position += batch_size
            got = _forward(task, _tensors(_rows(task.train, rows)))
            want = _tensors(_rows(task.teacher_train, rows))
            loss = _loss(task, got, want, temperature, alpha, feature_weight)
            value = float(loss.detach())
            taken += 1
            if not math.isfinite(value):
                break
            # Bias-corrected moving average: one noisy batch must not decide the rate.
            average = 0.9 * average + 0.1 * value
            current = average / (1 - 0.9 ** (step + 1))
            rates.append(rate)
            smoothed.append(current)
            best = min(best, current)
            if step > 5 and current > 4 * best:
                break  # diverged: larger rates only get worse
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    finally:
        per_step = (time.perf_counter() - started) / max(taken, 1)
        task.module.load_state_dict(saved)
        task.projections.load_state_dict(saved_projections)
        task.module.eval()
    if not smoothed:
        return RangeTest(LR_FLOOR, "the range test's first step diverged: the floor", per_step)
    lowest = rates[smoothed.index(min(smoothed))]
    lr = min(max(lowest / 10, LR_FLOOR), LR_CEILING)
    clamp = "" if lr == lowest / 10 else f", kept within [{LR_FLOOR:g}, {LR_CEILING:g}]"
    why = (
        f"a tenth of {lowest:.2g}, where the training loss was lowest in a {len(rates)}-step "
        f"range test{clamp}"
    )
    return RangeTest(lr, why, per_step)


def plan(
    *,
    task: Task,
    epochs: int | None,
    lr: float | None,
    patience: int | None,
    max_seconds: float | None,
    schedule: str,
    batch_size: int,
    temperature: float,
    alpha: float,
    feature_weight: float,
    seed: int,
    judge_seconds: float,
    step_seconds: float | None = None,
) -> Plan:
    """The plan for ``task``: what the caller gave, the rest chosen (module docstring).

    ``step_seconds``, where known, is a training step's time: it sizes the range test to its
    share of the time budget.
    """
    count = len(next(iter(task.train.values())))
    steps_per_epoch = max(math.ceil(count / batch_size), 1)
    started = time.perf_counter()
    if max_seconds is None and epochs is None:
        max_seconds = DEFAULT_TIME_BUDGET
    tested: RangeTest | None = None
    if lr is None:
        share = RANGE_SHARE * max_seconds if max_seconds is not None else None
        steps = RANGE_STEPS
        if share is not None and step_seconds:
            steps = min(max(int(share / step_seconds), RANGE_FEWEST), RANGE_STEPS)
        tested = range_test(
            task, batch_size, temperature, alpha, feature_weight, seed, steps, share
        )
        lr, lr_why = tested.lr, tested.why
    else:
        lr_why = "given"
    if epochs is not None:
        epochs_why = "given"
    else:
        per_step = tested.seconds_per_step if tested else step_seconds
        if per_step is None:
            epochs, epochs_why = MAX_EPOCHS, f"the default most, {MAX_EPOCHS}"
        else:
            spent = time.perf_counter() - started
            per_epoch = per_step * steps_per_epoch + judge_seconds
            budget = (max_seconds or DEFAULT_TIME_BUDGET) - spent
            fit = max(int(budget / max(per_epoch, 1e-9)), 1)
            epochs = min(fit, MAX_EPOCHS)
            epochs_why = (
                f"the default most, {MAX_EPOCHS}"
                if fit >= MAX_EPOCHS
                else f"what fits the time budget at about {per_epoch:.2g} s per epoch"
            )
    if patience is None and epochs_why != "given":
        patience = DEFAULT_PATIENCE
    warmup = min(steps_per_epoch, max(1, round(0.05 * epochs * steps_per_epoch)))
    return Plan(
        lr=lr,
        lr_why=lr_why,
        epochs=epochs,
        epochs_why=epochs_why,
        patience=patience,
        max_seconds=max_seconds,
        schedule=schedule,
        warmup_steps=warmup,
        steps_per_epoch=steps_per_epoch,
    )


#: A training step shorter than this on one thread stays on one thread (seconds).
SHORT_STEP = 0.05


def choose_threads(task: Task, batch_size: int) -> tuple[int, str, float]:
    """The thread count to train on, why, and a training step's time on it (seconds).

    A short step (under :data:`SHORT_STEP` on one thread) stays on one thread without more
    timing: it is too small to split, and splitting is where a busy machine hurts most. On this
    project's shared 2-core machine (load average 6 to 9) the digits CNN took 7.6 to 13 s per
    epoch on 2 threads and 0.47 s on 1, while timing both counts for a few of its short steps
    did not show it. A longer step is timed on torch's count too, and that count is kept only
    where it is over 20% faster (measured there: PP-LCNet, 1 s a step on one thread, ran an
    epoch 8 times slower on 2). The step is timed without an optimizer step, so the weights do
    not move.
    """
    from ferry.optimizer.distill._train import _forward, _loss, _rows, _tensors

    most = torch.get_num_threads()
    feeds = _tensors(_rows(task.train, slice(0, batch_size)))
    want = _tensors(_rows(task.teacher_train, slice(0, batch_size)))

    def step() -> float:
        begin = time.perf_counter()
        loss = _loss(task, _forward(task, feeds), want, 1.0, 1.0, 1.0)
        loss.backward()
        task.module.zero_grad(set_to_none=True)
        task.projections.zero_grad(set_to_none=True)
        return time.perf_counter() - begin

    task.module.train()
    try:
        torch.set_num_threads(1)
        step()  # the first call pays for allocations
        one = min(step() for _ in range(2))
        if most <= 1 or one < SHORT_STEP:
            why = f"a training step takes {1e3 * one:.3g} ms on one thread"
            return 1, why + (": too short to split" if most > 1 else ""), one
        torch.set_num_threads(most)
        many = step()
        if many < 0.8 * one:  # confirmed by a second step: one fast step may be luck
            many = max(many, step())
    finally:
        torch.set_num_threads(most)
        task.module.eval()
    timed = f"a training step took {1e3 * one:.3g} ms on one thread, {1e3 * many:.3g} ms on {most}"
    if many < 0.8 * one:
        return most, timed, many
    return 1, timed, one
