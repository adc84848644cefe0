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
        "bench", mlp_path, "--device", agent_url, "-n", "5", "--no-isolate", "--json", "-"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["configurations"][0]["error"] is None and data["model"]["path"] == str(mlp_path)
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
        [exe, "agent", "--port", "0", "--token", TOKEN],
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
        code, out, err = ferry(
            "bench", mlp_path, "--device", url, "--token", TOKEN, "-n", "3", "--no-isolate"
        )
        assert code == 0 and "onnxruntime fp32" in out, err
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode in (0, -15)
