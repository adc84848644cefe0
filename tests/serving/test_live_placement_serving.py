"""Live placement in ``ferry serve`` (issue 32): a model served on several engines with sizes
nobody gave learns its plan per bucket of input sizes, once per version (the other instances
adopt what the first learns), and says so in ``/metrics`` and the statistics; warm-up inputs take
no bucket; what it writes into an artifact's ``ferry.json`` does not reload the model.

The engines are made up (``fake_engines``: ``close`` answers within the default budget) and the
trial's timer (a call run on ONNX Runtime and the contender in a pair) is replaced, so which plan
is faster is known.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from _serving_models import write_config, write_model
from onnx import helper

import fake_engines
from ferry.runtime import LiveSession, _live_trial
from ferry.serving import create_app
from ferry.serving._repository_files import fingerprint as _fingerprint

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

SEQ = 8


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


def timed(plan_ms: float, alone_ms: float) -> Any:
    """The trial's call timer, giving the contender and ONNX Runtime alone these times."""

    def fake(session: Any, inputs: Any, outputs: Any) -> tuple[Any, float]:
        alone = session.plan.backends == ["onnxruntime"]
        return session.run(inputs, outputs), alone_ms if alone else plan_ms

    return fake


@pytest.fixture
def client(repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[TestClient]:
    fake_engines.register(monkeypatch)
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_live_trial, "_timed", timed(1.0, 4.0))
    write_model(repo, "seq", 1, seq_model())
    write_config(repo, "seq", {"max_batch_size": 0, "instance_group": [{"count": 2}]})
    app = create_app(repo, backends="close,onnxruntime", threads=1)
    with TestClient(app) as test_client:
        assert app.state.ferry.started.wait(120)
        yield test_client


def _infer(client: TestClient, x: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    response = client.post("/v2/models/seq/infer", json=body)
    assert response.status_code == 200, response.text
    out = response.json()["outputs"][0]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_a_served_model_learns_once_adopts_everywhere_and_shows_it(client: TestClient) -> None:
    version = client.app.state.ferry.repository.get("seq")  # type: ignore[attr-defined]
    learner, sibling = version.loaded.sessions
    assert isinstance(learner, LiveSession) and isinstance(sibling, LiveSession)
    # The warm-up ran on found inputs without taking a bucket.
    assert learner.placement_report()["buckets"] == []
    x = np.random.default_rng(0).standard_normal((1, SEQ, fake_engines.WIDTH)).astype(np.float32)
    reference = ort.InferenceSession(seq_model().SerializeToString())
    truth = reference.run(None, {"x": x})[0]
    for _ in range(200):  # learning: ONNX Runtime's answer (JSON carries float32 exactly)
        got = _infer(client, x)
        assert np.allclose(got, truth, rtol=1e-5, atol=1e-6) or np.allclose(
            got, fake_engines.close(truth), rtol=1e-5, atol=1e-6
        )
        if learner.placement_settled(0.02):
            break
    assert learner.placement_settled(1), learner.placement_report()
    # Both instances run the plan now: the learner switched, the sibling adopted.
    for _ in range(4):
        np.testing.assert_allclose(_infer(client, x), fake_engines.close(truth), rtol=1e-5)
    bucket = {"x": [1, SEQ, fake_engines.WIDTH]}
    assert [s["how"] for s in sibling.placement_report()["switches"]] == ["adopted"]
    stats = client.get("/v2/models/seq/stats").json()["model_stats"][0]
    placement = stats["placement"]
    assert stats["name"] == "seq" and "inference_stats" in stats  # Triton's shape kept
    (learned,) = placement["buckets"]
    assert learned["bucket"] == bucket and learned["plan"] == "close"
    assert learned["speedup"] == pytest.approx(4.0)
    assert len(placement["instances"]) == 2
    for instance in placement["instances"]:
        (seen,) = instance
        assert seen["plan"] == "close" and seen["state"].startswith("switched"), seen
    text = client.get("/metrics").text
    assert re.search(
        r'ferry_placement_switches_total\{model="seq",plan="close",version="1"\} 1\.0', text
    ), text
    label = f'bucket="x=1x{SEQ}x{fake_engines.WIDTH}",model="seq",version="1"'
    assert f"ferry_placement_speedup{{{label}}} 4.0" in text, text
    assert f"ferry_placement_measured_speedup{{{label}}} 4.0" in text, text
    # A second scrape counts no switch twice.
    assert 'plan="close",version="1"} 1.0' in client.get("/metrics").text


def test_before_any_call_the_placement_is_shown_empty(client: TestClient) -> None:
    (stats,) = client.get("/v2/models/stats").json()["model_stats"]
    assert stats["placement"]["buckets"] == [] and stats["placement"]["switches"] == []
    assert stats["placement"]["offered"] == ["close", "onnxruntime"]
    assert "ferry_placement_switches_total{" not in client.get("/metrics").text


def test_what_ferry_writes_into_ferry_json_does_not_reload_the_model(tmp_path: Path) -> None:
    folder = tmp_path / "1"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"onnx")
    report = folder / "ferry.json"
    report.write_text(json.dumps({"format": "ferry-artifact", "shapes": {"x": [1, 8]}}))
    before = _fingerprint(folder)
    data = json.loads(report.read_text())
    data["placement"] = {"live": [{"key": "k", "bucket": {"x": [1, 8]}, "plan": None}]}
    data["found_inputs"] = {"model": "model.onnx", "shapes": {"x": [1, 8]}}
    report.write_text(json.dumps(data, indent=1))
    os.utime(report, ns=(1, 1))
    (folder / ".ferry.json.0a1b2c3d.tmp").write_text("{")  # an atomic write under way
    assert _fingerprint(folder) == before
    data["shapes"] = {"x": [1, 16]}  # a change the user made: reload
    report.write_text(json.dumps(data))
    assert _fingerprint(folder) != before
    (folder / "model.onnx").write_bytes(b"onnx2")
    report.write_text("not json")  # unreadable: its size and time stand for it
    assert _fingerprint(folder) != before


@pytest.mark.parametrize("where", ["config", "server"])
def test_placement_fixed_turns_learning_off(
    where: str, repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``"placement": "fixed"`` in config.json, or the server's ``--placement fixed``: the model
    keeps the plan made at load, learns nothing and reports no placement."""
    fake_engines.register(monkeypatch)
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))
    write_model(repo, "seq", 1, seq_model())
    config: dict[str, Any] = {"max_batch_size": 0}
    if where == "config":
        config["placement"] = "fixed"
    write_config(repo, "seq", config)
    server = {"placement": "fixed"} if where == "server" else {}
    app = create_app(repo, backends="close,onnxruntime", threads=1, **server)
    with TestClient(app) as test_client:
        assert app.state.ferry.started.wait(120)
        (version,) = app.state.ferry.repository.serving("seq")
        assert not any(isinstance(s, LiveSession) for s in version.loaded.sessions)
        stats = test_client.get("/v2/models/seq/stats").json()
        assert "placement" not in stats["model_stats"][0]


def test_a_config_with_an_unknown_placement_is_refused(repo: Path) -> None:
    write_model(repo, "seq", 1, seq_model())
    write_config(repo, "seq", {"placement": "sometimes"})
    app = create_app(repo, threads=1)
    with TestClient(app) as test_client:
        assert app.state.ferry.started.wait(60)
        index = test_client.post("/v2/repository/index").json()
        (row,) = index
        assert row["state"] == "UNAVAILABLE" and "'placement' must be \"live\"" in row["reason"]
