"""The kit's streaming wake-word detector (microWakeWord ``okay nabu``, TFLite with resource
variables) served with sequence batching: converted by ferry, its variables become ``state:*``
inputs and ``state_out:*`` outputs, which the server keeps per sequence. 8 sequences interleaved
over HTTP give exactly what the converted model gives with the state fed back by hand (the model
has a fixed batch of 1, so each request runs alone: bit-exact)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import kit_models
from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX

pytest.importorskip("uvicorn")
pytest.importorskip("tritonclient.http")

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))
from _sequence_client import by_hand, interleaved, max_difference, stream_over_http

from ferry.serving import ServerThread, create_app

MODEL = "wakeword_int8"
SEQUENCES = 8
CHUNKS = 12


def test_wakeword_streams_through_sequence_batching(tmp_path: Path) -> None:
    import ferry

    model_dir = tmp_path / "repo" / "wakeword" / "1"
    model_dir.mkdir(parents=True)
    path = kit_models.convert(MODEL, model_dir / "model.onnx")
    # The engine the hand-fed reference runs on: the answer must not depend on a learned plan.
    config = {"backends": ["onnxruntime"], "placement": "fixed"}
    (tmp_path / "repo" / "wakeword" / "config.json").write_text(json.dumps(config))
    session = ferry.load(path, backends=["onnxruntime"])
    (name,) = (i["name"] for i in kit_models.entry(MODEL)["inputs"])
    frames = [kit_models.feeds(MODEL, i) for i in range(6)]
    streams = [[frames[(s + k) % 6] for k in range(CHUNKS)] for s in range(SEQUENCES)]
    want = [by_hand(session.run, stream) for stream in streams]  # from the model's own defaults
    app = create_app(tmp_path / "repo")
    with ServerThread(app, host="127.0.0.1", port=0) as server:
        import httpx

        meta = httpx.get(f"{server.url}/v2/models/wakeword").json()
        assert [i["name"] for i in meta["inputs"]] == [name]
        assert not any(o["name"].startswith("state_out:") for o in meta["outputs"])
        ids: list[int | str] = [f"mic-{i}" if i % 2 else i + 1 for i in range(SEQUENCES)]
        got = interleaved(server.url, "wakeword", ids, streams)
        assert max_difference(got, want) == 0.0
        # The answers are all "no wake word" here, so look at the state itself: what the server
        # holds after 5 chunks is what feeding the state back by hand gives.
        stream_over_http(server.url, "wakeword", "open", streams[0][:5], end=False)
        version = app.state.ferry.repository.get("wakeword", None)
        held = version.sequencer._sequences["open"].state
    hand: dict[str, np.ndarray] = {}
    for feeds in streams[0][:5]:
        out = session.run({**feeds, **hand})
        hand = {
            STATE_INPUT_PREFIX + k[len(STATE_OUTPUT_PREFIX) :]: v
            for k, v in out.items()
            if k.startswith(STATE_OUTPUT_PREFIX)
        }
    assert held.keys() == hand.keys() and hand
    for key in hand:
        np.testing.assert_array_equal(held[key], hand[key])
    assert any(np.any(v != 0) for v in hand.values())  # the state did move from its zeros
