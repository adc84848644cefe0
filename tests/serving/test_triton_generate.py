"""Triton's generate extension on ``ferry serve`` (issue 30): ``/generate`` and
``/generate_stream`` on a fake engine that follows ``BatchEngine``'s interface."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_generative import ANSWER, CONTEXT, FakeVersion, serve_fake
from _serving_models import add_const, write_model

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

from ferry.serving import create_app

HEAD = {"model_name": "tiny", "model_version": "1"}


@pytest.fixture
def served(repo: Path) -> Iterator[tuple[TestClient, FakeVersion]]:
    write_model(repo, "add", 1, add_const(1))
    app = create_app(repo, warmup=False)
    fake = serve_fake(app)
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(60)
        yield client, fake


def events(text: str) -> list[dict[str, Any]]:
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), text
    return [json.loads(b[len("data: ") :]) for b in blocks]


def test_generate(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    body: dict[str, Any] = {
        "text_input": "Once",
        "parameters": {"temperature": 0, "seed": 3, "stop": "wor"},
    }
    response = client.post("/v2/models/tiny/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {**HEAD, "text_output": "Hello ", "finish_reason": "stop"}
    request = fake.engine.requests[-1]
    assert list(request.prompt_ids) == [ord(c) for c in "Once"]
    assert request.max_new_tokens == CONTEXT - 4 and request.stop == ("wor",)
    assert request.sampling.temperature == 0 and request.sampling.seed == 3
    # TensorRT-LLM's ensembles take the parameters at the top level; the prompt first on ask.
    body = {"text_input": "Once", "max_tokens": 2, "exclude_input_in_output": False}
    answer = client.post("/v2/models/tiny/versions/1/generate", json=body).json()
    assert answer == {**HEAD, "text_output": "OnceHello", "finish_reason": "length"}


def test_generate_stream(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    response = client.post("/v2/models/tiny/generate_stream", json={"text_input": "Once"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)
    assert all(c.items() >= HEAD.items() for c in chunks)
    assert [c["text_output"] for c in chunks[:-1]] == ["Hel", "lo", " wor", "ld", "!"]
    assert chunks[-1] == {**HEAD, "text_output": "", "finish_reason": "stop"}
    body = {"text_input": "Hi ", "parameters": {"exclude_input_in_output": False, "stream": True}}
    chunks = events(client.post("/v2/models/tiny/generate_stream", json=body).text)
    assert "".join(c["text_output"] for c in chunks) == "Hi " + ANSWER


def test_a_failure_mid_stream_is_an_error_event(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    fake.engine.fail_after = 1
    chunks = events(client.post("/v2/models/tiny/generate_stream", json={"text_input": "a"}).text)
    assert chunks[0]["text_output"] == "Hel"
    assert "the fake engine failed" in chunks[-1]["error"]


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("tiny/generate", {}, 400, "'text_input' must be a non-empty string"),
        ("tiny/generate", {"text_input": "a", "bad_words": ""}, 400, "unknown field 'bad_words'"),
        ("tiny/generate", {"text_input": "a", "parameters": {"beam": 2}}, 400, "'beam'"),
        ("tiny/generate", {"text_input": "a", "parameters": []}, 400, "must be an object"),
        (
            "tiny/generate",
            {"text_input": "a", "max_tokens": 2, "parameters": {"max_tokens": 3}},
            400,
            "given twice",
        ),
        ("tiny/generate", {"text_input": "a", "max_tokens": -1}, 400, "max_tokens=-1"),
        (
            "tiny/generate",
            {"text_input": "a", "parameters": {"stream": True}},
            400,
            "generate_stream",
        ),
        ("tiny/generate", {"text_input": "x" * CONTEXT}, 400, "leaves no room"),
        ("add/generate", {"text_input": "a"}, 400, "/v2/models/add/infer"),
        ("nope/generate", {"text_input": "a"}, 404, "unknown model"),
        ("tiny/versions/2/generate", {"text_input": "a"}, 404, "no version 2"),
    ],
)
def test_bad_requests(
    served: tuple[TestClient, FakeVersion], path: str, body: Any, status: int, words: str
) -> None:
    client, _ = served
    response = client.post(f"/v2/models/{path}", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and words in response.json()["error"]


def test_busy_and_closed(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    fake.engine.refuse = "busy"
    response = client.post("/v2/models/tiny/generate", json={"text_input": "a"})
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    fake.engine.refuse = "closed"
    response = client.post("/v2/models/tiny/generate_stream", json={"text_input": "a"})
    assert response.status_code == 503 and "shutting down" in response.json()["error"]


def test_infer_on_the_tensor_model_still_works(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
    response = client.post("/v2/models/add/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [1, 1, 1, 1]
