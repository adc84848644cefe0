"""``ferry serve`` end to end, driven by Triton's own HTTP client (KServe v2 / Open Inference Protocol).

Black-box: the server runs in a thread (``ServerThread``, 127.0.0.1, a free port) or as the
``ferry serve`` process, and is spoken to only over HTTP: ``tritonclient.http`` for everything a
Triton client does (JSON and binary tensors, every datatype, requested outputs, the repository,
statistics), ``httpx`` for what a well-behaved client never sends (bad JSON, wrong sizes, oversized
bodies, traversal names, missing tokens). Every answer is compared with ONNX Runtime run directly
on the same model. Load tests are bounded in requests and seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
httpclient = pytest.importorskip("tritonclient.http")

import serve_models as sm  # noqa: E402
from serve_models import DATATYPES, Reference  # noqa: E402
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

from ferry.serving import ServerThread, create_app  # noqa: E402

API_KEY = "s3cret-token"
SMALL_LIMIT = 4096  # bytes: the request size limit of the secured server

# ---------------------------------------------------------------------------------------------
# helpers


def client_for(server: Any, **kw: Any) -> Any:
    """A tritonclient for ``server``; one per thread (the client is gevent-based)."""
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"), **kw)


def infer(
    client: Any,
    model: str,
    feeds: dict[str, np.ndarray],
    *,
    binary_in: bool = True,
    binary_out: bool | None = True,
    outputs: list[str] | None = None,
    **kw: Any,
) -> Any:
    """One inference through tritonclient; ``outputs=None`` asks for every output."""
    inputs = []
    for name, array in feeds.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary_in)
        inputs.append(tensor)
    requested = None
    if outputs is not None:
        requested = [
            httpclient.InferRequestedOutput(o, binary_data=bool(binary_out)) for o in outputs
        ]
    if kw.get("headers") is not None:
        kw["headers"] = dict(kw["headers"])  # tritonclient adds its own headers to the dict
    return client.infer(model, inputs, outputs=requested, **kw)


def as_text(array: np.ndarray) -> np.ndarray:
    """BYTES come back as bytes (binary) or str (JSON): compare them as str."""
    return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])(array)


def assert_error(response: Any, status: int, *words: str) -> str:
    """The response is ``status`` with a JSON ``{"error": "..."}`` body mentioning ``words``."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    for word in words:
        assert word.lower() in body["error"].lower(), (word, body["error"])
    return str(body["error"])


def raises_status(status: int | tuple[int, ...]) -> Any:
    return _RaisesStatus((status,) if isinstance(status, int) else status)


class _RaisesStatus:
    """``with raises_status(404): client.call()``: a tritonclient error with that HTTP status."""

    def __init__(self, statuses: tuple[int, ...]) -> None:
        self.statuses = statuses
        self.message = ""

    def __enter__(self) -> _RaisesStatus:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        assert kind is not None, f"expected HTTP {self.statuses}, the call succeeded"
        assert isinstance(exc, InferenceServerException), exc
        assert int(exc.status()) in self.statuses, (exc.status(), exc.message())
        self.message = exc.message()
        return True


def binary_request(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """A body in the binary tensor data extension: JSON header, then the raw tensor bytes."""
    head = json.dumps(header).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }
    return head + b"".join(chunks), headers


def parse_infer(response: Any) -> Any:
    """A raw HTTP inference response read the way tritonclient reads it."""
    length = response.headers.get("Inference-Header-Content-Length")
    return httpclient.InferResult.from_response_body(
        response.content, header_length=None if length is None else int(length)
    )


def model_stats(client: Any, model: str, version: str = "") -> dict[str, Any]:
    stats = client.get_inference_statistics(model, version)["model_stats"]
    assert len(stats) == 1, stats
    return dict(stats[0])


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def index_entries(client: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in client.get_model_repository_index() if e.get("name") == name]


# ---------------------------------------------------------------------------------------------
# servers


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("serve") / "repo"
    models = sm.build_main_repository(path)
    return path, models


@pytest.fixture(scope="module")
def references(repo: tuple[Path, dict[str, Any]]) -> dict[str, Reference]:
    return {name: Reference(model) for name, model in repo[1].items()}


@pytest.fixture(scope="module")
def server(repo: tuple[Path, dict[str, Any]]) -> Iterator[Any]:
    with ServerThread(create_app(repo[0]), host="127.0.0.1", port=0) as running:
        yield running


@pytest.fixture
def client(server: Any) -> Iterator[Any]:
    c = client_for(server)
    yield c
    c.close()


@pytest.fixture
def http(server: Any) -> Iterator[Any]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


# ---------------------------------------------------------------------------------------------
# health, metadata, configuration


def test_health_and_server_metadata(server: Any, client: Any) -> None:
    assert server.url.startswith("http://127.0.0.1:") and server.port > 0
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] and meta["version"]
    extensions = set(meta["extensions"])
    for extension in (
        "binary_tensor_data",
        "model_repository",
        "statistics",
        "model_configuration",
    ):
        assert extension in extensions, (extension, meta["extensions"])


def test_model_metadata_variable_dims_are_minus_one(client: Any) -> None:
    meta = client.get_model_metadata("two_outputs")
    assert meta["name"] == "two_outputs" and "1" in meta["versions"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert sorted(meta["outputs"], key=lambda t: t["name"]) == [
        {"name": "prod", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "sum", "datatype": "FP32", "shape": [-1, 4]},
    ]
    meta = client.get_model_metadata("reshaper", "1")
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]} == {
        "x": ("FP32", [-1]),
        "shape": ("INT64", [2]),
    }
    assert client.get_model_metadata("dtype_bytes")["inputs"][0]["datatype"] == "BYTES"
    assert client.get_model_metadata("dtype_bf16")["inputs"][0]["datatype"] == "BF16"
    assert client.get_model_metadata("fixed_shape")["inputs"][0]["shape"] == [2, 3]


def _dims(tensors: list[dict[str, Any]]) -> dict[str, tuple[str, list[int]]]:
    return {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in tensors}


def test_model_config_triton_style(client: Any) -> None:
    # config.json: max_batch_size 8 and dynamic batching; dims leave the batch dim out.
    config = client.get_model_config("rowwise")
    assert config["name"] == "rowwise" and config["max_batch_size"] == 8
    assert _dims(config["input"]) == {"x": ("TYPE_FP32", [-1, 4])}
    assert _dims(config["output"]) == {"y": ("TYPE_FP32", [-1, 3])}
    batching = config["dynamic_batching"]
    assert int(batching["max_queue_delay_microseconds"]) == 20000
    assert [int(b) for b in batching["preferred_batch_size"]] == [4, 8]
    # No config.json, every I/O batchable: max_batch_size 8 with dynamic batching on.
    config = client.get_model_config("two_outputs")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    # No precision asked for: ONNX Runtime's own, fp32.
    assert config["parameters"]["ferry_backends"] == {"string_value": "onnxruntime"}
    assert config["parameters"]["ferry_precision"] == {"string_value": "fp32"}
    assert _dims(config["input"]) == {"x": ("TYPE_FP32", [4])}
    # Not batchable: max_batch_size 0 and the full shape.
    config = client.get_model_config("reshaper")
    assert config["max_batch_size"] == 0
    assert _dims(config["input"]) == {"x": ("TYPE_FP32", [-1]), "shape": ("TYPE_INT64", [2])}
    config = client.get_model_config("fixed_shape", "1")
    assert config["max_batch_size"] == 0 and _dims(config["input"]) == {"x": ("TYPE_FP32", [2, 3])}


# ---------------------------------------------------------------------------------------------
# inference: every datatype, JSON and binary, both directions

MODES = {
    "json": (False, False),
    "binary": (True, True),
    "json_in_binary_out": (False, True),
    "binary_in_json_out": (True, False),
}
CASES = [
    (datatype, mode)
    for datatype in DATATYPES
    for mode in MODES
    # BF16 has no JSON form: tritonclient (and the protocol) send it as binary only.
    if not (datatype == "BF16" and mode != "binary")
]


@pytest.mark.parametrize(("datatype", "mode"), CASES, ids=[f"{d}-{m}" for d, m in CASES])
def test_every_datatype(
    client: Any, references: dict[str, Reference], datatype: str, mode: str
) -> None:
    name = f"dtype_{datatype.lower()}"
    binary_in, binary_out = MODES[mode]
    x = sm.dtype_sample(datatype, batch=2, seed=len(mode))
    outputs = ["y"] if datatype == "BYTES" else ["y", "d"]
    result = infer(
        client, name, {"x": x}, binary_in=binary_in, binary_out=binary_out, outputs=outputs
    )
    expected = references[name]({"x": x})
    response = result.get_response()
    assert response["model_name"] == name and str(response["model_version"]) == "1"
    y = result.get_output("y")
    assert y["datatype"] == datatype and y["shape"] == [2, 2, 3]
    assert ("binary_data_size" in y.get("parameters", {})) == binary_out
    got = result.as_numpy("y")
    if datatype == "BYTES":
        np.testing.assert_array_equal(as_text(got), as_text(expected["y"]))
    else:
        assert got.dtype == expected["y"].dtype
        np.testing.assert_array_equal(got.view(np.uint8), expected["y"].view(np.uint8))
        assert result.get_output("d")["datatype"] == "FP64"
        np.testing.assert_array_equal(result.as_numpy("d"), expected["d"])


def test_bytes_with_nul_and_non_ascii(client: Any, http: Any) -> None:
    # Binary BYTES elements are length-prefixed, so NULs, newlines and UTF-8 travel intact.
    x = np.array([b"\x00\x01", "naïve".encode(), b"", b"a\x00b", b"z" * 300, b"\n"], object)
    x = x.reshape(1, 2, 3)
    result = infer(client, "dtype_bytes", {"x": x}, outputs=["y"])
    assert list(result.as_numpy("y").reshape(-1)) == list(x.reshape(-1))
    # Invalid UTF-8 cannot become an ONNX string tensor on ONNX Runtime: a clean 400 is fine
    # (or an exact echo); a 500 is not.
    payload = b"".join(len(s).to_bytes(4, "little") + s for s in [b"\xff\xfe", *[b"ok"] * 5])
    header = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 2, 3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(payload)},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    body, headers = binary_request(header, payload)
    response = http.post("/v2/models/dtype_bytes/infer", content=body, headers=headers)
    if response.status_code == 200:
        assert parse_infer(response).as_numpy("y").reshape(-1)[0] == b"\xff\xfe"
    else:
        assert_error(response, 400)


def test_all_outputs_by_default_and_requested_outputs(
    client: Any, references: dict[str, Reference]
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    expected = references["two_outputs"]({"x": x})
    result = infer(client, "two_outputs", {"x": x})  # no outputs named: all, binary
    assert {o["name"] for o in result.get_response()["outputs"]} == {"sum", "prod"}
    for name in ("sum", "prod"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])
    for wanted in (["prod"], ["sum"]):
        for binary in (True, False):
            result = infer(client, "two_outputs", {"x": x}, outputs=wanted, binary_out=binary)
            assert [o["name"] for o in result.get_response()["outputs"]] == wanted
            np.testing.assert_array_equal(result.as_numpy(wanted[0]), expected[wanted[0]])
    # One output binary, the other JSON, in one response.
    inputs = [httpclient.InferInput("x", [3, 4], "FP32").set_data_from_numpy(x)]
    outputs = [
        httpclient.InferRequestedOutput("sum", binary_data=True),
        httpclient.InferRequestedOutput("prod", binary_data=False),
    ]
    result = client.infer("two_outputs", inputs, outputs=outputs)
    assert "binary_data_size" in result.get_output("sum")["parameters"]
    assert "data" in result.get_output("prod")
    np.testing.assert_array_equal(result.as_numpy("sum"), expected["sum"])
    np.testing.assert_array_equal(result.as_numpy("prod"), expected["prod"])


def test_request_id_is_echoed(client: Any) -> None:
    x = np.ones((1, 4), np.float32)
    result = infer(client, "two_outputs", {"x": x}, request_id="req-42/é")
    assert result.get_response()["id"] == "req-42/é"


def test_raw_json_nested_and_flat_data(http: Any, references: dict[str, Reference]) -> None:
    x = np.array([[1.5, -2, 3, 4], [5, 6, 7, 8.25]], np.float32)
    expected = references["two_outputs"]({"x": x})
    for data in (x.tolist(), x.reshape(-1).tolist()):
        body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": data}]}
        response = http.post("/v2/models/two_outputs/infer", json=body)
        assert response.status_code == 200, response.text
        assert "Inference-Header-Content-Length" not in response.headers
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        assert outputs["sum"]["shape"] == [2, 4] and outputs["sum"]["datatype"] == "FP32"
        got = np.array(outputs["sum"]["data"], np.float32).reshape(outputs["sum"]["shape"])
        np.testing.assert_array_equal(got, expected["sum"])


def test_raw_binary_both_directions(http: Any, references: dict[str, Reference]) -> None:
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    expected = references["two_outputs"]({"x": x})
    header = {
        "id": "raw",
        "inputs": [
            {
                "name": "x",
                "shape": [2, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_request(header, x.tobytes())
    response = http.post("/v2/models/two_outputs/versions/1/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    head = json.loads(response.content[:length])
    assert head["id"] == "raw"
    sizes = {o["name"]: o["parameters"]["binary_data_size"] for o in head["outputs"]}
    assert sizes == {"sum": x.nbytes, "prod": x.nbytes}
    assert len(response.content) == length + 2 * x.nbytes
    result = parse_infer(response)
    for name in ("sum", "prod"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])


def test_versions_and_policies(client: Any, http: Any) -> None:
    x = np.zeros((1, 3), np.float32)
    # versioned: policy "specific [1, 3]"; no version asked: the newest served (3).
    assert infer(client, "versioned", {"x": x}).as_numpy("y").tolist() == [[3, 3, 3]]
    assert infer(client, "versioned", {"x": x}, model_version="1").as_numpy("y").tolist() == [
        [1, 1, 1]
    ]
    assert infer(client, "versioned", {"x": x}, model_version="3").as_numpy("y").tolist() == [
        [3, 3, 3]
    ]
    assert client.is_model_ready("versioned", "1") and client.is_model_ready("versioned", "3")
    assert not client.is_model_ready("versioned", "2")
    assert sorted(client.get_model_metadata("versioned")["versions"]) == ["1", "3"]
    with raises_status(404):  # on disk, but not served by the policy
        infer(client, "versioned", {"x": x}, model_version="2")
    with raises_status(404):
        infer(client, "versioned", {"x": x}, model_version="7")
    # latest: no config.json, versions 1 and 2: only the newest is served.
    assert infer(client, "latest", {"x": x}).as_numpy("y").tolist() == [[20, 20, 20]]
    assert client.is_model_ready("latest", "2") and not client.is_model_ready("latest", "1")
    assert http.get("/v2/models/versioned/versions/3/ready").status_code == 200
    assert http.get("/v2/models/nosuchmodel/ready").status_code != 200


# ---------------------------------------------------------------------------------------------
# errors


def test_unknown_model_and_version_404(client: Any, http: Any) -> None:
    x = np.ones((1, 4), np.float32)
    with raises_status(404):
        infer(client, "no_such_model", {"x": x})
    with raises_status(404):
        infer(client, "two_outputs", {"x": x}, model_version="9")
    with raises_status(404):
        client.get_model_metadata("no_such_model")
    with raises_status(404):
        client.get_model_config("no_such_model")
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert_error(http.post("/v2/models/no_such_model/infer", json=body), 404, "no_such_model")


def _json_input(**overrides: Any) -> dict[str, Any]:
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    tensor.update(overrides)
    return {"inputs": [tensor]}


BAD_JSON_REQUESTS = {
    "not json": b"{not json",
    "not an object": b"[1, 2]",
    "no inputs": json.dumps({"outputs": [{"name": "sum"}]}).encode(),
    "unknown input": json.dumps(_json_input(name="nope")).encode(),
    "wrong datatype": json.dumps(_json_input(datatype="FP64")).encode(),
    "unknown datatype": json.dumps(_json_input(datatype="FP128")).encode(),
    "too few values": json.dumps(_json_input(data=[1, 2, 3])).encode(),
    "too many values": json.dumps(_json_input(data=[1, 2, 3, 4, 5])).encode(),
    "wrong rank": json.dumps(_json_input(shape=[4], data=[1, 2, 3, 4])).encode(),
    "wrong fixed dim": json.dumps(_json_input(shape=[2, 2], data=[1, 2, 3, 4])).encode(),
    "negative dim": json.dumps(_json_input(shape=[-1, 4])).encode(),
    "not numbers": json.dumps(_json_input(data=["a", "b", "c", "d"])).encode(),
    "ragged nesting": json.dumps(_json_input(shape=[2, 2], data=[[1, 2], [3]])).encode(),
    "unknown output": json.dumps({**_json_input(), "outputs": [{"name": "nope"}]}).encode(),
    "input twice": json.dumps(
        {"inputs": _json_input()["inputs"] + _json_input(data=[5, 6, 7, 8])["inputs"]}
    ).encode(),
}


@pytest.mark.parametrize("case", list(BAD_JSON_REQUESTS))
def test_bad_json_request_400(http: Any, case: str) -> None:
    response = http.post(
        "/v2/models/two_outputs/infer",
        content=BAD_JSON_REQUESTS[case],
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400)


def test_bad_binary_requests_400(http: Any) -> None:
    x = np.ones((1, 4), np.float32)
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32"}

    def post(header: dict[str, Any], payload: bytes, **headers: str) -> Any:
        body, base = binary_request(header, payload)
        return http.post("/v2/models/two_outputs/infer", content=body, headers={**base, **headers})

    # binary_data_size says more bytes than the body holds
    sized = {**tensor, "parameters": {"binary_data_size": 64}}
    assert_error(post({"inputs": [sized]}, x.tobytes()), 400)
    # size matches the body, but not the shape (4 floats = 16 bytes, 12 given)
    sized = {**tensor, "parameters": {"binary_data_size": 12}}
    assert_error(post({"inputs": [sized]}, x.tobytes()[:12]), 400)
    # bytes left over after every tensor
    sized = {**tensor, "parameters": {"binary_data_size": 16}}
    assert_error(post({"inputs": [sized]}, x.tobytes() + b"junk"), 400)
    # the header length points past the end of the body
    assert_error(
        post({"inputs": [sized]}, x.tobytes(), **{"Inference-Header-Content-Length": "99999"}), 400
    )
    assert_error(
        post({"inputs": [sized]}, x.tobytes(), **{"Inference-Header-Content-Length": "x"}), 400
    )
    # a binary tensor that also carries JSON data
    both = {**tensor, "data": [1, 2, 3, 4], "parameters": {"binary_data_size": 16}}
    assert_error(post({"inputs": [both]}, x.tobytes()), 400)
    # BYTES whose length prefix runs past the tensor's bytes
    strings = {"name": "x", "shape": [1, 2, 3], "datatype": "BYTES"}
    payload = b"".join(len(s).to_bytes(4, "little") + s for s in [b"a"] * 5) + b"\xff\x00\x00\x00ab"
    strings["parameters"] = {"binary_data_size": len(payload)}
    body, headers = binary_request({"inputs": [strings]}, payload)
    assert_error(http.post("/v2/models/dtype_bytes/infer", content=body, headers=headers), 400)


def test_batch_larger_than_max_batch_size_400(client: Any) -> None:
    x = np.zeros((9, 2, 4), np.float32)
    with raises_status(400) as error:
        infer(client, "rowwise", {"x": x})
    assert "8" in error.message and "9" in error.message, error.message
    # at the limit it works
    assert infer(client, "rowwise", {"x": x[:8]}).as_numpy("y").shape == (8, 2, 3)


def test_model_failure_500_then_serves_on(
    client: Any, http: Any, references: dict[str, Reference]
) -> None:
    x = np.arange(6, dtype=np.float32)
    good = {"x": x, "shape": np.array([2, 3], np.int64)}
    bad = {"x": x, "shape": np.array([4, 4], np.int64)}
    before = model_stats(client, "reshaper")
    with raises_status(500) as error:
        infer(client, "reshaper", bad)
    assert error.message
    body = {
        "inputs": [
            {"name": "x", "shape": [6], "datatype": "FP32", "data": x.tolist()},
            {"name": "shape", "shape": [2], "datatype": "INT64", "data": [5, 5]},
        ]
    }
    assert_error(http.post("/v2/models/reshaper/infer", json=body), 500)
    for _ in range(2):
        result = infer(client, "reshaper", good)
        np.testing.assert_array_equal(result.as_numpy("y"), references["reshaper"](good)["y"])
    assert client.is_server_live() and client.is_model_ready("reshaper")
    after = model_stats(client, "reshaper")
    stats_before, stats_after = before["inference_stats"], after["inference_stats"]
    assert stats_after["fail"]["count"] - stats_before["fail"]["count"] == 2
    assert stats_after["success"]["count"] - stats_before["success"]["count"] == 2


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/%2E%2E/infer",
        "/v2/models/..%2F..%2Fetc/infer",
        "/v2/models/%2E%2E%2Frepo/infer",
        "/v2/models/a%00b/infer",
    ],
)
def test_traversal_model_names_rejected(http: Any, path: str) -> None:
    response = http.post(path, json=_json_input())
    # ".." reaches the route as a model name and must be refused as one; names holding a
    # slash may already miss the route. Either way the answer is a JSON error.
    expected = 400 if path.endswith("%2E%2E/infer") else response.status_code
    assert response.status_code in (400, 404), (response.status_code, response.text)
    assert_error(response, expected)


# ---------------------------------------------------------------------------------------------
# statistics and metrics


def test_statistics_triton_format(client: Any) -> None:
    before = model_stats(client, "two_outputs", "1")
    for batch in (3, 1):
        infer(client, "two_outputs", {"x": np.ones((batch, 4), np.float32)})
    after = model_stats(client, "two_outputs", "1")
    assert after["name"] == "two_outputs" and str(after["version"]) == "1"
    # inference_count counts samples (3 + 1); success counts requests.
    assert after["inference_count"] - before["inference_count"] == 4
    assert 1 <= after["execution_count"] - before["execution_count"] <= 2
    stats = after["inference_stats"]
    for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(stats[key]) >= {"count", "ns"}, (key, stats[key])
    assert stats["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert stats["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert stats["compute_infer"]["ns"] > 0 and stats["queue"]["count"] >= 2
    assert after["last_inference"] > 0
    # Every model at once.
    everything = client.get_inference_statistics()["model_stats"]
    names = {s["name"] for s in everything}
    assert {"two_outputs", "rowwise", "reshaper", "dtype_fp32"} <= names
    with raises_status(404):
        client.get_inference_statistics("no_such_model")


def _metrics(http: Any) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return list(text_string_to_metric_families(response.text))


def _model_value(families: list[Any], family: Any, model: str, suffix: str = "") -> float:
    return sum(
        s.value
        for s in family.samples
        if s.labels.get("model") == model and s.name == family.name + suffix
    )


def test_prometheus_metrics(client: Any, http: Any) -> None:
    infer(client, "two_outputs", {"x": np.ones((2, 4), np.float32)})
    with raises_status(500):
        infer(client, "reshaper", {"x": np.ones(3, np.float32), "shape": np.array([2, 2])})
    families = _metrics(http)
    with_model = [f for f in families if any("model" in s.labels for s in f.samples)]
    counters = [f for f in with_model if f.type == "counter"]
    histograms = [f for f in with_model if f.type == "histogram"]
    success = [f for f in counters if "success" in f.name]
    failure = [f for f in counters if "fail" in f.name]
    assert success and failure, [f.name for f in counters]
    assert _model_value(families, success[0], "two_outputs", "_total") >= 1
    assert _model_value(families, failure[0], "reshaper", "_total") >= 1
    # every model sample carries its version
    for family in with_model:
        for sample in family.samples:
            if "model" in sample.labels:
                assert "version" in sample.labels, (family.name, sample.labels)
    names = " ".join(f.name for f in histograms)
    for kind in ("request", "queue", "compute", "batch"):
        assert kind in names, (kind, names)
    for family in histograms:
        assert _model_value(families, family, "two_outputs", "_count") >= 1, family.name


# ---------------------------------------------------------------------------------------------
# dynamic batching under concurrency


def test_concurrent_requests_form_batches(
    server: Any, client: Any, references: dict[str, Reference]
) -> None:
    requests, threads = 64, 16
    rng = np.random.default_rng(7)
    # two sequence lengths: only requests of equal shape may be batched together
    inputs = [
        rng.standard_normal((1, 3 if i % 2 else 5, 4)).astype(np.float32) for i in range(requests)
    ]
    expected = [references["rowwise"]({"x": x})["y"] for x in inputs]
    results: list[np.ndarray | None] = [None] * requests
    errors: list[str] = []
    before = model_stats(client, "rowwise")

    def worker(first: int) -> None:
        c = client_for(server, network_timeout=30)
        try:
            for i in range(first, requests, threads):
                results[i] = infer(c, "rowwise", {"x": inputs[i]}).as_numpy("y")
        except Exception as e:
            errors.append(repr(e))
        finally:
            c.close()

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in pool), "requests still running after 30 s"
    assert errors == []
    after = model_stats(client, "rowwise")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == requests
    assert executions < inferences, (executions, inferences)
    sizes = [int(b["batch_size"]) for b in after.get("batch_stats", [])]
    assert sizes and max(sizes) > 1 and max(sizes) <= 8, after.get("batch_stats")
    for got, want in zip(results, expected):
        assert got is not None
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# safety: API key, request size limit, bind address


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # One model file served as one model named after its stem; no host given: 127.0.0.1.
    path = tmp_path_factory.mktemp("secured") / "two_outputs.onnx"
    path.write_bytes(sm.two_outputs().SerializeToString())
    app = create_app(path, api_key=API_KEY, max_request_bytes=SMALL_LIMIT)
    with ServerThread(app, port=0) as running:
        yield running


def test_binds_localhost_by_default(secured: Any) -> None:
    assert secured.url.startswith("http://127.0.0.1:")


def test_api_key(secured: Any) -> None:
    x = np.ones((1, 4), np.float32)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    c = client_for(secured)
    try:
        assert c.is_server_live()  # health stays open for probes
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            with raises_status(401):
                infer(c, "two_outputs", {"x": x}, headers=headers)
            with raises_status(401):
                c.get_model_repository_index(headers=headers)
            with raises_status(401):
                c.unload_model("two_outputs", headers=headers)
        result = infer(c, "two_outputs", {"x": x}, headers=auth)
        assert result.get_response()["model_name"] == "two_outputs"
        np.testing.assert_array_equal(result.as_numpy("sum"), x + 1)
        index = c.get_model_repository_index(headers=auth)
        assert [(e["name"], str(e.get("version")), e["state"]) for e in index] == [
            ("two_outputs", "1", "READY")
        ]
    finally:
        c.close()
    with httpx.Client(base_url=secured.url) as h:
        assert_error(h.post("/v2/models/two_outputs/infer", json=_json_input()), 401)


def test_request_size_limit_413(secured: Any) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    c = client_for(secured)
    try:
        with raises_status(413):
            infer(c, "two_outputs", {"x": np.ones((300, 4), np.float32)}, headers=auth)
        infer(c, "two_outputs", {"x": np.ones((8, 4), np.float32)}, headers=auth)
    finally:
        c.close()
    big = json.dumps(_json_input(shape=[400, 4], data=[0.5] * 1600)).encode()
    with httpx.Client(base_url=secured.url) as h:
        headers = {**auth, "Content-Type": "application/json"}
        assert_error(h.post("/v2/models/two_outputs/infer", content=big, headers=headers), 413)

        # No Content-Length (chunked): the limit must hold while reading, too.
        def chunks() -> Iterator[bytes]:
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        assert_error(h.post("/v2/models/two_outputs/infer", content=chunks(), headers=headers), 413)
        assert h.get("/v2/health/live").status_code == 200


# ---------------------------------------------------------------------------------------------
# repository: explicit mode, load / unload, traversal, failed loads


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    base = tmp_path_factory.mktemp("explicit")
    repo = base / "repo"
    sm.add_version(repo, "alpha", 1, sm.add_const(1))
    sm.add_version(repo, "beta", 1, sm.add_const(2))
    sm.add_version(repo, "broken", 1, b"this is not an onnx model")
    # A model outside the repository that a traversal name would reach.
    sm.add_version(base / "outside", "m", 1, sm.add_const(99))
    app = create_app(repo, explicit=True, load=["alpha"])
    with ServerThread(app, host="127.0.0.1", port=0) as running:
        yield running, repo


def test_explicit_mode_load_unload(explicit: tuple[Any, Path]) -> None:
    server, repo = explicit
    x = np.zeros((1, 3), np.float32)
    c = client_for(server)
    try:
        states = {e["name"]: e.get("state") for e in c.get_model_repository_index()}
        assert states["alpha"] == "READY"
        assert "beta" in states and states["beta"] != "READY"
        assert c.is_model_ready("alpha") and not c.is_model_ready("beta")
        with raises_status(503):
            infer(c, "beta", {"x": x})

        c.load_model("beta")
        assert c.is_model_ready("beta")
        assert infer(c, "beta", {"x": x}).as_numpy("y").tolist() == [[2, 2, 2]]
        assert {"beta": "READY"}.items() <= {
            e["name"]: e.get("state") for e in c.get_model_repository_index()
        }.items()

        c.unload_model("alpha")
        assert not c.is_model_ready("alpha")
        with raises_status(503):
            infer(c, "alpha", {"x": x})
        (entry,) = [e for e in index_entries(c, "alpha") if e.get("state")]
        assert entry["state"] == "UNAVAILABLE"

        # Loading again picks up a new version written meanwhile.
        sm.add_version(repo, "alpha", 2, sm.add_const(5))
        c.load_model("alpha")
        assert infer(c, "alpha", {"x": x}).as_numpy("y").tolist() == [[5, 5, 5]]
        assert c.get_model_metadata("alpha")["versions"] == ["2"]
    finally:
        c.close()


def test_explicit_mode_bad_loads(explicit: tuple[Any, Path]) -> None:
    server, _ = explicit
    c = client_for(server)
    try:
        with raises_status(404):
            c.load_model("no_such_model")
        with raises_status(400) as error:  # Triton answers a failed load with 400
            c.load_model("broken")
        assert "broken" in error.message
        assert error.message
        (entry,) = index_entries(c, "broken")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"], entry
        assert not c.is_model_ready("broken")
        with raises_status(503):  # in the repository, but not ready
            infer(c, "broken", {"x": np.zeros((1, 3), np.float32)})
    finally:
        c.close()
    with httpx.Client(base_url=server.url) as h:
        assert_error(h.post("/v2/repository/models/%2E%2E/load"), 400)
        for name in ("..%2Foutside%2Fm", "%2E%2E%2Foutside%2Fm", "%2Ftmp", "a%00b"):
            response = h.post(f"/v2/repository/models/{name}/load")
            assert response.status_code in (400, 404), (name, response.status_code)
        index = h.post("/v2/repository/index").json()
        assert all("outside" not in e["name"] and "/" not in e["name"] for e in index), index
        assert h.post("/v2/models/m/infer", json=_json_input()).status_code == 404


# ---------------------------------------------------------------------------------------------
# precision: per model (config.json) and per server (--precision)


def _has_openvino() -> bool:
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    try:
        get_backend("openvino")
    except BackendUnavailableError:
        return False
    return True


needs_openvino = pytest.mark.skipif(not _has_openvino(), reason="OpenVINO is not installed")


@pytest.fixture(scope="module")
def precision_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Any, dict[str, Any]]]:
    repo = tmp_path_factory.mktemp("precision") / "repo"
    models = sm.build_precision_repository(repo)
    with ServerThread(create_app(repo), host="127.0.0.1", port=0) as running:
        yield running, models


@pytest.mark.openvino
@needs_openvino
def test_precision_per_model_config(precision_server: tuple[Any, dict[str, Any]]) -> None:
    server, models = precision_server
    c = client_for(server)
    try:
        # Models with a bad precision are unavailable, with the reason; the server serves on,
        # live but not ready (Triton's strict readiness: models that should load did not).
        assert c.is_server_live() and not c.is_server_ready()
        (bad,) = index_entries(c, "bad_precision")
        assert bad["state"] == "UNAVAILABLE"
        assert "'precision' must be one of fp32, bf16, fp16, int8" in bad["reason"]
        assert "got 'bf61'" in bad["reason"]
        (int8,) = index_entries(c, "ort_int8")
        assert int8["state"] == "UNAVAILABLE" and "precision 'int8'" in int8["reason"]
        assert "onnxruntime offers fp32" in int8["reason"]
        assert not c.is_model_ready("bad_precision") and not c.is_model_ready("ort_int8")
        with raises_status(503):
            infer(c, "ort_int8", {"x": np.zeros((1, 3), np.float32)})
        # The one that asks for bf16 on OpenVINO: /config says so, and it answers.
        config = c.get_model_config("rowwise_bf16")
        assert config["platform"] == "ferry" and config["backend"] == "openvino"
        assert config["parameters"]["ferry_precision"] == {"string_value": "bf16"}
        assert config["parameters"]["ferry_backends"] == {"string_value": "openvino"}
        default = c.get_model_config("rowwise_default")["parameters"]
        assert default["ferry_precision"] == {"string_value": "fp32"}
        x = np.random.default_rng(3).standard_normal((2, 5, 4)).astype(np.float32)
        want = Reference(models["rowwise_bf16"])({"x": x})["y"]
        got = infer(c, "rowwise_bf16", {"x": x}).as_numpy("y")
        # bf16 keeps 8 bits of mantissa: tanh's outputs in [-1, 1] within a few hundredths.
        np.testing.assert_allclose(got, want, atol=5e-2)
        exact = infer(c, "rowwise_default", {"x": x}).as_numpy("y")
        np.testing.assert_allclose(exact, want, rtol=1e-5, atol=1e-6)
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# hot reload under load (poll mode)


def test_hot_reload_under_load_drops_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    sm.add_version(repo, "hot", 1, sm.add_const(1))
    sm.write_config(
        repo,
        "hot",
        {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}},
    )
    app = create_app(repo, poll_interval=0.2)
    stop = threading.Event()
    answers: list[list[float]] = [[] for _ in range(4)]
    errors: list[str] = []
    x = np.zeros((1, 3), np.float32)

    with ServerThread(app, host="127.0.0.1", port=0) as server:

        def fire(k: int) -> None:
            c = client_for(server, network_timeout=30)
            try:
                while not stop.is_set():
                    try:
                        y = infer(c, "hot", {"x": x}).as_numpy("y")
                        answers[k].append(float(y[0, 0]))
                    except Exception as e:
                        errors.append(repr(e))
                        time.sleep(0.01)
            finally:
                c.close()

        clients = [threading.Thread(target=fire, args=(k,)) for k in range(4)]
        c = client_for(server)
        try:
            for t in clients:
                t.start()
            wait_until(lambda: all(len(a) >= 3 for a in answers), 10, "first answers")
            sm.add_version(repo, "hot", 2, sm.add_const(2))
            wait_until(lambda: all(2.0 in a for a in answers), 15, "version 2 to answer")
            counts = [len(a) for a in answers]
            wait_until(
                lambda: all(len(a) >= n + 3 for a, n in zip(answers, counts)), 10, "more answers"
            )
            # A broken version 3: version 2 keeps serving, the index says why 3 failed.
            sm.add_version(repo, "hot", 3, b"\x08\x07 corrupt onnx")

            def failed_v3() -> bool:
                return any(
                    str(e.get("version")) == "3" and e.get("state") != "READY" and e.get("reason")
                    for e in index_entries(c, "hot")
                )

            wait_until(failed_v3, 15, "the index to report version 3's failure")
            counts = [len(a) for a in answers]
            wait_until(
                lambda: all(len(a) >= n + 3 for a, n in zip(answers, counts)), 10, "more answers"
            )
        finally:
            stop.set()
            for t in clients:
                t.join(timeout=30)
        try:
            assert errors == [], errors[:5]
            assert all(set(a) <= {1.0, 2.0} for a in answers)
            assert all(a[-1] == 2.0 for a in answers)  # the last answers came from version 2
            # once a client saw version 2, it never saw version 1 again
            for a in answers:
                first = a.index(2.0)
                assert 1.0 not in a[first:], a
            assert c.is_model_ready("hot", "2") and not c.is_model_ready("hot", "3")
            assert not c.is_model_ready("hot", "1")  # default policy: the latest version only
            assert infer(c, "hot", {"x": x}).as_numpy("y").tolist() == [[2, 2, 2]]
            states = {str(e.get("version")): e.get("state") for e in index_entries(c, "hot")}
            assert states.get("2") == "READY", states
        finally:
            c.close()


# ---------------------------------------------------------------------------------------------
# graceful shutdown


def test_shutdown_drains_in_flight_requests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    sm.add_version(repo, "slow", 1, sm.add_const(4))
    # A lone request waits the whole queue delay for a batch to fill: it is in flight at exit.
    sm.write_config(
        repo,
        "slow",
        {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 800_000}},
    )
    outcome: dict[str, Any] = {}
    server = ServerThread(create_app(repo), host="127.0.0.1", port=0)
    with server:
        url = server.url

        def request() -> None:
            try:
                with httpx.Client(base_url=url, timeout=30) as h:
                    body = {
                        "inputs": [
                            {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
                        ]
                    }
                    outcome["response"] = h.post("/v2/models/slow/infer", json=body)
            except Exception as e:
                outcome["error"] = repr(e)

        thread = threading.Thread(target=request)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
    # __exit__ returned: the request must have been answered, not cut off.
    thread.join(timeout=10)
    assert "error" not in outcome, outcome
    response = outcome["response"]
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [5, 6, 7]
    assert time.monotonic() - started < 10
    with pytest.raises(httpx.TransportError), httpx.Client(base_url=url, timeout=2) as h:
        h.get("/v2/health/live")


# ---------------------------------------------------------------------------------------------
# a real CNN


@pytest.mark.torch
def test_digits_cnn(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from ferry import zoo

    path = zoo.save("digits_cnn", tmp_path)
    import onnx

    reference = Reference(onnx.load(path))
    with ServerThread(create_app(path), host="127.0.0.1", port=0) as server:
        c = client_for(server)
        try:
            meta = c.get_model_metadata("digits_cnn")
            assert meta["inputs"][0]["shape"] == [-1, 1, 8, 8]
            for batch, binary in ((1, True), (4, True), (4, False)):
                feeds = zoo.example_inputs("digits_cnn", batch=batch, seed=batch)
                result = infer(
                    c, "digits_cnn", feeds, binary_in=binary, binary_out=binary, outputs=["logits"]
                )
                np.testing.assert_allclose(
                    result.as_numpy("logits"), reference(feeds)["logits"], rtol=1e-5, atol=1e-5
                )
        finally:
            c.close()


# ---------------------------------------------------------------------------------------------
# the CLI


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ferry(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "ferry.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serve_starts_serves_and_stops(tmp_path: Path, stop: signal.Signals) -> None:
    path = tmp_path / "two_outputs.onnx"
    path.write_bytes(sm.two_outputs().SerializeToString())
    port = _free_port()
    process = _ferry("serve", str(path), "--port", str(port))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: any(url in line for line in lines) or process.poll() is not None, 60, url
        )
        assert process.poll() is None, "".join(lines)
        with httpx.Client(base_url=url, timeout=10) as h:
            wait_until(lambda: h.get("/v2/health/ready").status_code == 200, 20, "ready")
            body = {
                "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
            }
            response = h.post("/v2/models/two_outputs/infer", json=body)
            assert response.status_code == 200, response.text
            outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
            assert outputs == {"sum": [2, 3, 4, 5], "prod": [2, 4, 6, 8]}
        process.send_signal(stop)
        code = process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=5)
    output = "".join(lines)
    assert code in (0, 130), (code, output)
    assert "Traceback" not in output, output


def test_cli_serve_bad_precision_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "two_outputs.onnx"
    path.write_bytes(sm.two_outputs().SerializeToString())
    process = _ferry("serve", str(path), "--port", str(_free_port()), "--precision", "half")
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [line for line in output.splitlines() if line.strip()]
    assert process.returncode == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: precision must be one of"), output
    assert "fp32, bf16, fp16, int8" in lines[0] and "got 'half'" in lines[0]


@pytest.mark.openvino
@needs_openvino
def test_cli_serve_precision_shows_in_the_table(tmp_path: Path) -> None:
    path = tmp_path / "two_outputs.onnx"
    path.write_bytes(sm.two_outputs().SerializeToString())
    port = _free_port()
    process = _ferry(
        "serve", str(path), "--port", str(port), "--backends", "openvino", "--precision", "bf16"
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(
            lambda: any("two_outputs" in line for line in lines) or process.poll() is not None,
            60,
            "the models table",
        )
        assert process.poll() is None, "".join(lines)
        (row,) = [line for line in lines if line.lstrip().startswith("two_outputs")]
        assert row.split()[:5] == ["two_outputs", "1", "READY", "openvino", "bf16"], row
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as h:
            parameters = h.get("/v2/models/two_outputs/config").json()["parameters"]
            assert parameters["ferry_precision"] == {"string_value": "bf16"}
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=5)
    assert code in (0, 130), "".join(lines)


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_cli_serve_bad_source_exit_2(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "model.onnx"
    if kind == "corrupt":
        source.write_bytes(b"not a model")
    process = _ferry("serve", str(source), "--port", str(_free_port()))
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = [line for line in output.splitlines() if line.strip()]
    assert process.returncode == 2, output
    assert len(lines) == 1 and lines[0].startswith("error:"), output
