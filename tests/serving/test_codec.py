"""KServe v2 codec: every datatype both ways, JSON and binary, checked against Triton's own client."""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ferry.errors import InvalidInputError
from ferry.serving import DATATYPES, datatype_of, decode_request, encode_response

tritonhttp = pytest.importorskip("tritonclient.http")
from tritonclient.http._utils import _get_inference_request  # noqa: E402

RNG = np.random.default_rng(0)


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """Values that use the whole range of the type: extremes, negatives, fractions."""
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        words = [b"", b"a", b"hello", "caf\u00e9".encode(), b"x" * 300, b"z"]
        return np.array(words[: int(np.prod(shape))], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return RNG.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = np.array([info.min, info.max, 0, 1, info.max // 3, info.min // 2 + 1], dtype=dtype)
        return np.resize(flat, shape)
    return (RNG.standard_normal(shape) * 100).astype(dtype)


def client_request(
    arrays: dict[str, np.ndarray], binary: bool, outputs: list[Any] | None = None, **kw: Any
) -> tuple[bytes, int | None]:
    """The body (and header length) Triton's Python client sends for these inputs."""
    inputs = []
    for name, array in arrays.items():
        item = tritonhttp.InferInput(name, list(array.shape), datatype_of(array.dtype))
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id=kw.get("request_id", ""),
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )
    return (body.encode() if isinstance(body, str) else body), json_size


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.dtype == object
        assert [bytes(v) if isinstance(v, bytes) else v.encode() for v in got.reshape(-1)] == [
            bytes(v) for v in want.reshape(-1)
        ]
        return
    assert got.dtype == want.dtype
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_binary_request_round_trip(datatype: str) -> None:
    array = sample(datatype)
    body, json_size = client_request({"x": array}, binary=True, request_id="r1")
    assert json_size is not None
    request = decode_request(bytearray(body), json_size)
    assert request.id == "r1"
    assert request.datatypes == {"x": datatype}
    assert_same(request.inputs["x"], array)
    if datatype not in ("BYTES",):
        # Binary tensors are views over the body, not copies.
        assert request.inputs["x"].base is not None


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BF16"])
def test_json_request_round_trip(datatype: str) -> None:
    array = sample(datatype)
    body, json_size = client_request({"x": array}, binary=False)
    assert json_size is None
    request = decode_request(body)
    if datatype == "FP16":
        # JSON carries FP16 as decimal numbers; they round back to the same half floats.
        assert np.array_equal(request.inputs["x"], array)
    else:
        assert_same(request.inputs["x"], array)
    if datatype == "BYTES":
        assert all(isinstance(v, str) for v in request.inputs["x"].reshape(-1))


def test_bf16_json_is_refused() -> None:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "BF16", "data": [1.0]}]}
    with pytest.raises(InvalidInputError, match="BF16 data must be sent as binary"):
        decode_request(json.dumps(body).encode())


def test_binary_views_share_the_body() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    body, json_size = client_request({"x": array}, binary=True)
    buffer = bytearray(body)
    request = decode_request(buffer, json_size)
    assert np.shares_memory(request.inputs["x"], np.frombuffer(buffer, np.uint8))


def test_mixed_inputs_keep_order_and_offsets() -> None:
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    b = np.array([b"ab", b"", b"xyz"], dtype=object)
    c = np.linspace(0, 1, 5).astype(np.float64)
    inputs = []
    for name, array, binary in (("a", a, True), ("b", b, True), ("c", c, False)):
        item = tritonhttp.InferInput(name, list(array.shape), datatype_of(array.dtype))
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    body, size = _get_inference_request(inputs, "", None, 0, False, False, 0, None, None)
    request = decode_request(bytearray(body), size)
    assert list(request.inputs) == ["a", "b", "c"]
    assert_same(request.inputs["a"], a)
    assert_same(request.inputs["b"], b)
    assert np.array_equal(request.inputs["c"], c)
    assert request.binary_output  # the client asks for binary outputs when it names none


def test_nested_and_flat_json_data() -> None:
    nested = {
        "inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]
    }
    flat = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}]}
    for body in (nested, flat):
        got = decode_request(json.dumps(body).encode()).inputs["x"]
        assert got.dtype == np.int32
        assert got.tolist() == [[1, 2], [3, 4]]
    scalar = {"inputs": [{"name": "k", "shape": [], "datatype": "FP32", "data": 2.5}]}
    assert decode_request(json.dumps(scalar).encode()).inputs["k"].shape == ()


def test_requested_outputs() -> None:
    body = {
        "id": "7",
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
    }
    request = decode_request(json.dumps(body).encode())
    assert [(o.name, o.binary) for o in request.outputs or []] == [("y", True), ("z", None)]
    assert not request.binary_output


def _binary_body(header: dict[str, Any], data: bytes) -> tuple[bytes, int]:
    text = json.dumps(header).encode()
    return text + data, len(text)


def _one(datatype: str, shape: list[int], **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": shape, "datatype": datatype, **extra}]}


BAD_REQUESTS: list[tuple[str, bytes, int | None, str]] = [
    ("not json", b"{nope", None, "not valid JSON"),
    ("not an object", b"[1, 2]", None, "must be a JSON object"),
    ("no inputs", b'{"inputs": []}', None, "non-empty 'inputs'"),
    (
        "no name",
        json.dumps({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}).encode(),
        None,
        "needs a 'name'",
    ),
    ("bad shape", json.dumps(_one("FP32", [-1], data=[1])).encode(), None, "non-negative integers"),
    (
        "float shape",
        json.dumps(_one("FP32", [1.5], data=[1])).encode(),
        None,
        "non-negative integers",
    ),
    (
        "bad datatype",
        json.dumps(_one("FLOAT", [1], data=[1])).encode(),
        None,
        "unknown datatype 'FLOAT'",
    ),
    ("no data", json.dumps(_one("FP32", [1])).encode(), None, "has no data"),
    (
        "too few",
        json.dumps(_one("FP32", [2, 2], data=[1, 2, 3])).encode(),
        None,
        "has 3 elements but shape \\[2, 2\\] needs 4",
    ),
    ("ragged", json.dumps(_one("FP32", [2, 2], data=[[1, 2], [3]])).encode(), None, "ragged"),
    (
        "float for int",
        json.dumps(_one("INT32", [2], data=[1.5, 2])).encode(),
        None,
        "must be integers",
    ),
    (
        "out of range",
        json.dumps(_one("UINT8", [2], data=[1, 300])).encode(),
        None,
        "out of the range of UINT8",
    ),
    ("number for bool", json.dumps(_one("BOOL", [2], data=[1, 0])).encode(), None, "true/false"),
    (
        "number for bytes",
        json.dumps(_one("BYTES", [1], data=[1])).encode(),
        None,
        "must be strings",
    ),
    (
        "duplicate",
        json.dumps({"inputs": [_one("FP32", [1], data=[1])["inputs"][0]] * 2}).encode(),
        None,
        "given twice",
    ),
    (
        "bad id",
        json.dumps({"id": 3, **_one("FP32", [1], data=[1])}).encode(),
        None,
        "'id' must be a string",
    ),
    ("header too long", b'{"inputs": []}', 99, "Inference-Header-Content-Length is 99"),
    (
        "shared memory",
        json.dumps(_one("FP32", [1], parameters={"shared_memory_region": "r"})).encode(),
        None,
        "shared memory",
    ),
    (
        "classification",
        json.dumps(
            {
                **_one("FP32", [1], data=[1]),
                "outputs": [{"name": "y", "parameters": {"classification": 3}}],
            }
        ).encode(),
        None,
        "classification",
    ),
    (
        "binary_data_output not bool",
        json.dumps(
            {**_one("FP32", [1], data=[1]), "parameters": {"binary_data_output": "yes"}}
        ).encode(),
        None,
        "true or false",
    ),
]


@pytest.mark.parametrize(
    ("body", "length", "message"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_requests(body: bytes, length: int | None, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        decode_request(body, length)


BAD_BINARY: list[tuple[str, dict[str, Any], bytes, str]] = [
    ("size mismatch", _one("FP32", [2], parameters={"binary_data_size": 4}), b"\0" * 4, "needs 8"),
    (
        "past the end",
        _one("FP32", [2], parameters={"binary_data_size": 8}),
        b"\0" * 4,
        "runs past the end",
    ),
    (
        "extra bytes",
        _one("FP32", [1], parameters={"binary_data_size": 4}),
        b"\0" * 6,
        "2 bytes after",
    ),
    (
        "negative size",
        _one("FP32", [1], parameters={"binary_data_size": -4}),
        b"",
        "non-negative integer",
    ),
    (
        "both",
        _one("FP32", [1], data=[1], parameters={"binary_data_size": 4}),
        b"\0" * 4,
        "both 'data' and binary",
    ),
    ("bool not 0/1", _one("BOOL", [2], parameters={"binary_data_size": 2}), b"\x01\x07", "0 or 1"),
    (
        "bytes short",
        _one("BYTES", [2], parameters={"binary_data_size": 7}),
        struct.pack("<I", 3) + b"abc",
        "ends after 1 of 2",
    ),
    (
        "bytes length lies",
        _one("BYTES", [1], parameters={"binary_data_size": 6}),
        struct.pack("<I", 9) + b"ab",
        "claims 9 bytes",
    ),
    (
        "bytes leftover",
        _one("BYTES", [1], parameters={"binary_data_size": 6}),
        struct.pack("<I", 1) + b"ab",
        "1 bytes are left",
    ),
]


@pytest.mark.parametrize(
    ("header", "data", "message"), [c[1:] for c in BAD_BINARY], ids=[c[0] for c in BAD_BINARY]
)
def test_bad_binary_requests(header: dict[str, Any], data: bytes, message: str) -> None:
    body, length = _binary_body(header, data)
    with pytest.raises(InvalidInputError, match=message):
        decode_request(body, length)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_response_round_trip_through_triton_client(datatype: str, binary: bool) -> None:
    array = sample(datatype, (3, 2))
    if datatype == "BYTES" and not binary:
        array = np.array([v.decode() for v in array.reshape(-1)], dtype=object).reshape(3, 2)
    other = np.arange(4, dtype=np.int64)
    body, length = encode_response(
        model_name="m",
        model_version="2",
        outputs=[("y", array, binary), ("z", other, not binary)],
        request_id="abc",
    )
    result = tritonhttp.InferResult.from_response_body(body, header_length=length)
    response = result.get_response()
    assert response["model_name"] == "m" and response["model_version"] == "2"
    assert response["id"] == "abc"
    got = result.as_numpy("y")
    if datatype == "BYTES":
        want = [v if isinstance(v, bytes) else v.encode() for v in array.reshape(-1)]
        assert [bytes(v) if isinstance(v, bytes) else v.encode() for v in got.reshape(-1)] == want
    elif datatype == "BF16" or binary:
        assert_same(got, array)  # BF16 always goes binary
    else:
        assert np.array_equal(got, array)
    assert np.array_equal(result.as_numpy("z"), other)
    sent_binary = "parameters" in result.get_output("y")
    assert sent_binary == (binary or datatype == "BF16")


def test_all_json_response_has_no_header_length() -> None:
    body, length = encode_response(
        model_name="m", model_version="1", outputs=[("y", np.ones(2, np.float32), False)]
    )
    assert length is None
    assert json.loads(body)["outputs"][0]["data"] == [1.0, 1.0]


def test_non_utf8_bytes_as_json_is_refused() -> None:
    bad = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        encode_response(model_name="m", model_version="1", outputs=[("y", bad, False)])
    body, length = encode_response(model_name="m", model_version="1", outputs=[("y", bad, True)])
    assert length is not None and body.endswith(b"\xff\xfe")


def test_datatype_of() -> None:
    assert datatype_of(np.dtype(np.float32)) == "FP32"
    assert datatype_of(np.dtype(ml_dtypes.bfloat16)) == "BF16"
    assert datatype_of(np.dtype("U3")) == "BYTES"
    with pytest.raises(InvalidInputError, match="no KServe v2 datatype"):
        datatype_of(np.dtype(np.complex64))
