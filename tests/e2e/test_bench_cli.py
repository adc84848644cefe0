"""``ferry bench`` and ``ferry agent`` from the command line: outputs, files, errors, a device."""

from __future__ import annotations

import csv
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import models
from ferry.cli.main import cli

TOKEN = "cli-s3cret"


def ferry(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_bench_json(mlp_path: Path) -> None:
    code, out, _ = ferry(
        "bench", mlp_path, "-n", "30", "--warmup", "2", "--shape", "x=4x16", "--json", "-"
    )
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "ferry.bench/1"
    [row] = data["configurations"]
    assert row["iterations"] == 30 and row["batch"] == 4 and row["inputs"] == {"x": [4, 16]}
    lat = row["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert row["throughput"] > 0 and row["plan"]["backends"] == ["onnxruntime"]
    assert row["accuracy"]["passed"] and row["accuracy"]["worst"] == 1.0
    assert row["fastest"] and row["fastest_within_budget"]
    assert data["settings"]["accuracy"]["budget"] == [
        {"kind": "cosine", "min": 0.999},
        {"kind": "argmax_seq", "min_agreement": 0.99},
    ]


def test_bench_table_duration_threads(mlp_path: Path) -> None:
    code, out, _ = ferry("bench", mlp_path, "--duration", "0.2", "--threads", "1", "--no-isolate")
    assert code == 0 and "* onnxruntime fp32" in out and "p99" in out
    assert "threads: 1" in out and "device:" in out
    assert "Traceback" not in out


def test_bench_files_batches_and_inputs(tmp_path: Path, mlp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = ferry(
        "bench",
        mlp_path,
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--batch",
        "1,3",
        "-n",
        "10",
        "--warmup",
        "1",
        "--json",
        tmp_path / "r.json",
        "--csv",
        tmp_path / "r.csv",
        "--plot",
        tmp_path / "r.png",
    )
    assert code == 0, err
    data = json.loads((tmp_path / "r.json").read_text())
    assert [(c["batch"], c["inputs"]["x"]) for c in data["configurations"]] == [
        (1, [1, 16]),
        (3, [3, 16]),
    ]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["batch"] for r in rows] == ["1", "3"]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert "onnxruntime fp32" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mlp.onnx",
        "r.csv",
        "r.json",
        "r.png",
        "x.npy",
    ]


def test_bench_csv_to_stdout(mlp_path: Path) -> None:
    code, out, _ = ferry("bench", mlp_path, "-n", "5", "--no-isolate", "--csv", "-")
    assert code == 0
    rows = list(csv.DictReader(out.splitlines()))
    assert len(rows) == 1 and rows[0]["label"] == "onnxruntime fp32"


def test_bench_save_report(tmp_path: Path, mlp_path: Path) -> None:
    folder = tmp_path / "artifact"
    folder.mkdir()
    onnx.save(models.mlp(), folder / "model.onnx")
    code, out, _ = ferry("bench", folder, "-n", "5", "--no-isolate", "--save-report")
    assert code == 0 and "results saved in" in out
    report = json.loads((folder / "ferry.json").read_text())
    assert report["benchmarks"][0]["configurations"][0]["label"] == "onnxruntime fp32"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch takes positive integers"),
        (["--batch", "1,x"], "--batch takes positive integers"),
        (["--shape", "x=1x2"], "dim 1 is fixed at 16"),
        (["--shape", "x=1x?"], "bad shape"),
        (["--shape", "nope=1x16"], "--shape names unknown input 'nope'"),
        (["--precision", "fp16"], "precision 'fp16' is not offered"),
        (["--precision", "fp32,,bf16"], "--precision takes names joined by commas"),
        (["--backends", "nosuch"], "unknown backend 'nosuch'"),
        (["--accuracy", "nope=0.9"], "unknown measure 'nope'"),
        (["--accuracy", "cosine=2"], "the value must be a number in [0, 1]"),
        (["--accuracy", ""], "--accuracy is empty"),
        (["--backends", ""], "--backends takes names"),
        (["--input", "x={tmp}/missing.npy"], "input file for 'x' not found"),
        (["--save-report"], "--save-report needs an artifact folder"),
        (["--device", "http://127.0.0.1:9", "--token", "t"], "cannot reach the ferry agent"),
        (["--device", "ftp://host", "--token", "t"], "takes the agent's URL"),
        (["--device", "http://127.0.0.1:9"], "--device needs the agent's token"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    tmp_path: Path, mlp_path: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FERRY_AGENT_TOKEN", raising=False)
    argv = ["bench", str(mlp_path), "-n", "2", *(a.format(tmp=tmp_path) for a in args)]
    code, out, err = ferry(*argv)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.fixture
def agent_url() -> Iterator[str]:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from ferry.bench import create_agent_app
    from ferry.serving import ServerThread

    running = ServerThread(create_agent_app(TOKEN, max_upload_bytes=1 << 20), port=0).start()
    try:
        yield running.url
    finally:
        running.stop()


def test_bench_on_a_device(agent_url: str, mlp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_AGENT_TOKEN", TOKEN)
    code, out, err = ferry(
        "bench", mlp_path, "--device", agent_url, "-n", "5", "--no-isolate", "--json", "-",
        "--accuracy", "cosine=0.99",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["configurations"][0]["error"] is None and data["model"]["path"] == str(mlp_path)
    # The budget travelled with the spec and was judged there.
    assert data["settings"]["accuracy"]["budget"] == [{"kind": "cosine", "min": 0.99}]
    (row,) = data["configurations"]
    assert [j["kind"] for j in row["accuracy"]["judgements"]] == ["cosine"]
    assert row["fastest_within_budget"]
    code, out, err = ferry("bench", mlp_path, "--device", agent_url, "--token", "wrong")
    assert code == 2 and "refused the token (401)" in err and err.count("\n") == 1
    code, out, err = ferry("bench", mlp_path, "--device", agent_url, "--precision", "int3")
    assert code == 2 and "refused the job (400)" in err and "'int3'" in err


def test_agent_command(tmp_path: Path, mlp_path: Path) -> None:
    code, out, _ = ferry("agent", "--help")
    assert code == 0 and "--token" in out and "Bearer" in out
    result = CliRunner().invoke(cli, ["agent"], env={"FERRY_AGENT_TOKEN": ""})
    assert result.exit_code == 2 and "Missing option '--token'" in result.stderr
    # The real command, as a process on a free port: it answers and stops on SIGTERM.
    exe = Path(sys.executable).parent / "ferry"
    proc = subprocess.Popen(
        [
            exe,
            "agent",
            "--port",
            "0",
            "--token",
            TOKEN,
            "--job-memory",
            "2048",
            "--max-unpack-ratio",
            "50",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        with selectors.DefaultSelector() as sel:  # bounded: never block on a silent process
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + 60
            while "listening on" not in seen and time.monotonic() < deadline:
                if sel.select(timeout=1):
                    chunk = os.read(proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    seen += chunk.decode()
        url = seen.split("listening on ")[-1].split()[0] if "listening on" in seen else ""
        assert url.startswith("http://127.0.0.1:"), seen
        import httpx

        limits = httpx.get(f"{url}/agent", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert limits["job_memory_bytes"] == 2048 << 20
        assert limits["max_unpack_ratio"] == 50
        code, out, err = ferry(
            "bench", mlp_path, "--device", url, "--token", TOKEN, "-n", "3", "--no-isolate"
        )
        assert code == 0 and "onnxruntime fp32" in out, err
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode in (0, -15)


@pytest.fixture
def heavy_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/bench's made-up engines (``close``: within the default budget, just outside
    ``cosine=1``; ``wrong``: outside any), both far faster than ONNX Runtime on this model."""
    monkeypatch.syspath_prepend(Path(__file__).resolve().parents[1] / "bench")
    import fake_engines

    fake_engines.register(monkeypatch)
    path = tmp_path / "heavy.onnx"
    onnx.save(fake_engines.heavy_model(), path)
    return path


def _rows(out: str) -> dict[str, dict[str, Any]]:
    return {c["label"]: c for c in json.loads(out)["configurations"]}


def test_bench_marks_the_fastest_within_the_budget(heavy_path: Path) -> None:
    args = ["bench", heavy_path, "--backends", "close,wrong", "-n", "20", "--no-isolate"]
    code, out, err = ferry(*args, "--json", "-")
    assert code == 0, err
    rows = _rows(out)
    assert rows["close fp32"]["fastest_within_budget"] and rows["close fp32"]["accuracy"]["passed"]
    assert not rows["wrong fp32"]["fastest_within_budget"]
    assert not rows["wrong fp32"]["accuracy"]["passed"]
    code, out, err = ferry(*args)
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.startswith("* close fp32") and line.endswith(" ok") for line in lines), out
    assert any("wrong fp32" in line and line.endswith(" out") for line in lines), out
    assert "outside the accuracy budget wrong fp32: y: cosine similarity -1.000000" in out
    assert "* = fastest p50 within the accuracy budget" in out
    assert "cosine >= 0.999, argmax_seq >= 0.99 against onnxruntime fp32" in out


def test_bench_strict_accuracy_is_never_marked_outside_it(heavy_path: Path) -> None:
    args = ["bench", heavy_path, "--backends", "close", "-n", "20", "--no-isolate"]
    code, out, err = ferry(*args, "--accuracy", "cosine=1.0", "--json", "-")
    assert code == 0, err
    rows = _rows(out)
    near, base = rows["close fp32"], rows["onnxruntime fp32"]
    assert near["fastest"] and not near["accuracy"]["passed"]
    assert not near["fastest_within_budget"]
    assert base["fastest_within_budget"] and not base["fastest"]
    code, out, err = ferry(*args, "--accuracy", "cosine=1.0")
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.startswith("! close fp32") and line.endswith(" out") for line in lines), out
    assert any(line.startswith("* onnxruntime fp32") for line in lines), out


@pytest.mark.openvino
def test_bench_openvino_precisions_accuracy(mlp_path: Path) -> None:
    pytest.importorskip("openvino")
    code, out, err = ferry(
        "bench", mlp_path, "--backends", "openvino", "--precision", "fp32,bf16",
        "--batch", "1,4", "-n", "20", "--no-isolate", "--json", "-",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    for batch in (1, 4):
        rows = [c for c in data["configurations"] if c["batch"] == batch]
        assert {r["label"] for r in rows} == {"onnxruntime fp32", "openvino fp32", "openvino bf16"}
        for row in rows:
            assert row["error"] is None, row["error"]
            accuracy = row["accuracy"]
            assert accuracy["passed"] == all(j["passed"] for j in accuracy["judgements"])
            assert accuracy["worst"] == min(j["score"] for j in accuracy["judgements"])
        # An MLP in fp32 on another engine: the same answers to float rounding.
        assert next(r for r in rows if r["label"] == "openvino fp32")["accuracy"]["passed"]
        within = [r for r in rows if r["accuracy"]["passed"]]
        (marked,) = [r for r in rows if r["fastest_within_budget"]]
        assert marked is min(within, key=lambda r: r["latency_ms"]["p50"])
