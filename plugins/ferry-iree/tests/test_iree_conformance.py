"""ferry's adapter conformance kit on the plugin, as a vendor runs it (``python -m
ferry.conformance --backend iree``): a sample of ONNX's node cases for the ops its rules claim
(one per op: each case is an IREE compile), the engine cache, dynamic sizes, bad inputs and
thread safety. The full node run and the kit models are docs/conformance/iree.md's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_conformance_kit_passes_on_a_sample(tmp_path: Path) -> None:
    checks = "node,cache,dynamic,bad-inputs,threads"
    command = [sys.executable, "-m", "ferry.conformance", "--backend", "iree"]
    done = subprocess.run(
        [*command, "--checks", checks, "--sample", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "iree.json").read_text())
    assert report["backend"] == "iree" and report["passed"] is True
    assert report["sampled"] == "at most 1 node case per op"
    status = {check["check"]: check["status"] for check in report["checks"]}
    assert set(status) == set(checks.split(",")), status
    assert set(status.values()) == {"pass"}, status
    assert report["node_cases"], "no node case ran"
    assert (tmp_path / "iree.md").read_text().strip()
