"""``ferry serve`` on the kit's SmolLM2 (GGUF Q4_1 -> int4 artifact), driven by the ``openai``
client, curl-style raw HTTP and Triton's generate endpoint (issue 30): 16 concurrent greedy chats
each get exactly the answer they get alone; a client that disconnects frees its sequence; a full
queue answers 429 with Retry-After; SIGTERM mid-stream loses no admitted request; bad requests
get OpenAI-shaped 4xx errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_generate_kit import GGUF, kit_chats

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not GGUF.is_file():
        pytest.skip(f"the kit's SmolLM2 GGUF is not at {GGUF} (scripts/fetch-kit.sh)")
    folder = tmp_path_factory.mktemp("served") / "smollm2"
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli.main", "convert", str(GGUF), "-o", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return folder


class Server:
    """``ferry serve`` in its own process (SIGTERM is the real signal)."""

    def __init__(self, folder: Path, *flags: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-m",
            "ferry.cli.main",
            "serve",
            str(folder),
            "--port",
            str(self.port),
        ]
        self.process = subprocess.Popen(
            [*command, *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stdout and self.process.stdout.read()
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("ferry serve did not become ready")

    def client(self) -> Any:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return out or ""


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[Server]:
    running = Server(artifact, "--max-num-seqs", "16", "--max-model-len", "1024")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def narrow(artifact: Path) -> Iterator[Server]:
    """One sequence at a time and one waiting: the queue fills at once."""
    running = Server(artifact, "--max-num-seqs", "1", "--max-queue", "1", "--max-model-len", "2048")
    yield running
    running.stop()


def chat(client: Any, messages: list[dict[str, str]], stream: bool = False) -> str:
    if not stream:
        answer = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        return str(answer.choices[0].message.content)
    parts = []
    for chunk in client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def test_sixteen_concurrent_chats_get_what_they_get_alone(server: Server, artifact: Path) -> None:
    from ferry.generate import DecoderSession

    chats = kit_chats()[:16]
    client = server.client()
    alone = [chat(client, messages) for messages in chats]
    with ThreadPoolExecutor(16) as pool:
        # half of them streamed: the same tokens whichever way they are read
        together = list(pool.map(lambda i: chat(client, chats[i], stream=i % 2 == 1), range(16)))
    assert together == alone
    # and what the server says is what the token loop says in-process
    decoder = DecoderSession.from_folder(artifact)
    direct = [decoder.generate(messages=m, max_new_tokens=MAX_TOKENS).text for m in chats[:4]]
    assert alone[:4] == direct


def test_completions_models_and_triton_generate(server: Server) -> None:
    client = server.client()
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    text = client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert text.usage.completion_tokens == 8 and text.choices[0].finish_reason == "length"
    triton = httpx.post(
        f"{server.url}/v2/models/smollm2/generate",
        json={
            "text_input": "Once upon a time",
            "parameters": {"max_tokens": 8, "temperature": 0},
        },
        timeout=60,
    ).json()
    assert triton["text_output"] == text.choices[0].text


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
        ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        (
            {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
            400,
            "max_tokens",
        ),
        ({"model": "smollm2", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
        ({"model": "smollm2", "messages": "hi"}, 400, "messages"),
        (
            {"model": "smollm2", "messages": [{"role": "user", "content": "word " * 1200}]},
            400,
            "messages",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    server: Server, body: dict[str, Any], status: int, field: str
) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if field == "messages" and "word" in json.dumps(body):
        assert error["code"] == "context_length_exceeded"
    assert "Traceback" not in response.text


def _running(server: Server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("ferry_generation_running_sequences{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no running-sequences gauge")


def test_a_disconnect_frees_the_slot_and_a_full_queue_answers_429(narrow: Server) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1800,
        "stream": True,
        "temperature": 0,
    }
    client = httpx.Client(timeout=60)
    with client, client.stream("POST", f"{narrow.url}/v1/chat/completions", json=body) as long:
        lines = long.iter_lines()
        assert next(lines).startswith("data: ")  # admitted, streaming
        # one more waits for the only sequence; the next finds the queue full
        with (
            httpx.Client(timeout=60) as second,
            second.stream(
                "POST", f"{narrow.url}/v1/chat/completions", json={**body, "max_tokens": 4}
            ) as waiting,
        ):
            time.sleep(0.5)
            full = httpx.post(f"{narrow.url}/v1/chat/completions", json=body, timeout=30)
            assert full.status_code == 429, full.text
            assert float(full.headers["retry-after"]) > 0
            assert full.json()["error"]["type"]
            long.close()  # the client goes away mid-answer
            # its sequence is dropped at the next step: the waiting one runs and ends
            text = "".join(waiting.iter_lines())
            assert text.rstrip().endswith("data: [DONE]")
    deadline = time.monotonic() + 20
    while _running(narrow) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(narrow) == 0


def test_sigterm_mid_stream_loses_no_admitted_request(artifact: Path) -> None:
    running = Server(artifact, "--max-num-seqs", "4", "--max-model-len", "1024")
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Describe the sea."}],
        "max_tokens": 48,
        "stream": True,
        "temperature": 0,
    }

    def stream() -> list[str]:
        with httpx.stream(
            "POST", f"{running.url}/v1/chat/completions", json=body, timeout=120
        ) as response:
            assert response.status_code == 200
            return [line for line in response.iter_lines() if line]

    try:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(stream) for _ in range(6)]  # 4 running, 2 waiting
            time.sleep(1.5)
            running.process.send_signal(signal.SIGTERM)
            results = [f.result(timeout=120) for f in futures]
        for lines in results:
            assert lines[-1] == "data: [DONE]"
            final = json.loads(lines[-2].removeprefix("data: "))
            assert final["choices"][0]["finish_reason"] in ("stop", "length")
        assert running.process.wait(timeout=60) == 0
    finally:
        running.stop()
