"""``backends="auto"``: measured at the sizes the model runs at, judged by an accuracy budget.

The engines here are made up (``fake_engines``): they answer from a cache, so they are far faster
than ONNX Runtime on the heavy model whatever the machine's noise, and their accuracy is known in
advance (``close`` within the default budget, ``wrong`` outside any).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import fake_engines
import ferry
from ferry.errors import InvalidInputError
from ferry.graph import prepare
from ferry.plan import Plan
from ferry.runtime import _auto, auto_plan, timing_feeds
from ferry.runtime._auto import Candidate, choose


def heavy() -> ir.Model:
    return prepare(ir.from_proto(fake_engines.heavy_model()))


class Recording(fake_engines.FakeEngine):
    """``close``, remembering the input shapes it was run at, in two precisions."""

    precisions = ("fp32", "bf16")
    seen: ClassVar[list[tuple[int, ...]]] = []

    def compile(self, spec: Any) -> Any:
        inner = super().compile(spec)
        seen = self.seen

        class Run:
            def run(self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None):
                seen.extend(tuple(v.shape) for v in inputs.values())
                return inner.run(inputs, outputs)

            def serialize(self) -> bytes:
                return b""

        return Run()


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.backends._registry as registry

    fake_engines.register(monkeypatch)
    Recording.seen = []
    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, "recording": "-"})
    monkeypatch.setitem(
        registry._instances, "recording", Recording("recording", fake_engines.close)
    )


def test_auto_picks_the_fast_engine_within_budget_and_refuses_the_wrong_one(engines: None) -> None:
    choice = auto_plan(heavy(), backends=["close", "wrong"], budget_s=0.2, cache=False)
    assert choice.label == "close fp32"
    rows = {row["label"]: row for row in choice.table}
    assert rows["onnxruntime fp32"]["passed"] and rows["onnxruntime fp32"]["speedup"] == 1.0
    assert rows["close fp32"]["passed"] and rows["close fp32"]["speedup"] > 1.0
    wrong = rows["wrong fp32"]
    assert not wrong["passed"] and wrong["accuracy"]["worst"] < 0  # fastest, but negated
    # A budget ``close`` cannot meet leaves only the baseline.
    strict = auto_plan(
        heavy(),
        backends=["close"],
        accuracy={"kind": "cosine", "min": 1.0},
        budget_s=0.2,
        cache=False,
    )
    assert strict.label == "onnxruntime fp32"
    assert strict.plan.backends == ["onnxruntime"]


def test_auto_times_at_the_sizes_given(engines: None) -> None:
    choice = auto_plan(
        heavy(), backends=["recording"], shapes={"x": (8, 512)}, budget_s=0.1, cache=False
    )
    assert set(Recording.seen) == {(8, 512)}
    assert choice.inputs == {"x": [8, 512]} and choice.random_inputs
    feeds = {"x": np.ones((3, 512), np.float32)}
    Recording.seen = []
    given = auto_plan(heavy(), backends=["recording"], feeds=feeds, budget_s=0.1, cache=False)
    assert set(Recording.seen) == {(3, 512)} and not given.random_inputs


def test_each_precision_is_a_candidate_and_exact_measures_fp32_only(engines: None) -> None:
    choice = auto_plan(heavy(), backends=["recording"], budget_s=0.2, cache=False)
    labels = [row["label"] for row in choice.table]
    assert labels == ["onnxruntime fp32", "recording fp32", "recording bf16"]
    exact = auto_plan(heavy(), backends=["recording"], exact=True, budget_s=0.1, cache=False)
    assert [row["label"] for row in exact.table] == ["onnxruntime fp32", "recording fp32"]
    only = auto_plan(heavy(), backends=["recording"], precision="bf16", budget_s=0.1, cache=False)
    assert [row["label"] for row in only.table] == ["onnxruntime fp32", "recording bf16"]


def test_choose_breaks_near_ties_toward_the_baseline_then_fewer_partitions() -> None:
    model = heavy()
    whole = Plan.whole_graph(model, "onnxruntime")

    def cand(label: str, ms: float, precision: str = "fp32", ok: bool = True) -> Candidate:
        c = Candidate(label, whole, precision, latency_ms=ms)
        c.accuracy = ferry.parity.within_budget(
            {"y": np.ones(2)}, {"y": np.ones(2) if ok else -np.ones(2)}
        )
        return c

    base = cand("onnxruntime fp32", 10.0)
    assert choose([base, cand("a fp32", 9.95)]) is base  # within the 1% floor: not worth it
    fast = cand("a fp32", 8.0)
    assert choose([base, fast, cand("a bf16", 7.95, "bf16")]) is fast
    assert choose([base, cand("b", 1.0, ok=False)]) is base  # outside budget, however fast


def test_auto_finds_sizes_it_is_not_given() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x], [y], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = prepare(ir.from_proto(proto))
    # Measured at sizes the model runs at (found by running it), never a symbolic dim set to 1.
    choice = auto_plan(model, backends=[], cache=False)
    batch, channels, height, width = choice.inputs["x"]
    assert (batch, channels) == (1, 3) and height > 3 and width > 3
    # Without the model to probe, the sizes stay unknown and the error names them.
    specs = ferry.load(model).inputs
    with pytest.raises(InvalidInputError, match=r"x dims 2, 3 .*--shape x=") as info:
        timing_feeds(specs)
    assert "batch" not in str(info.value).split("(")[0]  # a symbolic batch alone would be 1
    assert timing_feeds(specs, {"x": (1, 3, 40, 60)})["x"].shape == (1, 3, 40, 60)


def test_simulated_adapters_are_left_out_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.backends._registry as registry

    class Simulated(fake_engines.FakeEngine):
        simulated = True

    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, "sim": "-"})
    monkeypatch.setitem(registry._instances, "sim", Simulated("sim", fake_engines.close))
    assert "sim" not in _auto.auto_engines(None)
    assert "sim" in _auto.auto_engines(["sim"])


def test_the_choice_and_table_are_cached_and_remeasured_on_request(engines: None) -> None:
    first = auto_plan(heavy(), backends=["close"], budget_s=0.1)
    assert first.cache_path is not None and first.cache_path.is_file()
    again = auto_plan(heavy(), backends=["close"], budget_s=0.1)
    assert again.from_cache and again.label == first.label and again.table == first.table
    other_size = auto_plan(heavy(), backends=["close"], shapes={"x": (2, 512)}, budget_s=0.1)
    assert not other_size.from_cache  # another size is another measurement
    fresh = auto_plan(heavy(), backends=["close"], budget_s=0.1, remeasure=True)
    assert not fresh.from_cache and fresh.candidates
