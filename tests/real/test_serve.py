"""``ferry serve`` on a repository of every kit model, driven by Triton's own client, judged at
the task against ONNX Runtime on the same files."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as http
from tritonclient.utils import np_to_triton_dtype

import kit_models
from ferry._state_names import STATE_OUTPUT_PREFIX
from ferry.serving import ServerThread, create_app

ALL = kit_models.tensor_ids()  # the generative (GGUF) models have verbs of their own


@pytest.fixture(scope="module")
def server(
    onnx_file: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("repository")
    for mid in ALL:
        (repo / mid / "1").mkdir(parents=True)
        shutil.copyfile(onnx_file(mid), repo / mid / "1" / "model.onnx")
    with ServerThread(create_app(repo), port=0) as running:
        yield running


_SEQUENCES = itertools.count(1)


def _infer(url: str, mid: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = http.InferenceServerClient(url.removeprefix("http://"))
    try:
        inputs = []
        for name, array in feeds.items():
            tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        metadata: Any = client.get_model_metadata(mid)
        outputs = [
            http.InferRequestedOutput(o["name"], binary_data=True) for o in metadata["outputs"]
        ]
        # A streaming model (state:* inputs) is served with sequence batching, as Triton's
        # implicit state: each call is then a sequence of one request, from the initial state,
        # which ONNX Runtime computes when the state inputs are left out.
        stateful = "sequence_batching" in client.get_model_config(mid)
        sequence = {"sequence_id": next(_SEQUENCES), "sequence_start": True, "sequence_end": True}
        result = client.infer(mid, inputs, outputs=outputs, **(sequence if stateful else {}))
        return {o["name"]: result.as_numpy(o["name"]) for o in metadata["outputs"]}
    finally:
        client.close()


def test_every_kit_model_is_ready(server: ServerThread) -> None:
    client = http.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        assert client.is_server_ready()
        index = {m["name"]: m for m in client.get_model_repository_index()}
        not_ready = {m: index[m].get("reason") for m in ALL if index[m]["state"] != "READY"}
        assert not not_ready, not_ready
    finally:
        client.close()


@pytest.mark.parametrize("mid", ALL)
def test_served_outputs_match_onnxruntime(
    server: ServerThread, mid: str, onnx_file: Callable[[str], Path]
) -> None:
    session = ort.InferenceSession(str(onnx_file(mid)), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        # A stateful model's served answer leaves its state out (the server keeps it).
        want = {
            name: value
            for name, value in zip(names, session.run(names, feeds))
            if not name.startswith(STATE_OUTPUT_PREFIX)
        }
        kit_models.judged(mid, "ferry serve", _infer(server.url, mid, feeds), want)
