"""A repository serving a tensor model and a generative artifact side by side (issue 30): the
KServe v2 routes keep working for the tensor model, the decoder is a model version like any other
for metadata, config, statistics and readiness, its /infer points at the routes it answers, and
its generation metrics reach /metrics."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _serving_models import add_const, write_model

pytest.importorskip("starlette")
pytest.importorskip("tokenizers")
from starlette.testclient import TestClient

from ferry.errors import InvalidInputError
from ferry.serving import GenerationSettings, GenerativeVersion, create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    sys.path.insert(0, str(Path(__file__).parents[1] / "generate"))
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    repo = tmp_path_factory.mktemp("mixed")
    write_model(repo, "adder", 1, add_const(1.0))
    write_tiny(repo / "tiny" / "1", model=tiny_model(tiny_config(), "ort"))
    app = create_app(repo, generation=GenerationSettings(max_num_seqs=3, max_model_len=48))
    with TestClient(app) as running:
        assert app.state.ferry.started.wait(120)
        yield running


def test_both_kinds_are_ready_and_kserve_still_infers(client: TestClient) -> None:
    assert client.get("/v2/health/ready").status_code == 200
    rows = client.post("/v2/repository/index").json()
    assert {(r["name"], r["state"]) for r in rows} == {("adder", "READY"), ("tiny", "READY")}
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    answer = client.post("/v2/models/adder/infer", json=body).json()
    assert answer["outputs"][0]["data"] == [2, 3, 4, 5]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]


def test_the_decoder_is_a_model_version_like_any_other(client: TestClient) -> None:
    meta = client.get("/v2/models/tiny").json()
    assert meta["platform"] == "ferry_generative"
    assert "input_ids" in [t["name"] for t in meta["inputs"]]
    assert client.get("/v2/models/tiny/ready").status_code == 200
    assert client.get("/v2/models/tiny/config").status_code == 200
    assert client.get("/v2/models/tiny/stats").status_code == 200
    body = {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]}
    refused = client.post("/v2/models/tiny/infer", json=body)
    assert refused.status_code == 400
    assert "/v1/chat/completions" in refused.json()["error"]


def test_generation_reaches_the_metrics(client: TestClient) -> None:
    answer = client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0},
    ).json()
    new = answer["usage"]["completion_tokens"]
    text = client.get("/metrics").text
    series = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ferry_generation_") and 'model="tiny"' in line
    }
    assert series["ferry_generation_tokens_total"] >= new
    assert series["ferry_generation_time_to_first_token_seconds_count"] >= 1
    assert series["ferry_generation_running_sequences"] == 0
    assert 0 <= series["ferry_generation_kv_cache_usage_ratio"] <= 1


def test_the_engine_takes_the_server_settings(client: TestClient) -> None:
    version = client.app.state.ferry.repository.get("tiny")  # type: ignore[attr-defined]
    assert isinstance(version, GenerativeVersion)
    assert version.engine.max_num_seqs == 3 and version.engine.context_length == 48


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_model_len": 1}, "max_model_len"),
        ({"kv_cache_mib": -1.0}, "kv_cache_mib"),
        ({"max_queue": True}, "max_queue"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        GenerationSettings(**settings)  # type: ignore[arg-type]
