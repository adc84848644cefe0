"""Every verb on every kit model, judged at the task against ONNX Runtime on the same ONNX file.

ONNX kit models are used as shipped; the others as ``ferry convert`` makes them (their
conversion itself is judged against their own framework in ``test_convert_*``). The reference
is a plain ``onnxruntime.InferenceSession`` on that file, on the kit's realistic inputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import ferry
import kit_models
from ferry.cli.main import cli

ALL = kit_models.tensor_ids()  # the generative (GGUF) models have verbs of their own
ONNX_OF = Callable[[str], Path]


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs from ONNX Runtime itself."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def ferry_cli(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def save_feeds(feeds: dict[str, np.ndarray], folder: Path) -> list[str]:
    """``--input NAME=FILE.npy`` arguments for ``feeds``."""
    args = []
    for i, (name, array) in enumerate(feeds.items()):
        file = folder / f"input{i}.npy"
        np.save(file, array)
        args += ["--input", f"{name}={file}"]
    return args


@pytest.mark.parametrize("mid", ALL)
def test_info(mid: str, onnx_file: ONNX_OF) -> None:
    code, out, err = ferry_cli("info", onnx_file(mid), "--json")
    assert code == 0, err
    info = json.loads(out)
    kit_inputs = [i["name"] for i in kit_models.entry(mid)["inputs"]]
    assert [i["name"] for i in info["inputs"]] == kit_inputs
    assert info["flops"] >= 0 and info["param_count"] > 0 and info["node_count"] > 0
    for tensor in (*info["inputs"], *info["outputs"]):
        assert all(d is None or isinstance(d, str) or d >= 0 for d in tensor["shape"] or ())


@pytest.mark.parametrize("mid", ALL)
def test_run_cli(mid: str, onnx_file: ONNX_OF, tmp_path: Path) -> None:
    path = onnx_file(mid)
    feeds = kit_models.feeds(mid)
    code, _, err = ferry_cli("run", path, *save_feeds(feeds, tmp_path), "-o", tmp_path / "out")
    assert code == 0, err
    assert "onnxruntime" not in err  # no engine log line on the user's terminal
    want = reference(path, feeds)
    got = {name: np.load(tmp_path / "out" / f"{_file_safe(name)}.npy") for name in want}
    kit_models.judged(mid, "ferry run", got, want)


@pytest.mark.parametrize("mid", ALL)
def test_run_random_inputs(mid: str, onnx_file: ONNX_OF) -> None:
    """Generated inputs run (sizes that work, not 1x1 pixels), or say which --shape to give."""
    code, _, err = ferry_cli("run", onnx_file(mid), "--random")
    assert code == 0 or (code == 2 and "--shape" in err), err
    assert "Traceback" not in err


@pytest.mark.parametrize("mid", ALL)
def test_load_and_run(mid: str, onnx_file: ONNX_OF) -> None:
    path = onnx_file(mid)
    session = ferry.load(path)
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        kit_models.judged(mid, "ferry.load", session.run(feeds), reference(path, feeds))


@pytest.mark.parametrize("mid", ALL)
def test_openvino_and_onnxruntime(mid: str, onnx_file: ONNX_OF) -> None:
    path = onnx_file(mid)
    # The plan as placed (whether it beats ONNX Runtime alone is benchmarks/placement.py's).
    session = ferry.load(path, backends=["openvino", "onnxruntime"], check_pays=False)
    assert "openvino" in session.plan.backends
    for index in (0, 1):
        feeds = kit_models.feeds(mid, index)
        kit_models.judged(mid, "openvino+onnxruntime", session.run(feeds), reference(path, feeds))


@pytest.mark.parametrize("mid", ALL)
def test_plan_verify(mid: str, onnx_file: ONNX_OF, tmp_path: Path) -> None:
    args = save_feeds(kit_models.feeds(mid), tmp_path)
    # Judged by the default accuracy budget: recurrent state and quantized kernels round
    # differently across engines (a wake-word model's state agrees to cosine 0.9998).
    code, out, err = ferry_cli(
        "plan", onnx_file(mid), "--backends", "openvino,onnxruntime", "--verify",
        "--accuracy", "default", "--json", *args,
    )  # fmt: skip
    assert code == 0, err or out
    result = json.loads(out)
    assert result["verify"] and all(check["passed"] for check in result["verify"])


@pytest.mark.parametrize("mid", ALL)
def test_bench(mid: str, onnx_file: ONNX_OF, tmp_path: Path) -> None:
    args = save_feeds(kit_models.feeds(mid), tmp_path)
    code, _, err = ferry_cli(
        "bench", onnx_file(mid), "--backends", "onnxruntime,openvino", "--iterations", "5",
        "--warmup", "1", "--no-isolate", "--json", tmp_path / "r.json", *args,
    )  # fmt: skip
    assert code == 0, err
    results = json.loads((tmp_path / "r.json").read_text())
    rows = {(c["backend"], c["precision"]): c for c in results["configurations"]}
    assert rows[("onnxruntime", "fp32")]["latency_ms"]["p50"] > 0
    assert not rows[("openvino", "fp32")].get("error"), rows[("openvino", "fp32")]


def _file_safe(name: str) -> str:
    from ferry.cli._run import _file_safe as safe

    return safe(name)
