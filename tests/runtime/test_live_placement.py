"""Live placement (``ferry.load(placement="live")``): a session loaded without sizes starts on ONNX
Runtime alone and learns, per bucket of input sizes, the plan that pays, in the background.

The engines are made up (``fake_engines``): ``close`` answers within the default budget, ``wrong``
outside any; the trial's timer (each call run on ONNX Runtime and a contender in a pair) is
replaced so that which plan is faster is known.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import helper

import fake_engines
import ferry
from ferry.errors import InvalidInputError
from ferry.runtime import LiveSession, _live, _live_trial, _pays


def seq_model() -> Any:
    """``fake_engines.heavy_model`` with a symbolic dim past the batch: x[batch, seq, 512]."""
    proto = fake_engines.heavy_model()
    for value in (proto.graph.input[0], proto.graph.output[0]):
        value.CopyFrom(
            helper.make_tensor_value_info(
                value.name, value.type.tensor_type.elem_type, ["batch", "seq", fake_engines.WIDTH]
            )
        )
    return proto


def feeds(seq: int, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, seq, fake_engines.WIDTH)).astype(np.float32)}


def truth(proto: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def timed(plan_ms: float, alone_ms: float) -> Any:
    """The trial's call timer, giving a contender and ONNX Runtime alone these times."""

    def fake(session: Any, inputs: Any, outputs: Any) -> tuple[Any, float]:
        alone = session.plan.backends == ["onnxruntime"]
        return session.run(inputs, outputs), alone_ms if alone else plan_ms

    return fake


def blocks(plan_ms: float, alone_ms: float) -> Any:
    """The pays check's block timer at load (sizes known), with these times."""

    def time_in_blocks(runs: list[Any], inputs: Any, budget_s: float) -> None:
        for contender, session in runs:
            session.run(dict(inputs))
            contender.latency_ms = plan_ms if contender.label == "plan" else alone_ms

    return time_in_blocks


def settle(session: Any, *calls: dict[str, np.ndarray], limit_s: float = 60) -> list[Any]:
    """Feed ``calls`` in turn until the session's placement is settled (a bucket on trial is
    decided by its calls); every answer, in order."""
    answers = []
    deadline = time.monotonic() + limit_s
    while True:
        for inputs in calls:
            answers.append((inputs, session.run(inputs)))
        if session.placement_settled(0.02) or time.monotonic() > deadline:
            break
    assert session.placement_settled(1), session.placement_report()
    return answers


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    fake_engines.register(monkeypatch)
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))


def test_a_live_session_starts_on_onnxruntime_and_switches_when_the_plan_pays(
    engines: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_live_trial, "_timed", timed(1.0, 4.0))
    proto = seq_model()
    session = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    assert isinstance(session, LiveSession)
    assert session.plan.backends == ["onnxruntime"]
    caplog.set_level(logging.INFO, logger="ferry.runtime._live")
    short = feeds(8)
    expected = truth(proto, short)
    # Every call while learning is ONNX Runtime's answer, exactly.
    answers = settle(session, short)
    for _, got in answers:
        np.testing.assert_array_equal(got["y"], expected)
    report = session.placement_report()
    (bucket,) = report["buckets"]
    assert bucket["bucket"] == {"x": [1, 8, fake_engines.WIDTH]}
    assert bucket["plan"] == "close" and bucket["state"].startswith("switched")
    assert bucket["speedup"] == pytest.approx(4.0)
    assert len(report["switches"]) == 1 and "switched to close" in caplog.text
    # Now on ``close``: within budget of the truth, not the truth itself.
    got = session.run(short)["y"]
    np.testing.assert_allclose(got, fake_engines.close(expected), rtol=1e-6)
    (bucket,) = session.placement_report()["buckets"]
    assert bucket["calls"] == len(answers) + 1
    assert _live_trial.MIN_TRIAL_PAIRS <= bucket["trial_calls"] <= len(answers)
    assert "over 5 calls (4.00x)" in bucket["tried"][0]


def test_a_plan_that_does_not_pay_is_not_taken_and_warned(
    engines: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_live_trial, "_timed", timed(9.0, 4.0))
    proto = seq_model()
    session = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    short = feeds(8)
    settle(session, short)
    (bucket,) = session.placement_report()["buckets"]
    assert bucket["plan"] == "onnxruntime" and "no plan is faster" in bucket["state"]
    assert (
        "running ONNX Runtime alone" in caplog.text and "9 ms vs ONNX Runtime 4 ms" in caplog.text
    )
    np.testing.assert_array_equal(session.run(short)["y"], truth(proto, short))


def test_a_plan_outside_the_judge_is_never_taken(
    engines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_live_trial, "_timed", timed(1.0, 4.0))  # fast, but wrong
    proto = seq_model()
    session = ferry.load(proto, backends="wrong,onnxruntime", cache_dir=False)
    short = feeds(8)
    settle(session, short)
    (bucket,) = session.placement_report()["buckets"]
    assert "no plan passed the judge" in bucket["state"]
    assert "outside the accuracy budget" in bucket["tried"][0]
    assert not session.placement_report()["switches"]
    np.testing.assert_array_equal(session.run(short)["y"], truth(proto, short))


def test_buckets_are_learned_apart_and_the_next_load_starts_on_what_was_learned(
    engines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[int]] = []

    def by_size(session: Any, inputs: Any, outputs: Any) -> tuple[Any, float]:
        seq = int(inputs["x"].shape[1])
        calls.append(list(inputs["x"].shape))
        alone = session.plan.backends == ["onnxruntime"]
        # ``close`` pays on long inputs only.
        return session.run(inputs, outputs), 4.0 if alone else (1.0 if seq > 16 else 9.0)

    monkeypatch.setattr(_live_trial, "_timed", by_size)
    proto = seq_model()
    session = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    short, long = feeds(8), feeds(32)
    settle(session, short, long)
    states = {b["bucket"]["x"][1]: b for b in session.placement_report()["buckets"]}
    assert states[8]["plan"] == "onnxruntime" and states[32]["plan"] == "close"
    np.testing.assert_array_equal(session.run(short)["y"], truth(proto, short))
    np.testing.assert_allclose(
        session.run(long)["y"], fake_engines.close(truth(proto, long)), rtol=1e-6
    )
    timed_calls = len(calls)
    # A new load: both buckets known at once, nothing timed again.
    again = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    assert isinstance(again, LiveSession)
    known = {b["bucket"]["x"][1]: b for b in again.placement_report()["buckets"]}
    assert known[32]["plan"] == "close" and known[8]["plan"] == "onnxruntime"
    np.testing.assert_allclose(
        again.run(long)["y"], fake_engines.close(truth(proto, long)), rtol=1e-6
    )
    again.run(short)
    assert again.placement_settled(5) and len(calls) == timed_calls


def test_learning_is_bounded_per_session(engines: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_live_trial, "_timed", timed(9.0, 4.0))
    monkeypatch.setattr(_live, "MAX_BUCKETS", 2)
    session = ferry.load(seq_model(), backends="close,onnxruntime", cache_dir=False)
    settle(session, feeds(2), feeds(3), feeds(4))
    states = [b["state"] for b in session.placement_report()["buckets"]]
    assert sum("bounded" in s for s in states) == 1


def test_auto_learns_per_bucket_on_the_real_call(
    engines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[int]] = []

    def auto_plan(model: ir.Model, **kwargs: Any) -> Any:
        seen.append(list(kwargs["feeds"]["x"].shape))
        return ferry.runtime.auto_plan(model, backends=["close", "wrong"], **kwargs)

    monkeypatch.setattr(_live, "auto_plan", functools.partial(auto_plan))
    proto = seq_model()
    session = ferry.load(proto, backends="auto", cache_dir=False)
    assert isinstance(session, LiveSession) and session.plan.backends == ["onnxruntime"]
    long = feeds(32, batch=2)
    for _, got in settle(session, long):
        np.testing.assert_array_equal(got["y"], truth(proto, long))
    assert seen == [[2, 32, fake_engines.WIDTH]]
    (bucket,) = session.placement_report()["buckets"]
    assert bucket["plan"] == "close fp32" and bucket["speedup"] > 1


def test_a_bucket_auto_keeps_on_onnxruntime_says_so(
    engines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def auto_plan(model: ir.Model, **kwargs: Any) -> Any:
        return ferry.runtime.auto_plan(model, backends=["wrong"], **kwargs)

    monkeypatch.setattr(_live, "auto_plan", auto_plan)
    session = ferry.load(seq_model(), backends="auto", cache_dir=False)
    settle(session, feeds(8))
    (bucket,) = session.placement_report()["buckets"]
    assert bucket["plan"] == "onnxruntime" and bucket["state"] == "on onnxruntime (auto's choice)"


def test_fixed_placement_and_a_forced_plan_keep_todays_behaviour(
    engines: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_pays, "time_in_blocks", blocks(9.0, 4.0))
    proto = seq_model()
    fixed = ferry.load(proto, backends="close,onnxruntime", cache_dir=False, placement="fixed")
    assert not isinstance(fixed, LiveSession) and fixed.plan.backends == ["close"]
    forced = ferry.load(proto, backends="close,onnxruntime", cache_dir=False, check_pays=False)
    assert not isinstance(forced, LiveSession) and forced.plan.backends == ["close"]
    sized = ferry.load(
        proto, backends="close,onnxruntime", cache_dir=False, shapes={"x": (1, 8, 512)}
    )
    assert not isinstance(sized, LiveSession) and sized.plan.backends == ["onnxruntime"]
    alone = ferry.load(proto, backends="close", cache_dir=False)
    assert not isinstance(alone, LiveSession)
    with pytest.raises(InvalidInputError, match="placement must be 'live'"):
        ferry.load(proto, backends="close,onnxruntime", placement="sometimes")


def test_a_known_bucket_costs_a_lookup(engines: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live route adds little to a call (measured: ~0.6 us on a 5 us call); the two are
    timed call by call in turn, so a busy machine slows both alike, and the bound is generous."""
    monkeypatch.setattr(_live_trial, "_timed", timed(9.0, 4.0))
    proto = seq_model()
    live = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    plain = ferry.load(proto, cache_dir=False)
    small = feeds(1)
    settle(live, small)
    times: dict[Any, list[float]] = {live: [], plain: []}
    for _ in range(300):
        for session, spent in times.items():
            start = time.perf_counter()
            session.run(small)
            spent.append(time.perf_counter() - start)
    live_s, plain_s = (float(np.median(times[s])) for s in (live, plain))
    assert live_s < plain_s * 1.3 + 20e-6, (live_s, plain_s)


def test_exiting_while_openvino_learns_is_clean(tmp_path: Any) -> None:
    """An engine compiling in the learner's daemon thread when the interpreter tears down aborted
    the process (rc 134, ``terminate called without an active exception``): exit stops it."""
    import subprocess
    import sys

    pytest.importorskip("openvino")
    model = tmp_path / "seq.onnx"
    model.write_bytes(seq_model().SerializeToString())
    env = {**__import__("os").environ, "FERRY_CACHE_DIR": str(tmp_path / "cache")}
    # Where exit lands in the learner's work is a matter of timing: exit at a few moments.
    for delay in (0.0, 0.01, 0.02, 0.05):
        script = (
            "import time, numpy as np, ferry\n"
            f"s = ferry.load({str(model)!r}, backends='openvino,onnxruntime', cache_dir=False)\n"
            f"s.run({{'x': np.ones((1, 8, 512), np.float32)}}); time.sleep({delay})\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (delay, done.stderr[-2000:])


def test_what_was_learned_travels_with_the_artifact(
    engines: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """An artifact ferry made keeps the learned plan in its ferry.json: a load with an empty cache
    (another process, another cache folder) starts the bucket on it."""
    monkeypatch.setattr(_live_trial, "_timed", timed(1.0, 4.0))
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    proto = seq_model()
    (artifact / "model.onnx").write_bytes(proto.SerializeToString())
    (artifact / "ferry.json").write_text('{"source": "test"}', encoding="utf-8")
    session = ferry.load(artifact / "model.onnx", backends="close,onnxruntime", cache_dir=False)
    settle(session, feeds(8))
    kept = json.loads((artifact / "ferry.json").read_text(encoding="utf-8"))
    assert kept["source"] == "test"  # the rest of the report is untouched
    (record,) = kept["placement"]["live"]
    assert record["bucket"] == {"x": [1, 8, fake_engines.WIDTH]} and record["label"] == "close"
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "another-cache"))
    again = ferry.load(artifact / "model.onnx", backends="close,onnxruntime", cache_dir=False)
    (bucket,) = again.placement_report()["buckets"]
    assert bucket["plan"] == "close" and bucket["state"] == "switched (learned before)"
    # A plain .onnx beside no ferry.json gets none written.
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(proto.SerializeToString())
    elsewhere = ferry.load(plain, backends="close,onnxruntime", cache_dir=False)
    settle(elsewhere, feeds(4))
    assert not (tmp_path / "ferry.json").exists()


def test_a_follower_adopts_what_its_leader_learns_without_learning(
    engines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's second instance: it never learns, and takes each switch of the first."""
    monkeypatch.setattr(_live_trial, "_timed", timed(1.0, 4.0))
    proto = seq_model()
    leader = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    follower = ferry.load(proto, backends="close,onnxruntime", cache_dir=False)
    assert isinstance(leader, LiveSession) and isinstance(follower, LiveSession)
    follower.follow(leader)
    heard: list[dict[str, Any]] = []
    leader.on_switch(heard.append)
    follower.run(feeds(40))  # sizes only the follower sees: the leader learns them
    assert follower.placement_settled(1)  # the follower itself learns nothing
    settle(leader, feeds(24), feeds(40))
    assert sorted(s["bucket"]["x"][1] for s in heard) == [24, 40]
    assert all(s["plan"] == "close" and s["plan_dict"]["partitions"] for s in heard)
    by_size = {b["bucket"]["x"][1]: b for b in follower.placement_report()["buckets"]}
    for size in (24, 40):
        assert by_size[size]["plan"] == "close" and by_size[size]["state"] == "switched (adopted)"
    assert [s["how"] for s in follower.switches] == ["adopted", "adopted"]
    expected = truth(proto, feeds(24))
    np.testing.assert_allclose(
        follower.run(feeds(24))["y"], fake_engines.close(expected), rtol=1e-6
    )
