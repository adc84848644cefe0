"""ferry.deploy.ray without a cluster: the replica's app (as Ray Serve calls it), batching on Ray
Serve's ``@serve.batch``, the front's answers, the applications built, and the CLI's bad input.
tests/real/test_ray_serve.py runs it all on a real local cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from _serving_models import add_const, write_config, write_model
from click.testing import CliRunner

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ferry[ray]'")

from ferry.cli.main import cli
from ferry.deploy import ray as ferry_ray
from ferry.errors import InvalidInputError, ModelLoadError


@pytest.fixture(autouse=True)
def replica_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """What @serve.batch reads from its replica (here there is none): max_ongoing_requests."""
    from types import SimpleNamespace

    from ray import serve

    context = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=32))
    monkeypatch.setattr(serve, "get_replica_context", lambda: context)


def _body(x: np.ndarray) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]
    }


async def _replica(source: Path, model: str | None, **options: Any) -> tuple[Any, Any]:
    """A replica as Ray Serve makes one: constructor, then the ASGI app it builds."""
    replica = ferry_ray.FerryModel(str(source), model, {"threads": 1, **options})
    app = await replica.__serve_build_asgi_app__()
    return replica, app


def _client(app: Any, model: str) -> httpx.AsyncClient:
    # Ray Serve's proxy sets root_path to the application's route prefix.
    transport = httpx.ASGITransport(app=app, root_path=f"/v2/models/{model}")
    return httpx.AsyncClient(transport=transport, base_url="http://ray")


def test_replica_serves_kserve_v2_under_its_route_prefix(repo: Path) -> None:
    write_model(repo, "add", 1, add_const(1))
    write_model(repo, "other", 1, add_const(5))

    async def main() -> None:
        replica, app = await _replica(repo, "add")
        async with _client(app, "add") as client:
            meta = (await client.get("/v2/models/add")).json()
            assert meta["inputs"][0]["name"] == "x"
            assert (await client.get("/v2/models/add/ready")).status_code == 200
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            answer = (await client.post("/v2/models/add/infer", json=_body(x))).json()
            assert np.allclose(np.array(answer["outputs"][0]["data"]).reshape(2, 4), x + 1)
            # The replica serves its one model of the repository, not the others.
            assert (await client.get("/v2/models/other/ready")).status_code in (400, 404)
        await replica.check_health()
        await replica._app.state.ferry.repository.stop()

    asyncio.run(main())


def test_batches_with_ray_serves_batching(repo: Path) -> None:
    write_model(repo, "add", 1, add_const(1))
    write_config(
        repo,
        "add",
        {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 50_000}},
    )

    async def main() -> dict[str, Any]:
        replica, app = await _replica(repo, "add")
        version = replica._app.state.ferry.repository.get("add")
        assert isinstance(version.batcher, ferry_ray.RayBatcher)
        async with _client(app, "add") as client:
            xs = [np.full((1, 4), i, np.float32) for i in range(12)]
            answers = await asyncio.gather(
                *(client.post("/v2/models/add/infer", json=_body(x)) for x in xs)
            )
            for x, answer in zip(xs, answers):
                assert answer.status_code == 200, answer.text
                got = np.array(answer.json()["outputs"][0]["data"], np.float32).reshape(1, 4)
                assert np.array_equal(got, x + 1)
            stats = (await client.get("/v2/models/add/stats")).json()["model_stats"][0]
        await replica._app.state.ferry.repository.stop()
        return stats

    stats = asyncio.run(main())
    assert stats["inference_count"] == 12
    # 12 requests within one 50 ms window, at most 8 rows a batch: Ray formed 2 or 3 batches.
    assert stats["execution_count"] <= 3, stats


def test_ray_batcher_runs_shapes_apart_and_reports_errors_per_request() -> None:
    class Session:
        def run(self, feeds: dict[str, np.ndarray], outputs: Any) -> dict[str, np.ndarray]:
            x = feeds["x"]
            if np.isnan(x).any():
                from ferry.errors import ExecutionError

                raise ExecutionError("NaN in")
            return {"y": x * 2}

    class Pool:
        def __init__(self) -> None:
            from concurrent.futures import ThreadPoolExecutor

            self.instances = [
                type("I", (), {"session": Session(), "executor": ThreadPoolExecutor(1)})()
            ]
            self.free = asyncio.Queue()  # type: ignore[var-annotated]
            self.free.put_nowait(self.instances[0])
            self.runs = 0

        async def acquire(self) -> Any:
            self.runs += 1
            return await self.free.get()

        def release(self, instance: Any) -> None:
            self.free.put_nowait(instance)

    async def main() -> tuple[list[Any], int]:
        pool = Pool()
        batcher = ferry_ray.RayBatcher(pool, max_batch_size=16, max_queue_delay_us=30_000)
        feeds = [
            {"x": np.ones((1, 3), np.float32)},
            {"x": np.ones((2, 5), np.float32)},  # other dims: its own engine batch
            {"x": np.full((1, 3), np.nan, np.float32)},  # fails alone, the others still answer
            {"x": np.full((1, 3), 3, np.float32)},
        ]
        results = await asyncio.gather(
            *(batcher.submit(f, None, f["x"].shape[0]) for f in feeds), return_exceptions=True
        )
        return results, pool.runs

    results, runs = asyncio.run(main())
    assert np.array_equal(results[0].outputs["y"], np.full((1, 3), 2, np.float32))
    assert results[1].outputs["y"].shape == (2, 5)
    assert "NaN" in str(results[2])
    assert np.array_equal(results[3].outputs["y"], np.full((1, 3), 6, np.float32))
    assert runs == 2  # one Ray batch, two shapes


def test_a_model_that_does_not_load_fails_the_replica_with_ferrys_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")

    async def main() -> None:
        await _replica(bad, None)

    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        asyncio.run(main())


def test_front_answers_health_index_and_unknown_models(monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.requests import Request

    rows = [
        {"name": "a", "state": "READY", "reason": ""},
        {"name": "b", "state": "LOADING", "reason": "replicas starting"},
    ]
    monkeypatch.setattr(ferry_ray, "_index_rows", lambda: rows)
    front = ferry_ray.FerryFront(api_key="k")

    def call(method: str, path: str, auth: bool = False) -> tuple[int, Any]:
        headers = [(b"authorization", b"Bearer k")] if auth else []
        scope = {"type": "http", "method": method, "path": path, "headers": headers,
                 "query_string": b"", "root_path": "/v2"}  # fmt: skip
        response = asyncio.run(front(Request(scope)))
        return response.status_code, json.loads(bytes(response.body))

    assert call("GET", "/v2")[1]["name"] == "ferry"
    assert call("GET", "/v2/health/live") == (200, {"live": True})
    status, body = call("GET", "/v2/health/ready")
    assert status == 400 and "'b' is LOADING" in body["reason"]
    assert call("POST", "/v2/repository/index")[0] == 401
    assert call("POST", "/v2/repository/index", auth=True) == (200, rows)
    status, body = call("GET", "/v2/models/zzz/ready")
    assert status == 404 and "'a', 'b'" in body["error"]
    assert call("POST", "/v2/repository/models/a/load", auth=True)[0] == 501
    rows[1]["state"] = "READY"
    assert call("GET", "/v2/health/ready") == (200, {"ready": True})


def test_applications_one_per_model_and_the_front(repo: Path, tmp_path: Path) -> None:
    write_model(repo, "add", 1, add_const(1))
    write_model(repo, "twice", 1, add_const(2))
    apps = ferry_ray.applications(repo, replicas=3, threads=2)
    assert [(n, r) for n, r, _ in apps] == [
        ("ferry-add", "/v2/models/add"),
        ("ferry-twice", "/v2/models/twice"),
        ("ferry", "/v2"),
    ]
    deployment = apps[0][2]._bound_deployment
    assert deployment.num_replicas == 3
    assert deployment.ray_actor_options["num_cpus"] == 2.0
    scaled = ferry_ray.applications(repo / "add" / "1" / "model.onnx", autoscale=(0, 4))
    config = scaled[0][2]._bound_deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas) == (0, 4)
    assert scaled[0][0] == "ferry-model"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 2, "autoscale": (1, 2)}, "not both"),
        ({"replicas": 0}, "positive integer"),
        ({"autoscale": (3, 1)}, "MIN <= MAX"),
        ({"threads": 0}, "threads"),
        ({"replica_cpus": -1.0}, "CPUs"),
        ({"backends": "nosuch"}, "unknown backend 'nosuch'"),
        ({"precision": "fp7"}, "fp7"),
        ({"api_key": ""}, "empty"),
    ],
)
def test_bad_options_are_refused_before_anything_deploys(
    repo: Path, kwargs: dict[str, Any], message: str
) -> None:
    write_model(repo, "add", 1, add_const(1))
    with pytest.raises(InvalidInputError, match=message):
        ferry_ray.applications(repo, **kwargs)


def test_bad_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        ferry_ray.applications(tmp_path / "missing")
    (tmp_path / "model.pb").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="ferry convert"):
        ferry_ray.applications(tmp_path / "model.pb")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no models"):
        ferry_ray.applications(tmp_path / "empty")


def test_reason_is_ferrys_error_line_not_the_traceback() -> None:
    message = (
        "Failed to update the deployments ['FerryModel'].\nTraceback (most recent call last):\n"
        "  File \"x.py\", line 1\nferry.errors.ModelLoadError: model 'm' version 1 is UNAVAILABLE"
    )
    model = ferry_ray.DeployedModel("m", "ferry-m", "/v2/models/m", "DEPLOY_FAILED", message)
    assert model.reason == "ferry.errors.ModelLoadError: model 'm' version 1 is UNAVAILABLE"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--down", "model.onnx"], "--down and --status take no SOURCE"),
        (["--down", "--status"], "not each other"),
        ([], "give a model"),
        (["missing.onnx"], "not found"),
        (["x.onnx", "--replicas", "2", "--autoscale", "1,3"], "not both"),
        (["x.onnx", "--autoscale", "3"], "MIN,MAX"),
        (["x.onnx", "--autoscale", "4,2"], "MIN <= MAX"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    write_model(tmp_path, "m", 1, add_const(1))
    (tmp_path / "x.onnx").write_bytes((tmp_path / "m" / "1" / "model.onnx").read_bytes())
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        result = CliRunner().invoke(cli, ["deploy", "ray", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
