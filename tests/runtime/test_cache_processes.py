"""The engine cache shared by processes: four processes loading one model at once on OpenVINO
compile it once (the others wait on the key's lock and load the stored engine), and leave one
complete entry. Ray Serve replicas on one node share the cache this way."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import models

pytest.importorskip("openvino")
pytestmark = pytest.mark.openvino

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np
    import ferry
    from ferry.backends import get_backend

    model, cache, start, out = sys.argv[1:]
    get_backend("openvino")  # imported before the start line, so that the loads overlap
    while time.time() < float(start):  # all four begin together
        time.sleep(0.001)
    session = ferry.load(model, backends="openvino", cache_dir=cache)
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    y = session.run({"x": x})
    Path(out).write_text(json.dumps({
        "origins": session.engine_origins,
        "y": {k: v.tolist() for k, v in y.items()},
    }))
    """
)


def _run_four(script: str, args: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``script`` in four processes (``python -c script *args OUT``) and read their JSON."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args, str(tmp_path / f"{i}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
    return [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(4)]


def test_four_processes_compile_once_and_share_one_entry(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), model)
    cache = tmp_path / "cache"
    start = time.time() + 6.0  # after the four interpreters have imported ferry and OpenVINO
    results = _run_four(WORKER, [str(model), str(cache), str(start)], tmp_path)
    origins = sorted(o for r in results for o in r["origins"])
    assert origins == ["compiled", "loaded", "loaded", "loaded"], origins
    entries = [p for p in (cache / "engines").iterdir() if len(p.name) == 64]
    assert len(entries) == 1
    assert sorted(f.name for f in entries[0].iterdir()) == ["engine.bin", "meta.json"]
    leftovers = [p.name for p in (cache / "engines").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []
    first = results[0]["y"]
    for other in results[1:]:
        for name, value in first.items():
            np.testing.assert_array_equal(np.array(other["y"][name]), np.array(value))


def test_eviction_passes_over_an_entry_being_read(tmp_path: Path) -> None:
    from ferry.runtime import EngineCache

    cache = EngineCache(tmp_path, max_bytes=10**9)
    keys = [f"{i:064x}" for i in range(3)]
    for key in keys:
        cache.put(key, key.encode() * 100)
    cache.max_bytes = 0
    with cache._hold(keys[0], exclusive=False):  # a reader in the middle of get()
        removed = cache.evict()
    assert sorted(removed) == keys[1:]
    assert cache.get(keys[0]) == keys[0].encode() * 100
    assert cache.evict() == [keys[0]]


STRESS = textwrap.dedent(
    """
    import hashlib, json, random, sys, time
    from ferry.runtime import EngineCache

    root, until, out = sys.argv[1:]
    cache = EngineCache(root, max_bytes=6 * 200_000)  # room for about 6 of the 12 entries
    rng = random.Random(out)  # each process its own sequence
    stats = {"puts": 0, "hits": 0, "misses": 0, "wrong": 0}
    def blob(i):
        return hashlib.sha256(str(i).encode()).digest() * (200_000 // 32)
    while time.time() < float(until):
        i = rng.randrange(12)
        key = hashlib.sha256(f"entry {i}".encode()).hexdigest()
        got = cache.get(key)
        if got is None:
            stats["misses"] += 1
            with cache.building(key):
                if cache._read(key) is None:
                    cache.put(key, blob(i))
                    stats["puts"] += 1
        elif got == blob(i):
            stats["hits"] += 1
        else:
            stats["wrong"] += 1
    open(out, "w").write(json.dumps(stats))
    """
)


def test_four_processes_reading_writing_and_evicting_never_see_a_torn_entry(
    tmp_path: Path,
) -> None:
    until = time.time() + 8.0
    stats = _run_four(STRESS, [str(tmp_path), str(until)], tmp_path)
    assert sum(s["wrong"] for s in stats) == 0, stats
    assert sum(s["hits"] for s in stats) > 50, stats
    assert sum(s["puts"] for s in stats) > 12, stats  # entries were evicted and rebuilt
    from ferry.runtime import EngineCache

    cache = EngineCache(tmp_path)
    for entry in cache.entries():  # what is left is whole
        assert cache.get(entry.key) is not None
    assert not [p for p in (tmp_path / "engines").iterdir() if p.name.startswith(".tmp-")]
