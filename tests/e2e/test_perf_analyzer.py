"""``ferry serve`` driven by ``perf_analyzer``, Triton's own C++ load generator.

perf_analyzer is a strict client: before it sends a request it reads the model's metadata and
configuration (``max_batch_size``, dims, datatypes) to build its tensors, and around every
measurement window it reads the server-side statistics (``/v2/models/{m}/stats``: queue, compute
input/infer/output) to split the latency it measured. A server it can drive and whose statistics it
can read speaks Triton's protocol as Triton's own tools expect.

perf_analyzer ships in the ``tritonclient==2.41.0`` wheel (PyPI's ``perf-analyzer`` is a
placeholder); ``bash scripts/triton-bench-env.sh`` puts it in ``.venv-triton/bin/perf_analyzer``
(``--perf-analyzer-only`` skips PyTriton), or point ``$FERRY_PERF_ANALYZER`` at one. Without it
these tests skip, saying so. Cheap: a few seconds at concurrency 1 and 8, 0.3 s windows.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import models  # noqa: E402
from ferry.serving import ServerThread, create_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SETUP = "bash scripts/triton-bench-env.sh --perf-analyzer-only"


def _perf_analyzer() -> str:
    """The perf_analyzer to run, or skip saying how to set it up."""
    explicit = os.environ.get("FERRY_PERF_ANALYZER")
    binary = explicit or str(ROOT / ".venv-triton" / "bin" / "perf_analyzer")
    if not Path(binary).exists():
        pytest.skip(
            f"perf_analyzer is not set up ({binary} does not exist): run `{SETUP}` "
            "or set FERRY_PERF_ANALYZER"
        )
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        pytest.skip(f"perf_analyzer at {binary} does not start ({e}): run `{SETUP}`")
    if done.returncode != 0:
        pytest.skip(
            f"perf_analyzer at {binary} does not start (exit {done.returncode}: "
            f"{(done.stdout + done.stderr).strip()[-300:]}): run `{SETUP}`"
        )
    return binary


@pytest.fixture(scope="module")
def perf_analyzer() -> str:
    return _perf_analyzer()


@pytest.fixture(scope="module")
def server(perf_analyzer: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """ferry serve (in a thread) with the MLP twice: batched (dynamic batching) and plain."""
    repo = tmp_path_factory.mktemp("repo")
    configs = {
        "mlp": {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}},
        "mlp_plain": {"max_batch_size": 0},
    }
    for name, config in configs.items():
        (repo / name / "1").mkdir(parents=True)
        onnx.save(models.mlp(), repo / name / "1" / "model.onnx")
        (repo / name / "config.json").write_text(json.dumps(config))
    with ServerThread(create_app(repo), host="127.0.0.1", port=0) as running:
        yield running


def run(
    binary: str, url: str, model: str, concurrency: str, tmp_path: Path, *extra: str
) -> tuple[list[dict[str, str]], str]:
    """perf_analyzer over HTTP; its CSV rows (one per concurrency) and its printed report."""
    report = tmp_path / f"{model}.csv"
    command = [
        binary,
        "-m", model,
        "-u", url.removeprefix("http://"),
        "-i", "http",
        "--concurrency-range", concurrency,
        "--measurement-interval", "300",
        "--max-trials", "10",
        "--stability-percentage", "1000",  # a loaded CI machine: we test the protocol, not speed
        "-f", str(report),
        *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"perf_analyzer failed ({done.returncode}):\n{output[-3000:]}"
    with report.open() as f:
        return list(csv.DictReader(f)), output


def server_sections(output: str) -> list[dict[str, int]]:
    """The counts of each ``Server:`` section perf_analyzer printed (one per concurrency)."""
    sections = []
    for block in output.split("Server:")[1:]:
        counts = {
            key: int(value)
            for key, value in re.findall(
                r"(Inference count|Execution count|Successful request count): (\d+)", block
            )
        }
        sections.append(counts)
    return sections


def test_binary_tensors_at_concurrency_1_and_8(
    perf_analyzer: str, server: Any, tmp_path: Path
) -> None:
    before = httpx.get(f"{server.url}/v2/models/mlp/stats", timeout=10).json()["model_stats"][0]
    rows, output = run(perf_analyzer, server.url, "mlp", "1:8:7", tmp_path)

    assert [int(r["Concurrency"]) for r in rows] == [1, 8]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0
        assert 0 < float(row["p50 latency"]) <= float(row["p99 latency"])
        # perf_analyzer split the latency with the server's statistics: the engine's share shows
        assert float(row["Server Compute Infer"]) > 0
    # It read the server-side statistics around each window: counts, and batching at c=8.
    sections = server_sections(output)
    assert len(sections) == 2, output[-3000:]
    for counts, concurrency in zip(sections, (1, 8), strict=True):
        assert counts["Inference count"] > 0
        # A run is counted when it ends, its request when answered: the snapshots around a
        # window may fall between the two for the requests then in flight.
        gap = counts["Successful request count"] - counts["Inference count"]
        assert abs(gap) <= concurrency
        assert 0 < counts["Execution count"] <= counts["Inference count"]
    assert "Failed" not in output and "error" not in output.lower(), output[-3000:]
    after = httpx.get(f"{server.url}/v2/models/mlp/stats", timeout=10).json()["model_stats"][0]
    measured = sum(c["Inference count"] for c in sections)
    assert after["inference_count"] - before["inference_count"] >= measured
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]


def test_json_tensors_on_a_model_without_batching(
    perf_analyzer: str, server: Any, tmp_path: Path
) -> None:
    """JSON tensors both ways, on a model whose batch dim is its own (max_batch_size 0)."""
    rows, output = run(
        perf_analyzer,
        server.url,
        "mlp_plain",
        "1",
        tmp_path,
        "--shape", "x:1,16",
        "--input-tensor-format", "json",
        "--output-tensor-format", "json",
    )  # fmt: skip
    assert [int(r["Concurrency"]) for r in rows] == [1]
    assert float(rows[0]["Inferences/Second"]) > 0
    (counts,) = server_sections(output)
    assert counts["Execution count"] == counts["Inference count"] > 0  # no batching
