"""CI's rule on skips (tests/ci_skips.py), run on a small suite in a subprocess: a skip fails,
a GPU's skip and an expected failure do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SUITE = """
import pytest

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False

def test_missing_framework():
    pytest.skip("needs somelib: pip install somelib")

def test_needs_a_gpu():
    pytest.skip("needs an NVIDIA GPU")

def test_passes():
    pass
"""


def _run(tmp_path: Path, ci: str) -> str:
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**os.environ, "FERRY_CI": ci, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ci_skips", "-q", "-rA", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


def test_in_ci_a_skip_fails_but_an_expected_failure_does_not(tmp_path: Path) -> None:
    out = _run(tmp_path, "1")
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed" in out, out
    assert "FAILED test_suite.py::test_missing_framework" in out
    assert "skipped in CI, which installs what this test needs" in out


def test_outside_ci_skips_stay_skips(tmp_path: Path) -> None:
    out = _run(tmp_path, "0")
    assert "1 passed, 2 skipped, 1 xfailed" in out, out
