"""``ferry deploy ray`` end to end: two kit models on a local Ray cluster, 2 replicas each, driven by
Triton's client under bounded concurrent load, rescaled to 3 and to 1 replica while the load runs
with no failed request, every answer judged against ONNX Runtime, then removed.

The cluster runs in a private network namespace (``unshare -rn``), where the only interface is
loopback: Ray binds its own ports (GCS, raylet, workers) to the node's address, which outside such a
namespace is the machine's external one whatever ``--node-ip-address`` says. The scenario itself is
tests/real/_ray_scenario.py; this module runs it once (about a minute) and checks its report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ferry[ray]'")

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
MODELS = ("orientation", "pitch_onnx")
PORT = 8731


def _namespace_command() -> list[str]:
    """``unshare -rn`` with loopback up, or skip saying why it cannot be had."""
    unshare = shutil.which("unshare")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        pytest.skip("needs unshare (util-linux) and ip (iproute2) for a loopback-only Ray cluster")
    probe = subprocess.run(
        [unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"unprivileged network namespaces are not allowed here: {probe.stderr.strip()}")
    return [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]


@pytest.fixture(scope="module")
def report(
    onnx_file: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    wrap = _namespace_command()
    repo = tmp_path_factory.mktemp("ray-repo")
    for mid in MODELS:
        (repo / mid / "1").mkdir(parents=True)
        shutil.copyfile(onnx_file(mid), repo / mid / "1" / "model.onnx")
    out = tmp_path_factory.mktemp("ray-report") / "report.json"
    env = dict(os.environ)
    analyzer = env.get("FERRY_PERF_ANALYZER") or str(ROOT / ".venv-triton/bin/perf_analyzer")
    if Path(analyzer).exists():
        env["FERRY_PERF_ANALYZER"] = analyzer
    # Ray's temporary files and the engine cache in the test's own folders.
    env["RAY_TMPDIR"] = str(tmp_path_factory.mktemp("ray-tmp"))
    command = [
        *wrap,
        sys.executable,
        str(HERE / "_ray_scenario.py"),
        str(repo),
        str(PORT),
        str(out),
    ]
    done = subprocess.run(
        [*command, *MODELS], capture_output=True, text=True, timeout=1200, env=env, check=False
    )
    assert out.exists(), (
        f"the scenario wrote no report:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    data: dict[str, Any] = json.loads(out.read_text())
    assert "error" not in data, data["error"]
    return data


def test_deploys_two_kit_models_with_two_replicas(report: dict[str, Any]) -> None:
    assert report["deploy"]["exit"] == 0, report["deploy"]["output"]
    assert report["replicas_at_start"] == {f"ferry-{m}": 2 for m in MODELS}
    assert report["server_ready"] is True
    assert {r["name"]: r["state"] for r in report["index"]} == {m: "READY" for m in MODELS}
    for mid in MODELS:
        assert report["metadata"][mid]["name"] == mid


def test_every_answer_matches_onnxruntime_with_no_failures(report: dict[str, Any]) -> None:
    assert report["requests"] >= 100, report["requests"]
    assert report["failures"] == []
    assert report["mismatches"] == []


@pytest.mark.parametrize(("phase", "replicas"), [("scale_up", 3), ("scale_down", 1)])
def test_rescales_under_load(report: dict[str, Any], phase: str, replicas: int) -> None:
    step = report[phase]
    assert step["exit"] == 0, step["output"]
    assert step["replicas"] == {f"ferry-{m}": replicas for m in MODELS}
    assert step["requests"] > 0


def test_perf_analyzer_drives_it(report: dict[str, Any]) -> None:
    if "perf_analyzer" not in report:
        pytest.skip(
            "perf_analyzer is not set up: bash scripts/triton-bench-env.sh --perf-analyzer-only"
        )
    run = report["perf_analyzer"]
    assert run["exit"] == 0, run["output"]
    assert "Throughput:" in run["output"], run["output"]


def test_down_removes_the_deployment(report: dict[str, Any]) -> None:
    assert report["down"]["exit"] == 0, report["down"]["output"]
    assert "ferry-orientation" in report["down"]["output"]
    assert report["after_down"] == 404
    assert report["status_after_down"] == {}
    assert report["ray_stop"] == 0
