"""``ferry serve --isolate`` on a kit model: its instances run in worker processes (the image
travels through shared memory) and answer at the task as the same server answers in-process."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from starlette.testclient import TestClient

import kit_models
from ferry.serving import create_app, datatype_of

#: A small image model (6.8 MB): a page's orientation from a photograph.
MODEL = "orientation"


def answers(source: Path, isolate: bool, feeds: list[dict[str, np.ndarray]]) -> list[Any]:
    with TestClient(create_app(source, isolate=isolate)) as client:
        deadline = time.monotonic() + 300
        while client.get("/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/v2/health/ready").text
            time.sleep(0.1)
        version = client.app.state.ferry.repository.get(source.stem)
        assert (version.loaded.isolation is not None) == isolate
        out = []
        for feed in feeds:
            body = {
                "inputs": [
                    {
                        "name": name,
                        "datatype": datatype_of(array.dtype),
                        "shape": list(array.shape),
                        "data": array.ravel().tolist(),
                    }
                    for name, array in feed.items()
                ]
            }
            response = client.post(f"/v2/models/{source.stem}/infer", json=body)
            assert response.status_code == 200, response.text
            out.append(
                {
                    o["name"]: np.array(o["data"]).reshape(o["shape"])
                    for o in response.json()["outputs"]
                }
            )
        return out


def test_an_isolated_kit_model_answers_as_in_process(tmp_path: Path) -> None:
    source = tmp_path / f"{MODEL}.onnx"
    shutil.copyfile(kit_models.path(MODEL), source)
    feeds = [kit_models.feeds(MODEL, index) for index in (0, 1)]
    assert all(a.nbytes >= 1 << 16 for feed in feeds for a in feed.values())  # shared memory
    in_process = answers(source, False, feeds)
    isolated = answers(source, True, feeds)
    for got, want in zip(isolated, in_process):
        kit_models.judged(MODEL, "ferry serve --isolate", got, want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
