"""``ferry.optimizer.distill``: a damaged digits CNN won back from the original on unlabeled real
digits, the export's parity, determinism, the time bound, never handing back a worse student,
bad inputs, and ``ferry distill`` (the command)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from ferry import zoo
from ferry.errors import InvalidInputError

pytest.importorskip("torch")

from ferry.cli._distill import EXIT_UNCHANGED, command
from ferry.optimizer.distill import distill
from ferry.optimizer.distill._train import loss_kind

#: Training samples (unlabeled) from the digits training split; the test split judges.
COUNT = 320


@pytest.fixture(scope="module")
def teacher() -> ir.Model:
    return zoo.build("digits_cnn")


def damaged(model: ir.Model, noise: float = 0.8, seed: int = 0) -> ir.Model:
    """A copy whose float weights carry Gaussian noise of ``noise`` times their own spread."""
    out = model.clone()
    rng = np.random.default_rng(seed)
    for name, value in out.graph.initializers.items():
        array = value.const_value.numpy()
        if array.dtype == np.float32 and array.size > 1:
            noisy = array + rng.normal(0, noise * array.std(), array.shape)
            value.const_value = ir.tensor(noisy.astype(np.float32), name=name)
    return out


@pytest.fixture(scope="module")
def student(teacher: ir.Model) -> ir.Model:
    return damaged(teacher)


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x_train, y_train, x_test, _ = zoo.digits_data()
    return x_train[:COUNT], y_train[:COUNT], x_test


def feeds(x: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"input": x[i : i + 1]} for i in range(len(x))]


def predict(model: ir.Model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return np.asarray(session.run(None, {"input": x})[0])


def test_distill_wins_back_a_damaged_student(
    teacher: ir.Model, student: ir.Model, digits: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> None:
    x, y, x_test = digits
    result = distill(teacher, student, data=feeds(x), labels=y, epochs=6, progress=False, threads=1)
    r = result.report
    assert r.improved and r.unchanged is None and r.best_epoch >= 1
    assert r.agreement_before is not None and r.agreement_after is not None
    assert r.agreement_after > r.agreement_before + 0.03
    assert r.cosine_after > r.cosine_before
    assert r.outputs == {"logits": "kl-logits"}
    assert r.epochs_run == 6 and len(r.loss_per_epoch) == 6
    assert r.loss_per_epoch[-1] < r.loss_per_epoch[0]
    assert r.accuracy_after is not None and r.accuracy_teacher is not None
    assert r.accuracy_after >= r.accuracy_before
    # The export (checked inside) matches the trained module.
    assert r.parity_max_abs is not None and r.parity_max_abs < 1e-4
    # On the 360 real test digits, never seen here: the student agrees with the teacher more.
    want = predict(teacher, x_test).argmax(1)
    before = np.mean(predict(student, x_test).argmax(1) == want)
    after = np.mean(predict(result.model, x_test).argmax(1) == want)
    assert after > before + 0.03, (before, after)
    # Same graph, new weights; the input student is untouched.
    assert [n.op_type for n in result.model.graph] == [n.op_type for n in student.graph]
    assert np.mean(predict(student, x_test).argmax(1) == want) == before
    d = r.to_dict()
    assert d["improved"] and json.dumps(d)


def test_same_seed_same_weights(teacher: ir.Model, student: ir.Model, digits: tuple) -> None:
    x = digits[0][:96]

    def weights(seed: int) -> dict[str, np.ndarray]:
        model = distill(
            teacher, student, data=feeds(x), epochs=2, seed=seed, progress=False, threads=1, lr=3e-3
        ).model
        return {k: v.const_value.numpy() for k, v in model.graph.initializers.items()}

    first, again, other = weights(0), weights(0), weights(1)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert any(not np.array_equal(first[n], other[n]) for n in first)


def test_max_seconds_stops_after_the_current_epoch(
    teacher: ir.Model, student: ir.Model, digits: tuple
) -> None:
    result = distill(
        teacher,
        student,
        data=feeds(digits[0][:64]),
        epochs=50,
        max_seconds=0.001,
        progress=False,
        threads=1,
    )
    assert result.report.epochs_run == 1
    assert result.report.stopped is not None and "time budget" in result.report.stopped


def test_a_student_that_cannot_improve_is_returned_unchanged(
    teacher: ir.Model, digits: tuple
) -> None:
    # The teacher itself: every epoch can only move it away from the teacher.
    result = distill(
        teacher, teacher, data=feeds(digits[0][:48]), epochs=1, progress=False, threads=1
    )
    assert not result.report.improved
    assert result.report.unchanged and "no epoch beat" in result.report.unchanged
    assert result.model is teacher
    assert result.report.agreement_after == result.report.agreement_before == 1.0


def test_feature_pairs_with_a_projection(
    teacher: ir.Model, student: ir.Model, digits: tuple
) -> None:
    # relu (16 channels) is matched to the teacher's relu_1 (32 channels): a 1x1 projection.
    result = distill(
        teacher,
        student,
        data=feeds(digits[0][:96]),
        epochs=2,
        feature_pairs={"relu": "relu_1", "relu_1": "relu_1"},
        progress=False,
        threads=1,
    )
    assert result.report.features == {"relu": "relu_1", "relu_1": "relu_1"}
    assert len(result.report.loss_per_epoch) == 2
    with pytest.raises(InvalidInputError, match="only the channel count"):
        distill(
            teacher, student, data=feeds(digits[0][:16]), feature_pairs={"relu": "view"},
            progress=False, threads=1,
        )  # fmt: skip
    with pytest.raises(InvalidInputError, match="does not have"):
        distill(
            teacher, student, data=feeds(digits[0][:16]), feature_pairs={"relu": "nope"},
            progress=False, threads=1,
        )  # fmt: skip


def renamed_output(model: ir.Model, name: str) -> ir.Model:
    out = model.clone()
    out.graph.outputs[0].name = name
    return out


def fewer_classes(model: ir.Model) -> ir.Model:
    """The head cut to 9 classes (its Gemm's weight and bias)."""
    out = model.clone()
    gemm = next(n for n in out.graph if n.op_type == "Gemm")
    for value in gemm.inputs[1:]:
        assert value is not None and value.const_value is not None
        value.const_value = ir.tensor(value.const_value.numpy()[:9], name=value.name)
    out.graph.outputs[0].shape = None
    return out


def test_bad_inputs_are_named(teacher: ir.Model, student: ir.Model, digits: tuple) -> None:
    data = feeds(digits[0][:16])
    with pytest.raises(InvalidInputError, match="outputs are \\['logits'\\].*'scores'"):
        distill(teacher, renamed_output(student, "scores"), data=data, progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="\\[10\\] in the teacher"):
        distill(teacher, fewer_classes(student), data=data, progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="at least 2 samples"):
        distill(teacher, student, data=[], progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="has no input 'input'"):
        distill(teacher, student, data=[{"x": digits[0][:1]}] * 4, progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="3 labels for 16 samples"):
        distill(teacher, student, data=data, labels=[1, 2, 3], progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="epochs must be >= 1.*lr must be > 0"):
        distill(teacher, student, data=data, epochs=0, lr=0, progress=False, threads=1)
    with pytest.raises(InvalidInputError, match="not found"):
        distill(teacher, student, data="/no/such/file.npz", progress=False, threads=1)


def test_loss_rule() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 5)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert loss_kind(logits) == "kl-logits"
    assert loss_kind(probs) == "kl-probs"
    assert loss_kind(probs.reshape(2, 4, 5)) == "kl-probs"
    assert loss_kind(rng.standard_normal((2, 4, 5)).astype(np.float32)) == "mse"  # a map
    assert loss_kind(rng.standard_normal((8, 1)).astype(np.float32)) == "mse"  # one score
    assert loss_kind(rng.standard_normal((8,)).astype(np.float32)) == "mse"


def test_cli_writes_the_student_and_its_report(
    tmp_path: Path, teacher: ir.Model, student: ir.Model, digits: tuple
) -> None:
    x, y, _ = digits
    ir.save(teacher, tmp_path / "teacher.onnx")
    ir.save(student, tmp_path / "student.onnx")
    np.save(tmp_path / "digits.npy", x[:160])
    np.save(tmp_path / "labels.npy", y[:160])
    out = tmp_path / "distilled.onnx"
    args = [
        "--teacher", str(tmp_path / "teacher.onnx"), "--student", str(tmp_path / "student.onnx"),
        "--data", str(tmp_path / "digits.npy"), "--labels", str(tmp_path / "labels.npy"),
        "-o", str(out), "--epochs", "3", "--lr", "3e-3", "--threads", "1",
    ]  # fmt: skip
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    assert "agreement" in result.output and out.is_file()
    report = json.loads(out.with_suffix(".distill.json").read_text())
    assert report["improved"] and report["epochs_run"] == 3

    same = tmp_path / "same.onnx"
    args = [
        "--teacher", str(tmp_path / "teacher.onnx"), "--student", str(tmp_path / "teacher.onnx"),
        "--data", str(tmp_path / "digits.npy"), "-o", str(same), "--epochs", "1", "--threads", "1",
    ]  # fmt: skip
    result = CliRunner().invoke(command, args)
    assert result.exit_code == EXIT_UNCHANGED, result.output
    assert "not written" in result.output and not same.exists()
