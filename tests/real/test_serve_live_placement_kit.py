"""Live placement in ``ferry serve`` under Triton's client (issue 32): the captcha CRNN
(``input1 [1, 1, 64, image_width]``) served on OpenVINO and ONNX Runtime with no sizes given, two
instances, driven by ``tritonclient.http`` with a bounded number of concurrent requests of real
lines at two widths.

Every answer, while it learns and after, is judged against ONNX Runtime at the kit's judge; the
learning instance decides each width (switch, or stay with both figures) within a bounded number
of calls, the other instance ends on the same plan, and ``/metrics`` and the model's statistics
show it.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as http
from tritonclient.utils import np_to_triton_dtype

import kit_models
from ferry.serving import ServerThread, create_app

MID = "captcha_ocr"
#: Requests in flight at once, and the most sent before every width must be decided.
CONCURRENCY, ROUND, MAX_CALLS = 4, 8, 600


def test_served_live_placement_decides_each_width_under_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("openvino")
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))
    source = kit_models.path(MID)
    repo = tmp_path / "repo"
    (repo / MID / "1").mkdir(parents=True)
    shutil.copyfile(source, repo / MID / "1" / "model.onnx")  # the kit is read-only
    (repo / MID / "config.json").write_text('{"instance_group": [{"count": 2}]}')
    wide = kit_models.feeds(MID)
    (name,) = wide
    # A real line cropped to half its width: a second bucket of real data.
    narrow = {name: np.ascontiguousarray(wide[name][..., : wide[name].shape[-1] // 2])}
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in reference.get_outputs()]
    want = [dict(zip(outputs, reference.run(outputs, f), strict=True)) for f in (wide, narrow)]

    with ServerThread(create_app(repo, backends="openvino,onnxruntime"), port=0) as server:
        url = server.url.removeprefix("http://")
        client = http.InferenceServerClient(url, concurrency=CONCURRENCY)
        try:
            sent, decided_at = 0, None
            while sent < MAX_CALLS:
                _round(client, [wide, narrow], want, outputs)
                sent += ROUND
                placement = _placement(client)
                states = [b["state"] for b in placement["buckets"]]
                if len(states) == 2 and all(
                    s.startswith(("switched", "on onnxruntime")) for s in states
                ):
                    decided_at = sent
                    break
                time.sleep(0.2)
            assert decided_at is not None, f"undecided after {sent} calls: {placement}"
            time.sleep(2.0)  # the other instance adopts on the learner's thread
            for _ in range(2):  # both instances, on what was decided
                _round(client, [wide, narrow], want, outputs)
            placement = _placement(client)
        finally:
            client.close()
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text

    buckets = {str(b["bucket"]): b for b in placement["buckets"]}
    assert len(buckets) == 2, placement
    for bucket in buckets.values():
        # Switched, or stayed on ONNX Runtime because the plan measured slower: with figures.
        assert bucket["state"].startswith(("switched", "on onnxruntime (no plan is")), bucket
        assert bucket["plan_ms"] and bucket["alone_ms"] and bucket["speedup"], bucket
    for instance in placement["instances"]:
        assert {str(b["bucket"]): b["plan"] for b in instance} == {
            k: b["plan"] for k, b in buckets.items()
        }, placement["instances"]
    switched = [b for b in buckets.values() if b["state"].startswith("switched")]
    for bucket in switched:
        assert re.search(
            rf'ferry_placement_switches_total\{{model="{MID}",plan="{re.escape(bucket["plan"])}",'
            rf'version="1"\}} [1-9]',
            metrics,
        ), metrics
    for bucket in buckets.values():
        dims = bucket["bucket"][name]
        label = f'bucket="{name}={"x".join(map(str, dims))}",model="{MID}",version="1"'
        assert f"ferry_placement_measured_speedup{{{label}}}" in metrics, metrics
        assert f"ferry_placement_speedup{{{label}}}" in metrics, metrics
    print(
        f"\n{MID} under ferry serve: decided after {decided_at} calls; "
        + "; ".join(
            f"{b['bucket'][name]}: {b['plan']} {b['plan_ms']:.2f} ms vs ONNX Runtime "
            f"{b['alone_ms']:.2f} ms ({b['speedup']:.2f}x), {b['state']}"
            for b in buckets.values()
        )
    )


def _round(
    client: Any, feeds: list[dict[str, np.ndarray]], want: list[dict[str, Any]], outputs: list[str]
) -> None:
    """:data:`ROUND` requests, the widths alternating, :data:`CONCURRENCY` in flight; each
    answer judged against ONNX Runtime's."""
    pending = []
    for i in range(ROUND):
        which = i % len(feeds)
        inputs = []
        for key, array in feeds[which].items():
            tensor = http.InferInput(key, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        asked = [http.InferRequestedOutput(o, binary_data=True) for o in outputs]
        pending.append((which, client.async_infer(MID, inputs, outputs=asked)))
    for which, request in pending:
        result = request.get_result(timeout=300)
        got = {o: result.as_numpy(o) for o in outputs}
        kit_models.judged(MID, "ferry serve, live placement", got, want[which])


def _placement(client: Any) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics(MID)["model_stats"]
    assert "inference_stats" in stats  # Triton's shape, as tritonclient parses it
    return stats["placement"]
