"""``ferry deploy kserve`` on a kit model: the manifest validates in the KServe SDK's types, and
its predictor command (``ferry serve`` on the model copied into the image's build context)
answers Triton's client at the task as ONNX Runtime does on the kit's own file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kit_models
from ferry.deploy import kserve_manifests

pytest.importorskip("starlette")
pytest.importorskip("tritonclient.http")

sys.path.insert(0, str(Path(__file__).parents[1] / "deploy"))
import _kserve_helpers as kh

#: A small image model (6.8 MB): a page's orientation from a photograph.
MODEL = "orientation"


def test_kit_model_deploys_on_kserve(tmp_path: Path) -> None:
    source = kit_models.path(MODEL)
    before = kh.tree_hash(source)
    deployment = kserve_manifests(source, tmp_path / "manifests", wheel=False, cpu="2")
    assert kh.tree_hash(source) == before
    assert deployment.served_models == (source.stem,)

    answer = kh.validate_with_sdk([deployment.manifest_path])[str(deployment.manifest_path)]
    (result,) = answer["results"]
    assert "error" not in result, result.get("error")
    assert result["differences"] == [] and result["equal"] is True
    assert result["predictor"]["readiness"]["path"] == "/v2/health/ready"

    with kh.serve_manifest(deployment.out_dir, tmp_path) as host:
        for index in (0, 1):
            feeds = kit_models.feeds(MODEL, index)
            got = kh.infer(host, source.stem, feeds)
            want = kh.onnxruntime_outputs(source, feeds)
            kit_models.judged(MODEL, "ferry deploy kserve", got, want)
        assert kh.get(f"http://{host}/v2/health/live") == 200
