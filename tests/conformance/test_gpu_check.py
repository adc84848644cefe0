"""scripts/gpu-check.sh on a machine without an NVIDIA GPU: one line saying so, exit 0, nothing
installed (its GPU path runs only where a GPU is, see the script)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


@pytest.mark.parametrize(
    ("smi", "why"),
    [("/nonexistent/nvidia-smi", "nvidia-smi not found"), ("false", "nvidia-smi fails")],
)
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(smi: str, why: str) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={"PATH": "/usr/bin:/bin", "NVIDIA_SMI": smi},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no NVIDIA GPU here")
    assert why in lines[0]
