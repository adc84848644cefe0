"""``ferry convert`` on the kit's Paddle inference models, judged against Paddle's own inference.

Each model is converted through the CLI with a kit input as its example (so the converter's own
parity check runs on realistic data), then the written file is run with ``ferry.load`` on two
kit inputs and judged at the task (kit.json) against ``paddle.inference`` run in the Paddle
Python by ``paddle_reference`` (independently of the converter's reference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import ferry
import kit_models
from ferry.cli.main import cli
from paddle_reference import paddle_outputs

pytestmark = pytest.mark.paddle

PADDLE_IDS = kit_models.ids("paddle")


@pytest.fixture(scope="module", params=PADDLE_IDS)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(model id, the ONNX file ``ferry convert`` wrote, its parity report as JSON)."""
    mid = request.param
    if not kit_models.kit_ready():
        pytest.skip("the real-model kit is not fetched: run scripts/fetch-kit.sh")
    work = tmp_path_factory.mktemp(mid)
    args = ["convert", str(kit_models.path(mid)), "-o", str(work / "model.onnx")]
    for name, value in kit_models.feeds(mid, 0).items():
        np.save(work / f"{name}.npy", value)
        args += ["--example-input", f"{name}={work / f'{name}.npy'}"]
    args += ["--report", str(work / "report.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, f"{mid}: {result.output}"
    assert "Traceback" not in result.output
    report = json.loads((work / "report.json").read_text())
    return mid, work / "model.onnx", report


def test_convert_writes_a_model_that_passed_its_parity_check(converted: Any) -> None:
    mid, out, report = converted
    assert out.is_file() and out.stat().st_size > 0
    parity = report["parity"]
    assert report["converter"] == "paddle"
    assert parity["passed"] and parity["skipped"] is None, parity
    # The check ran on the kit input, at the kit's shape.
    want = {i["name"]: i["shape"] for i in kit_models.entry(mid)["inputs"]}
    assert parity["inputs"] == want


@pytest.mark.parametrize("index", [0, 1])
def test_converted_model_matches_paddle_inference(converted: Any, index: int) -> None:
    mid, out, _ = converted
    feeds = kit_models.feeds(mid, index)
    got = ferry.load(out).run(feeds)
    want = paddle_outputs(kit_models.path(mid), feeds)
    assert [np.shape(v) for v in got.values()] == [np.shape(v) for v in want.values()]
    verdicts = kit_models.judged(mid, "convert", got, want)
    assert verdicts


def test_info_reads_the_converted_model(converted: Any) -> None:
    mid, out, _ = converted
    result = CliRunner().invoke(cli, ["info", str(out), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    entry = kit_models.entry(mid)
    assert [i["name"] for i in info["inputs"]] == [i["name"] for i in entry["inputs"]]
    assert len(info["outputs"]) == len(entry["outputs"])
    assert info["param_count"] > 0  # Paddle's weights, though paddle2onnx wrote Constant nodes


def test_a_failed_parity_check_writes_nothing(tmp_path: Path) -> None:
    # A tolerance no float32 conversion meets: a clean one-line error, and no file at all.
    mid = "ppocr_rec_paddle"
    np.save(tmp_path / "x.npy", kit_models.feeds(mid, 0)["x"])
    out = tmp_path / "model.onnx"
    args = ["convert", str(kit_models.path(mid)), "-o", str(out)]
    args += ["--example-input", f"x={tmp_path / 'x.npy'}", "--tolerance", "0,0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    message = result.stderr
    assert "parity FAILED" in message and "Traceback" not in message
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "x.npy"], "a partial output was left behind"
