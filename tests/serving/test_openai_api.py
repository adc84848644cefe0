"""The OpenAI API on ``ferry serve`` (issue 30): routes, request checks, answers, streaming,
errors, disconnects and the drain's cut-off, on a fake engine that follows ``BatchEngine``'s
interface; the ``openai`` client against a real server."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_generative import ANSWER, CONTEXT, VOCAB, FakeVersion, serve_fake
from _serving_models import add_const, write_model

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for httpx2; httpx is what we have
    from starlette.testclient import TestClient

from ferry.serving import ServerThread, create_app

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}


def make_app(repo: Path, **options: Any) -> Any:
    write_model(repo, "add", 1, add_const(1))
    return create_app(repo, warmup=False, **options)


@pytest.fixture
def served(repo: Path) -> Iterator[tuple[TestClient, FakeVersion]]:
    app = make_app(repo)
    fake = serve_fake(app)
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(60)
        yield client, fake


def events(text: str) -> list[Any]:
    """The server-sent events' data, JSON decoded ("[DONE]" as is)."""
    out = []
    for block in text.split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# -- models ---------------------------------------------------------------------------------------


def test_models_list_only_generative_ones(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    listing = client.get("/v1/models").json()
    assert listing == {
        "object": "list",
        "data": [{"id": "tiny", "object": "model", "created": 1_700_000_000, "owned_by": "ferry"}],
    }
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    error = error_of(client.get("/v1/models/add"), 404)
    assert error["code"] == "model_not_found" and "/v2/models/add/infer" in error["message"]
    assert error_of(client.get("/v1/models/nope"), 404)["code"] == "model_not_found"
    assert error_of(client.get("/v1/models/org/nope"), 404)["code"] == "model_not_found"
    # The KServe routes still serve the tensor model beside it.
    assert client.get("/v2/models/add").status_code == 200


# -- answers --------------------------------------------------------------------------------------


def test_chat_completion(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
    ]
    body = {"model": "tiny", "messages": messages, "temperature": 0, "seed": 7, "user": "u1"}
    response = client.post("/v1/chat/completions", json={**body, "some_future_field": 1})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["id"].startswith("chatcmpl-") and answer["object"] == "chat.completion"
    assert answer["model"] == "tiny" and isinstance(answer["created"], int)
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ANSWER},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert fake.rendered == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\n!"},
    ]
    request = fake.engine.requests[-1]
    prompt = len("<system>Be brief.<user>Hi\n!<assistant>")
    assert answer["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 7,
        "total_tokens": prompt + 7,
    }
    # No max_tokens: what the context leaves.
    assert len(request.prompt_ids) == prompt and request.max_new_tokens == CONTEXT - prompt
    assert request.sampling.temperature == 0 and request.sampling.seed == 7


def test_completion_and_its_prompts(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 2, "stop": ["x"], "top_p": 0.5}
    answer = client.post("/v1/completions", json=body).json()
    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion"
    assert answer["choices"][0]["text"] == "Hello"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 2 and answer["usage"]["prompt_tokens"] == 4
    request = fake.engine.requests[-1]
    assert request.max_new_tokens == 2 and request.stop == ("x",)
    assert request.sampling.top_p == 0.5 and request.sampling.temperature == 1.0  # OpenAI's
    for prompt in (["Once"], [5, 6, 7], [[5, 6, 7]]):
        response = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt})
        assert response.status_code == 200, response.text
    assert list(fake.engine.requests[-1].prompt_ids) == [5, 6, 7]
    # A stop string cuts the answer: "stop".
    answer = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "a", "stop": "wor"}
    ).json()
    assert (
        answer["choices"][0]["text"] == "Hello " and answer["choices"][0]["finish_reason"] == "stop"
    )


def test_max_tokens_clipped_to_the_context(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    response = client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x" * 60, "max_completion_tokens": 50}
    )
    assert response.status_code == 200, response.text
    assert fake.engine.requests[-1].max_new_tokens == CONTEXT - 60
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_an_aborted_answer_says_abort(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    fake.engine.finish_reason = "abort"  # what the engine answers when the drain runs out
    answer = client.post("/v1/chat/completions", json=CHAT).json()
    assert answer["choices"][0]["finish_reason"] == "abort"


# -- streaming ------------------------------------------------------------------------------------


def test_chat_stream(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    # One chunk per token that adds text: the held-back ("") and end tokens add none.
    assert [d["content"] for d in deltas[1:-1]] == ["Hel", "lo", " wor", "ld", "!"]
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all("usage" not in c for c in chunks)
    assert fake.entered == 1 and fake.active == 0  # in flight until the stream ended


def test_stream_with_usage(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    body = {
        "model": "tiny",
        "prompt": "abc",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = events(client.post("/v1/completions", json=body).text)
    assert chunks[-1] == "[DONE]"
    *texts, last, usage = chunks[:-1]
    assert "".join(c["choices"][0]["text"] for c in texts) == ANSWER
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in [*texts, last])
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["text"] == ""
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_an_engine_failure_mid_stream_is_an_error_event(
    served: tuple[TestClient, FakeVersion],
) -> None:
    client, fake = served
    fake.engine.fail_after = 2
    chunks = events(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).text)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["error"]["type"] == "server_error"
    assert "the fake engine failed" in chunks[-2]["error"]["message"]
    error = error_of(client.post("/v1/chat/completions", json=CHAT), 500)
    assert error["type"] == "server_error" and "Traceback" not in error["message"]


# -- bad requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"n": 2}, "n", "n=2 is not supported"),
        ({"n": True}, "n", "not supported"),
        ({"max_tokens": -1}, "max_tokens", "max_tokens=-1"),
        ({"max_tokens": 0}, "max_tokens", "int >= 1"),
        ({"max_tokens": "5"}, "max_tokens", "out of range"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens", "disagree"),
        ({"temperature": 2.5}, "temperature", "0 to 2"),
        ({"top_p": 0}, "top_p", "(0, 1]"),
        ({"seed": 1.5}, "seed", "seed=1.5"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "true or false"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"frequency_penalty": -1}, "frequency_penalty", "not supported"),
        ({"logprobs": True}, "logprobs", "log probabilities"),
        ({"top_logprobs": 3}, "top_logprobs", "log probabilities"),
        ({"response_format": {"type": "json_object"}}, "response_format", "json_object"),
        ({"tools": [{"type": "function"}]}, "tools", "tool calling"),
        ({"tool_choice": "required"}, "tool_choice", "tool calling"),
        ({"logit_bias": {"5": 1}}, "logit_bias", "not supported"),
        ({"model": ""}, "model", "'model' is required"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": ["hi"]}, "messages[0]", "object"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "tool calling"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "string"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "messages[0].content[0]",
            "'image_url' is not supported",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]},
            "messages[0].tool_calls",
            "not supported",
        ),
        # The template's own refusal, said as a bad "messages".
        ({"messages": [{"role": "assistant", "content": "x"}]}, "messages", "starts with"),
    ],
)
def test_bad_chat_requests_are_refused_by_name(
    served: tuple[TestClient, FakeVersion], change: dict[str, Any], param: str, words: str
) -> None:
    client, fake = served
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, **change}), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"], error["message"]
    assert not fake.engine.requests


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"prompt": ["a", "b"]}, "one per request"),
        ({"prompt": ""}, "empty"),
        ({"prompt": [1, VOCAB]}, "outside this model's vocabulary"),
        ({"prompt": None}, "required"),
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "one choice"),
        ({"suffix": "x"}, "not supported"),
        ({"logprobs": 0}, "log probabilities"),
    ],
)
def test_bad_completion_requests_are_refused_by_name(
    served: tuple[TestClient, FakeVersion], change: dict[str, Any], words: str
) -> None:
    client, _ = served
    body = {"model": "tiny", "prompt": "x", **change}
    error = error_of(client.post("/v1/completions", json=body), 400)
    assert words in error["message"], error["message"]


def test_off_values_of_unsupported_fields_pass(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    body = {
        **CHAT,
        "n": 1,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logprobs": False,
        "response_format": {"type": "text"},
        "tool_choice": "none",
        "tools": [],
        "max_tokens": None,
        "stream_options": None,
        "top_k": -1,
        "repetition_penalty": 1.1,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text


def test_a_prompt_over_the_context(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    body = {"model": "tiny", "prompt": "x" * CONTEXT}
    error = error_of(client.post("/v1/completions", json=body), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"context is {CONTEXT} tokens" in error["message"]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x" * CONTEXT}]}
    error = error_of(client.post("/v1/chat/completions", json=chat), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert not fake.engine.requests


def test_malformed_bodies_and_unknown_models(served: tuple[TestClient, FakeVersion]) -> None:
    client, _ = served
    error = error_of(client.post("/v1/chat/completions", content=b"{not json"), 400)
    assert "not valid JSON" in error["message"]
    error = error_of(client.post("/v1/chat/completions", content=b"[1, 2]"), 400)
    assert "JSON object" in error["message"]
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "model": "add"}), 404)
    assert "/v2/models/add/infer" in error["message"]


def test_full_queue_closed_engine_and_drain(served: tuple[TestClient, FakeVersion]) -> None:
    client, fake = served
    fake.engine.refuse = "busy"
    response = client.post("/v1/chat/completions", json=CHAT)
    error = error_of(response, 429)
    assert response.headers["retry-after"] == "3"  # 2.5 s, in whole seconds
    assert error["code"] == "rate_limit_exceeded"
    fake.engine.refuse = "closed"
    error_of(client.post("/v1/completions", json={"model": "tiny", "prompt": "a"}), 503)
    assert fake.entered == 2 and fake.active == 0  # a refused request is not in flight
    fake.engine.refuse = None
    client.app.state.ferry.draining = True  # type: ignore[attr-defined]
    try:
        error = error_of(client.post("/v1/chat/completions", json=CHAT), 503)
        assert "shutting down" in error["message"]
    finally:
        client.app.state.ferry.draining = False  # type: ignore[attr-defined]


def test_the_api_key(repo: Path) -> None:
    app = make_app(repo, api_key=KEY)
    serve_fake(app)
    with TestClient(app) as client:
        for method, path, body in (
            ("POST", "/v1/chat/completions", CHAT),
            ("GET", "/v1/models", None),
            ("GET", "/v1/models/tiny", None),
        ):
            response = client.request(method, path, json=body)
            error = error_of(response, 401)
            assert error["code"] == "invalid_api_key"
            assert response.headers["www-authenticate"] == "Bearer"
            assert client.request(method, path, json=body, headers=AUTH).status_code == 200


# -- disconnects and the drain's cut-off, on the ASGI app itself ---------------------------------


async def call_app(
    app: Any, path: str, body: dict[str, Any], gone: asyncio.Event
) -> list[dict[str, Any]]:
    """Send one request to the ASGI app; the client disconnects when ``gone`` is set."""
    sent: list[dict[str, Any]] = []
    payload = json.dumps(body).encode()
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    await app(scope, receive, send)
    return sent


def body_of(sent: list[dict[str, Any]]) -> str:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_cancels_the_sequence(repo: Path, stream: bool) -> None:
    app = make_app(repo)
    fake = serve_fake(app)
    fake.engine.delay = 0.05

    async def run() -> list[dict[str, Any]]:
        gone = asyncio.Event()
        task = asyncio.ensure_future(
            call_app(app, "/v1/chat/completions", {**CHAT, "stream": stream}, gone)
        )
        while not fake.engine.streams:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.08)  # a token or two
        gone.set()
        return await asyncio.wait_for(task, 5)

    sent = asyncio.run(run())
    assert fake.engine.streams[0].cancelled
    assert fake.entered == 1 and fake.active == 0
    if stream:
        assert "[DONE]" not in body_of(sent)


def test_a_drain_cut_off_still_ends_the_stream(repo: Path) -> None:
    app = make_app(repo)
    fake = serve_fake(app)
    fake.engine.delay = 0.05

    async def run() -> list[dict[str, Any]]:
        task = asyncio.ensure_future(
            call_app(app, "/v1/chat/completions", {**CHAT, "stream": True}, asyncio.Event())
        )
        while not fake.engine.streams:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.12)
        app.state.ferry.cut_off = True  # as ServerThread's drain does at its timeout
        task.cancel()
        return await asyncio.wait_for(task, 5)

    sent = asyncio.run(run())
    assert fake.engine.streams[0].cancelled
    chunks = events(body_of(sent))
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"][0]["finish_reason"] == "abort"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2])
    assert text and ANSWER.startswith(text) and text != ANSWER
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert fake.active == 0


def test_a_server_shut_down_mid_stream_still_ends_it(repo: Path) -> None:
    """SIGTERM (ServerThread.stop) drains; at its timeout, a stream gets a last chunk with
    finish_reason "abort" and [DONE] over the socket, not a cut connection."""
    app = make_app(repo)
    fake = serve_fake(app)
    fake.engine.delay = 0.25  # 7 tokens: 1.75 s, past the drain timeout
    server = ServerThread(app, host="127.0.0.1", port=0, drain_timeout=0.3).start()
    got: dict[str, Any] = {}

    def call() -> None:
        import httpx

        body = {**CHAT, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
            got["text"] = "".join(r.iter_text())

    thread = threading.Thread(target=call)
    thread.start()
    try:
        while not fake.engine.streams:
            time.sleep(0.01)
        time.sleep(0.3)
    finally:
        server.stop(timeout=30)
        thread.join(30)
    chunks = events(got["text"])
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"][0]["finish_reason"] == "abort"
    assert fake.engine.streams[0].cancelled and server.cut_off == 1


# -- the openai client, against a real server -------------------------------------------------------


def test_the_openai_client(repo: Path) -> None:
    openai = pytest.importorskip("openai")
    app = make_app(repo, api_key=KEY)
    fake = serve_fake(app)
    with ServerThread(app, host="127.0.0.1", port=0) as server:
        assert app.state.ferry.started.wait(60)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0
        )
        assert chat.choices[0].message.content == ANSWER
        assert chat.choices[0].finish_reason == "stop" and chat.usage is not None
        assert chat.usage.completion_tokens == 7
        pieces = []
        usage = None
        for chunk in client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
        assert "".join(pieces) == ANSWER and usage is not None and usage.total_tokens > 7
        text = client.completions.create(model="tiny", prompt="Once", max_tokens=2)
        assert text.choices[0].text == "Hello" and text.choices[0].finish_reason == "length"
        with pytest.raises(openai.NotFoundError, match="unknown model"):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.BadRequestError, match="n=2 is not supported"):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], n=2
            )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        fake.engine.refuse = "busy"
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}]
            )
        fake.engine.refuse = None
        # "abort" is not one of OpenAI's finish reasons: the client takes it as it is.
        fake.engine.finish_reason = "abort"
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}]
        )
        assert chat.choices[0].finish_reason == "abort"
        finishes = [
            c.choices[0].finish_reason
            for c in client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], stream=True
            )
            if c.choices
        ]
        assert finishes[-1] == "abort"


# -- the real engine: a tiny decoder artifact served as `ferry serve` serves it -------------------


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tokenizers")
    # The generative tests' tiny decoder (its module imports its neighbours by name).
    sys.path.insert(0, str(Path(__file__).parents[1] / "generate"))
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    # A repository: REPO/tiny/1/ is the artifact (model.onnx, tokenizer, chat template).
    repo = tmp_path_factory.mktemp("gen")
    return write_tiny(repo / "tiny" / "1", model=tiny_model(tiny_config(), "ort"))


@pytest.fixture(scope="module")
def real(tiny_artifact: Path) -> Iterator[TestClient]:
    app = create_app(tiny_artifact.parents[1])
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(120)
        assert client.get("/v2/health/ready").status_code == 200
        yield client


def alone(folder: Path, **options: Any) -> Any:
    """What ``ferry generate`` answers (the token loop alone, greedy)."""
    from ferry.generate import DecoderSession

    return DecoderSession.from_folder(folder).generate(**options)


def test_real_chat_completion_and_stream(real: TestClient, tiny_artifact: Path) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    expected = alone(tiny_artifact, messages=messages, max_new_tokens=8)
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    response = real.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["message"]["content"] == expected.text
    assert answer["choices"][0]["finish_reason"] == expected.finish_reason
    assert answer["usage"]["prompt_tokens"] == expected.prompt_tokens
    assert answer["usage"]["completion_tokens"] == len(expected.ids)
    chunks = events(real.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert chunks[-1] == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == expected.text
    assert chunks[-2]["choices"][0]["finish_reason"] == expected.finish_reason
    listing = real.get("/v1/models").json()["data"]
    assert [m["id"] for m in listing] == ["tiny"]


def test_real_completion_and_triton_generate(real: TestClient, tiny_artifact: Path) -> None:
    expected = alone(tiny_artifact, prompt="Once upon", max_new_tokens=6)
    body = {"model": "tiny", "prompt": "Once upon", "max_tokens": 6, "temperature": 0}
    answer = real.post("/v1/completions", json=body).json()
    assert answer["choices"][0]["text"] == expected.text
    parameters = {"max_tokens": 6, "temperature": 0}
    triton = real.post(
        "/v2/models/tiny/generate", json={"text_input": "Once upon", "parameters": parameters}
    ).json()
    assert triton["text_output"] == expected.text and triton["model_name"] == "tiny"
    # KServe v2's /infer points a generative model to these routes.
    ids = {"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [5]}
    response = real.post("/v2/models/tiny/infer", json={"inputs": [ids]})
    assert response.status_code == 400 and "/v1/chat/completions" in response.json()["error"]


def test_real_artifact_folder_served_alone(tiny_artifact: Path) -> None:
    """``ferry serve ARTIFACT/``: the folder is the model (named after it)."""
    app = create_app(tiny_artifact)
    with TestClient(app) as client:
        assert app.state.ferry.started.wait(120)
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["1"]
        body = {"model": "1", "prompt": "Hi", "max_tokens": 3, "temperature": 0}
        answer = client.post("/v1/completions", json=body).json()
        assert (
            answer["choices"][0]["text"] == alone(tiny_artifact, prompt="Hi", max_new_tokens=3).text
        )


@pytest.mark.parametrize(
    ("change", "status", "param", "code"),
    [
        ({"model": "nope"}, 404, "model", "model_not_found"),
        ({"n": 2}, 400, "n", None),
        ({"max_tokens": -3}, 400, "max_tokens", None),
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content", None),
        ({"messages": [{"content": "x"}]}, 400, "messages[0].role", None),
        (
            {"messages": [{"role": "user", "content": "x" * 200}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
    ],
)
def test_real_bad_requests(
    real: TestClient, change: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], **change}
    error = error_of(real.post("/v1/chat/completions", json=body), status)
    assert error["param"] == param and error["code"] == code


def test_real_concurrent_chats_with_the_openai_client(tiny_artifact: Path) -> None:
    """16 greedy chats at once, streamed through the openai client: each gets exactly the text
    it gets alone."""
    openai = pytest.importorskip("openai")
    prompts = [f"Question {i}: {'why ' * (i % 5)}?" for i in range(16)]
    expected = [
        alone(tiny_artifact, messages=[{"role": "user", "content": p}], max_new_tokens=10).text
        for p in prompts
    ]
    app = create_app(tiny_artifact.parents[1])
    with ServerThread(app, host="127.0.0.1", port=0) as server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

        async def chat(prompt: str) -> str:
            pieces: list[str] = []
            stream = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=10,
                temperature=0,
                stream=True,
            )
            async for chunk in stream:
                pieces.extend(c.delta.content or "" for c in chunk.choices)
            return "".join(pieces)

        async def main() -> list[str]:
            try:
                return list(await asyncio.gather(*(chat(p) for p in prompts)))
            finally:
                await client.close()

        assert asyncio.run(main()) == expected
