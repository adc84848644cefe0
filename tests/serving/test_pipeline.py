"""Pipelines of models: ``pipeline.json`` and Triton's ensemble ``config.pbtxt`` served as models,
their steps on their models' own request paths, errors naming the failing step."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serving_models import add_const, gather_rows, write_model

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

from ferry.serving import create_app

STEPS_PY = """
import numpy as np

def double(inputs):
    return {"out": inputs["in"] * 2}

def broken(inputs):
    return {"out": inputs["in"] / 0 if inputs["in"].sum() > 1e6 else 1 // 0}

def wrong_name(inputs):
    return {"other": inputs["in"]}

def thread(inputs):
    import threading
    return {"name": np.array([threading.current_thread().name], dtype=object)}
"""


def pipeline(steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [-1, 4]}],
        "steps": steps,
        **extra,
    }


#: x -> plus1 -> double (Python) -> plus10 -> y: (x + 1) * 2 + 10.
CHAIN = [
    {"model": "plus1", "inputs": {"x": "x"}, "outputs": {"y": "a"}},
    {"name": "double", "python": "steps:double", "inputs": {"in": "a"}, "outputs": {"out": "b"}},
    {"model": "plus10", "inputs": {"x": "b"}, "outputs": {"y": "y"}},
]


def write_pipeline(repo: Path, name: str, data: dict[str, Any]) -> None:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.json").write_text(json.dumps(data))
    (folder / "steps.py").write_text(STEPS_PY)


@pytest.fixture
def models(repo: Path) -> Path:
    write_model(repo, "plus1", 1, add_const(1))
    write_model(repo, "plus10", 1, add_const(10))
    write_model(repo, "gather", 1, gather_rows())
    write_pipeline(repo, "chain", pipeline(CHAIN))
    return repo


@contextlib.contextmanager
def started(repo: Path, **kwargs: Any) -> Iterator[TestClient]:
    app = create_app(repo, **kwargs)
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(120)
        yield client


def infer(client: TestClient, name: str, x: np.ndarray, datatype: str = "FP32") -> Any:
    body = {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}
        ]
    }
    return client.post(f"/v2/models/{name}/infer", json=body)


def output(response: Any, name: str = "y") -> np.ndarray:
    assert response.status_code == 200, response.text
    out = next(o for o in response.json()["outputs"] if o["name"] == name)
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_a_pipeline_runs_models_and_a_python_step(models: Path) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with started(models) as client:
        np.testing.assert_allclose(output(infer(client, "chain", x)), (x + 1) * 2 + 10)
        meta = client.get("/v2/models/chain").json()
        assert meta["platform"] == "ensemble"
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
        assert client.get("/v2/models/chain/ready").status_code == 200
        config = client.get("/v2/models/chain/config").json()
        steps = config["ensemble_scheduling"]["step"]
        assert [s["model_name"] for s in steps] == ["plus1", "python:steps:double", "plus10"]
        assert steps[0]["input_map"] == {"x": "x"} and steps[0]["output_map"] == {"y": "a"}
        stats = {s["name"]: s for s in client.get("/v2/models/stats").json()["model_stats"]}
        # The steps went through their models' own request paths: their statistics count them.
        assert stats["chain"]["inference_stats"]["success"]["count"] == 1
        assert stats["plus1"]["inference_stats"]["success"]["count"] == 1
        assert stats["plus10"]["inference_stats"]["success"]["count"] == 1
        index = {r["name"]: r for r in client.post("/v2/repository/index").json()}
        assert index["chain"]["state"] == "READY"


def test_a_step_above_the_models_batch_is_cut_into_pieces(models: Path) -> None:
    x = np.random.default_rng(0).standard_normal((21, 4)).astype(np.float32)  # batch limit 8
    with started(models) as client:
        np.testing.assert_allclose(output(infer(client, "chain", x)), (x + 1) * 2 + 10, rtol=1e-6)


def test_an_ensemble_config_pbtxt_is_read_as_it_is(models: Path) -> None:
    folder = models / "ens"
    (folder / "1").mkdir(parents=True)  # Triton's ensembles have an empty version folder
    (folder / "config.pbtxt").write_text(
        """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "plus1" model_version: -1
      input_map { key: "x" value: "INPUT" } output_map { key: "y" value: "mid" } },
    { model_name: "plus10" model_version: 1
      input_map { key: "x" value: "mid" } output_map { key: "y" value: "OUTPUT" } }
  ]
}
"""
    )
    x = np.ones((3, 4), np.float32)
    with started(models) as client:
        body = {"inputs": [{"name": "INPUT", "shape": [3, 4], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        response = client.post("/v2/models/ens/infer", json=body)
        np.testing.assert_allclose(output(response, "OUTPUT"), x + 11)
        meta = client.get("/v2/models/ens").json()
        assert meta["inputs"] == [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}]
        config = client.get("/v2/models/ens/config").json()
        assert config["platform"] == "ensemble" and config["max_batch_size"] == 8
        # A batch above the ensemble's max_batch_size is refused, as for a model.
        big = np.ones((9, 4), np.float32)
        body["inputs"][0].update(shape=[9, 4], data=big.ravel().tolist())
        refused = client.post("/v2/models/ens/infer", json=body)
        assert refused.status_code == 400 and "max_batch_size" in refused.json()["error"]


def test_errors_name_the_failing_step(models: Path) -> None:
    write_pipeline(
        models,
        "broken",
        pipeline(
            [
                {"model": "plus1", "inputs": {"x": "x"}, "outputs": {"y": "a"}},
                {"python": "steps:broken", "inputs": {"in": "a"}, "outputs": {"out": "y"}},
            ]
        ),
    )
    write_pipeline(
        models,
        "misnamed",
        pipeline([{"python": "steps:wrong_name", "inputs": {"in": "x"}, "outputs": {"out": "y"}}]),
    )
    gather = pipeline(
        [
            {"name": "lookup", "model": "gather", "inputs": {"idx": "i"}, "outputs": {"y": "y"}},
        ],
        inputs=[{"name": "i", "datatype": "INT64", "dims": [-1]}],
        outputs=[{"name": "y", "datatype": "FP32", "dims": [-1, 2]}],
    )
    write_pipeline(models, "lookup", gather)
    with started(models) as client:
        failed = infer(client, "broken", np.zeros((1, 4), np.float32))
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error.startswith("step 2 'broken' (python steps:broken): ZeroDivisionError"), error
        misnamed = infer(client, "misnamed", np.zeros((1, 4), np.float32))
        assert misnamed.status_code == 500
        assert (
            "step 1 'wrong_name' (python steps:wrong_name): gave no 'out' output"
            in (misnamed.json()["error"])
        )
        body = {"inputs": [{"name": "i", "shape": [1], "datatype": "INT64", "data": [7]}]}
        engine = client.post("/v2/models/lookup/infer", json=body)  # index 7 of 4 rows
        assert engine.status_code == 500
        assert engine.json()["error"].startswith("step 1 'lookup' (model gather): ")
        body["inputs"][0]["data"] = [2]
        ok = client.post("/v2/models/lookup/infer", json=body)
        np.testing.assert_allclose(output(ok), [[4, 5]])


def test_a_pipeline_naming_a_missing_model_is_unavailable_with_the_reason(models: Path) -> None:
    steps = [{"name": "det", "model": "nope", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]
    write_pipeline(models, "dangling", pipeline(steps))
    write_pipeline(models, "unwired", pipeline([{**CHAIN[0], "inputs": {"x": "z"}}]))
    with started(models, strict_readiness=False) as client:
        index = {r["name"]: r for r in client.post("/v2/repository/index").json()}
        assert index["dangling"]["state"] == "UNAVAILABLE"
        assert (
            "step 1 'det' (model nope) runs model 'nope', which is not in the repository"
            in (index["dangling"]["reason"])
        )
        assert (
            "reads 'z' (as 'x'), which neither the request nor any step writes"
            in (index["unwired"]["reason"])
        )
        response = infer(client, "dangling", np.zeros((1, 4), np.float32))
        assert response.status_code == 503 and "not in the repository" in response.json()["error"]
        assert client.get("/v2/models/dangling/ready").status_code == 400


def test_a_pipeline_is_ready_when_its_steps_models_are(models: Path) -> None:
    with started(models, explicit=True, load=["chain", "plus1"]) as client:
        ready = client.get("/v2/models/chain/ready")
        assert ready.status_code == 400
        assert "step 3 'plus10' (model plus10): model 'plus10' is not loaded" in ready.text
        response = infer(client, "chain", np.zeros((1, 4), np.float32))
        assert response.status_code == 503
        assert "step 3 'plus10' (model plus10)" in response.json()["error"]
        index = {r["name"]: r for r in client.post("/v2/repository/index").json()}
        assert index["chain"]["state"] == "UNAVAILABLE" and "plus10" in index["chain"]["reason"]
        assert client.post("/v2/repository/models/plus10/load").status_code == 200
        assert client.get("/v2/models/chain/ready").status_code == 200
        x = np.ones((1, 4), np.float32)
        np.testing.assert_allclose(output(infer(client, "chain", x)), (x + 1) * 2 + 10)


def test_bad_inputs_are_refused_against_the_pipelines_declaration(models: Path) -> None:
    with started(models) as client:
        wrong_type = infer(client, "chain", np.zeros((1, 4), np.int32), datatype="INT32")
        assert wrong_type.status_code == 400
        assert "is FP32 in model 'chain', got INT32" in wrong_type.json()["error"]
        wrong_dims = infer(client, "chain", np.zeros((1, 5), np.float32))
        assert wrong_dims.status_code == 400 and "'x'" in wrong_dims.json()["error"]
        body = {"inputs": [{"name": "q", "shape": [1], "datatype": "FP32", "data": [1]}]}
        unknown = client.post("/v2/models/chain/infer", json=body)
        assert unknown.status_code == 400 and "unknown input 'q'" in unknown.json()["error"]


def test_bad_pipeline_files_say_what_is_wrong(models: Path) -> None:
    cases = {
        "no_steps": {**pipeline([]), "steps": []},
        "both": pipeline([{**CHAIN[0], "python": "steps:double"}]),
        "bad_type": {**pipeline(CHAIN), "inputs": [{"name": "x", "datatype": "F32", "dims": [4]}]},
        "no_module": pipeline(
            [{"python": "absent:f", "inputs": {"in": "x"}, "outputs": {"o": "y"}}]
        ),
        "escape": pipeline([{"python": "../x:f", "inputs": {"in": "x"}, "outputs": {"o": "y"}}]),
        "twice": pipeline([CHAIN[0], {**CHAIN[2], "inputs": {"x": "x"}, "outputs": {"y": "a"}}]),
    }
    for name, data in cases.items():
        write_pipeline(models, name, data)
    (models / "badjson").mkdir()
    (models / "badjson" / "pipeline.json").write_text("{")
    with started(models, strict_readiness=False) as client:
        index = {r["name"]: r for r in client.post("/v2/repository/index").json()}
    reasons = {name: index[name]["reason"] for name in [*cases, "badjson"]}
    assert "'steps' must be a non-empty list" in reasons["no_steps"]
    assert "needs exactly one of 'model'" in reasons["both"]
    assert "datatype 'F32'; use one of" in reasons["bad_type"]
    assert "absent.py for the Python step" in reasons["no_module"]
    assert "'python' must be 'module:function'" in reasons["escape"]
    assert "which step 1 'plus1' (model plus1) already writes" in reasons["twice"]
    assert "is not valid JSON" in reasons["badjson"]
    assert all(index[n]["state"] == "UNAVAILABLE" for n in reasons)
    assert all("Traceback" not in r for r in reasons.values())


def test_concurrent_requests_each_get_their_own_answer(models: Path) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(24)]
    with started(models) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: output(infer(client, "chain", x)), xs))
    for x, got in zip(xs, answers):
        np.testing.assert_allclose(got, (x + 1) * 2 + 10, rtol=1e-6)


def test_python_steps_run_in_the_pipelines_thread_pool(models: Path) -> None:
    steps = [{"python": "steps:thread", "inputs": {"in": "x"}, "outputs": {"name": "thread"}}]
    outputs = [{"name": "thread", "datatype": "BYTES", "dims": [1]}]
    write_pipeline(models, "where", pipeline(steps, outputs=outputs))
    with started(models) as client:
        response = infer(client, "where", np.zeros((1, 4), np.float32))
        assert response.status_code == 200, response.text
        (out,) = response.json()["outputs"]
        assert out["datatype"] == "BYTES" and out["data"][0].startswith("ferry-where-py")


def test_an_edited_pipeline_reloads_when_polled(models: Path) -> None:
    x = np.ones((1, 4), np.float32)
    with started(models, poll_interval=0.1) as client:
        np.testing.assert_allclose(output(infer(client, "chain", x)), (x + 1) * 2 + 10)
        write_pipeline(models, "chain", pipeline([CHAIN[0], {**CHAIN[2], "inputs": {"x": "a"}}]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = output(infer(client, "chain", x))
            if np.allclose(got, x + 11):
                break
            time.sleep(0.1)
        np.testing.assert_allclose(got, x + 11)


def test_triton_grpc_client_drives_a_pipeline(models: Path) -> None:
    pytest.importorskip("grpc")
    tgrpc = pytest.importorskip("tritonclient.grpc")
    from ferry.serving import GrpcServer, ServerThread

    app = create_app(models)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with ServerThread(app, port=0), GrpcServer(app, port=0) as server:
        client = tgrpc.InferenceServerClient(server.address)
        try:
            assert client.is_model_ready("chain")
            config = client.get_model_config("chain").config
            assert config.platform == "ensemble"
            assert [s.model_name for s in config.ensemble_scheduling.step][::2] == [
                "plus1",
                "plus10",
            ]
            tensor = tgrpc.InferInput("x", [2, 4], "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("chain", [tensor])
            np.testing.assert_allclose(result.as_numpy("y"), (x + 1) * 2 + 10)
        finally:
            client.close()


def test_a_steps_error_keeps_its_status_and_retry_after() -> None:
    from ferry.errors import EngineBusyError, ExecutionError, InvalidInputError
    from ferry.serving._pipeline import _step_error
    from ferry.serving._pipeline_spec import Step
    from ferry.serving._state import status_of

    step = Step(2, "rec", "ppocr_rec", None, None, None, {"x": "lines"}, {"y": "scores"})
    busy = _step_error(step, EngineBusyError("the queue is full", retry_after=3.0))
    assert isinstance(busy, EngineBusyError) and busy.retry_after == 3.0
    assert str(busy) == "step 2 'rec' (model ppocr_rec): the queue is full"
    assert status_of(busy) == 429
    assert status_of(_step_error(step, InvalidInputError("bad"))) == 400
    assert status_of(_step_error(step, ExecutionError("engine"))) == 500
    crashed = _step_error(step, ValueError("no"))
    assert status_of(crashed) == 500 and str(crashed).endswith(": ValueError: no")
