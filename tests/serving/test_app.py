"""The HTTP app: routes, status mapping, auth, limits, metrics; one real server for graceful shutdown."""

from __future__ import annotations

import gzip
import json
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from _serving_models import add_const, gather_rows, write_config, write_model
from click.testing import CliRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

from ferry.cli.main import cli
from ferry.serving import ServerThread, create_app

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def client(repo: Path) -> Iterator[TestClient]:
    write_model(repo, "add", 1, add_const(1))
    write_model(repo, "add", 2, add_const(2))
    write_config(repo, "add", {"version_policy": {"all": {}}})
    write_model(repo, "gather", 1, gather_rows())
    write_model(repo, "idle", 1, add_const(9))
    app = create_app(
        repo,
        api_key=KEY,
        max_request_bytes=4096,
        warmup=False,
        explicit=True,
        load=["add", "gather"],
    )
    with TestClient(app) as test_client:
        assert app.state.ferry.started.wait(60)
        yield test_client


def infer_json(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}],
        **extra,
    }


def test_health_and_metadata_are_open(client: TestClient) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    meta = client.get("/v2").json()
    assert meta["name"] == "ferry" and "binary_tensor_data" in meta["extensions"]
    model = client.get("/v2/models/add").json()
    assert model["versions"] == ["1", "2"]
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.get("/v2/models/add/versions/1/ready").status_code == 200
    assert client.get("/v2/models/idle/ready").status_code == 400  # known, not ready: Triton
    config = client.get("/v2/models/add/config").json()
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [4]
    assert config["version_policy"] == {"all": {}}
    assert "dynamic_batching" in config


def test_json_and_binary_inference(client: TestClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    response = client.post(
        "/v2/models/add/versions/1/infer", json=infer_json(x, id="q1"), headers=AUTH
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "q1" and body["model_version"] == "1"
    assert np.array_equal(np.array(body["outputs"][0]["data"]).reshape(2, 4), x + 1)
    # Binary in, binary out, default version (the highest).
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 32},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    response = client.post(
        "/v2/models/add/infer",
        content=header + x.tobytes(),
        headers={**AUTH, "Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    meta = json.loads(response.content[:length])
    assert meta["model_version"] == "2"
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 32
    got = np.frombuffer(response.content[length:], np.float32).reshape(2, 4)
    assert np.array_equal(got, x + 2)


def test_gzip_request_and_response(client: TestClient) -> None:
    x = np.ones((1, 4), np.float32)
    body = gzip.compress(json.dumps(infer_json(x)).encode())
    response = client.post(
        "/v2/models/add/versions/1/infer",
        content=body,
        headers={**AUTH, "Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.json()["outputs"][0]["data"] == [2.0] * 4


def test_matches_onnxruntime(client: TestClient) -> None:
    idx = np.array([3, 0, 2], np.int64)
    body = {"inputs": [{"name": "idx", "shape": [3], "datatype": "INT64", "data": idx.tolist()}]}
    response = client.post("/v2/models/gather/infer", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    reference = ort.InferenceSession(gather_rows().SerializeToString())
    (want,) = reference.run(None, {"idx": idx})
    got = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(want.shape)
    assert np.array_equal(got, want)


ERRORS = [
    ("/v2/models/add/infer", b"{nope", 400, "not valid JSON"),
    (
        "/v2/models/add/infer",
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]}
        ).encode(),
        400,
        "is FP32 in model 'add', got INT32",
    ),
    (
        "/v2/models/add/infer",
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        ).encode(),
        400,
        "dim 1 must be 4",
    ),
    (
        "/v2/models/add/infer",
        json.dumps(
            {"inputs": [{"name": "z", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        ).encode(),
        400,
        "unknown input 'z'",
    ),
    (
        "/v2/models/add/infer",
        json.dumps(
            {"inputs": [{"name": "x", "shape": [9, 1], "datatype": "FP32", "data": [0] * 9}]}
        ).encode(),
        400,
        "max_batch_size 8",
    ),
    (
        "/v2/models/add/infer",
        json.dumps(
            {**infer_json(np.ones((1, 4), np.float32)), "outputs": [{"name": "w"}]}
        ).encode(),
        400,
        "unknown output 'w'",
    ),
    ("/v2/models/nope/infer", b"{}", 404, "unknown model 'nope'"),
    ("/v2/models/add/versions/7/infer", b"{}", 404, "no version 7"),
    ("/v2/models/.hidden/infer", b"{}", 400, "invalid model name"),
    ("/v2/models/idle/infer", b"{}", 503, "not loaded"),
    (
        "/v2/models/gather/infer",
        json.dumps(
            {"inputs": [{"name": "idx", "shape": [1], "datatype": "INT64", "data": [10]}]}
        ).encode(),
        500,
        "onnxruntime failed",
    ),
    ("/v2/models/add/infer", b"x" * 5000, 413, "above this server's limit of 4096"),
    ("/v2/models/add/infer", b"{}", 400, "non-empty 'inputs'"),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), ERRORS)
def test_errors(client: TestClient, path: str, body: bytes, status: int, message: str) -> None:
    response = client.post(path, content=body, headers=AUTH)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_model_failure_leaves_the_server_serving(client: TestClient) -> None:
    bad = {"inputs": [{"name": "idx", "shape": [1], "datatype": "INT64", "data": [99]}]}
    good = {"inputs": [{"name": "idx", "shape": [1], "datatype": "INT64", "data": [1]}]}
    for _ in range(3):
        assert client.post("/v2/models/gather/infer", json=bad, headers=AUTH).status_code == 500
        response = client.post("/v2/models/gather/infer", json=good, headers=AUTH)
        assert response.status_code == 200
        assert response.json()["outputs"][0]["data"] == [2.0, 3.0]
    stats = client.get("/v2/models/gather/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 3
    assert stats["inference_stats"]["success"]["count"] == 3
    metrics = client.get("/metrics").text
    assert (
        'ferry_inference_request_failure_total{code="500",model="gather",version="1"} 3.0'
        in metrics
    )
    assert 'ferry_inference_request_success_total{model="gather",version="1"} 3.0' in metrics
    assert "ferry_inference_batch_size_bucket" in metrics


def test_streamed_body_is_counted(client: TestClient) -> None:
    chunks = iter([b"{" + b" " * 3000, b" " * 3000 + b"}"])  # no Content-Length: chunked
    response = client.post("/v2/models/add/infer", content=chunks, headers=AUTH)
    assert response.status_code == 413, response.text


def test_decompression_bomb_is_refused(client: TestClient) -> None:
    bomb = gzip.compress(b"\0" * 100_000)
    assert len(bomb) < 4096
    response = client.post(
        "/v2/models/add/infer", content=bomb, headers={**AUTH, "Content-Encoding": "gzip"}
    )
    assert response.status_code == 413


def test_api_key(client: TestClient) -> None:
    x = infer_json(np.ones((1, 4), np.float32))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = client.post("/v2/models/add/infer", json=x, headers=headers)
        assert response.status_code == 401
        assert "API key" in response.json()["error"]
        assert client.post("/v2/repository/index", headers=headers).status_code == 401
        assert client.post("/v2/repository/models/idle/load", headers=headers).status_code == 401
    assert client.get("/v2/models/add").status_code == 200  # metadata stays open


def test_repository_endpoints(client: TestClient) -> None:
    rows = client.post("/v2/repository/index", headers=AUTH).json()
    assert {(r["name"], r["version"], r["state"]) for r in rows} == {
        ("add", "1", "READY"),
        ("add", "2", "READY"),
        ("gather", "1", "READY"),
        ("idle", "", "UNAVAILABLE"),
    }
    ready = client.post("/v2/repository/index", json={"ready": True}, headers=AUTH).json()
    assert all(r["state"] == "READY" for r in ready) and len(ready) == 3
    files = {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}}
    response = client.post("/v2/repository/models/idle/load", json=files, headers=AUTH)
    assert response.status_code == 400 and "files sent in the request" in response.json()["error"]
    config = {"parameters": {"config": json.dumps({"max_batch_size": 0})}}
    assert (
        client.post("/v2/repository/models/idle/load", json=config, headers=AUTH).status_code == 200
    )
    assert client.get("/v2/models/idle/config").json()["max_batch_size"] == 0
    response = client.post(
        "/v2/models/idle/infer", json=infer_json(np.zeros((1, 4), np.float32)), headers=AUTH
    )
    assert response.json()["outputs"][0]["data"] == [9.0] * 4
    assert client.post("/v2/repository/models/idle/unload", headers=AUTH).status_code == 200
    assert client.get("/v2/models/idle/ready").status_code == 400  # known, not ready: Triton
    response = client.post("/v2/repository/models/nope/load", headers=AUTH)
    assert response.status_code == 404
    bad = {"parameters": {"config": json.dumps({"max_batch_size": 4, "instance_group": 2})}}
    response = client.post("/v2/repository/models/idle/load", json=bad, headers=AUTH)
    assert response.status_code == 400 and "instance_group" in response.json()["error"]


def test_unknown_route_is_json(client: TestClient) -> None:
    response = client.get("/v3/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_graceful_shutdown_finishes_in_flight_requests(repo: Path) -> None:
    write_model(repo, "slow", 1, add_const(1))
    # A lone request waits the whole queue delay in the batcher: a request reliably in flight.
    write_config(
        repo,
        "slow",
        {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 600_000}},
    )
    server = ServerThread(create_app(repo, warmup=False), host="127.0.0.1", port=0).start()
    assert server.url.startswith("http://127.0.0.1:")
    result: dict[str, Any] = {}

    def call() -> None:
        body = infer_json(np.zeros((1, 4), np.float32))
        result["response"] = httpx.post(f"{server.url}/v2/models/slow/infer", json=body, timeout=30)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.2)
    start = time.perf_counter()
    server.stop()
    caller.join(30)
    response = result["response"]
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.0] * 4
    assert time.perf_counter() - start < 10
    assert not server.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/v2/health/live", timeout=2)


def test_cli_bad_source_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "missing"), "--port", "0"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "not found" in lines[0]
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--explicit", "--poll", "1"])
    assert result.exit_code == 2 and "exclude each other" in result.output
