"""The bench agent on loopback: uploads, jobs, results in the local form, tokens, size limits,
broken models, the queue, and the temporary files. The agent runs in a thread on 127.0.0.1 at a
free port; every job is a few calls of a small model, and every wait is bounded."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import models  # noqa: E402
from ferry.bench import (  # noqa: E402
    BenchSpec,
    check_results,
    create_agent_app,
    device_info,
    run_bench,
    run_remote,
)
from ferry.errors import FerryError  # noqa: E402
from ferry.serving import ServerThread  # noqa: E402

TOKEN = "agent-s3cret"
LIMIT = 200_000  # bytes: the agent's upload limit here (the MLP is ~1 KB)
SPEC = BenchSpec(iterations=5, warmup=1, isolate=False)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def job_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir the agent makes job folders in, so tests can see them come and go."""
    folder = tmp_path / "agent-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def agent(job_tmp: Path) -> Iterator[ServerThread]:
    running = ServerThread(create_agent_app(TOKEN, max_upload_bytes=LIMIT, max_queue=1), port=0)
    running.start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.is_alive()


def _post(agent: ServerThread, body: bytes, spec: dict[str, Any] | None = None, **kw: Any) -> Any:
    headers = {**AUTH, "X-Ferry-Spec": json.dumps(spec if spec is not None else SPEC.to_dict())}
    headers.update(kw.pop("headers", {}))
    return httpx.post(f"{agent.url}/jobs", content=body, headers=headers, timeout=30, **kw)


def _wait(agent: ServerThread, job: str, limit_s: float = 60) -> Any:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        r = httpx.get(f"{agent.url}/jobs/{job}?wait=5", headers=AUTH, timeout=30)
        if r.json()["status"] in ("done", "failed"):
            return r
    raise AssertionError(f"job {job} did not finish in {limit_s} s")


def _shape_of(value: Any) -> Any:
    """The document's form: keys and types, not values (floats and ints are both numbers)."""
    if isinstance(value, dict):
        return {k: _shape_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape_of(v) for v in value[:1]]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def test_remote_results_have_the_local_form(agent: ServerThread, mlp_path: Path) -> None:
    spec = BenchSpec(batches=(1, 3), iterations=5, warmup=1, isolate=False)
    stages: list[str] = []
    remote = run_remote(agent.url, TOKEN, mlp_path, spec, progress=lambda s, d, t: stages.append(s))
    local = run_bench(mlp_path, spec)
    assert check_results(remote)
    assert _shape_of(remote) == _shape_of(local)
    assert remote["model"] == local["model"]  # path and name are set back to the local ones
    assert remote["device"] == httpx.get(f"{agent.url}/device", headers=AUTH).json()
    assert [(c["label"], c["batch"], c["inputs"]) for c in remote["configurations"]] == [
        (c["label"], c["batch"], c["inputs"]) for c in local["configurations"]
    ]
    for c in remote["configurations"]:
        assert c["error"] is None and c["latency_ms"]["p50"] <= c["latency_ms"]["p99"]
        assert c["throughput"] > 0
    assert stages[0].startswith("connecting") and stages[-1] == "done"


def test_artifact_with_external_data_and_inputs(
    agent: ServerThread, tmp_path: Path, job_tmp: Path
) -> None:
    folder = tmp_path / "artifact"
    folder.mkdir()
    models.save_external(models.mlp(), folder / "model.onnx")
    assert any(p.name != "model.onnx" for p in folder.iterdir())  # the weights file
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    spec = BenchSpec(batches=(4,), iterations=3, warmup=0, isolate=False)
    remote = run_remote(agent.url, TOKEN, folder, spec, inputs={"x": x})
    assert remote["settings"]["inputs_from"] == {"x": "file"}
    assert remote["configurations"][0]["inputs"] == {"x": [4, 16]}
    assert remote["model"]["name"] == "artifact"
    assert list(job_tmp.iterdir()) == []  # the job's files are gone


def test_zip_of_a_folder_and_isolated_job(agent: ServerThread, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("my-model/", "")
        zf.writestr("my-model/net.onnx", models.mlp().SerializeToString())
    spec = BenchSpec(iterations=3, warmup=0).to_dict()  # isolated: cold start in a child
    r = _post(agent, buf.getvalue(), spec)
    assert r.status_code == 202, r.text
    done = _wait(agent, r.json()["id"])
    assert done.status_code == 200, done.text
    row = done.json()["result"]["configurations"][0]
    assert row["error"] is None and row["peak_rss_mb"] > 0 and row["cold_start_s"] > 0


def test_token_is_required(agent: ServerThread, mlp_path: Path, job_tmp: Path) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.get(f"{agent.url}/device", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "token" in r.json()["error"]
        r = httpx.post(f"{agent.url}/jobs", content=mlp_path.read_bytes(), headers=headers)
        assert r.status_code == 401
    assert list(job_tmp.iterdir()) == []
    with pytest.raises(FerryError, match=r"refused the token \(401\)"):
        run_remote(agent.url, "wrong", mlp_path, SPEC)
    info = httpx.get(f"{agent.url}/device", headers=AUTH).json()
    assert set(info) == set(device_info())
    engines = {e["name"]: e for e in info["engines"]}
    assert engines["onnxruntime"]["available"] and engines["onnxruntime"]["precisions"] == ["fp32"]


def test_oversized_uploads_are_refused(agent: ServerThread, tmp_path: Path, job_tmp: Path) -> None:
    r = _post(agent, b"\0" * (LIMIT + 1))
    assert r.status_code == 413 and "at most" in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(LIMIT // 10_000 + 2):
            yield b"\0" * 10_000

    r = _post(agent, chunks())  # type: ignore[arg-type]
    assert r.status_code == 413
    # A small archive that unpacks to more than the limit.
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w:gz") as tar:
        info = tarfile.TarInfo("model.onnx")
        info.size = LIMIT * 4
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    assert len(bomb.getvalue()) < LIMIT
    r = _post(agent, bomb.getvalue())
    assert r.status_code == 413 and "unpacked" in r.json()["error"]
    big_model = models.mlp()  # a valid model over the limit: an unused 240 KB weight
    big_model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.zeros(LIMIT // 4 + 10_000, np.float32), "padding")
    )
    big = tmp_path / "big.onnx"
    onnx.save(big_model, big)
    with pytest.raises(FerryError, match="takes at most"):
        run_remote(agent.url, TOKEN, big, SPEC)  # the client checks before it uploads
    assert list(job_tmp.iterdir()) == []


def test_bad_uploads_and_specs(agent: ServerThread, mlp_path: Path, job_tmp: Path) -> None:
    model = mlp_path.read_bytes()
    for spec_header, message in (
        ("{not json", "not valid JSON"),
        ('{"colour": 1}', "unknown bench spec key 'colour'"),
        ('{"precisions": ["fp16"]}', "precision 'fp16' is not offered"),
        ('{"backends": ["nosuch"]}', "unknown backend 'nosuch'"),
    ):
        r = _post(agent, model, headers={"X-Ferry-Spec": spec_header})
        assert r.status_code == 400 and message in r.json()["error"], r.text
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../evil.onnx")
        info.size = len(model)
        tar.addfile(info, io.BytesIO(model))
    r = _post(agent, evil.getvalue())
    assert r.status_code == 400 and "unsafe path" in r.json()["error"]
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w") as tar:
        info = tarfile.TarInfo("model.onnx")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    r = _post(agent, link.getvalue())
    assert r.status_code == 400 and "not a plain file" in r.json()["error"]
    r = _post(agent, gzip.compress(b"not a tar"))
    assert r.status_code == 400 and "not a readable tar" in r.json()["error"]
    r = _post(agent, b"")
    assert r.status_code == 400 and "empty" in r.json()["error"]
    r = httpx.get(f"{agent.url}/jobs/nope", headers=AUTH)
    assert r.status_code == 404
    assert list(job_tmp.iterdir()) == []


def test_broken_models_fail_their_job_and_the_agent_stays_up(
    agent: ServerThread, mlp_path: Path, tmp_path: Path, job_tmp: Path
) -> None:
    # Not ONNX at all: refused at upload.
    r = _post(agent, b"garbage" * 100)
    assert r.status_code == 422 and "not a valid ONNX model" in r.json()["error"]
    # Reads as ONNX, but no engine can run it: the job fails with the engine's message.
    r = _post(agent, models.custom_ops().SerializeToString())
    assert r.status_code == 202
    failed = _wait(agent, r.json()["id"])
    assert failed.status_code == 422 and failed.json()["status"] == "failed"
    assert "Frobnicate" in failed.json()["error"] or "custom" in failed.json()["error"].lower()
    # The agent goes on serving.
    results = run_remote(agent.url, TOKEN, mlp_path, SPEC)
    assert results["configurations"][0]["error"] is None
    onnx.save(models.custom_ops(), tmp_path / "custom.onnx")
    with pytest.raises(FerryError, match="the job on .* failed"):
        run_remote(agent.url, TOKEN, tmp_path / "custom.onnx", SPEC)
    assert list(job_tmp.iterdir()) == []


def test_one_job_at_a_time_and_a_bounded_queue(agent: ServerThread, mlp_path: Path) -> None:
    model = mlp_path.read_bytes()
    answers = [_post(agent, model) for _ in range(3)]
    codes = [r.status_code for r in answers]
    # max_queue=1: one runs, one waits; a third submitted at once finds the queue full.
    assert codes.count(503) >= 1 and "queue is full" in answers[codes.index(503)].json()["error"]
    accepted = [r.json() for r in answers if r.status_code == 202]
    assert accepted and all(a["position"] == 1 for a in accepted)
    windows = []
    for a in accepted:
        done = _wait(agent, a["id"])
        assert done.status_code == 200
        windows.append((done.json()["started"], done.json()["finished"]))
    windows.sort()
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert end <= start  # never two at once
    info = httpx.get(f"{agent.url}/agent", headers=AUTH).json()
    assert info["queued"] == 0 and info["running"] is False and info["max_upload_bytes"] == LIMIT


def test_unreachable_agent(mlp_path: Path) -> None:
    with pytest.raises(FerryError, match="cannot reach the ferry agent"):
        run_remote("http://127.0.0.1:9", TOKEN, mlp_path, SPEC)
    with pytest.raises(FerryError, match="takes the agent's URL"):
        run_remote("127.0.0.1:8765", TOKEN, mlp_path, SPEC)
