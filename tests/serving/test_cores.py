"""The cores a server shares out: the CPU affinity, capped by a container's CPU quota."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.serving import _scheduler
from ferry.serving._scheduler import _cpu_quota, available_cores, engine_threads


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cpu_quota(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    assert _cpu_quota(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert _cpu_quota(tmp_path) is None


def test_no_cgroup_files_mean_no_limit(tmp_path: Path) -> None:
    assert _cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("garbage")
    assert _cpu_quota(tmp_path) is None


@pytest.mark.parametrize(
    ("quota", "cores"), [(None, 64), (2.0, 2), (1.5, 2), (0.25, 1), (100.0, 64)]
)
def test_a_pod_limit_caps_the_cores(
    monkeypatch: pytest.MonkeyPatch, quota: float | None, cores: int
) -> None:
    monkeypatch.setattr(
        _scheduler.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False
    )
    monkeypatch.setattr(_scheduler, "_cpu_quota", lambda: quota)
    assert available_cores() == cores
    assert engine_threads(1) == max(1, cores - 1)
