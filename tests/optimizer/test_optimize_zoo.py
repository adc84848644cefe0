"""The optimizer on the zoo (PyTorch exports made in code): every model at every level and
target keeps its answers; the digits CNN keeps its accuracy; the transformer block's attention
fuses into ONNX Runtime's kernel when ONNX Runtime is the target."""

from __future__ import annotations

import numpy as np
import pytest

import ferry

torch = pytest.importorskip("torch")
from ferry import zoo  # noqa: E402  (first-party: imported, never skipped)
from ferry.optimizer import optimize  # noqa: E402
from optimizer.check import ops  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def built() -> dict[str, object]:
    return {name: zoo.build(name) for name in zoo.names()}


@pytest.mark.parametrize("name", ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"])
@pytest.mark.parametrize(
    ("level", "target"), [("basic", None), ("extended", None), ("extended", "onnxruntime")]
)
def test_zoo_keeps_answers(
    built: dict[str, object], name: str, level: str, target: str | None
) -> None:
    feeds = zoo.example_inputs(name, batch=4)
    result = optimize(built[name], level=level, target=target, example_inputs=feeds, measure=False)  # type: ignore[arg-type]
    assert result.accepted, result.report.refused
    assert result.report.nodes_after <= result.report.nodes_before
    want = ferry.load(built[name]).run(feeds)  # type: ignore[arg-type]
    got = ferry.load(result.model).run(feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5)
    again = optimize(result.model, level=level, target=target, verify=False, measure=False)
    assert again.report.nodes_after == result.report.nodes_after


def test_digits_accuracy_after_optimizing(built: dict[str, object]) -> None:
    result = optimize(built["digits_cnn"], level="extended", measure=False)  # type: ignore[arg-type]
    assert zoo.digits_accuracy(ferry.load(result.model).run) >= 0.95


def test_transformer_attention_fuses_for_onnxruntime(built: dict[str, object]) -> None:
    model = built["transformer_block"]
    result = optimize(model, level="extended", target="onnxruntime", measure=False)  # type: ignore[arg-type]
    found = ops(result.model)
    assert found.get("Attention", 0) + found.get("MultiHeadAttention", 0) == 1, found
    assert "Softmax" not in found
    # Rules valid for every engine leave the contrib ops out.
    plain = optimize(model, level="extended", measure=False)  # type: ignore[arg-type]
    assert "Attention" not in ops(plain.model) and "MultiHeadAttention" not in ops(plain.model)
