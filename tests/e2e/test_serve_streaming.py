"""Two streaming models (a keyword spotter, a voice-activity net: ``ferry.zoo._streaming``, exported
from PyTorch) served with sequence batching: 8 sequences of each model interleaved over HTTP with
``tritonclient.http`` give what ONNX Runtime gives with the state fed back by hand.

The model batches (max_batch_size 8), so concurrent sequences run as one batch: the comparison is
within float tolerance (a batch of 8 may sum its GEMMs in another order than a batch of 1); one
sequence alone runs at batch 1 and is bit-exact.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
pytest.importorskip("tritonclient.http")

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))
from _sequence_client import by_hand, interleaved, max_difference, ort_runner, stream_over_http

from ferry.serving import ServerThread, create_app

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MODELS = ("keyword_spotter", "voice_activity")
SEQUENCES = 8
CHUNKS = 12


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import json

    import onnx_ir as ir

    from ferry.zoo import streaming_model

    path = tmp_path_factory.mktemp("streaming")
    for name in MODELS:
        (path / name / "1").mkdir(parents=True)
        ir.save(streaming_model(name), path / name / "1" / "model.onnx")
        config = {
            "max_batch_size": 8,
            # Long enough that concurrent sequences meet in the queue on a busy 2-core machine.
            "dynamic_batching": {"max_queue_delay_microseconds": 20000},
            "sequence_batching": {"max_sequence_idle_microseconds": 60_000_000},
        }
        (path / name / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Any]:
    with ServerThread(create_app(repo), host="127.0.0.1", port=0) as running:
        yield running


def streams(name: str) -> list[list[dict[str, np.ndarray]]]:
    from ferry.zoo import streaming_inputs

    return [
        [{"audio": a} for a in streaming_inputs(name, CHUNKS, seed=s)] for s in range(SEQUENCES)
    ]


@pytest.mark.parametrize("name", MODELS)
def test_eight_interleaved_streams_equal_feeding_state_by_hand(
    server: Any, repo: Path, name: str
) -> None:
    run = ort_runner(repo / name / "1" / "model.onnx")
    sizes = {"keyword_spotter": {"h": 64}, "voice_activity": {"h": 32, "c": 32}}[name]
    zeros = {f"state:{v}": np.zeros((1, n), np.float32) for v, n in sizes.items()}
    chunks = streams(name)
    want = [by_hand(run, s, zeros) for s in chunks]
    ids: list[int | str] = [f"{name}-{i}" if i % 2 else 1000 + i for i in range(SEQUENCES)]
    stats = f"{server.url}/v2/models/{name}/stats"
    import httpx

    before = httpx.get(stats).json()["model_stats"][0]
    got = interleaved(server.url, name, ids, chunks)
    after = httpx.get(stats).json()["model_stats"][0]
    assert max_difference(got, want) < 1e-5
    assert after["inference_count"] - before["inference_count"] == SEQUENCES * CHUNKS
    assert after["execution_count"] - before["execution_count"] < SEQUENCES * CHUNKS  # batched
    # One sequence alone runs at batch 1: exactly ONNX Runtime's outputs.
    alone = stream_over_http(server.url, name, 77, chunks[0])
    assert max_difference([alone], [want[0]]) == 0.0
