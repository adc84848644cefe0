"""The engine cache: keys, atomic entries, damaged-entry recovery, LRU cap, and its use by Session."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import NameFixPass

import ferry
import ferry.backends
import models
from ferry.backends import BackendBase, CompileSpec, OpRule
from ferry.plan import Partition, Plan
from ferry.runtime import EngineCache, engine_key, resolve_cache
from ferry.runtime import _cache as cache_mod

MAGIC = b"FAKE-ENGINE\n"
X = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)


class FakePartition:
    """Runs through ONNX Runtime; its 'engine' is the serialized model behind a magic header."""

    def __init__(self, model_bytes: bytes) -> None:
        self.model_bytes = model_bytes
        self.session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = list(outputs or [o.name for o in self.session.get_outputs()])
        return dict(zip(names, self.session.run(names, inputs)))

    def serialize(self) -> bytes:
        return MAGIC + self.model_bytes


class FakeBackend(BackendBase):
    """An engine that builds something worth caching (slowly: ``build_s``), and counts its calls."""

    name = "fake"
    device = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    install_hint = "nothing to install"

    def __init__(self, version: str = "1.0", *, empty: bool = False, build_s: float = 0.0) -> None:
        self._version = version
        self.empty = empty
        self.build_s = build_s
        self.compiles = 0
        self.loads = 0

    @property
    def version(self) -> str:
        return self._version

    def available(self) -> bool:
        return True

    def rules(self) -> list[Any]:
        # Claims every standard op, so that ``backends="fake"`` places whole models on it.
        return [OpRule(s.name) for s in onnx.defs.get_all_schemas() if s.domain == ""]

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        return {}

    def compile(self, spec: CompileSpec) -> FakePartition:
        self.compiles += 1
        time.sleep(self.build_s)  # what a real engine spends building (TensorRT: minutes)
        compiled = FakePartition(ir.to_proto(spec.model).SerializeToString())
        if self.empty:
            compiled.serialize = lambda: b""  # type: ignore[method-assign]
        return compiled

    def load(self, blob: bytes, spec: CompileSpec) -> FakePartition:
        self.loads += 1
        if not blob.startswith(MAGIC):
            raise RuntimeError("not an engine of mine")
        return FakePartition(blob[len(MAGIC) :])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    backend = FakeBackend()
    monkeypatch.setitem(ferry.backends._registry._instances, "fake", backend)
    monkeypatch.setattr(cache_mod, "_EMPTY_BLOB_BACKENDS", set())
    return backend


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def expected_y(proto: onnx.ModelProto | None = None) -> np.ndarray:
    session = ort.InferenceSession(
        (proto or models.mlp()).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": X})[0]


def entries(root: Path) -> list[Path]:
    engines = root / "engines"
    return (
        sorted(p for p in engines.iterdir() if not p.name.startswith("."))
        if engines.exists()
        else []
    )


def spec_for(model: ir.Model, **options: Any) -> CompileSpec:
    plan = Plan.whole_graph(model, "fake")
    return CompileSpec(partition=plan.partitions[0], model=model, options=options)


def named(proto: onnx.ModelProto) -> ir.Model:
    model = ir.from_proto(proto)
    NameFixPass()(model)
    return model


# ---------------------------------------------------------------------------------------------
# Session through the cache


def test_cold_compile_then_warm_load(fake: FakeBackend, cache_dir: Path) -> None:
    cold = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    assert cold.engine_origins == ["compiled"] and (fake.compiles, fake.loads) == (1, 0)
    (entry,) = entries(cache_dir)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["backend"] == "fake" and meta["backend_version"] == "1.0"
    assert meta["blob_bytes"] == (entry / "engine.bin").stat().st_size

    warm = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    assert warm.engine_origins == ["loaded"] and (fake.compiles, fake.loads) == (1, 1)
    np.testing.assert_array_equal(warm.run({"x": X})["y"], expected_y())
    np.testing.assert_array_equal(cold.run({"x": X})["y"], expected_y())


def test_split_plan_caches_each_partition(fake: FakeBackend, cache_dir: Path) -> None:
    model = named(models.mlp())
    plan = Plan(
        (
            Partition("fake", ("fc1", "relu"), ("x",), ("r",)),
            Partition("onnxruntime", ("fc2",), ("r",), ("logits",)),
            Partition("fake", ("softmax",), ("logits",), ("y",)),
        ),
        ("x",),
        ("y",),
    )
    first = ferry.load(model, plan=plan, cache_dir=cache_dir)
    assert first.engine_origins == ["compiled", "uncached", "compiled"]
    assert len(entries(cache_dir)) == 2
    again = ferry.load(model, plan=plan, cache_dir=cache_dir)
    assert again.engine_origins == ["loaded", "uncached", "loaded"]
    assert fake.compiles == 2
    np.testing.assert_allclose(again.run({"x": X})["y"], expected_y(), rtol=1e-6, atol=1e-7)


def test_damaged_blob_is_rebuilt(fake: FakeBackend, cache_dir: Path) -> None:
    ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    (entry,) = entries(cache_dir)
    blob = bytearray((entry / "engine.bin").read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # one flipped byte: size fine, hash not
    (entry / "engine.bin").write_bytes(bytes(blob))
    session = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    assert session.engine_origins == ["compiled"] and fake.loads == 0 and fake.compiles == 2
    assert ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir).engine_origins == [
        "loaded"
    ]
    np.testing.assert_array_equal(session.run({"x": X})["y"], expected_y())


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: (e / "meta.json").write_text("{not json"),
        lambda e: (e / "meta.json").unlink(),
        lambda e: (e / "engine.bin").write_bytes(b""),
        lambda e: (e / "meta.json").write_text("[1, 2]"),
    ],
)
def test_unreadable_entries_are_rebuilt(fake: FakeBackend, cache_dir: Path, damage: Any) -> None:
    ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    (entry,) = entries(cache_dir)
    damage(entry)
    assert ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir).engine_origins == [
        "compiled"
    ]
    assert ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir).engine_origins == [
        "loaded"
    ]


def test_blob_the_engine_cannot_load_is_rebuilt(
    fake: FakeBackend, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    (entry,) = entries(cache_dir)
    # Intact as a file (size and hash agree) but not an engine, e.g. from an incompatible build.
    store = EngineCache(cache_dir)
    store.discard(entry.name)
    store.put(entry.name, b"something else entirely")
    session = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    assert session.engine_origins == ["compiled"] and fake.loads == 1
    assert "could not load its cached engine" in caplog.text
    assert (entry / "engine.bin").read_bytes().startswith(MAGIC)
    np.testing.assert_array_equal(session.run({"x": X})["y"], expected_y())


def test_onnxruntime_is_never_hashed(
    monkeypatch: pytest.MonkeyPatch, cache_dir: Path, mlp_path: Path
) -> None:
    def boom(*args: Any) -> str:
        raise AssertionError("hashed an ONNX Runtime partition")

    monkeypatch.setattr(cache_mod, "engine_key", boom)
    model = named(models.mlp())
    plan = Plan(
        (
            Partition("onnxruntime", ("fc1", "relu"), ("x",), ("r",)),
            Partition("onnxruntime", ("fc2", "softmax"), ("r",), ("y",)),
        ),
        ("x",),
        ("y",),
    )
    assert ferry.load(model, plan=plan, cache_dir=cache_dir).engine_origins == ["uncached"] * 2
    assert ferry.load(mlp_path, cache_dir=cache_dir).engine_origins == ["uncached"]
    assert not cache_dir.exists()


def test_backend_with_nothing_to_store_is_hashed_once(
    monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    backend = FakeBackend(empty=True)
    monkeypatch.setitem(ferry.backends._registry._instances, "fake", backend)
    monkeypatch.setattr(cache_mod, "_EMPTY_BLOB_BACKENDS", set())
    calls: list[str] = []
    real_key = cache_mod.engine_key

    def counted(*args: Any) -> str:
        calls.append(real_key(*args))
        return calls[-1]

    monkeypatch.setattr(cache_mod, "engine_key", counted)
    for _ in range(3):
        session = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
        assert session.engine_origins == ["uncached"]
    assert len(calls) == 1 and backend.compiles == 3
    assert entries(cache_dir) == []


def test_backend_that_says_it_stores_nothing_is_never_hashed(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, cache_dir: Path
) -> None:
    monkeypatch.setattr(FakeBackend, "engine_cache", False, raising=False)
    monkeypatch.setattr(cache_mod, "engine_key", lambda *a: pytest.fail("hashed"))
    assert ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir).engine_origins == [
        "uncached"
    ]


def test_cache_dir_choices(
    fake: FakeBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "from_env"))
    ferry.load(models.mlp(), backends="fake")
    assert len(entries(tmp_path / "from_env")) == 1
    session = ferry.load(models.mlp(), backends="fake", cache_dir=False)
    assert session.engine_origins == ["uncached"] and fake.compiles == 2
    monkeypatch.delenv("FERRY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_mod.default_cache_dir() == tmp_path / "xdg" / "ferry"
    with pytest.raises(ferry.FerryError, match="cache_dir must be a folder"):
        resolve_cache(True)  # type: ignore[arg-type]


def test_unwritable_cache_does_not_stop_loading(
    fake: FakeBackend, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir.mkdir()
    (cache_dir / "engines").write_text("a file where the folder should be")
    session = ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir)
    assert session.engine_origins == ["compiled"]
    assert "cannot write" in caplog.text
    np.testing.assert_array_equal(session.run({"x": X})["y"], expected_y())


# ---------------------------------------------------------------------------------------------
# Keys


def test_key_is_stable_and_follows_what_matters() -> None:
    backend = FakeBackend()
    model = named(models.mlp())
    key = engine_key(backend, spec_for(model))
    assert len(key) == 64
    assert engine_key(backend, spec_for(named(models.mlp()))) == key  # rebuilt: same key
    assert engine_key(backend, spec_for(model.clone())) == key

    assert engine_key(backend, spec_for(model, threads=2)) != key
    assert engine_key(backend, spec_for(model, precision="fp16")) != key
    assert engine_key(FakeBackend("1.1"), spec_for(model)) != key
    other_device = FakeBackend()
    other_device.device = "gpu"
    assert engine_key(other_device, spec_for(model)) != key
    fingerprinted = FakeBackend()
    fingerprinted.cache_fingerprint = lambda: "GPU model X, compute 9.0"  # type: ignore[attr-defined]
    assert engine_key(fingerprinted, spec_for(model)) != key
    assert engine_key(backend, spec_for(named(models.mlp(batch=4)))) != key  # input shapes
    assert engine_key(backend, spec_for(named(models.mlp(seed=1)))) != key  # weights

    changed = model.clone()
    w2 = changed.graph.initializers["w2"]
    assert w2.const_value is not None
    array = w2.const_value.numpy().copy()
    array[0, 0] = np.nextafter(array[0, 0], np.float32(np.inf))  # one ulp of one weight
    w2.const_value = ir.Tensor(array, name="w2")
    assert engine_key(backend, spec_for(changed)) != key

    moved = model.clone()
    softmax = next(n for n in moved.graph if n.op_type == "Softmax")
    softmax.attributes["axis"] = ir.AttrInt64("axis", 0)
    assert engine_key(backend, spec_for(moved)) != key  # an attribute


def test_key_does_not_depend_on_where_weights_are_stored(tmp_path: Path) -> None:
    backend = FakeBackend()
    path = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    external = ferry.graph.load_model(path)
    assert isinstance(external.graph.initializers["w1"].const_value, ir.ExternalTensor)
    NameFixPass()(external)
    key = engine_key(backend, spec_for(external))
    assert key == engine_key(backend, spec_for(named(models.mlp())))
    # And the external file's bytes are what is hashed.
    data = path.with_name("ext.onnx.data")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0x01
    data.write_bytes(bytes(raw))
    reloaded = ferry.graph.load_model(path)
    NameFixPass()(reloaded)
    assert engine_key(backend, spec_for(reloaded)) != key


def test_key_covers_subgraph_weights() -> None:
    def with_local_weight(value: float) -> ir.Model:
        proto = models.with_if()
        # Move 'two' from the outer graph into the then-branch: a weight of the subgraph.
        two = next(t for t in proto.graph.initializer if t.name == "two")
        proto.graph.initializer.remove(two)
        then_branch = next(a for a in proto.graph.node[2].attribute if a.name == "then_branch")
        then_branch.g.initializer.append(
            onnx.numpy_helper.from_array(np.array(value, np.float32), "two")
        )
        return named(proto)

    backend = FakeBackend()
    key = engine_key(backend, spec_for(with_local_weight(2.0)))
    assert key == engine_key(backend, spec_for(with_local_weight(2.0)))
    assert key != engine_key(backend, spec_for(with_local_weight(3.0)))


# ---------------------------------------------------------------------------------------------
# The store itself


def test_put_is_atomic_and_idempotent(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    key = "ab" * 32
    path = cache.put(key, b"engine bytes", {"backend": "fake"})
    assert path == tmp_path / "engines" / key
    assert sorted(p.name for p in (tmp_path / "engines").iterdir()) == [key]
    assert cache.put(key, b"engine bytes") == path  # a concurrent writer's twin
    assert sorted(p.name for p in (tmp_path / "engines").iterdir()) == [key]
    assert cache.get(key) == b"engine bytes"
    assert cache.get("cd" * 32) is None
    cache.discard(key)
    assert cache.get(key) is None and not path.exists()
    with pytest.raises(ferry.FerryError, match="not an engine cache key"):
        cache.get("../../etc")


def test_stale_temporary_folders_are_cleared(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    engines = tmp_path / "engines"
    stale = engines / ".tmp-dead-writer"
    fresh = engines / ".tmp-live-writer"
    for d in (stale, fresh):
        d.mkdir(parents=True)
        (d / "engine.bin").write_bytes(b"x")
    long_ago = time.time() - 2 * 3600
    os.utime(stale, (long_ago, long_ago))
    cache.evict()
    assert not stale.exists() and fresh.exists()


def test_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, max_bytes=1 << 40)
    keys = [c * 64 for c in "abcd"]
    for i, key in enumerate(keys[:3]):
        cache.put(key, bytes(1000))
        stamp = 1_000_000 + i  # a, then b, then c, far in the past
        os.utime(cache.path(key) / "meta.json", (stamp, stamp))
    size = max(e.size for e in cache.entries())
    assert 3 * 1000 < cache.size() <= 3 * size
    assert cache.get(keys[0]) is not None  # a is now the most recently used
    cache.max_bytes = 3 * size + size // 2
    cache.put(keys[3], bytes(1000))
    assert [e.key for e in cache.entries()] == [keys[2], keys[0], keys[3]]
    # An entry bigger than the whole cap still stays: it is the one being used.
    cache.max_bytes = 10
    cache.put("e" * 64, bytes(1000))
    assert [e.key for e in cache.entries()] == ["e" * 64]
    cache.clear()
    assert cache.entries() == []


def test_max_bytes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FERRY_CACHE_MAX_BYTES", "12345")
    assert EngineCache(tmp_path).max_bytes == 12345
    monkeypatch.setenv("FERRY_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ferry.FerryError, match="FERRY_CACHE_MAX_BYTES"):
        EngineCache(tmp_path)


def test_entry_meta_is_informative(fake: FakeBackend, cache_dir: Path) -> None:
    ferry.load(models.mlp(), backends="fake", cache_dir=cache_dir, threads=1)
    (entry,) = EngineCache(cache_dir).entries()
    assert entry.meta["options"] == {"threads": 1}
    assert entry.meta["nodes"] == 4
    assert entry.meta["inputs"][0][0] == "x"
    assert dataclasses.asdict(entry)["key"] == entry.path.name
