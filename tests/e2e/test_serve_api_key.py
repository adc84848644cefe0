"""``ferry serve --api-key`` / ``$FERRY_API_KEY`` from the command line: inference needs the key,
health and metadata do not; a bind beyond loopback without a key warns; keys compare in constant
time. The non-loopback bind runs in a private network namespace (``unshare -rn``), whose only
interface is loopback, so the test server is reachable from this machine alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

import models

KEY = "k3y-with-some-length"
BODY = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


def _start(
    args: list[str], env: dict[str, str] | None = None, wrap: list[str] | None = None
) -> tuple[subprocess.Popen[str], list[str]]:
    """``ferry serve ARGS --port 0`` with ``env`` (and no $FERRY_API_KEY unless it has one)."""
    base = {k: v for k, v in os.environ.items() if k != "FERRY_API_KEY"}
    process = subprocess.Popen(
        [*(wrap or []), sys.executable, "-m", "ferry.cli.main", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**base, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(process.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    return process, lines


def _url(process: subprocess.Popen[str], lines: list[str]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in list(lines):
            if "serving on " in line:
                return line.split("serving on ")[1].split()[0]
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError("ferry serve did not start:\n" + "".join(lines))


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), path)
    return path


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_key_guards_inference_but_not_health(model: Path, how: str) -> None:
    args, env = (
        ([str(model), "--api-key", KEY], None)
        if how == "option"
        else ([str(model)], {"FERRY_API_KEY": KEY})
    )
    process, lines = _start(args, env)
    try:
        url = _url(process, lines)
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/v2/health/ready").status_code == 200
            assert client.get("/v2/models/mlp").status_code == 200
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": KEY},
                {"Authorization": f"Basic {KEY}"},
            ):
                refused = client.post("/v2/models/mlp/infer", json=BODY, headers=headers)
                assert refused.status_code == 401, headers
                assert refused.headers["www-authenticate"] == "Bearer"
                assert "API key" in refused.json()["error"]
            ok = client.post(
                "/v2/models/mlp/infer", json=BODY, headers={"Authorization": f"Bearer {KEY}"}
            )
            assert ok.status_code == 200, ok.text
            assert np.isfinite(ok.json()["outputs"][0]["data"]).all()
            index = client.post("/v2/repository/index", json={})
            assert index.status_code == 401
    finally:
        _stop(process)
    assert "warning" not in "".join(lines)


def test_an_empty_key_is_refused(model: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ferry.cli.main", "serve", str(model), "--api-key", ""],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "API key is empty" in done.stderr
    assert "Traceback" not in done.stderr


def _namespace() -> list[str]:
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        pytest.skip("needs unshare (util-linux) and ip (iproute2) to bind beyond loopback safely")
    probe = subprocess.run(
        [unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("unprivileged network namespaces are not allowed here")
    return [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]


@pytest.mark.parametrize("key", [None, KEY], ids=["no key", "key from the environment"])
def test_non_loopback_bind_warns_without_a_key(model: Path, key: str | None) -> None:
    wrap = _namespace()
    env = {"FERRY_API_KEY": key} if key else None
    process, lines = _start([str(model), "--host", "0.0.0.0"], env, wrap)
    try:
        _url(process, lines)
    finally:
        _stop(process)
    output = "".join(lines)
    warned = "listening on 0.0.0.0 without --api-key" in output
    assert warned is (key is None), output


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmac

    from ferry.serving import HTTPError, check_bearer

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    check_bearer(f"Bearer {KEY}", KEY, "no")
    with pytest.raises(HTTPError):
        check_bearer("Bearer k3y", KEY, "no")  # a prefix of the key: same path, same comparison
    assert calls == [(KEY.encode(), KEY.encode()), (b"k3y", KEY.encode())]
