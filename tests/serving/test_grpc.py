"""Triton's gRPC service beside the HTTP app: every RPC driven by ``tritonclient.grpc`` unchanged,
raw and typed tensor contents, errors per code, streaming, the API key, and the drain."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _serving_models import add_const, gather_rows, identity, write_config, write_model
from click.testing import CliRunner
from onnx import TensorProto

grpc = pytest.importorskip("grpc")
tgrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

import ferry.serving._grpc as grpc_module  # noqa: E402
from ferry.cli.main import cli  # noqa: E402
from ferry.serving import GrpcServer, ServerThread, create_app  # noqa: E402

KEY = "s3cret"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "add", 1, add_const(1))
    write_model(repo, "add", 2, add_const(2))
    write_config(repo, "add", {"version_policy": {"all": {}}})
    write_model(repo, "gather", 1, gather_rows())
    write_model(repo, "text", 1, identity(TensorProto.STRING))
    write_model(repo, "half", 1, identity(TensorProto.FLOAT16))
    write_model(repo, "idle", 1, add_const(9))
    app = create_app(
        repo,
        api_key=KEY,
        max_request_bytes=4096,
        warmup=False,
        explicit=True,
        load=["add", "gather", "text", "half"],
    )
    with ServerThread(app, port=0), GrpcServer(app, port=0) as server:
        yield server


@pytest.fixture
def client(served: GrpcServer) -> Iterator[Any]:
    c = tgrpc.InferenceServerClient(served.address)
    yield c
    c.close()


@pytest.fixture
def stub(served: GrpcServer) -> Iterator[Any]:
    channel = grpc.insecure_channel(served.address)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def tensor(name: str, array: np.ndarray, datatype: str) -> Any:
    t = tgrpc.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def code_of(call: Any) -> tuple[Any, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_health_metadata_and_config_are_open(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and client.is_model_ready("add", "2")
    assert not client.is_model_ready("idle")  # known, not loaded
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "ferry" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("add", as_json=True)
    assert model["versions"] == ["1", "2"]
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = client.get_model_config("add").config
    assert config.name == "add" and config.max_batch_size == 8
    assert list(config.input[0].dims) == [4] and config.input[0].data_type == 11  # TYPE_FP32
    assert config.version_policy.HasField("all") and config.HasField("dynamic_batching")


def test_binary_inference_both_versions(client: Any) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for version, k in (("1", 1), ("2", 2)):
        result = client.infer(
            "add", [tensor("x", x, "FP32")], model_version=version, request_id="q", headers=AUTH
        )
        np.testing.assert_array_equal(result.as_numpy("y"), x + k)
        response = result.get_response()
        assert response.id == "q" and response.model_version == version
    outputs = [tgrpc.InferRequestedOutput("y")]
    result = client.infer("gather", [tensor("idx", np.array([3, 0]), "INT64")], outputs=outputs,
                          headers=AUTH)  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("y"), [[6, 7], [0, 1]])


def test_typed_contents(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="add", model_version="1", id="typed")
    x = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    x.contents.fp32_contents.extend([1, 2, 3, 4])
    response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
    (raw,) = response.raw_output_contents
    assert response.id == "typed" and list(response.outputs[0].shape) == [1, 4]
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), [2, 3, 4, 5])

    request = service_pb2.ModelInferRequest(model_name="gather")
    idx = request.inputs.add(name="idx", datatype="INT64", shape=[1])
    idx.contents.int64_contents.append(2)
    response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
    np.testing.assert_array_equal(
        np.frombuffer(response.raw_output_contents[0], np.float32), [4, 5]
    )

    request = service_pb2.ModelInferRequest(model_name="text")
    text = request.inputs.add(name="x", datatype="BYTES", shape=[1, 3])
    text.contents.bytes_contents.extend([b"a", "é".encode(), b""])
    response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
    raw = response.raw_output_contents[0]
    assert raw == b"\x01\x00\x00\x00a\x02\x00\x00\x00\xc3\xa9\x00\x00\x00\x00"


def test_bytes_and_fp16_tensors(client: Any) -> None:
    words = np.array([[b"one", b"two", "três".encode()]], dtype=object)
    result = client.infer("text", [tensor("x", words, "BYTES")], headers=AUTH)
    assert result.as_numpy("y").tolist() == words.tolist()
    half = np.array([[0.5, -2, 65504]], np.float16)
    result = client.infer("half", [tensor("x", half, "FP16")], headers=AUTH)
    np.testing.assert_array_equal(result.as_numpy("y"), half)


def test_errors_map_to_codes(client: Any, stub: Any) -> None:
    x = np.ones((1, 4), np.float32)
    meta = tuple(AUTH.items())

    def infer(request: Any) -> Any:
        return lambda: stub.ModelInfer(request, metadata=meta)

    code, details = code_of(infer(service_pb2.ModelInferRequest(model_name="nope")))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    code, details = code_of(infer(service_pb2.ModelInferRequest(model_name="idle")))
    assert code == grpc.StatusCode.UNAVAILABLE, details
    # No inputs; a wrong datatype; raw contents that do not add up; typed contents of the wrong
    # field: each one clear line.
    bad = service_pb2.ModelInferRequest(model_name="add")
    assert code_of(infer(bad))[0] == grpc.StatusCode.INVALID_ARGUMENT
    wrong_type = service_pb2.ModelInferRequest(model_name="add")
    wrong_type.inputs.add(name="x", datatype="INT32", shape=[1, 4])
    wrong_type.raw_input_contents.append(np.ones(4, np.int32).tobytes())
    code, details = code_of(infer(wrong_type))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "FP32" in details and "INT32" in details
    short = service_pb2.ModelInferRequest(model_name="add")
    short.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    short.raw_input_contents.append(b"\0" * 12)
    code, details = code_of(infer(short))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 16" in details
    typed = service_pb2.ModelInferRequest(model_name="add")
    typed.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.int_contents.extend([1] * 4)
    code, details = code_of(infer(typed))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "fp32_contents" in details
    # The engine fails on this input (an index past the table): INTERNAL, the engine's reason.
    with pytest.raises(InferenceServerException) as info:
        client.infer("gather", [tensor("idx", np.array([7]), "INT64")], headers=AUTH)
    assert info.value.status() == "StatusCode.INTERNAL"
    # Above --max-request-bytes (4096): RESOURCE_EXHAUSTED, from grpc itself.
    big = np.ones((300, 4), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add", [tensor("x", big, "FP32")], headers=AUTH)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    # What this server does not offer.
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("r", "/k", 64)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "shared memory" in str(info.value)
    # And it still serves (the latest version: 2).
    result = client.infer("add", [tensor("x", x, "FP32")], headers=AUTH)
    np.testing.assert_array_equal(result.as_numpy("y"), x + 2)


def test_api_key(client: Any, stub: Any) -> None:
    x = tensor("x", np.ones((1, 4), np.float32), "FP32")
    for headers in (None, {"authorization": "Bearer wrong"}):
        with pytest.raises(InferenceServerException) as info:
            client.infer("add", [x], headers=headers)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "authorization: Bearer" in str(info.value)
        with pytest.raises(InferenceServerException) as info:
            client.get_model_repository_index(headers=headers)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    # Health, metadata and statistics stay open, as over HTTP.
    assert client.is_server_ready() and client.get_inference_statistics("add")


def test_statistics(client: Any) -> None:
    before = client.get_inference_statistics("add", "1").model_stats[0]
    x = np.ones((2, 4), np.float32)
    client.infer("add", [tensor("x", x, "FP32")], model_version="1", headers=AUTH)
    after = client.get_inference_statistics("add", "1").model_stats[0]
    assert after.inference_count == before.inference_count + 2
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.inference_stats.compute_infer.ns > 0
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {(s["name"], s["version"]) for s in every} >= {("add", "1"), ("add", "2")}
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_repository_index_load_unload(client: Any) -> None:
    index = {m.name: m for m in client.get_model_repository_index(headers=AUTH).models}
    assert index["idle"].state != "READY" and index["gather"].state == "READY"
    client.load_model("idle", headers=AUTH)
    assert client.is_model_ready("idle")
    result = client.infer("idle", [tensor("x", np.zeros((1, 4), np.float32), "FP32")], headers=AUTH)
    np.testing.assert_array_equal(result.as_numpy("y"), np.full((1, 4), 9, np.float32))
    client.unload_model("idle", headers=AUTH)
    assert not client.is_model_ready("idle")
    # A config sent with the load: the load API's parameter, as over HTTP.
    client.load_model("idle", config='{"max_batch_size": 2}', headers=AUTH)
    assert client.get_model_config("idle").config.max_batch_size == 2
    client.unload_model("idle", headers=AUTH)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("idle", config="{not json", headers=AUTH)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "not valid JSON" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("idle", files={"file:1/model.onnx": b"x"}, headers=AUTH)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_streaming_inference(client: Any) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)), headers=AUTH)
    try:
        for i in range(6):
            x = np.full((1, 4), i, np.float32)
            client.async_stream_infer("add", [tensor("x", x, "FP32")], request_id=str(i))
        client.async_stream_infer("nope", [tensor("x", x, "FP32")], request_id="bad")
        got: dict[str, Any] = {}
        errors = []
        for _ in range(7):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(str(error))
            else:
                got[result.get_response().id] = result.as_numpy("y")
    finally:
        client.stop_stream()
    assert sorted(got) == [str(i) for i in range(6)]
    for i in range(6):
        np.testing.assert_array_equal(got[str(i)], np.full((1, 4), i + 2, np.float32))
    assert len(errors) == 1 and "nope" in errors[0]


def test_request_parameters_reach_the_infer_path(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequence id and flags, priority and timeout reach the path HTTP's parameters take, as the
    dict HTTP's codec gives; a stream runs one sequence's requests in order."""
    seen: list[dict[str, Any]] = []
    original = grpc_module.infer_decoded

    async def spy(state: Any, version: Any, decoded: Any) -> Any:
        seen.append(dict(decoded.parameters))
        return await original(state, version, decoded)

    monkeypatch.setattr(grpc_module, "infer_decoded", spy)
    x = tensor("x", np.ones((1, 4), np.float32), "FP32")
    client.infer("add", [x], sequence_id=42, sequence_start=True, priority=2, timeout=5_000_000,
                 headers=AUTH)  # fmt: skip
    assert seen[-1] == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 5_000_000,
    }
    seen.clear()
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: answers.put(error), headers=AUTH)
    try:
        for i in range(5):
            client.async_stream_infer("add", [x], request_id=str(i), sequence_id="s-1",
                                      sequence_start=i == 0, sequence_end=i == 4)  # fmt: skip
        assert [answers.get(timeout=30) for _ in range(5)] == [None] * 5
    finally:
        client.stop_stream()
    assert [p["sequence_start"] for p in seen] == [True, False, False, False, False]
    assert [p["sequence_end"] for p in seen] == [False, False, False, False, True]
    assert {p["sequence_id"] for p in seen} == {"s-1"}


def test_drain_finishes_grpc_requests_in_flight(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_model(repo, "add", 1, add_const(1))
    original = grpc_module.infer_decoded
    entered = threading.Event()

    async def slow(state: Any, version: Any, decoded: Any) -> Any:
        import asyncio

        entered.set()
        await asyncio.sleep(0.5)
        return await original(state, version, decoded)

    monkeypatch.setattr(grpc_module, "infer_decoded", slow)
    app = create_app(repo, warmup=False)
    http = ServerThread(app, port=0).start()
    server = GrpcServer(app, port=0).start()
    client = tgrpc.InferenceServerClient(server.address)
    results: list[Any] = []
    x = np.ones((1, 4), np.float32)
    worker = threading.Thread(
        target=lambda: results.append(client.infer("add", [tensor("x", x, "FP32")]).as_numpy("y"))
    )
    worker.start()
    assert entered.wait(10)
    started = time.monotonic()
    http.stop()  # the HTTP server's drain stops gRPC too
    worker.join(10)
    assert results and np.array_equal(results[0], x + 1)
    assert server.drained == 1 and server.cut_off == 0
    assert time.monotonic() - started < 10
    with pytest.raises(InferenceServerException):
        client.is_server_live(client_timeout=2)
    client.close()


def test_port_in_use_is_one_clear_line(repo: Path, served: GrpcServer) -> None:
    write_model(repo, "add", 1, add_const(1))
    result = CliRunner().invoke(
        cli, ["serve", str(repo), "--port", "0", "--grpc-port", str(served.port)]
    )
    assert result.exit_code != 0
    assert "--grpc-port" in result.output and "Traceback" not in result.output


def test_a_full_queue_says_when_to_retry(served: GrpcServer) -> None:
    """429's Retry-After travels as trailing metadata with RESOURCE_EXHAUSTED."""
    import asyncio

    from ferry.errors import EngineBusyError

    class Context:
        def set_trailing_metadata(self, items: Any) -> None:
            self.trailing = dict(items)

        def set_code(self, code: Any) -> None:
            self.code = code

        def set_details(self, details: str) -> None:
            self.details = details

    context = Context()
    servicer = grpc_module._Servicer(served.state)
    asyncio.run(servicer._fail(context, EngineBusyError("the queue is full", retry_after=2.5)))
    assert context.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.trailing == {"retry-after": "3"} and context.details == "the queue is full"


def _health_messages() -> tuple[Any, Any]:
    """grpc.health.v1's two messages, built from their proto definition (no package needed)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name="ferry_test_health.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=9, label=1)  # string
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for i, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=i)
    response.field.add(
        name="status",
        number=1,
        type=14,
        label=1,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")
        ),
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")
        ),
    )


def test_grpc_health_service_answers_probes(served: GrpcServer) -> None:
    """Kubernetes' grpc probes and grpc_health_probe call grpc.health.v1.Health/Check."""
    request_type, response_type = _health_messages()
    with grpc.insecure_channel(served.address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        serving = response_type.ServingStatus.Value("SERVING")
        not_serving = response_type.ServingStatus.Value("NOT_SERVING")
        assert check(request_type(service="")).status == serving
        assert check(request_type(service="live")).status == serving
        assert check(request_type(service="add")).status == serving
        assert check(request_type(service="idle")).status == not_serving  # not loaded
        code, details = code_of(lambda: check(request_type(service="nope")))
        assert code == grpc.StatusCode.NOT_FOUND and "'nope'" in details
        raw = channel.unary_unary("/grpc.health.v1.Health/Check")
        code, details = code_of(lambda: raw(b"\x0a\x20truncated"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "HealthCheckRequest" in details
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
        code, _ = code_of(lambda: list(watch(b"")))
        assert code == grpc.StatusCode.UNIMPLEMENTED
