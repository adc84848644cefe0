"""The Python API's quickstart (docs/python-api.md) and the README tour's Python block run as
written, on a model shaped like the demo's."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _block(after: str, page: str = "README.md") -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index(after)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, f"no python block after {after!r}"
    return match.group(1)


@pytest.mark.torch
def test_python_quickstart_runs_on_the_demo_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    import ferry

    class Digits(
        torch.nn.Module
    ):  # the demo's CNN's interface: x [batch, 1, 8, 8] -> output [batch, 10]
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    result = ferry.convert(
        Digits().eval(), example_inputs=(torch.zeros(2, 1, 8, 8),), dynamic_axes={"x": {0: "batch"}}
    )
    result.save(tmp_path / "demo-out" / "model.onnx")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        page = "docs/python-api.md"
        exec(compile(_block("## Loading and running", page), page, "exec"), {})
    out = printed.getvalue()
    assert "TensorSpec(name='x', shape=('batch', 1, 8, 8)" in out
    assert "(4, 10)" in out and "input 'x' must be float32, got float64" in out

    # The tour's block: the demo's 8 digits through ferry.load, one class each.
    import numpy as np

    np.save(tmp_path / "demo-out" / "digits.npy", np.zeros((8, 1, 8, 8), np.float32))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_block("### Run: `ferry run` and `ferry.load`"), "README.md", "exec"), {})
    classes = printed.getvalue().strip()
    assert re.fullmatch(r"\[(\d\s*){8}\]", classes), classes
