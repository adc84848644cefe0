"""``ferry serve --grpc-port`` on kit models: Triton's gRPC client (unary and streaming) answers at
the task as ONNX Runtime does on the kit's own files, and perf_analyzer ``-i grpc`` drives it (when
set up: ``bash scripts/triton-bench-env.sh --perf-analyzer-only`` or ``$FERRY_PERF_ANALYZER``)."""

from __future__ import annotations

import csv
import os
import queue
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import kit_models
from ferry.serving import GrpcServer, ServerThread, create_app

pytest.importorskip("starlette")
tgrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import np_to_triton_dtype  # noqa: E402

#: An image classifier (a page's orientation) and a text recognizer (a captcha's characters).
MODELS = ["orientation", "captcha_ocr"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    repo = tmp_path_factory.mktemp("repository")
    for mid in MODELS:
        (repo / mid / "1").mkdir(parents=True)
        shutil.copyfile(kit_models.path(mid), repo / mid / "1" / "model.onnx")
    app = create_app(repo)
    with ServerThread(app, port=0), GrpcServer(app, port=0) as server:
        yield server


def _inputs(feeds: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, array in feeds.items():
        tensor = tgrpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _reference(mid: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(kit_models.path(mid)), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@pytest.mark.parametrize("mid", MODELS)
def test_grpc_answers_match_onnxruntime(served: GrpcServer, mid: str) -> None:
    client = tgrpc.InferenceServerClient(served.address)
    try:
        assert client.is_server_ready() and client.is_model_ready(mid)
        outputs = [o.name for o in client.get_model_metadata(mid).outputs]
        config = client.get_model_config(mid).config
        assert [i.name for i in config.input] == list(kit_models.feeds(mid, 0))
        answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(lambda result, error: answers.put((result, error)))
        for index in (0, 1):
            feeds = kit_models.feeds(mid, index)
            want = _reference(mid, feeds)
            result = client.infer(mid, _inputs(feeds))
            kit_models.judged(
                mid, "ferry serve (gRPC)", {o: result.as_numpy(o) for o in outputs}, want
            )
            client.async_stream_infer(mid, _inputs(feeds), request_id=str(index))
            streamed, error = answers.get(timeout=120)
            assert error is None, error
            got = {o: streamed.as_numpy(o) for o in outputs}
            kit_models.judged(mid, "ferry serve (gRPC stream)", got, want)
        client.stop_stream()
    finally:
        client.close()


def test_perf_analyzer_drives_grpc(served: GrpcServer, tmp_path: Path) -> None:
    binary = os.environ.get("FERRY_PERF_ANALYZER") or str(ROOT / ".venv-triton/bin/perf_analyzer")
    if not Path(binary).exists():
        pytest.skip(
            f"perf_analyzer is not set up ({binary} does not exist): run `bash "
            "scripts/triton-bench-env.sh --perf-analyzer-only` or set FERRY_PERF_ANALYZER"
        )
    report = tmp_path / "grpc.csv"
    command = [
        binary,
        "-m", "orientation",
        "-u", served.address,
        "-i", "grpc",
        "--concurrency-range", "1:4:3",
        "--measurement-interval", "500",
        "--max-trials", "6",
        "--stability-percentage", "1000",  # a busy machine: the protocol is tested, not speed
        "-f", str(report),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"perf_analyzer failed ({done.returncode}):\n{output[-3000:]}"
    with report.open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["Concurrency"]) for r in rows] == [1, 4], output[-3000:]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0
        # It split the latency with the statistics it read over gRPC (ModelStatistics).
        assert float(row["Server Compute Infer"]) > 0
    assert "Failed" not in output and "error" not in output.lower(), output[-3000:]
