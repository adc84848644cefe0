"""A generative model on Ray Serve (issue 30): its replicas batch continuously and answer the OpenAI
API at ``/v2/models/<model>/v1`` (Ray Serve routes by prefix), the generation settings reach them,
a replica takes a full batch and as many again, bad settings are refused before anything deploys;
then once on a real local Ray cluster (slow): chat completions, streamed and not, through the
OpenAI base URL with httpx and the ``openai`` client, greedy text equal to ``DecoderSession``'s,
the repository index row.

The cluster runs in a private network namespace with only loopback (as tests/real/test_ray_serve.py
explains): this file, run as a script inside it, is the scenario.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ferry[ray]'")

MESSAGES: Any = [{"role": "user", "content": "Say hi"}]
NEW_TOKENS = 8
CHAT = {"model": "tiny", "messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama decoder artifact (context 64), served as ``tiny``."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "generate"))  # its helpers' imports
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    return write_tiny(
        tmp_path_factory.mktemp("ray-gen") / "tiny", model=tiny_model(tiny_config(), "ort")
    )


@pytest.fixture(scope="module")
def greedy(artifact: Path) -> str:
    """What ``DecoderSession.generate`` answers, greedy, on the same artifact."""
    from ferry.generate import DecoderSession

    decoder = DecoderSession.from_folder(artifact)
    return decoder.generate(messages=MESSAGES, max_new_tokens=NEW_TOKENS).text


def _sse(text: str) -> list[Any]:
    """The server-sent events' data, JSON decoded ("[DONE]" as is)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _streamed_text(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if e != "[DONE]" and e["choices"]
    )


def test_replica_answers_the_openai_api_under_its_route(
    artifact: Path, greedy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from ferry.deploy import ray as ferry_ray
    from ferry.serving import GenerationSettings

    settings = GenerationSettings(max_num_seqs=2, max_model_len=48)

    async def main() -> None:
        replica = ferry_ray.FerryModel(str(artifact), None, {"threads": 1, "generation": settings})
        app = await replica.__serve_build_asgi_app__()
        engine = replica._app.state.ferry.repository.get("tiny").engine
        assert (engine.max_num_seqs, engine.context_length) == (2, 48)
        # Ray Serve's proxy sets root_path to the application's route prefix.
        transport = httpx.ASGITransport(app=app, root_path="/v2/models/tiny")
        base = "http://ray/v2/models/tiny"
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            models = (await client.get(f"{base}/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["tiny"]
            answer = await client.post(f"{base}/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == greedy
            streamed = await client.post(
                f"{base}/v1/chat/completions", json={**CHAT, "stream": True}
            )
            assert streamed.headers["content-type"].startswith("text/event-stream")
            events = _sse(streamed.text)
            assert events[-1] == "[DONE]" and _streamed_text(events) == greedy
            # Triton's generate extension and the KServe v2 metadata under the same prefix
            body = {"text_input": "hi", "parameters": {"max_tokens": 2}}
            assert (await client.post(f"{base}/generate", json=body)).status_code == 200
            assert (await client.get(base)).json()["name"] == "tiny"
            # the bare /v1 is not rewritten: only the model's own prefix is
            assert (await client.get("http://ray/v1x/models")).status_code == 404
        await _through_the_router(replica, greedy, monkeypatch)
        await replica.check_health()
        await replica._app.state.ferry.repository.stop()

    asyncio.run(main())


async def _through_the_router(replica: Any, greedy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The /v1 router hands requests to the replica its "model" names (the replica's handle
    stood for by a call on it) and streams the answer back."""
    from starlette.requests import Request

    from ferry.deploy import _ray_openai

    class Handle:
        class openai_call:  # as Ray Serve's handle names the method
            @staticmethod
            def remote(*call: Any) -> Any:
                return replica.openai_call(*call)

    router = _ray_openai.FerryOpenAI(lambda: ["tiny"])  # Ray Serve's status: tiny runs
    router._handle = lambda model: Handle  # type: ignore[method-assign]

    async def call(method: str, path: str, body: Any = None) -> tuple[int, bytes, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.Event().wait()
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}

        headers = [(b"content-type", b"application/json")]
        scope = {"type": "http", "method": method, "path": path, "headers": headers,
                 "query_string": b"", "root_path": "/v1"}  # fmt: skip
        response = await router(Request(scope, receive))
        if hasattr(response, "body_iterator"):
            content = b"".join([chunk async for chunk in response.body_iterator])
        else:
            content = bytes(response.body)
        return response.status_code, content, dict(response.headers)

    status, content, _ = await call("POST", "/v1/chat/completions", CHAT)
    assert status == 200, content
    assert json.loads(content)["choices"][0]["message"]["content"] == greedy
    status, content, headers = await call("POST", "/v1/chat/completions", {**CHAT, "stream": True})
    assert headers["content-type"].startswith("text/event-stream")
    assert _streamed_text(_sse(content.decode())) == greedy
    status, content, _ = await call("GET", "/v1/models")
    assert [m["id"] for m in json.loads(content)["data"]] == ["tiny"]
    status, content, _ = await call("POST", "/v1/completions", {**CHAT, "model": "nope"})
    error = json.loads(content)["error"]
    assert status == 404 and error["code"] == "model_not_found" and "'tiny'" in error["message"]
    status, content, _ = await call("POST", "/v1/chat/completions", {"messages": MESSAGES})
    assert status == 400 and "'model' field" in json.loads(content)["error"]["message"]


def test_run_asgi_streams_and_tells_the_app_when_the_client_left() -> None:
    """The replica's side of the router: the app's answer as it comes, and closing the stream
    early (Ray Serve does when the router's client went away) is the app's http.disconnect, which
    ferry's OpenAI routes turn into cancelling the sequence."""
    from ferry.deploy._ray_openai import run_asgi

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["body"].decode())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"1")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"x%d" % i, "more_body": True})
        seen.append((await receive())["type"])  # waits for the client to leave

    async def main() -> list[Any]:
        parts = run_asgi(app, "POST", "/v1/completions", b"", [], b"hello")
        got = [await parts.__anext__() for _ in range(4)]
        await parts.aclose()
        return got

    got = asyncio.run(main())
    assert got == [{"status": 200, "headers": [(b"a", b"1")]}, b"x0", b"x1", b"x2"]
    assert seen == ["hello", "http.disconnect"]


def test_applications_pass_generation_settings_and_fill_the_batch(
    artifact: Path, tmp_path: Path
) -> None:
    from _serving_models import add_const, write_model

    from ferry.deploy import ray as ferry_ray

    apps = ferry_ray.applications(artifact, max_num_seqs=4, max_model_len=32, max_queue=2)
    assert [(n, r) for n, r, _ in apps] == [
        ("ferry-tiny", "/v2/models/tiny"),
        ("ferry_openai", "/v1"),  # the OpenAI router, with generative models only
        ("ferry", "/v2"),
    ]
    assert apps[1][2]._bound_deployment.ray_actor_options["num_cpus"] == 0
    deployment = apps[0][2]._bound_deployment
    # a full batch and the next in the replica (no more than its queue holds); Ray queues the rest
    assert deployment.max_ongoing_requests == 4 + 2
    settings = deployment.init_args[2]["generation"]
    assert (settings.max_num_seqs, settings.max_model_len, settings.max_queue) == (4, 32, 2)
    # in a repository beside a tensor model: each gets its own
    repo = tmp_path / "repo"
    write_model(repo, "add", 1, add_const(1))
    (repo / "chat" / "1").mkdir(parents=True)
    for file in artifact.iterdir():
        (repo / "chat" / "1" / file.name).write_bytes(file.read_bytes())
    assert ferry_ray.generative_models(repo) == ["chat"]
    ongoing = {
        name: app._bound_deployment.max_ongoing_requests
        for name, _, app in ferry_ray.applications(repo)
        if name.startswith("ferry-")
    }
    assert ongoing == {"ferry-add": 32, "ferry-chat": 32}  # 16 sequences, 16 waiting
    given = ferry_ray.applications(repo, max_ongoing_requests=5)
    assert {a._bound_deployment.max_ongoing_requests for n, _, a in given if "-" in n} == {5}
    assert ferry_ray.openai_url("http://h:8000/", "chat") == "http://h:8000/v2/models/chat/v1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer >= 1"),
        ({"max_queue": 0}, "max_queue must be an integer >= 1"),
        ({"max_model_len": 1}, "max_model_len must be an integer >= 2"),
        ({"kv_cache_mib": 0}, "kv_cache_mib must be > 0"),
        ({"max_model_len": 65}, "over model 'tiny''s context (64 tokens)"),
    ],
)
def test_bad_generation_settings_are_refused_before_anything_deploys(
    artifact: Path, kwargs: dict[str, Any], message: str
) -> None:
    from ferry.deploy import ray as ferry_ray
    from ferry.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ferry_ray.applications(artifact, **kwargs)


def test_cli_refuses_a_bad_generation_option_in_one_line(artifact: Path) -> None:
    from click.testing import CliRunner

    from ferry.cli.main import cli

    result = CliRunner().invoke(cli, ["deploy", "ray", str(artifact), "--max-model-len", "100"])
    assert result.exit_code == 2, result.output
    assert "--max-model-len 64 or less" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["deploy", "ray", str(artifact), "--max-num-seqs", "0"])
    assert result.exit_code == 2 and "--max-num-seqs" in result.output


# -- on a real local cluster -------------------------------------------------------------------


@pytest.mark.slow
def test_on_a_local_ray_cluster(artifact: Path, greedy: str, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "real"))
    from test_ray_serve import _namespace_command

    wrap = _namespace_command()
    out = tmp_path / "report.json"
    # Ray's own temporary folder: short, for its sockets' paths (at most 107 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="fr-")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    command = [*wrap, sys.executable, __file__, str(artifact), "8741", str(out)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=900, env=env, check=False
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.exists(), f"no report:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert "error" not in report, report["error"]
    assert report["deploy"]["exit"] == 0, report["deploy"]["output"]
    assert (
        "OpenAI API of tiny: http://127.0.0.1:8741/v2/models/tiny/v1" in report["deploy"]["output"]
    )
    assert "OpenAI API: http://127.0.0.1:8741/v1" in report["deploy"]["output"]
    assert report["index"] == [{"name": "tiny", "state": "READY", "reason": ""}]
    assert report["models"] == ["tiny"]
    # both base URLs: the /v1 router and the model's own; httpx and the openai client
    for base in ("router", "own"):
        answers = report[base]
        assert answers["chat"] == answers["stream"] == greedy, (base, answers)
        if importlib.util.find_spec("openai") is not None:
            assert answers["openai"] == answers["openai_stream"] == greedy, (base, answers)
    assert report["unknown_model"] == 404
    assert report["down"] == 0
    print("replica memory (RSS MiB):", report.get("rss_mib"))


def _scenario(artifact: str, port: int, out: Path) -> None:
    """Deploy ``artifact`` with ``ferry deploy ray`` (a new local cluster), query it, remove it,
    stop the cluster; write what was seen to ``out``."""
    import httpx

    ferry = str(Path(sys.executable).parent / "ferry")
    report: dict[str, Any] = {}
    base = f"http://127.0.0.1:{port}"
    try:
        flags = ["--http-port", str(port), "--replica-cpus", "0.5", "--max-num-seqs", "4"]
        flags += ["--max-model-len", "48", "--timeout", "400"]
        done = subprocess.run(
            [ferry, "deploy", "ray", artifact, *flags],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        report["deploy"] = {"exit": done.returncode, "output": done.stdout + done.stderr}
        if done.returncode == 0:
            with httpx.Client(timeout=120) as client:
                report["index"] = client.post(f"{base}/v2/repository/index").json()
                listed = client.get(f"{base}/v1/models").json()["data"]
                report["models"] = [m["id"] for m in listed]
                wrong = {**CHAT, "model": "nope"}
                report["unknown_model"] = client.post(f"{base}/v1/completions", json=wrong)
                report["unknown_model"] = report["unknown_model"].status_code
            report["router"] = _chats(f"{base}/v1")
            report["own"] = _chats(f"{base}/v2/models/tiny/v1")
            report["rss_mib"] = _replica_rss()
    except Exception as e:  # the report says what went wrong; the test shows it
        import traceback

        report["error"] = f"{e!r}\n{traceback.format_exc()}"
    finally:
        down = subprocess.run(
            [ferry, "deploy", "ray", "--down"], capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
        report["down"] = down.returncode
        ray_cli = str(Path(sys.executable).parent / "ray")
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120, check=False)
        out.write_text(json.dumps(report, indent=1), encoding="utf-8")


def _chats(url: str) -> dict[str, str]:
    """The greedy chat's text through the OpenAI base URL ``url``: httpx, streamed and not, and
    the ``openai`` client where it is installed."""
    import httpx

    out = {}
    with httpx.Client(timeout=120) as client:
        answer = client.post(f"{url}/chat/completions", json=CHAT).json()
        out["chat"] = answer["choices"][0]["message"]["content"]
        streamed = client.post(f"{url}/chat/completions", json={**CHAT, "stream": True})
        out["stream"] = _streamed_text(_sse(streamed.text))
    try:
        import openai
    except ImportError:
        return out
    openai_client = openai.OpenAI(base_url=url, api_key="none")
    chat = openai_client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0
    )
    out["openai"] = chat.choices[0].message.content or ""
    chunks = openai_client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0, stream=True
    )
    out["openai_stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return out


def _replica_rss() -> dict[str, float]:
    """Resident memory of Ray Serve's replica processes (``ray::ServeReplica:<app>:...``)."""
    done = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True, check=False)
    out = {}
    for line in done.stdout.splitlines():
        rss, _, args = line.strip().partition(" ")
        if "ServeReplica:" in args:
            app = args.split("ServeReplica:", 1)[1].split(":", 1)[0]
            out[app] = round(int(rss) / 1024, 1)
    return out


if __name__ == "__main__":
    _scenario(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
