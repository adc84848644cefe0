"""Readiness that tells the truth: a version is READY only once its warm-up passed; the server is
ready (Triton's strict readiness) only while every model that should be loaded is READY."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from _serving_models import _model, add_const, gather_rows, write_config, write_model
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

from ferry.serving import create_app


def fails_at_run_time() -> onnx.ModelProto:
    """x[n] -> Reshape(x, Shape(x) + 1): loads, but no input can run (n elements into n + 1)."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Add", ["shape", "one"], ["bigger"]),
            helper.make_node("Reshape", ["x", "bigger"], ["y"]),
        ],
        "fails_at_run_time",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [one],
    )
    return _model(graph)


def reshaper() -> onnx.ModelProto:
    """x[n], shape[2] int64 -> Reshape(x, shape): random shapes fail, real ones (and ones) run."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshaper",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
    )
    return _model(graph)


X = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


@contextlib.contextmanager
def started(repo: Path, **kwargs: Any) -> Iterator[TestClient]:
    app = create_app(repo, **kwargs)
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(120)
        yield client


@pytest.fixture
def mixed(repo: Path) -> Path:
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "bad", 1, fails_at_run_time())
    write_model(repo, "gather", 1, gather_rows())  # random indices fail, ones run
    write_model(repo, "reshaper", 1, reshaper())  # random shapes fail, ones run
    return repo


def test_failed_warm_up_is_unavailable_and_the_server_not_ready(mixed: Path) -> None:
    with started(mixed) as client:
        index = {row["name"]: row for row in client.post("/v2/repository/index").json()}
        bad = index["bad"]
        assert bad["state"] == "UNAVAILABLE" and bad["version"] == "1", bad
        assert "warm-up failed" in bad["reason"] and "Reshape" in bad["reason"], bad
        # Models whose data-dependent inputs need the right values warm up on ones.
        for name in ("good", "gather", "reshaper"):
            assert index[name]["state"] == "READY", index[name]
        # Triton's strict readiness: not ready (400) while a model that should load is not READY.
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 400, ready.text
        assert "'bad'" in ready.json()["reason"] and "warm-up failed" in ready.json()["reason"]
        assert client.get("/v2/health/live").status_code == 200
        response = client.get("/v2/models/bad/ready")
        assert response.status_code == 400 and "warm-up failed" in response.json()["error"]
        assert client.get("/v2/models/bad/versions/1/ready").status_code == 400
        assert client.get("/v2/models/nosuch/ready").status_code == 404
        assert client.post("/v2/models/bad/infer", json=X).status_code == 503
        # The good models serve on.
        assert client.get("/v2/models/good/ready").status_code == 200
        response = client.post("/v2/models/good/infer", json=X)
        assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [1] * 4
        body = {
            "inputs": [
                {"name": "x", "shape": [6], "datatype": "FP32", "data": list(range(6))},
                {"name": "shape", "shape": [2], "datatype": "INT64", "data": [2, 3]},
            ]
        }
        response = client.post("/v2/models/reshaper/infer", json=body)
        assert response.status_code == 200 and response.json()["outputs"][0]["shape"] == [2, 3]


def test_readiness_not_strict(mixed: Path) -> None:
    with started(mixed, strict_readiness=False) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/models/bad/ready").status_code == 400  # the model still is not


def test_ready_once_every_model_is(repo: Path) -> None:
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "other", 1, add_const(2))
    with started(repo) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/health/ready").json() == {"ready": True}


def test_explicit_mode_counts_what_was_asked_for(repo: Path) -> None:
    """Models never asked for do not count; a failed load does until it is unloaded."""
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "bad", 1, fails_at_run_time())
    with started(repo, explicit=True, load=["good"]) as client:
        assert client.get("/v2/health/ready").status_code == 200
        response = client.post("/v2/repository/models/bad/load")
        assert response.status_code == 400 and "warm-up failed" in response.json()["error"]
        assert client.get("/v2/health/ready").status_code == 400
        assert client.post("/v2/repository/models/bad/unload").status_code == 200
        (row,) = [r for r in client.post("/v2/repository/index").json() if r["name"] == "bad"]
        assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded", row
        assert client.get("/v2/health/ready").status_code == 200


def test_failed_reload_keeps_the_previous_load_serving(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))
    with started(repo, explicit=True, load=["m"]) as client:
        # The new files fail their warm-up: the load fails, version 1 keeps serving.
        write_model(repo, "m", 1, fails_at_run_time())
        response = client.post("/v2/repository/models/m/load")
        assert response.status_code == 400 and "warm-up failed" in response.json()["error"]
        (row,) = client.post("/v2/repository/index").json()
        assert row["state"] == "READY" and "warm-up failed" in row["reason"], row
        assert "serving the previous load" in row["reason"]
        response = client.post("/v2/models/m/infer", json=X)
        assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [1] * 4
        assert client.get("/v2/models/m/ready").status_code == 200
        assert client.get("/v2/health/ready").status_code == 200  # it serves: READY


def test_bad_config_is_not_ready(repo: Path) -> None:
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "broken", 1, add_const(1))
    write_config(repo, "broken", "{not json")
    with started(repo) as client:
        ready = client.get("/v2/health/ready")
        assert ready.status_code == 400 and "'broken'" in ready.json()["reason"]
