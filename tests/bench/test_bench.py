"""ferry.bench: the runner (configurations, feeds, results schema), reports, plots, the latency
interleaver and the Session's partition timer. Real models, short runs: timing *goals* live in
benchmarks/, these check the figures are consistent and describe the run that was asked for."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import ferry
import models
from ferry import bench
from ferry.bench import (
    SCHEMA,
    BenchSpec,
    batch_feeds,
    device_info,
    file_sha256,
    resolve_targets,
    run_bench,
)
from ferry.errors import BackendUnavailableError, FerryError, InvalidInputError
from ferry.parity import DEFAULT_BUDGET
from ferry.plan import Partition, Plan


def _available(name: str) -> bool:
    from ferry.backends import get_backend

    try:
        get_backend(name)
    except BackendUnavailableError:
        return False
    return True


HAS_OPENVINO = _available("openvino")
HAS_TENSORRT = _available("tensorrt")


@pytest.fixture(scope="module")
def local_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One isolated run shared by the schema tests: MLP at batch 1 and 4, with TensorRT asked
    for where it is absent (a failing configuration that must not stop the others)."""
    path = tmp_path_factory.mktemp("bench") / "mlp.onnx"
    onnx.save(models.mlp(), path)
    backends = ("onnxruntime",) if HAS_TENSORRT else ("onnxruntime", "tensorrt")
    spec = BenchSpec(backends=backends, batches=(1, 4), iterations=40, warmup=3)
    stages: list[str] = []
    results = run_bench(path, spec, progress=lambda stage, done, total: stages.append(stage))
    assert "timing" in stages and any(s.startswith("cold start") for s in stages)
    return path, results


def test_results_schema_and_sanity(local_results: tuple[Path, dict[str, Any]]) -> None:
    path, results = local_results
    assert bench.check_results(results) is results
    assert results["schema"] == SCHEMA
    json.dumps(results, allow_nan=False)  # plain JSON: no NaN/inf, no numpy types
    assert results["model"]["sha256"] == file_sha256(path)
    assert results["model"]["inputs"] == [{"name": "x", "shape": ["batch", 16], "dtype": "float32"}]
    assert set(results["device"]) == set(device_info())
    assert results["settings"]["batches"] == [1, 4] and results["settings"]["isolated"]
    timed = [c for c in results["configurations"] if c["error"] is None]
    assert [(c["label"], c["batch"]) for c in timed] == [
        ("onnxruntime fp32", 1),
        ("onnxruntime fp32", 4),
    ]
    for c in timed:
        lat = c["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert lat["min"] <= lat["mean"] <= lat["max"] and lat["std"] >= 0
        q = c["latency_percentiles_ms"]
        assert len(q) == 101 and q == sorted(q) and q[50] == lat["p50"] and q[0] == lat["min"]
        assert c["iterations"] == 40
        assert c["throughput"] == pytest.approx(c["batch"] * 1000 / lat["mean"])
        assert c["inputs"] == {"x": [c["batch"], 16]}
        assert c["baseline"] and c["requested"] and c["fastest"]
        assert c["ratio_to_ort_fp32"]["p50"] == 1.0 and c["ratio_to_ort_fp32"]["throughput"] == 1.0
        assert c["cold_start_s"] > 0 and c["first_run_ms"] > 0
        assert c["warm_start_s"] is None  # ONNX Runtime stores no engine
        # The child's own high-water mark: above what the interpreter and imports took, and far
        # below what a child of this (bigger) test process would report through ru_maxrss.
        assert 0 < c["rss_before_load_mb"] <= c["peak_rss_mb"] < 2048
        assert c["plan"] == {"partitions": 1, "backends": ["onnxruntime"], "chosen": None}
        assert c["partitions"] is None
        # The baseline is the reference: judged against itself, within budget, and the fastest.
        assert c["accuracy"]["passed"] and c["accuracy"]["worst"] == 1.0
        assert {j["kind"] for j in c["accuracy"]["judgements"]} == {"cosine", "argmax_seq"}
        assert c["fastest_within_budget"]
    assert results["settings"]["accuracy"] == {
        "budget": [dict(b) for b in DEFAULT_BUDGET],
        "batch": 1,
        "reference": "onnxruntime fp32",
    }
    # Batch 4 moves 4x the data through the same model: more samples per second than batch 1
    # would be a timing claim; that it has its own inputs is not.
    assert timed[0]["peak_rss_mb"] <= timed[1]["peak_rss_mb"]


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here: nothing fails")
def test_unavailable_engine_is_a_failed_row_not_fatal(
    local_results: tuple[Path, dict[str, Any]],
) -> None:
    rows = [c for c in local_results[1]["configurations"] if c["backend"] == "tensorrt"]
    assert [r["batch"] for r in rows] == [1, 4]
    for row in rows:
        assert "not available" in row["error"] and "ferry[tensorrt]" in row["error"]
        assert row["latency_ms"] is None and row["ratio_to_ort_fp32"] is None
        assert not row["fastest"] and not row["fastest_within_budget"]
        assert row["accuracy"] is None
    assert bench.errors(local_results[1]) == [f"tensorrt fp32: {rows[0]['error']}"]


def test_reports_table_and_csv(local_results: tuple[Path, dict[str, Any]]) -> None:
    from rich.console import Console

    results = local_results[1]
    console = Console(width=200, record=True)
    console.print(bench.table(results))
    text = console.export_text()
    assert "* onnxruntime fp32" in text and "p50 vs ORT" in text and "1.00x" in text
    console = Console(width=80, record=True)
    console.print(bench.table(results, compact=True))
    assert max(len(line) for line in console.export_text().splitlines()) <= 80
    rows = list(csv.DictReader(io.StringIO(bench.to_csv(results))))
    assert len(rows) == len(results["configurations"])
    first, config = rows[0], results["configurations"][0]
    assert float(first["p99_ms"]) == config["latency_ms"]["p99"]
    assert float(first["throughput"]) == config["throughput"]
    assert first["inputs"] == "x=1x16" and first["baseline"] == "True"
    assert first["fastest_within_budget"] == "True" and first["accuracy_passed"] == "True"
    assert float(first["accuracy_worst"]) == 1.0
    # Columns added within schema 1 come last: those read by position stay where they were.
    assert list(rows[0])[-3:] == ["fastest_within_budget", "accuracy_passed", "accuracy_worst"]
    assert "1.00000 ok" in text and "accuracy" in text


def test_no_isolate_and_given_inputs(mlp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    spec = BenchSpec(batches=(2, 5), iterations=5, warmup=1, isolate=False)
    results = run_bench(mlp_path, spec, inputs={"x": x})
    assert results["settings"]["inputs_from"] == {"x": "file"}
    for c in results["configurations"]:
        assert c["inputs"] == {"x": [c["batch"], 16]}
        assert c["cold_start_s"] > 0
        assert c["peak_rss_mb"] is None and c["warm_start_s"] is None
    bench.check_results(results)


def test_batch_feeds_cut_repeat_and_generate() -> None:
    session = ferry.load(models.two_inputs())
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    feeds = batch_feeds(session.inputs, {"a": a}, {}, [2, 5], seed=0)
    assert sorted(feeds) == [2, 5]
    np.testing.assert_array_equal(feeds[2]["a"], a[:2])
    np.testing.assert_array_equal(feeds[5]["a"], a[[0, 1, 2, 0, 1]])
    assert feeds[5]["b"].shape == (5, 4) and feeds[5]["k"].shape == ()
    for batch in (2, 5):  # the model runs on them and gives the right answer
        out = session.run(feeds[batch])
        f = feeds[batch]
        np.testing.assert_allclose(out["sum"], (f["a"] + f["b"]) * f["k"], rtol=1e-6)
    # Without --batch: the batch is the first input's first dim.
    assert list(batch_feeds(session.inputs, {"a": a}, {}, None, seed=0)) == [3]
    fixed = ferry.load(models.mlp(batch=1))
    assert list(batch_feeds(fixed.inputs, {}, {}, [1], seed=0)) == [1]
    with pytest.raises(InvalidInputError, match="no input of this model has a symbolic first"):
        batch_feeds(fixed.inputs, {}, {}, [1, 8], seed=0)
    with pytest.raises(InvalidInputError, match="dim 1 is fixed at 16"):
        batch_feeds(ferry.load(models.mlp()).inputs, {}, {"x": (1, 2)}, [4], seed=0)
    with pytest.raises(InvalidInputError, match="--shape names unknown input 'nope'"):
        batch_feeds(session.inputs, {}, {"nope": (1,)}, None, seed=0)


def test_targets_and_spec_validation() -> None:
    targets = resolve_targets(BenchSpec(backends=("onnxruntime",)))
    assert [(t.backend, t.precision, t.baseline) for t in targets] == [
        ("onnxruntime", "fp32", True)
    ]
    with pytest.raises(InvalidInputError, match="unknown backend 'nosuch'"):
        resolve_targets(BenchSpec(backends=("nosuch",)))
    with pytest.raises(InvalidInputError, match=r"precision 'fp16' is not offered.*fp32"):
        resolve_targets(BenchSpec(backends=("onnxruntime",), precisions=("fp16",)))
    if HAS_OPENVINO:
        targets = resolve_targets(BenchSpec(backends=("openvino",), precisions=("bf16",)))
        assert [(t.label, t.baseline, t.requested) for t in targets] == [
            ("onnxruntime fp32", True, False),
            ("openvino bf16", False, True),
        ]
    spec = BenchSpec(backends=("onnxruntime",), batches=(1, 8), shapes={"x": (1, 16)}, seed=3)
    assert BenchSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert BenchSpec.from_dict({"duration_s": 0.5}).iterations is None
    for bad, message in (
        ({"batches": [0]}, "batches must be positive"),
        ({"iterations": 0}, "iterations must be 1 or more"),
        ({"backends": "onnxruntime"}, "backends must be a list"),
        ({"threads": True}, "threads must be a positive integer"),
        ({"colour": 1}, "unknown bench spec key 'colour'"),
        ([], "must be a JSON object"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            BenchSpec.from_dict(bad)


def test_broken_model_is_a_ferry_error(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not a model at all")
    with pytest.raises(FerryError, match="not a valid ONNX model"):
        run_bench(tmp_path / "bad.onnx", BenchSpec(iterations=2, isolate=False))


@pytest.mark.openvino
@pytest.mark.skipif(not HAS_OPENVINO, reason="OpenVINO is not installed")
def test_split_plan_times_each_partition(mlp_path: Path) -> None:
    spec = BenchSpec(
        backends=("openvino",), precisions=("fp32",), force_cpu=("Softmax",), iterations=30
    )
    results = run_bench(mlp_path, spec)
    row = next(c for c in results["configurations"] if c["backend"] == "openvino")
    assert row["error"] is None, row["error"]
    assert row["plan"]["partitions"] == 2 and row["plan"]["backends"] == ["openvino", "onnxruntime"]
    parts = row["partitions"]
    assert [(p["backend"], p["nodes"]) for p in parts] == [("openvino", 3), ("onnxruntime", 1)]
    # Each partition's time lies inside its call's: their sum cannot exceed the mean latency.
    assert all(p["mean_ms"] > 0 for p in parts)
    assert sum(p["mean_ms"] for p in parts) <= row["latency_ms"]["mean"] * (1 + 1e-9)
    assert row["warm_start_s"] is not None and row["warm_start_s"] > 0  # OpenVINO stores engines
    assert row["ratio_to_ort_fp32"]["p50"] > 0
    assert bench.partition_lines(results)[0].startswith("openvino fp32 batch 1: #0 openvino")


def test_session_partition_timer() -> None:
    plan = Plan(
        (
            Partition("onnxruntime", ("fc1", "relu"), ("x",), ("r",)),
            Partition("onnxruntime", ("fc2", "softmax"), ("r",), ("y",)),
        ),
        ("x",),
        ("y",),
    )
    session = ferry.load(models.mlp(), plan=plan)
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    calls: list[tuple[int, float]] = []
    session.partition_timer = lambda index, seconds: calls.append((index, seconds))
    got = session.run({"x": x})["y"]
    assert [i for i, _ in calls] == [0, 1] and all(s > 0 for _, s in calls)
    import onnxruntime as ort

    want = ort.InferenceSession(models.mlp().SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    session.partition_timer = None
    session.run({"x": x})
    assert len(calls) == 2


def test_interleave_alternates_blocks_and_survives_errors() -> None:
    log: list[str] = []

    def fn(name: str) -> Any:
        return lambda: log.append(name)

    def boom() -> None:
        log.append("c")
        if log.count("c") > 3:
            raise RuntimeError("engine fell over")

    timing: list[bool] = []
    a = bench.Contender(fn("a"), timing=timing.append)
    b = bench.Contender(fn("b"))
    c = bench.Contender(boom)
    bench.interleave([a, b, c], warmup=2, iterations=25, block=10)
    assert len(a.samples_ns) == len(b.samples_ns) == 25
    assert isinstance(c.error, RuntimeError) and len(c.samples_ns) < 25
    calls = [x for x in log if x in "ab"]
    # Warm-up (2 each), then blocks of 1 untimed + 10 timed calls, the order reversing each round.
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:15] == ["a"] * 11 and calls[15:26] == ["b"] * 11
    assert calls[26:37] == ["b"] * 11 and calls[37:48] == ["a"] * 11
    assert timing == [True, False] * 3
    d = bench.Contender(lambda: None)
    bench.interleave([d], warmup=0, iterations=None, duration_s=0.05)
    assert d.timed_ns >= 0.05e9 and len(d.samples_ns) > 1
    stats = bench.summarize_ms([1_000_000, 2_000_000, 3_000_000], batch=2)
    assert stats["latency_ms"]["p50"] == 2.0 and stats["throughput"] == pytest.approx(1000.0)


def _artifact(tmp_path: Path, name: str = "artifact") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    onnx.save(models.mlp(), folder / "model.onnx")
    return folder


def test_save_to_artifact_merges(tmp_path: Path) -> None:
    folder = _artifact(tmp_path)
    (folder / "ferry.json").write_text(json.dumps({"parity": {"passed": True}}))
    results = run_bench(folder, BenchSpec(iterations=3, warmup=0, isolate=False))
    assert results["model"]["name"] == "artifact"
    saved = bench.save_to_artifact(results, folder)
    data = json.loads(saved.read_text())
    assert data["parity"] == {"passed": True} and data["benchmarks"] == [results]
    other = json.loads(json.dumps(results))
    other["device"]["hostname"] = "board-7"
    bench.save_to_artifact(other, folder)
    again = json.loads(json.dumps(results))
    again["created"] = "later"
    bench.save_to_artifact(again, folder)  # same device: replaces its earlier run
    runs = json.loads(saved.read_text())["benchmarks"]
    assert [(r["device"]["hostname"], r["created"]) for r in runs] == [
        ("board-7", results["created"]),
        (results["device"]["hostname"], "later"),
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["ferry.json", "model.onnx"]
    # Created when missing.
    fresh = _artifact(tmp_path, "fresh")
    bench.save_to_artifact(results | {"model": {**results["model"]}}, fresh)
    assert json.loads((fresh / "ferry.json").read_text())["benchmarks"][0]["schema"] == SCHEMA


def test_save_to_artifact_refuses(tmp_path: Path, mlp_path: Path) -> None:
    folder = _artifact(tmp_path)
    results = run_bench(folder, BenchSpec(iterations=2, warmup=0, isolate=False))
    with pytest.raises(FerryError, match="needs an artifact folder"):
        bench.save_to_artifact(results, mlp_path)
    other = _artifact(tmp_path, "other")
    onnx.save(models.mlp(seed=5), other / "model.onnx")
    with pytest.raises(FerryError, match="for another model"):
        bench.save_to_artifact(results, other)
    (folder / "ferry.json").write_text("{not json")
    with pytest.raises(FerryError, match="not valid JSON"):
        bench.save_to_artifact(results, folder)
    assert (folder / "ferry.json").read_text() == "{not json"  # left as it was


def test_plot(tmp_path: Path, local_results: tuple[Path, dict[str, Any]], monkeypatch: Any) -> None:
    pytest.importorskip("matplotlib")
    from ferry.bench import plot_latency

    out = plot_latency(local_results[1], tmp_path / "lat.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lat.png"]
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(BackendUnavailableError, match=r"pip install 'ferry\[plot\]'"):
        plot_latency(local_results[1], tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()


# ---------------------------------------------------------------------------------------------
# Accuracy against ONNX Runtime fp32, and the fastest configuration within the budget


@pytest.fixture
def heavy_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model ONNX Runtime takes ~50 us on, and the made-up engines ``close`` and ``wrong`` that
    answer it from a cache in ~2 us (fake_engines)."""
    import fake_engines

    fake_engines.register(monkeypatch)
    path = tmp_path / "heavy.onnx"
    onnx.save(fake_engines.heavy_model(), path)
    return path


def _by_label(results: dict[str, Any], batch: int) -> dict[str, dict[str, Any]]:
    return {c["label"]: c for c in results["configurations"] if c["batch"] == batch}


def test_fastest_within_budget_is_marked_never_one_outside(heavy_path: Path) -> None:
    spec = BenchSpec(
        backends=("close", "wrong"), batches=(1, 4), iterations=30, warmup=2, isolate=False
    )
    results = run_bench(heavy_path, spec)
    bench.check_results(results)
    json.dumps(results, allow_nan=False)
    for batch in (1, 4):
        rows = _by_label(results, batch)
        base, near, wrong = rows["onnxruntime fp32"], rows["close fp32"], rows["wrong fp32"]
        assert base["accuracy"]["passed"] and base["accuracy"]["worst"] == 1.0
        # close: the argmax kept, cosine just under 1: within the default budget.
        assert near["accuracy"]["passed"] and 0.999 < near["accuracy"]["worst"] < 1.0
        # wrong: the negation, cosine -1, every argmax moved.
        assert not wrong["accuracy"]["passed"] and wrong["accuracy"]["worst"] == pytest.approx(-1)
        failed = {j["kind"] for j in wrong["accuracy"]["judgements"] if not j["passed"]}
        assert failed == {"cosine", "argmax_seq"}
        # Both made-up engines answer from a cache, far faster than ONNX Runtime computes.
        assert (
            max(near["latency_ms"]["p50"], wrong["latency_ms"]["p50"]) < base["latency_ms"]["p50"]
        )
        assert near["fastest_within_budget"]
        assert not wrong["fastest_within_budget"] and not base["fastest_within_budget"]
        assert near["fastest"] or wrong["fastest"]
        assert sum(r["fastest_within_budget"] for r in rows.values()) == 1
    assert bench.outside_budget(results) == [
        "wrong fp32: y: cosine similarity -1.000000 (needs 0.999); "
        "y: argmax positions agree on 0.00% (needs 99.00%)"
    ]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(bench.table(results))
    lines = console.export_text().splitlines()
    assert any(line.startswith("* close fp32") and "ok" in line for line in lines)
    assert not any(line.startswith("* wrong") or line.startswith("* onnx") for line in lines)
    assert any(
        line.startswith(("! wrong fp32", "  wrong fp32")) and "out" in line for line in lines
    )


def test_strict_budget_leaves_the_baseline_the_fastest_within_it(heavy_path: Path) -> None:
    from ferry.parity import parse_budget

    spec = BenchSpec(
        backends=("close",),
        iterations=20,
        warmup=2,
        isolate=False,
        accuracy=tuple(parse_budget("cosine=1.0")),
    )
    results = run_bench(heavy_path, spec)
    assert results["settings"]["accuracy"]["budget"] == [{"kind": "cosine", "min": 1.0}]
    rows = _by_label(results, 1)
    near, base = rows["close fp32"], rows["onnxruntime fp32"]
    assert [j["kind"] for j in near["accuracy"]["judgements"]] == ["cosine"]
    assert not near["accuracy"]["passed"] and near["fastest"]
    assert not near["fastest_within_budget"]
    assert base["fastest_within_budget"] and not base["fastest"]
    assert bench.accuracy_cell(near).endswith(" out")
    assert "cosine >= 1 against onnxruntime fp32 on the batch-1 inputs" in (
        bench.budget_summary(results)
    )


def test_a_configuration_that_fails_to_run_is_not_judged(
    heavy_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fake_engines

    def broken(y: np.ndarray) -> np.ndarray:
        raise RuntimeError("the made-up engine fell over")

    from ferry.backends import _registry

    monkeypatch.setitem(_registry._instances, "close", fake_engines.FakeEngine("close", broken))
    results = run_bench(heavy_path, BenchSpec(backends=("close",), iterations=5, isolate=False))
    row = _by_label(results, 1)["close fp32"]
    assert "fell over" in row["error"] and row["accuracy"] is None
    assert row["latency_ms"] is None and not row["fastest_within_budget"]
    assert _by_label(results, 1)["onnxruntime fp32"]["fastest_within_budget"]


def test_accuracy_spec_validation_and_round_trip() -> None:
    spec = BenchSpec(accuracy=({"kind": "cosine", "min": 0.9995},))
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["accuracy"] == [{"kind": "cosine", "min": 0.9995}]
    assert BenchSpec.from_dict(data) == spec
    # The default budget travels as no key: an agent of an older ferry still takes the spec.
    assert "accuracy" not in BenchSpec().to_dict()
    for bad, message in (
        ({"accuracy": "cosine=0.9"}, "accuracy must be a list of judge specs"),
        ({"accuracy": [{"kind": "nope"}]}, "unknown judge kind 'nope'"),
        ({"accuracy": [{"kind": "cosine", "least": 1}]}, "has no setting 'least'"),
        ({"accuracy": []}, "accuracy: give judge specs"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            BenchSpec.from_dict(bad)
    with pytest.raises(InvalidInputError, match="cannot travel as JSON"):
        BenchSpec(accuracy=({"kind": "custom", "function": lambda g, w: True},))


def test_results_written_before_accuracy_still_read(
    local_results: tuple[Path, dict[str, Any]],
) -> None:
    old = json.loads(json.dumps(local_results[1]))
    del old["settings"]["accuracy"]
    for config in old["configurations"]:
        del config["accuracy"], config["fastest_within_budget"]
    assert bench.check_results(old) is old
    assert all(c["accuracy"] is None for c in old["configurations"])
    assert not any(c["fastest_within_budget"] for c in old["configurations"])
    assert bench.budget_summary(old) == "" and bench.outside_budget(old) == []
    assert bench.accuracy_cell(old["configurations"][0]) == "-"
    broken = json.loads(json.dumps(local_results[1]))
    del broken["configurations"][0]["latency_ms"]
    with pytest.raises(FerryError, match="lacks latency_ms"):
        bench.check_results(broken)


def test_accuracy_cell_never_rounds_up_to_a_threshold() -> None:
    def row(worst: float, passed: bool) -> dict[str, Any]:
        return {"accuracy": {"worst": worst, "passed": passed, "judgements": []}}

    assert bench.accuracy_cell(row(0.9989996, False)) == "0.99899 out"
    assert bench.accuracy_cell(row(1.0, True)) == "1.00000 ok"
    assert bench.accuracy_cell(row(0.99999999, True)) == "0.99999 ok"
    assert bench.accuracy_cell({"accuracy": None}) == "-"
