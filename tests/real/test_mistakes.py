"""A user's mistakes on real models: one clear line, exit 2, no traceback, no engine log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kit_models
from ferry.cli.main import cli

ALL = kit_models.tensor_ids()  # the generative (GGUF) models have verbs of their own


def _fails_cleanly(*args: str | Path) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    err = result.stderr
    assert result.exit_code == 2, (result.exit_code, result.stdout, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for noise in (
        "Traceback",
        "onnxruntime_src",
        "[E:onnxruntime",
        "[W:onnxruntime",
        "Exception from",
    ):
        assert noise not in err, err
    return lines[0]


@pytest.mark.parametrize("mid", ALL)
def test_wrong_inputs_are_named(mid: str, onnx_file: Callable[[str], Path], tmp_path: Path) -> None:
    path = onnx_file(mid)
    name, array = next(iter(kit_models.feeds(mid).items()))
    wrong_dtype = tmp_path / "f64.npy"
    np.save(wrong_dtype, array.astype(np.float64 if array.dtype != np.float64 else np.float32))
    message = _fails_cleanly("run", path, "--random", "--input", f"{name}={wrong_dtype}")
    assert repr(name) in message and "must be" in message
    right = tmp_path / "x.npy"
    np.save(right, array)
    message = _fails_cleanly("run", path, "--random", "--input", f"no_such_input={right}")
    assert "'no_such_input'" in message and repr(name) in message
    extra_dim = tmp_path / "extra.npy"
    np.save(extra_dim, array[None])
    message = _fails_cleanly("run", path, "--random", "--input", f"{name}={extra_dim}")
    assert repr(name) in message and "dims" in message


def test_a_corrupt_copy_of_a_kit_model(tmp_path: Path) -> None:
    data = kit_models.path("captcha_det").read_bytes()
    broken = tmp_path / "truncated.onnx"
    broken.write_bytes(data[: len(data) // 3])
    for verb in ("info", "run"):
        message = _fails_cleanly(verb, broken, *(["--random"] if verb == "run" else []))
        assert "truncated.onnx" in message
