"""The model repository: layout, config.json, version policies, modes, hot reload, failed loads."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import pytest
from _serving_models import add_const, gather_rows, identity, write_config, write_model
from onnx import TensorProto

from ferry.errors import InvalidInputError, ModelLoadError
from ferry.serving import (
    ConfigError,
    InferRequest,
    ModelConfig,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelRepository,
    VersionPolicy,
    check_model_name,
    find_model_file,
    parse_config,
    resolve_config,
)

T = TypeVar("T")


def run(repository: ModelRepository, body: Callable[[ModelRepository], Awaitable[T]]) -> T:
    """Start the repository, run ``body`` on it, stop it: all on one event loop."""

    async def main() -> T:
        await repository.start()
        try:
            return await body(repository)
        finally:
            await repository.stop()

    return asyncio.run(main())


async def infer(
    repository: ModelRepository, name: str, x: np.ndarray, version: str | None = None
) -> np.ndarray:
    served = repository.get(name, version)
    request = InferRequest(None, {"x": x}, {"x": "FP32"}, None, False, {})
    feeds, batch = served.prepare(request)
    outcome = await served.infer(feeds, None, batch)
    return outcome.outputs["y"]


X = np.zeros((2, 4), np.float32)


# -- config.json ----------------------------------------------------------------------------------


def test_version_policies_select() -> None:
    available = [3, 1, 2, 10]
    assert VersionPolicy().select(available) == [10]
    assert VersionPolicy("latest", num_versions=2).select(available) == [3, 10]
    assert VersionPolicy("all").select(available) == [1, 2, 3, 10]
    assert VersionPolicy("specific", versions=(1, 3, 7)).select(available) == [1, 3]


def test_parse_full_config() -> None:
    config = parse_config(
        {
            "max_batch_size": 8,
            "dynamic_batching": {
                "max_queue_delay_microseconds": 500,
                "preferred_batch_size": [8, 4],
            },
            "instance_group": [{"count": 2}, {"count": 1, "kind": "KIND_CPU"}],
            "backends": ["onnxruntime"],
            "precision": "bf16",
            "version_policy": {"specific": {"versions": [3, 1]}},
        },
        "m",
    )
    assert config.max_batch_size == 8 and config.dynamic_batching
    assert config.max_queue_delay_us == 500 and config.preferred_batch_sizes == (4, 8)
    assert config.instance_count == 3
    assert config.backends == ("onnxruntime",) and config.precision == "bf16"
    assert parse_config({}, "m").precision is None
    assert config.version_policy == VersionPolicy("specific", versions=(1, 3))


BAD_CONFIGS = [
    ({"max_batch": 8}, "unknown key 'max_batch'"),
    ({"max_batch_size": "8"}, "max_batch_size must be an integer"),
    ({"max_batch_size": True}, "max_batch_size must be an integer"),
    ({"max_batch_size": -1}, "max_batch_size must be an integer >= 0"),
    ({"max_batch_size": 0, "dynamic_batching": {}}, "needs max_batch_size > 0"),
    (
        {"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}},
        "above max_batch_size 4",
    ),
    ({"dynamic_batching": {"delay": 1}}, "unknown dynamic_batching key 'delay'"),
    ({"instance_group": [{"count": 0}]}, "instance_group.count must be an integer >= 1"),
    ({"instance_group": [{"kind": "KIND_GPU"}]}, "KIND_GPU"),
    ({"backends": "onnxruntime"}, "non-empty list of backend names"),
    ({"version_policy": {"newest": {}}}, "unknown version_policy 'newest'"),
    ({"version_policy": {"latest": {"num_versions": 0}}}, "num_versions must be an integer >= 1"),
    ({"version_policy": {"specific": {"versions": []}}}, "non-empty list"),
    ({"name": "other"}, "model folder is 'm'"),
    ({"precision": "bf61"}, r"'precision' must be one of fp32, bf16, fp16, int8.*got 'bf61'"),
    ({"precision": 16}, r"'precision' must be one of fp32, bf16, fp16, int8.*got 16"),
    ({"precision": ["bf16"]}, "'precision' must be one of"),
    ([1], "must be a JSON object"),
]


@pytest.mark.parametrize(("data", "message"), BAD_CONFIGS)
def test_bad_configs(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "m")


class Spec:
    def __init__(self, name: str, shape: tuple[Any, ...] | None) -> None:
        self.name, self.shape = name, shape


def test_defaults_follow_the_model() -> None:
    batchable = [Spec("x", ("batch", 4))], [Spec("y", ("batch", 4))]
    resolved = resolve_config(ModelConfig(), "m", *batchable)
    assert (resolved.max_batch_size, resolved.dynamic_batching) == (8, True)
    fixed = [Spec("x", (1, 4))], [Spec("y", (1, 4))]
    resolved = resolve_config(ModelConfig(), "m", *fixed)
    assert (resolved.max_batch_size, resolved.dynamic_batching) == (0, False)
    # max_batch_size given without dynamic_batching: Triton's default scheduler, no batcher.
    resolved = resolve_config(ModelConfig(max_batch_size=4), "m", *batchable)
    assert (resolved.max_batch_size, resolved.dynamic_batching) == (4, False)
    with pytest.raises(ConfigError, match="fixed leading dim of 1"):
        resolve_config(ModelConfig(max_batch_size=4), "m", *fixed)


# -- layout and names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["..", ".", "a/b", "/etc", "..\\x", ".hidden", "", "a b", "x" * 200]
)
def test_model_names_cannot_escape(name: str) -> None:
    with pytest.raises(InvalidInputError, match="invalid model name"):
        check_model_name(name)


def test_traversal_in_lookups_is_refused(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))
    (repo.parent / "outside" / "1").mkdir(parents=True)

    async def body(r: ModelRepository) -> None:
        for name in ("..", "../outside", "m/../.."):
            with pytest.raises(InvalidInputError):
                r.get(name)
        with pytest.raises(InvalidInputError):
            await r.load("..")
        with pytest.raises(ModelNotFoundError):
            r.get("outside")

    run(ModelRepository(repo, warmup=False), body)


def test_find_model_file(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    (one / "net.onnx").write_bytes(b"x")
    assert find_model_file(one).name == "net.onnx"
    artifact = tmp_path / "art" / "bundle"
    artifact.mkdir(parents=True)
    (artifact / "model.onnx").write_bytes(b"x")
    assert find_model_file(tmp_path / "art") == artifact
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.onnx").write_bytes(b"x")
    (two / "b.onnx").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="2 .onnx files"):
        find_model_file(two)


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        ModelRepository(tmp_path / "missing")
    (tmp_path / "weights.pt").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not an .onnx model"):
        ModelRepository(tmp_path / "weights.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no models in"):
        ModelRepository(tmp_path / "empty")
    with pytest.raises(InvalidInputError, match="exclude each other"):
        ModelRepository(tmp_path / "empty", explicit=True, poll_interval=1)


# -- loading -------------------------------------------------------------------------------------------


def test_version_policy_decides_what_serves(repo: Path) -> None:
    for v in (1, 2, 3):
        write_model(repo, "latest", v, add_const(v))
        write_model(repo, "all", v, add_const(v))
        write_model(repo, "pick", v, add_const(v))
    write_config(repo, "all", {"version_policy": {"all": {}}})
    write_config(repo, "pick", {"version_policy": {"specific": {"versions": [1, 3]}}})

    async def body(r: ModelRepository) -> None:
        assert [v.version for v in r.serving("latest")] == [3]
        assert [v.version for v in r.serving("all")] == [1, 2, 3]
        assert [v.version for v in r.serving("pick")] == [1, 3]
        assert (await infer(r, "all", X, "2"))[0, 0] == 2
        assert (await infer(r, "all", X))[0, 0] == 3  # no version: the highest
        with pytest.raises(ModelNotFoundError, match="no version 2"):
            r.get("pick", "2")
        with pytest.raises(InvalidInputError, match="versions are integers"):
            r.get("pick", "one")

    run(ModelRepository(repo, warmup=False), body)


def test_a_bad_config_fails_only_its_model(repo: Path) -> None:
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "badjson", 1, add_const(1))
    write_config(repo, "badjson", "{not json")
    write_model(repo, "badkey", 1, add_const(1))
    write_config(repo, "badkey", {"max_batch": 4})
    write_model(repo, "fixed", 1, add_const(1, batch=1))
    write_config(repo, "fixed", {"max_batch_size": 4})
    write_model(repo, "nofile", 1, add_const(1))
    (repo / "nofile" / "1" / "model.onnx").unlink()

    async def body(r: ModelRepository) -> list[dict[str, str]]:
        assert (await infer(r, "good", X))[0, 0] == 1
        with pytest.raises(ModelNotReadyError, match="not valid JSON"):
            r.get("badjson")
        return await r.index()

    rows = {row["name"]: row for row in run(ModelRepository(repo, warmup=False), body)}
    assert rows["good"]["state"] == "READY"
    assert "not valid JSON" in rows["badjson"]["reason"]
    assert "unknown key 'max_batch'" in rows["badkey"]["reason"]
    assert "fixed leading dim" in rows["fixed"]["reason"]
    assert "holds no model" in rows["nofile"]["reason"]
    for name in ("badjson", "badkey", "fixed", "nofile"):
        assert rows[name]["state"] == "UNAVAILABLE"


def test_corrupt_model_is_reported(repo: Path) -> None:
    write_model(repo, "good", 1, add_const(1))
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a model")

    rows = run(ModelRepository(repo, warmup=False), lambda r: r.index())
    broken = next(row for row in rows if row["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE" and broken["reason"].startswith("load failed")


def test_poll_picks_up_new_versions_and_keeps_old_on_failure(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))

    async def body(r: ModelRepository) -> None:
        v1 = r.get("m")
        assert (await infer(r, "m", X))[0, 0] == 1
        # A request in flight on version 1 while version 2 arrives.
        v1.enter()
        write_model(repo, "m", 2, add_const(2))
        await r.poll_once()
        assert r.get("m").version == 2
        assert (await infer(r, "m", X))[0, 0] == 2
        assert v1.closed
        out = await v1.infer({"x": X}, None, 2)  # the old version still finishes its requests
        assert out.outputs["y"][0, 0] == 1
        v1.exit()
        await asyncio.sleep(0.05)
        assert [row["state"] for row in await r.index() if row["version"] == "1"] == ["UNAVAILABLE"]
        # A broken version 3: version 2 keeps serving, the index says why.
        (repo / "m" / "3").mkdir()
        (repo / "m" / "3" / "model.onnx").write_bytes(b"garbage")
        await r.poll_once()
        assert r.get("m").version == 2
        assert (await infer(r, "m", X))[0, 0] == 2
        rows = {row["version"]: row for row in await r.index()}
        assert rows["2"]["state"] == "READY"
        assert rows["3"]["state"] == "UNAVAILABLE" and "load failed" in rows["3"]["reason"]
        # Fixing version 3 on disk is picked up.
        write_model(repo, "m", 3, add_const(3))
        os.utime(repo / "m" / "3" / "model.onnx", ns=(1, 10**18))
        await r.poll_once()
        assert (await infer(r, "m", X))[0, 0] == 3
        # A version removed from disk: the previous one serves again.
        for f in (repo / "m" / "3").iterdir():
            f.unlink()
        (repo / "m" / "3").rmdir()
        await r.poll_once()
        assert (await infer(r, "m", X))[0, 0] == 2

    run(ModelRepository(repo, warmup=False, poll_interval=3600), body)


def test_changed_file_and_config_reload(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))

    async def body(r: ModelRepository) -> None:
        first = r.get("m")
        assert first.resolved.max_batch_size == 8
        write_config(repo, "m", {"max_batch_size": 2, "dynamic_batching": {}})
        await r.poll_once()
        assert r.get("m") is not first
        assert r.get("m").resolved.max_batch_size == 2
        # A broken config keeps the loaded one; the index says so.
        write_config(repo, "m", {"max_batch_size": "two"})
        await r.poll_once()
        assert r.get("m").resolved.max_batch_size == 2
        (row,) = await r.index()
        assert row["state"] == "READY" and "max_batch_size must be an integer" in row["reason"]
        # The same version's file replaced: reloaded in place.
        write_config(repo, "m", {})
        onnx.save(add_const(5), repo / "m" / "1" / "model.onnx")
        os.utime(repo / "m" / "1" / "model.onnx", ns=(1, 10**18))
        await r.poll_once()
        assert (await infer(r, "m", X))[0, 0] == 5
        # The model's folder removed: unloaded.
        for path in sorted(repo.joinpath("m").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        repo.joinpath("m").rmdir()
        await r.poll_once()
        with pytest.raises(ModelNotFoundError):
            r.get("m")

    run(ModelRepository(repo, warmup=False, poll_interval=3600), body)


def test_explicit_mode(repo: Path) -> None:
    write_model(repo, "a", 1, add_const(1))
    write_model(repo, "b", 1, add_const(2))
    write_model(repo, "fixed", 1, add_const(3, batch=2))

    async def body(r: ModelRepository) -> None:
        assert r.get("a").version == 1
        with pytest.raises(ModelNotReadyError, match="not loaded"):
            r.get("b")
        rows = {row["name"]: row for row in await r.index()}
        assert rows["b"]["state"] == "UNAVAILABLE" and rows["b"]["reason"] == "not loaded"
        await r.load("b")
        assert (await infer(r, "b", X))[0, 0] == 2
        await r.unload("a")
        with pytest.raises(ModelNotReadyError, match="unloaded"):
            r.get("a")
        assert await r.index(ready_only=True) == [
            {"name": "b", "version": "1", "state": "READY", "reason": ""}
        ]
        with pytest.raises(ModelNotFoundError):
            await r.load("nope")
        with pytest.raises(ModelLoadError, match="fixed leading dim"):
            await r.load("fixed", {"max_batch_size": 2})
        await r.load("fixed", {"max_batch_size": 0, "instance_group": [{"count": 2}]})
        served = r.get("fixed")
        assert served.resolved.max_batch_size == 0 and len(served.pool.instances) == 2
        with pytest.raises(ConfigError, match="unknown key"):
            await r.load("b", {"bogus": 1})

    run(ModelRepository(repo, warmup=False, explicit=True, load=["a"]), body)


def test_single_file_source_and_request_checks(tmp_path: Path) -> None:
    path = tmp_path / "my model.onnx"
    onnx.save(gather_rows(), path)

    async def body(r: ModelRepository) -> None:
        served = r.get("my_model")
        assert served.version == 1 and served.resolved.max_batch_size == 8
        good = InferRequest(
            None, {"idx": np.array([0, 3], np.int64)}, {"idx": "INT64"}, None, False, {}
        )
        feeds, batch = served.prepare(good)
        out = await served.infer(feeds, None, batch)
        assert out.outputs["y"].tolist() == [[0, 1], [6, 7]]
        cases = [
            ({"idx": np.zeros(9, np.int64)}, {"idx": "INT64"}, "above the max_batch_size 8"),
            ({"idx": np.zeros(2, np.int32)}, {"idx": "INT32"}, "is INT64 in model"),
            ({"other": np.zeros(2, np.int64)}, {"other": "INT64"}, "unknown input 'other'"),
            ({"idx": np.zeros((2, 2), np.int64)}, {"idx": "INT64"}, "must have 1 dims"),
        ]
        for inputs, types, message in cases:
            with pytest.raises(InvalidInputError, match=message):
                served.prepare(InferRequest(None, inputs, types, None, False, {}))

    run(ModelRepository(path, warmup=True), body)


def test_string_inputs_take_binary_bytes(repo: Path) -> None:
    write_model(repo, "s", 1, identity(TensorProto.STRING))

    async def body(r: ModelRepository) -> np.ndarray:
        served = r.get("s")
        x = np.array([[b"a", "caf\u00e9".encode(), b""]], dtype=object)
        feeds, batch = served.prepare(InferRequest(None, {"x": x}, {"x": "BYTES"}, None, False, {}))
        return (await served.infer(feeds, None, batch)).outputs["y"]

    out = run(ModelRepository(repo, warmup=False), body)
    assert out.tolist() == [["a", "caf\u00e9", ""]]


# -- precision -------------------------------------------------------------------------------------


def _has_openvino() -> bool:
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    try:
        get_backend("openvino")
    except BackendUnavailableError:
        return False
    return True


def test_precision_no_engine_offers_fails_only_its_model(repo: Path) -> None:
    write_model(repo, "good", 1, add_const(1))
    write_model(repo, "int8", 1, add_const(1))
    write_config(repo, "int8", {"precision": "int8"})  # ONNX Runtime runs fp32 only
    write_model(repo, "typo", 1, add_const(1))
    write_config(repo, "typo", {"precision": "bf61"})

    async def body(r: ModelRepository) -> list[dict[str, str]]:
        served = r.get("good")
        assert served.loaded.precision is None
        assert served.loaded.precisions == {"onnxruntime": "fp32"}
        assert (await infer(r, "good", X))[0, 0] == 1
        return await r.index(engines=True)

    rows = {row["name"]: row for row in run(ModelRepository(repo, warmup=False), body)}
    assert rows["good"]["state"] == "READY" and rows["good"]["engines"] == "onnxruntime fp32"
    assert rows["int8"]["state"] == "UNAVAILABLE" and rows["int8"]["engines"] == ""
    assert "load failed: precision 'int8'" in rows["int8"]["reason"]
    assert "onnxruntime offers fp32" in rows["int8"]["reason"]
    assert rows["typo"]["state"] == "UNAVAILABLE"
    assert "must be one of fp32, bf16, fp16, int8" in rows["typo"]["reason"]


def test_server_precision_is_checked_and_applies_where_config_names_none(repo: Path) -> None:
    write_model(repo, "m", 1, add_const(1))
    with pytest.raises(InvalidInputError, match="must be one of fp32, bf16, fp16, int8"):
        ModelRepository(repo, precision="half")
    # The server's precision, on ONNX Runtime alone: that model cannot load, and says why.
    rows = run(ModelRepository(repo, warmup=False, precision="bf16"), lambda r: r.index())
    assert rows[0]["state"] == "UNAVAILABLE" and "precision 'bf16'" in rows[0]["reason"]
    # Its config names fp32: the config wins.
    write_config(repo, "m", {"precision": "fp32"})
    rows = run(ModelRepository(repo, warmup=False, precision="bf16"), lambda r: r.index())
    assert rows[0]["state"] == "READY", rows


@pytest.mark.openvino
@pytest.mark.skipif(not _has_openvino(), reason="OpenVINO is not installed")
def test_precision_from_config_and_server_on_openvino(repo: Path) -> None:
    write_model(repo, "low", 1, add_const(1))
    write_config(repo, "low", {"backends": ["openvino"], "precision": "bf16"})
    write_model(repo, "plain", 1, add_const(2))  # the server's: openvino at fp16

    async def body(r: ModelRepository) -> list[dict[str, str]]:
        low, plain = r.get("low"), r.get("plain")
        assert low.loaded.precision == "bf16" and low.loaded.precisions == {"openvino": "bf16"}
        assert low.loaded.sessions[0].plan.partitions[0].options["precision"] == "bf16"
        assert plain.loaded.precision == "fp16"
        assert plain.loaded.precisions == {"openvino": "fp16"}
        assert (await infer(r, "low", X))[0, 0] == 1  # 0 + 1, exact in bf16
        return await r.index(engines=True)

    repository = ModelRepository(repo, warmup=True, backends="openvino", precision="fp16")
    rows = {row["name"]: row for row in run(repository, body)}
    assert rows["low"]["engines"] == "openvino bf16"
    assert rows["plain"]["engines"] == "openvino fp16"
