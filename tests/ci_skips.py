"""In CI (``FERRY_CI=1``) a skipped test is a failure: CI installs every engine and framework but
TensorRT's GPU, so a skip there means something CI should run silently did not. An expected
failure (``xfail``, which pytest reports as skipped too) stays one: counting it as a skip failed
CI on a known cell of the as-typed matrix. tests/conftest.py registers the hook;
tests/unit/test_ci_skips.py runs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

__all__ = ["pytest_runtest_makereport"]

#: Skips CI keeps: what needs a GPU.
_MAY_SKIP_IN_CI = ("TensorRT", "tensorrt", "NVIDIA GPU", "CUDA")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("FERRY_CI") != "1" or not report.skipped:
        return
    if hasattr(report, "wasxfail"):  # an expected failure, not a skip
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    if item.get_closest_marker("gpu") is not None or any(w in reason for w in _MAY_SKIP_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, which installs what this test needs: {reason}"
