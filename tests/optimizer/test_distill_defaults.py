"""``distill`` with no options: the learning rate from a range test, warm-up + cosine, early
stopping on the held-back judge within a time budget, all reported; given options used as given;
and the issue's case: the digits CNN with half its channels pruned, distilled with no options,
ends within 1 point of the original's accuracy."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from ferry import zoo

pytest.importorskip("torch")

from ferry.cli._distill import command
from ferry.errors import InvalidInputError
from ferry.optimizer.distill import distill
from ferry.optimizer.distill._schedule import (
    DEFAULT_PATIENCE,
    DEFAULT_TIME_BUDGET,
    LR_CEILING,
    LR_FLOOR,
    Plan,
)
from ferry.optimizer.distill._train import Judged, _gain
from ferry.optimizer.prune import prune


@pytest.fixture(scope="module")
def teacher() -> ir.Model:
    return zoo.build("digits_cnn")


@pytest.fixture(scope="module")
def pruned(teacher: ir.Model) -> ir.Model:
    # multiple=1: the same channels removed on every CPU (the default follows its channel block).
    return prune(teacher, sparsity=0.5, multiple=1).model


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return zoo.digits_data()


def feeds(x: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"input": x[i : i + 1]} for i in range(len(x))]


def accuracy(model: ir.Model, x: np.ndarray, y: np.ndarray) -> float:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return float(np.mean(np.asarray(session.run(None, {"input": x})[0]).argmax(1) == y))


def test_the_plan_chosen_is_reported(teacher: ir.Model, pruned: ir.Model, digits: tuple) -> None:
    x = digits[0][:160]
    r = distill(teacher, pruned, data=feeds(x), max_seconds=20, progress=False).report
    s = r.settings
    assert r.epochs is None and r.improved
    assert "range test" in s["lr_chosen_by"] and LR_FLOOR <= s["lr"] <= LR_CEILING
    assert s["schedule"] == "cosine" and s["patience"] == DEFAULT_PATIENCE
    assert s["max_seconds"] == 20 and s["planned_epochs"] >= 1 and s["threads"] >= 1
    assert s["threads_chosen_by"]
    assert f"lr {s['lr']:.2g} (a tenth of" in r.plan and "warm-up" in r.plan
    lines = "\n".join(r.lines())
    assert "plan: " in lines and "threads: " in lines
    assert "held-back agreement per epoch (0: the input): 0: " in lines
    assert f"{r.best_epoch}: " in lines and "(best)" in lines
    assert r.seconds < 20 + 10  # the budget bounds the training; loading and judging add little


def test_without_a_budget_the_default_one_applies(teacher: ir.Model, digits: tuple) -> None:
    # The teacher as its own student: nothing to gain, so patience ends it long before.
    r = distill(teacher, teacher, data=feeds(digits[0][:48]), patience=2, progress=False).report
    assert r.settings["max_seconds"] == DEFAULT_TIME_BUDGET
    assert r.epochs_run == 2 and r.best_epoch == 0 and not r.improved
    assert r.stopped and "no gain on the held-back split for 2 epochs" in r.stopped


def test_early_stopping_stops_when_the_judge_stops_improving(
    teacher: ir.Model, pruned: ir.Model, digits: tuple
) -> None:
    r = distill(teacher, pruned, data=feeds(digits[0][:96]), patience=1, progress=False).report
    assert r.stopped and "stopped early" in r.stopped, r.lines()
    assert r.epochs_run < r.settings["planned_epochs"]
    # It stopped one epoch after the last gain: that epoch gained nothing on the best before it.
    last = r.agreement_per_epoch[-1]
    assert last is not None and last <= max(a for a in r.agreement_per_epoch[:-1] if a is not None)


def test_a_gain_is_agreement_or_a_clearly_lower_loss() -> None:
    def judged(agreement: float | None, loss: float, cosine: float = 0.9) -> Judged:
        return Judged(agreement=agreement, cosine=cosine, accuracy=None, loss=loss)

    assert _gain(judged(0.9, 1.0), 0.8, 1.0)
    assert _gain(judged(0.8, 0.9), 0.8, 1.0)
    # A cosine that creeps up, or a loss a hair lower, is not a gain.
    assert not _gain(judged(0.8, 0.99, cosine=0.99), 0.8, 1.0)
    assert _gain(judged(None, 0.5), None, 1.0) and not _gain(judged(None, 0.99), None, 1.0)


def test_warm_up_then_cosine_or_constant() -> None:
    plan = Plan(
        lr=1e-3, lr_why="given", epochs=10, epochs_why="given", patience=None,
        max_seconds=None, schedule="cosine", warmup_steps=5, steps_per_epoch=10,
    )  # fmt: skip
    rates = [plan.lr_at(step) for step in range(100)]
    assert rates[0] == pytest.approx(2e-4) and rates[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(rates[4:]))  # never rises after the top
    assert rates[-1] == pytest.approx(1e-5, rel=0.05)  # a hundredth at the end
    assert plan.lr_at(52) == pytest.approx(5.05e-4, rel=0.05)  # half way down
    constant = Plan(**{**plan.__dict__, "schedule": "constant"})
    assert {constant.lr_at(step) for step in range(100)} == {1e-3}
    assert "no early stop" in plan.line() and "lr 0.001 (given)" in plan.line()


def test_given_options_are_used_as_given(
    teacher: ir.Model, pruned: ir.Model, digits: tuple
) -> None:
    r = distill(
        teacher, pruned, data=feeds(digits[0][:96]), epochs=3, lr=2e-3, threads=1, progress=False
    ).report
    s = r.settings
    assert r.epochs == 3 and r.epochs_run == 3 and r.stopped is None
    assert s["lr"] == 2e-3 and s["lr_chosen_by"] == "given" and s["threads_chosen_by"] == "given"
    assert s["patience"] is None and s["max_seconds"] is None and s["planned_epochs"] == 3
    assert "lr 0.002 (given)" in r.plan and "at most 3 epochs (given)" in r.plan
    assert "no early stop" in r.plan
    with pytest.raises(InvalidInputError, match="patience must be >= 1"):
        distill(teacher, pruned, data=feeds(digits[0][:16]), patience=0, progress=False)
    with pytest.raises(InvalidInputError, match="schedule must be one of cosine, constant"):
        distill(teacher, pruned, data=feeds(digits[0][:16]), schedule="step", progress=False)


def test_cli_says_what_it_chose_and_what_was_given(
    tmp_path: Path, teacher: ir.Model, pruned: ir.Model, digits: tuple
) -> None:
    ir.save(teacher, tmp_path / "teacher.onnx")
    ir.save(pruned, tmp_path / "pruned.onnx")
    np.save(tmp_path / "digits.npy", digits[0][:96])
    base = [
        "--teacher", str(tmp_path / "teacher.onnx"), "--student", str(tmp_path / "pruned.onnx"),
        "--data", str(tmp_path / "digits.npy"),
    ]  # fmt: skip
    result = CliRunner().invoke(
        command, [*base, "-o", str(tmp_path / "a.onnx"), "--epochs", "2", "--lr", "1e-3"]
    )
    assert result.exit_code == 0, result.output
    assert "lr 0.001 (given)" in result.output and "at most 2 epochs (given)" in result.output
    result = CliRunner().invoke(
        command, [*base, "-o", str(tmp_path / "b.onnx"), "--time-budget", "5", "--patience", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "range test" in result.output and "stop after 1 epochs" in result.output
    result = CliRunner().invoke(command, [*base, "-o", str(tmp_path / "c.onnx"), "--patience", "0"])
    assert result.exit_code == 2 and "patience" in result.output


def weights(value: ir.Value | None) -> np.ndarray:
    assert value is not None and value.const_value is not None
    return value.const_value.numpy()


def test_half_the_channels_pruned_is_the_original_with_them_silenced(
    teacher: ir.Model, pruned: ir.Model, digits: tuple
) -> None:
    """Pruning the digits CNN by half loses accuracy (98.61% -> 71.94%) because of the channels
    it removes, not by a mistake: the pruned model computes what the original computes with
    those channels' filters and biases zeroed (the Flatten -> Gemm columns included)."""
    whole = prune(teacher, sparsity=0.0, multiple=1).model  # BatchNorms folded, nothing cut
    layers = [n for n in whole.graph if n.op_type == "Conv"]
    cut = [n for n in pruned.graph if n.op_type == "Conv"]
    silenced = whole.clone()
    kept_inputs: list[int] | None = None
    conv = [n for n in silenced.graph if n.op_type == "Conv"]
    for big, small, node in zip(layers, cut, conv, strict=True):
        weight = weights(big.inputs[1])
        if kept_inputs is not None:
            weight = weight[:, kept_inputs]
        rows = weights(small.inputs[1])
        kept = [int(np.abs(weight - row).reshape(len(weight), -1).sum(1).argmin()) for row in rows]
        assert len(set(kept)) == len(rows) < len(weight)
        for value in node.inputs[1:3]:
            assert value is not None
            array = weights(value).copy()
            array[[i for i in range(len(array)) if i not in kept]] = 0
            value.const_value = ir.tensor(array, name=value.name)
        kept_inputs = kept
    x = digits[2]

    def run(model: ir.Model) -> np.ndarray:
        proto = ir.to_proto(model).SerializeToString()
        session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, {"input": x})[0])

    np.testing.assert_allclose(run(pruned), run(silenced), atol=1e-4)


@pytest.mark.slow
def test_digits_pruned_by_half_then_distilled_with_no_options_within_one_point(
    teacher: ir.Model, pruned: ir.Model, digits: tuple
) -> None:
    """The issue's case: prune 0.5 then distill with its defaults, on the unlabeled training
    digits; judged on the 360 test digits no step saw. Measured: 98.61% -> 71.94% -> 97.78%
    in 45 s on a 2-core machine at load average 9."""
    x_train, _, x_test, y_test = digits
    original = accuracy(teacher, x_test, y_test)
    assert accuracy(pruned, x_test, y_test) < original - 0.1  # pruning hurt
    started = time.perf_counter()
    result = distill(teacher, pruned, data=feeds(x_train), progress=False)
    seconds = time.perf_counter() - started
    after = accuracy(result.model, x_test, y_test)
    assert after >= original - 0.01, (original, after, result.report.lines())
    assert seconds < DEFAULT_TIME_BUDGET + 60
