"""Stateful models served with sequence batching (``ferry.serving._sequence``), over HTTP.

The server runs in a thread (127.0.0.1, a free port) and is driven with ``tritonclient.http``'s
``sequence_id`` / ``sequence_start`` / ``sequence_end`` arguments, as a Triton client drives
Triton. Every answer is compared with ONNX Runtime fed the state by hand, one sequence at a time:
bit-exact where each request runs alone (batch 1), within float tolerance where concurrent
sequences are batched together (a batch of 8 may take another GEMM kernel, which sums in another
order).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from _sequence_client import by_hand as fed_by_hand
from _sequence_client import ort_runner, stream_over_http
from _serving_models import write_config, write_model
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
httpclient = pytest.importorskip("tritonclient.http")
ort = pytest.importorskip("onnxruntime")

from tritonclient.utils import InferenceServerException  # noqa: E402

from ferry.serving import ServerThread, create_app  # noqa: E402
from ferry.serving._config import ConfigError, parse_config  # noqa: E402
from ferry.serving._pbtxt import parse_pbtxt  # noqa: E402
from ferry.serving._sequence import DEFAULT_IDLE_US  # noqa: E402

FEATURES = 3
HIDDEN = 4
CHUNKS = 10
SEQUENCES = 8


def recurrent(
    batch: str | int = "batch",
    names: tuple[str, str, str, str] = ("audio", "state:h", "prob", "state_out:h"),
) -> onnx.ModelProto:
    """A one-layer RNN cell: h' = tanh(x W + h U + b), prob = sigmoid(h' v); inputs ``x``,
    ``h``, outputs ``prob``, ``h'`` named by ``names``."""
    x, h, prob, h_out = names
    rng = np.random.default_rng(7)
    weights = {
        "W": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
        "U": rng.normal(size=(HIDDEN, HIDDEN)).astype(np.float32) * 0.5,
        "b": rng.normal(size=(HIDDEN,)).astype(np.float32),
        "v": rng.normal(size=(HIDDEN, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", [x, "W"], ["xw"]),
        helper.make_node("MatMul", [h, "U"], ["hu"]),
        helper.make_node("Add", ["xw", "hu"], ["s"]),
        helper.make_node("Add", ["s", "b"], ["sb"]),
        helper.make_node("Tanh", ["sb"], [h_out]),
        helper.make_node("MatMul", [h_out, "v"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [prob]),
    ]
    graph = helper.make_graph(
        nodes,
        "recurrent",
        [
            helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, FEATURES]),
            helper.make_tensor_value_info(h, TensorProto.FLOAT, [batch, HIDDEN]),
        ],
        [
            helper.make_tensor_value_info(prob, TensorProto.FLOAT, [batch, 1]),
            helper.make_tensor_value_info(h_out, TensorProto.FLOAT, [batch, HIDDEN]),
        ],
        [numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


TRITON_NAMES = ("INPUT", "STATE_IN", "OUTPUT", "STATE_OUT")
PBTXT = """
max_batch_size: 0
sequence_batching {
  max_sequence_idle_microseconds: 20000000
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ 1, 4 ]
      initial_state: { data_type: TYPE_FP32 dims: [ 1, 4 ] zero_data: true name: "zeros" }
    }
  ]
}
"""


DECLARED = """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1, 3 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]
"""


def chunks(seed: int, count: int = CHUNKS) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + seed)
    return [rng.normal(size=(1, FEATURES)).astype(np.float32) for _ in range(count)]


def by_hand(
    model: onnx.ModelProto, stream: list[np.ndarray], names: tuple[str, ...]
) -> list[np.ndarray]:
    """ONNX Runtime fed the state back by hand, from zeros: the ``prob`` of each chunk."""
    x, h, prob, h_out = names
    run = ort_runner(model.SerializeToString())
    zeros = {h: np.zeros((1, HIDDEN), np.float32)}
    return [o[prob] for o in fed_by_hand(run, [{x: c} for c in stream], zeros, {h_out: h})]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seqrepo")
    write_model(path, "rnn", 1, recurrent())
    write_config(
        path,
        "rnn",
        {
            "max_batch_size": 8,
            # Long enough that 8 concurrent sequences meet in the queue on a busy machine.
            "dynamic_batching": {"max_queue_delay_microseconds": 20000},
            "sequence_batching": {"max_sequence_idle_microseconds": 20_000_000},
        },
    )
    write_model(path, "rnn_plain", 1, recurrent())  # the naming convention alone, no config
    write_model(path, "rnn_brief", 1, recurrent())
    write_config(
        path,
        "rnn_brief",
        {"max_batch_size": 8, "sequence_batching": {"max_sequence_idle_microseconds": 200_000}},
    )
    write_model(path, "triton_style", 1, recurrent(1, TRITON_NAMES))
    (path / "triton_style" / "config.pbtxt").write_text(PBTXT)
    # Declared tensors leave the state out, as in Triton (it is implicit).
    write_model(path, "triton_declared", 1, recurrent(1, TRITON_NAMES))
    (path / "triton_declared" / "config.pbtxt").write_text(PBTXT + DECLARED)
    return path


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Any]:
    with ServerThread(create_app(repo), host="127.0.0.1", port=0) as running:
        yield running


def client_for(server: Any) -> Any:
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"))


def step(
    client: Any,
    model: str,
    chunk: np.ndarray,
    sequence_id: int | str,
    name: str = "audio",
    **kw: Any,
) -> dict[str, np.ndarray]:
    tensor = httpclient.InferInput(name, list(chunk.shape), "FP32")
    tensor.set_data_from_numpy(chunk)
    result = client.infer(model, [tensor], sequence_id=sequence_id, **kw)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def run_stream(
    server: Any, model: str, sequence_id: int | str, stream: list[np.ndarray], name: str = "audio"
) -> list[np.ndarray]:
    """One sequence over HTTP: the (one) output of each chunk."""
    got = stream_over_http(server.url, model, sequence_id, [{name: c} for c in stream])
    return [o[next(iter(o))] for o in got]


def test_metadata_hides_the_state(server: Any) -> None:
    client = client_for(server)
    meta = client.get_model_metadata("rnn")
    assert [i["name"] for i in meta["inputs"]] == ["audio"]
    assert [o["name"] for o in meta["outputs"]] == ["prob"]
    meta = client.get_model_metadata("triton_style")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"]
    (state,) = client.get_model_config("triton_style")["sequence_batching"]["state"]
    assert state["input_name"] == "STATE_IN" and state["output_name"] == "STATE_OUT"
    assert state["dims"] == [1, 4] and state["initial_state"][0]["zero_data"] is True
    sequence = client.get_model_config("rnn")["sequence_batching"]
    assert sequence["max_sequence_idle_microseconds"] == 20_000_000
    assert sequence["state"][0]["dims"] == [HIDDEN]  # after the batch dim
    client.close()


def test_eight_interleaved_sequences_match_feeding_state_by_hand(server: Any) -> None:
    """8 sequences at once (ids: ints and strings): each gives what ONNX Runtime gives with the
    state fed back by hand. Batched with the others, within float tolerance; the stats show the
    sequences did run together."""
    model = recurrent()
    client = client_for(server)
    before = client.get_inference_statistics("rnn")["model_stats"][0]
    ids: list[int | str] = [i + 1 if i % 2 else f"stream-{i}" for i in range(SEQUENCES)]
    streams = [chunks(i) for i in range(SEQUENCES)]
    with concurrent.futures.ThreadPoolExecutor(SEQUENCES) as pool:
        results = list(
            pool.map(lambda i: run_stream(server, "rnn", ids[i], streams[i]), range(SEQUENCES))
        )
    for stream, got in zip(streams, results):
        want = by_hand(model, stream, ("audio", "state:h", "prob", "state_out:h"))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    after = client.get_inference_statistics("rnn")["model_stats"][0]
    client.close()
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == SEQUENCES * CHUNKS
    assert executions < inferences  # concurrent sequences ran as batches


def test_one_at_a_time_is_bit_exact(server: Any) -> None:
    """Run alone (batch 1), a sequence gives exactly ONNX Runtime's outputs, on a batching model
    and on an unbatched one whose state config.pbtxt declares (Triton's implicit state)."""
    stream = chunks(42)
    got = run_stream(server, "rnn", 4242, stream)
    want = by_hand(recurrent(), stream, ("audio", "state:h", "prob", "state_out:h"))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    got = run_stream(server, "triton_style", 7, stream, name="INPUT")
    want = by_hand(recurrent(1, TRITON_NAMES), stream, TRITON_NAMES)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    got = run_stream(server, "triton_declared", 8, stream, name="INPUT")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    got = run_stream(server, "rnn_plain", 1, stream[:3])
    for g, w in zip(got, want[:3]):
        np.testing.assert_array_equal(g, w)


def test_batched_equals_one_by_one(server: Any) -> None:
    streams = [chunks(200 + i, 6) for i in range(4)]
    alone = [run_stream(server, "rnn", 500 + i, s) for i, s in enumerate(streams)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(
            pool.map(lambda i: run_stream(server, "rnn", 600 + i, streams[i]), range(4))
        )
    for a, t in zip(alone, together):
        np.testing.assert_allclose(np.concatenate(a), np.concatenate(t), rtol=1e-5, atol=1e-6)


def test_state_never_leaks_between_sequences(server: Any) -> None:
    client = client_for(server)
    first = chunks(1, 1)[0]
    fresh = step(client, "rnn", first, 11, sequence_start=True)["prob"]
    for chunk in chunks(2, 4):  # sequence 11 moves on
        step(client, "rnn", chunk, 11)
    # Another sequence starts from zeros, not from 11's state.
    np.testing.assert_array_equal(
        step(client, "rnn", first, 12, sequence_start=True)["prob"], fresh
    )
    # Restarting 11 resets its state.
    np.testing.assert_array_equal(
        step(client, "rnn", first, 11, sequence_start=True)["prob"], fresh
    )
    step(client, "rnn", first, 11, sequence_end=True)
    step(client, "rnn", first, 12, sequence_end=True)
    client.close()


def test_errors(server: Any) -> None:
    client = client_for(server)
    x = chunks(3, 1)[0]
    tensor = httpclient.InferInput("audio", [1, FEATURES], "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="send the request parameter sequence_id"):
        client.infer("rnn", [tensor])
    with pytest.raises(InferenceServerException, match="sequence 31 .* is not active") as e:
        step(client, "rnn", x, 31)
    assert e.value.status() == "400"
    step(client, "rnn", x, 32, sequence_start=True)
    step(client, "rnn", x, 32, sequence_end=True)
    with pytest.raises(InferenceServerException, match="sequence_start=true"):
        step(client, "rnn", x, 32)  # ended
    with pytest.raises(InferenceServerException, match="unknown input 'state:h'"):
        state = httpclient.InferInput("state:h", [1, HIDDEN], "FP32")
        state.set_data_from_numpy(np.zeros((1, HIDDEN), np.float32))
        client.infer("rnn", [tensor, state], sequence_id=33, sequence_start=True)
    with pytest.raises(
        InferenceServerException, match="every request of a sequence has the same batch"
    ):
        step(client, "rnn", x, 34, sequence_start=True)
        step(client, "rnn", np.concatenate([x, x]), 34)
    client.close()
    body = {
        "inputs": [{"name": "audio", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}],
        "parameters": {"sequence_id": 35, "sequence_start": "yes"},
    }
    answer = httpx.post(f"{server.url}/v2/models/rnn/infer", json=body)
    assert answer.status_code == 400
    assert "sequence_start must be true or false" in answer.json()["error"]
    body["parameters"] = {"sequence_id": 1.5, "sequence_start": True}
    answer = httpx.post(f"{server.url}/v2/models/rnn/infer", json=body)
    assert answer.status_code == 400 and "sequence_id must be" in answer.json()["error"]


def test_idle_sequences_expire(server: Any) -> None:
    client = client_for(server)
    x = chunks(5, 1)[0]
    step(client, "rnn_brief", x, 41, sequence_start=True)
    step(client, "rnn_brief", x, 42, sequence_start=True)
    time.sleep(0.5)
    with pytest.raises(InferenceServerException, match="expired.*max_sequence_idle_microseconds"):
        step(client, "rnn_brief", x, 41)
    step(client, "rnn_brief", x, 42, sequence_start=True)  # a start brings it back
    step(client, "rnn_brief", x, 42, sequence_end=True)
    client.close()


def test_active_sequences_gauge(server: Any) -> None:
    client = client_for(server)
    x = chunks(6, 1)[0]
    step(client, "rnn", x, 51, sequence_start=True)
    step(client, "rnn", x, 52, sequence_start=True)
    text = httpx.get(f"{server.url}/metrics").text
    line = next(
        line
        for line in text.splitlines()
        if line.startswith('ferry_sequences_active{model="rnn",version="1"}')
    )
    active = float(line.split()[-1])
    step(client, "rnn", x, 51, sequence_end=True)
    text = httpx.get(f"{server.url}/metrics").text
    line = next(
        line
        for line in text.splitlines()
        if line.startswith('ferry_sequences_active{model="rnn",version="1"}')
    )
    assert float(line.split()[-1]) == active - 1
    step(client, "rnn", x, 52, sequence_end=True)
    client.close()


# -- the config --------------------------------------------------------------------------------


def test_config_json_and_pbtxt() -> None:
    config = parse_pbtxt(PBTXT, "m")
    (state,) = config.sequence_batching.states
    assert (state.input_name, state.output_name, state.dims) == ("STATE_IN", "STATE_OUT", (1, 4))
    assert state.dtype == np.float32 and config.sequence_batching.max_idle_us == 20_000_000
    assert (
        parse_config({"sequence_batching": {}}, "m").sequence_batching.max_idle_us
        == DEFAULT_IDLE_US
    )
    assert DEFAULT_IDLE_US == 1_000_000  # Triton's default
    # A batching model's sequences are batched, with the strategy's delay.
    for strategy in ("oldest", "direct"):
        text = f"max_batch_size: 4 sequence_batching {{ {strategy} {{ max_queue_delay_microseconds: 500 }} }}"
        config = parse_pbtxt(text, "m")
        assert config.dynamic_batching and config.max_queue_delay_us == 500
        assert config.sequence_batching is not None


@pytest.mark.parametrize(
    ("sequence", "words"),
    [
        ([], "'sequence_batching' must be an object"),
        ({"state": [{"input_name": "a"}]}, "needs input_name and output_name"),
        ({"control_input": [{"name": "START"}]}, "control_input is not supported"),
        ({"max_sequence_idle_microseconds": 0}, "max_sequence_idle_microseconds"),
        ({"state": [{"input_name": "a", "output_name": "b", "data_type": "FP32"}]}, "TYPE_FP32"),
        ({"stat": []}, "stat"),
    ],
)
def test_config_errors(sequence: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config({"sequence_batching": sequence}, "m")


def test_a_state_the_model_lacks_fails_the_load(tmp_path: Path) -> None:
    write_model(tmp_path, "bad", 1, recurrent())
    write_config(
        tmp_path,
        "bad",
        {"sequence_batching": {"state": [{"input_name": "nope", "output_name": "state_out:h"}]}},
    )
    with ServerThread(create_app(tmp_path), host="127.0.0.1", port=0) as running:
        index = httpx.post(f"{running.url}/v2/repository/index").json()
    (row,) = index
    assert (
        row["state"] == "UNAVAILABLE" and "'nope', which the model does not have" in row["reason"]
    )


def test_a_sequence_over_grpc(repo: Path) -> None:
    """tritonclient.grpc's sequence arguments reach the same sequence batcher: bit-exact at batch 1,
    and an unknown sequence is INVALID_ARGUMENT naming what to send."""
    pytest.importorskip("grpc")
    tgrpc = pytest.importorskip("tritonclient.grpc")
    from ferry.serving import GrpcServer

    stream = chunks(77)
    want = by_hand(recurrent(), stream, ("audio", "state:h", "prob", "state_out:h"))
    app = create_app(repo)
    with ServerThread(app, port=0), GrpcServer(app, port=0) as server:
        client = tgrpc.InferenceServerClient(server.address)
        for i, chunk in enumerate(stream):
            tensor = tgrpc.InferInput("audio", list(chunk.shape), "FP32")
            tensor.set_data_from_numpy(chunk)
            result = client.infer(
                "rnn",
                [tensor],
                sequence_id="grpc-1",
                sequence_start=i == 0,
                sequence_end=i == len(stream) - 1,
            )
            np.testing.assert_array_equal(result.as_numpy("prob"), want[i])
            assert result.as_numpy("state_out:h") is None
        config = client.get_model_config("rnn").config
        assert config.sequence_batching.state[0].input_name == "state:h"
        with pytest.raises(InferenceServerException, match="sequence_start=true") as e:
            client.infer("rnn", [tensor], sequence_id="grpc-1")
        assert "INVALID_ARGUMENT" in str(e.value.status())
        client.close()


def test_an_isolated_stateful_model(tmp_path: Path) -> None:
    """Under ``isolate`` the state is found in the worker (where the model is) and kept by the
    server: a stream gives exactly ONNX Runtime's outputs."""
    write_model(tmp_path, "rnn", 1, recurrent())
    write_config(tmp_path, "rnn", {"max_batch_size": 8, "isolate": True})
    stream = chunks(9, 4)
    want = by_hand(recurrent(), stream, ("audio", "state:h", "prob", "state_out:h"))
    app = create_app(tmp_path)
    with ServerThread(app, host="127.0.0.1", port=0) as running:
        session = app.state.ferry.repository.get("rnn", None).loaded.sessions[0]
        assert type(session).__name__ == "WorkerSession"
        got = run_stream(running, "rnn", "isolated", stream)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
