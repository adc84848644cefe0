"""Never slower than asked (issue 32): a split plan competes with each of its engines alone, and
the fastest engine alone replaces it, not ONNX Runtime by default.

mobilenet_v2 on ``["acme_npu", "openvino", "onnxruntime"]``: the example NPU takes the plain
convolutions and refuses the grouped ones, OpenVINO takes those, so the plan alternates between
the two; OpenVINO alone takes the whole model. The timing itself is replaced by fixed figures
(speed is checked in benchmarks/placement.py), so what is tested is the decision.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import zoo
from ferry.backends import get_backend, place
from ferry.graph import prepare
from ferry.runtime import _load, _pays
from ferry.runtime._measure import save_verdict
from ferry.runtime._pays import PaysVerdict, single_engine_plans, winning_plan

ENGINES = ["acme_npu", "openvino", "onnxruntime"]
AT = {"x": [1, 3, 224, 224]}


@pytest.fixture()
def split(acme_npu: str) -> tuple[Any, Any]:
    pytest.importorskip("openvino")
    model = prepare(zoo.build("mobilenet_v2"))
    plan = place(model, [get_backend(n) for n in ENGINES])
    assert len(plan.partitions) > 2 and {"acme_npu", "openvino"} <= set(plan.backends)
    return model, plan


def test_a_split_plans_engine_that_takes_the_whole_model_is_a_contender(split: Any) -> None:
    model, plan = split
    singles = single_engine_plans(model, plan)
    # The NPU refuses the grouped convolutions: it cannot run the model alone.
    assert list(singles) == ["openvino"]
    (part,) = singles["openvino"].partitions
    assert part.backend == "openvino" and len(part.nodes) == len(list(model.graph))
    assert single_engine_plans(model, singles["openvino"]) == {}  # one partition: itself


def test_the_fastest_engine_alone_wins_beyond_the_noise() -> None:
    slow_plan = PaysVerdict(10.0, 8.0, AT, others=(("openvino", 5.0, 0.0),))
    assert not slow_plan.pays and slow_plan.fastest_alone[0] == "openvino"
    assert "OpenVINO alone in 5 ms" in slow_plan.describe()
    tie = PaysVerdict(10.0, 8.0, AT, others=(("openvino", 7.95, 0.02),))
    assert tie.fastest_alone[0] == "onnxruntime"  # within the noise: nothing to compile
    fast_plan = PaysVerdict(4.0, 8.0, AT, others=(("openvino", 5.0, 0.0),))
    assert fast_plan.pays
    assert not PaysVerdict(4.9, 8.0, AT, 0.05, 0.0, (("openvino", 5.0, 0.0),)).pays


def test_load_replaces_a_slower_split_by_the_fastest_engine_alone(
    split: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    model, plan = split
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    timed: list[list[str]] = []

    def measured(work: Any, placed: Any, feeds: Any, **kw: Any) -> PaysVerdict:
        timed.append(sorted(kw["singles"]))
        return PaysVerdict(10.0, 8.0, AT, others=(("openvino", 5.0, 0.01),))

    monkeypatch.setattr(_load, "plan_pays", measured)
    (name,) = [v.name for v in model.graph.inputs]
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32), dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="ferry"):
        session = ferry.load(model, backends=ENGINES, example_inputs={name: x})
    assert timed == [["openvino"]]
    assert session.plan.backends == ["openvino"] and len(session.plan.partitions) == 1
    assert "running openvino alone" in caplog.text and "OpenVINO alone in 5 ms" in caplog.text
    assert winning_plan(prepare(model), plan, PaysVerdict(4.0, 8.0, AT)) == plan


def test_a_verdict_with_other_engines_is_cached_whole(
    split: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, plan = split
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    verdict = PaysVerdict(10.0, 8.0, AT, 0.01, 0.02, (("openvino", 5.0, 0.03),))
    feeds = {"x": np.zeros(AT["x"], np.float32)}
    path = _pays._path(model, plan, AT, None)
    save_verdict(path, dataclasses.asdict(verdict), "test")
    assert _pays.cached_verdict(model, plan, feeds) == verdict


def test_a_faster_plan_with_wrong_answers_is_not_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """The pays check judges before it times: ``wrong`` (a made-up engine answering outside any
    budget) is never run, however fast."""
    import fake_engines

    fake_engines.register(monkeypatch)
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    timed: list[Any] = []
    monkeypatch.setattr(_load, "plan_pays", lambda *a, **k: timed.append(a))
    proto = fake_engines.heavy_model()
    x = np.random.default_rng(0).standard_normal((4, fake_engines.WIDTH), dtype=np.float32)
    with caplog.at_level(logging.WARNING, logger="ferry"):
        session = ferry.load(proto, backends="wrong,onnxruntime", example_inputs={"x": x})
    assert session.plan.backends == ["onnxruntime"] and not timed
    assert "answers (1 partition(s) on wrong) are outside the accuracy budget" in caplog.text
    assert "on the example inputs" in caplog.text
