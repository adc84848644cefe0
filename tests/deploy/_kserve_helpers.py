"""Helpers for the ``ferry deploy kserve`` tests (imported by name: keep it unique).

- :func:`validate_with_sdk`: runs ``_kserve_validate.py`` in the KServe SDK's environment
  (``$FERRY_KSERVE_PYTHON``, made by scripts/setup-kserve.sh).
- :func:`serve_manifest`: runs the predictor container's command from a written manifest, here:
  the in-container model path becomes the output folder's copy (what the Dockerfile copies into
  the image), port 8080 a free port, 0.0.0.0 127.0.0.1, and the container's environment is set
  as the manifest says (a Secret's value given by the test).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

HERE = Path(__file__).parent
VALIDATOR = HERE / "_kserve_validate.py"
START_TIMEOUT = 120.0
EXIT_TIMEOUT = 40.0


def kserve_python() -> str:
    """The KServe SDK's Python, or a skip that says how to get it."""
    python = os.environ.get("FERRY_KSERVE_PYTHON")
    if not python:
        pytest.skip(
            "FERRY_KSERVE_PYTHON is not set: run scripts/setup-kserve.sh and export "
            "FERRY_KSERVE_PYTHON=$PWD/.venv-kserve/bin/python (scripts/test.sh does both)"
        )
    if not Path(python).is_file():
        pytest.fail(f"FERRY_KSERVE_PYTHON={python} does not exist: run scripts/setup-kserve.sh")
    return python


def validate_with_sdk(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """``{str(path): the validator's answer}`` for InferenceService YAML files."""
    python = kserve_python()
    done = subprocess.run(
        [python, str(VALIDATOR), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {a["file"]: a for a in answers}


def load_manifest(out_dir: Path) -> dict[str, Any]:
    documents = list(yaml.safe_load_all((out_dir / "inferenceservice.yaml").read_text()))
    assert len(documents) == 1
    return documents[0]


def container_of(manifest: dict[str, Any]) -> dict[str, Any]:
    containers = manifest["spec"]["predictor"]["containers"]
    assert len(containers) == 1
    return containers[0]


def tree_hash(path: Path) -> dict[str, tuple[str, float]]:
    """Every file under ``path`` (or the file itself): its SHA-256 and modification time."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime) for p in files}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_argv(
    mount: Path, container: dict[str, Any], port: int, grpc_port: int | None = None
) -> list[str]:
    """The container's command with ``mount`` for /mnt/models, this port (and ``grpc_port`` for
    the gRPC one) and address."""
    argv = [*container["command"], *container["args"]]
    assert argv[:2] == ["ferry", "serve"], argv
    local: list[str] = []
    for arg in argv:
        if arg.startswith("/mnt/models"):
            arg = str(mount) + arg.removeprefix("/mnt/models")
        elif arg == "8080":
            arg = str(port)
        elif arg == "8081" and grpc_port is not None:
            arg = str(grpc_port)
        elif arg == "0.0.0.0":
            arg = "127.0.0.1"
        local.append(arg)
    script = Path(sys.executable).with_name("ferry")
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "ferry.cli.main"]
    return [*head, *local[1:]]


def container_env(
    container: dict[str, Any], secrets: Mapping[tuple[str, str], str]
) -> dict[str, str]:
    """The container's environment variables, a Secret's key read from ``secrets``."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def get(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@contextlib.contextmanager
def serve_manifest(
    out_dir: Path,
    tmp: Path,
    *,
    secrets: Mapping[tuple[str, str], str] | None = None,
    mount: Path | None = None,
    grpc_port: int | None = None,
) -> Iterator[str]:
    """Run the manifest's predictor command here; yield ``host:port`` once its readiness probe
    answers 200. On exit: SIGTERM (as Kubernetes stops a pod), and ferry serve must exit 0.

    ``mount`` stands for /mnt/models (default: the output folder's ``model/``, what the
    Dockerfile copies there; with a storage URI, where the test put what KServe downloads)."""
    container = container_of(load_manifest(out_dir))
    port = free_port()
    mount = mount if mount is not None else out_dir / "model"
    argv = local_argv(mount, container, port, grpc_port)
    # The container's environment only, as the pod has it: no API key but the manifest's.
    env = {k: v for k, v in os.environ.items() if k != "FERRY_API_KEY"}
    env["FERRY_CACHE_DIR"] = str(tmp / "engine-cache")
    env.update(container_env(container, secrets or {}))
    # With --protocol grpc the probes ask gRPC's health service; HTTP's readiness (the same
    # answer, served inside the pod) tells this test when to start.
    ready = container["readinessProbe"].get("httpGet", {}).get("path", "/v2/health/ready")
    log = tmp / f"ferry-serve-{port}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{argv} exited {proc.returncode} before it was ready:\n{log.read_text()}"
                )
            with contextlib.suppress(OSError):
                if get(f"http://127.0.0.1:{port}{ready}", timeout=2) == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"{argv} not ready in {START_TIMEOUT} s:\n{log.read_text()}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=EXIT_TIMEOUT)
        assert code == 0, f"ferry serve exited {code} at SIGTERM:\n{log.read_text()}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def infer(
    host: str, model: str, feeds: Mapping[str, np.ndarray], headers: dict[str, str] | None = None
) -> dict[str, np.ndarray]:
    """One inference with Triton's own client (binary tensors), every output asked for."""
    import tritonclient.http as http
    from tritonclient.utils import np_to_triton_dtype

    client = http.InferenceServerClient(host)
    try:
        inputs = []
        for name, array in feeds.items():
            tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        metadata: Any = client.get_model_metadata(model)
        outputs = [
            http.InferRequestedOutput(o["name"], binary_data=True) for o in metadata["outputs"]
        ]
        result = client.infer(model, inputs, outputs=outputs, headers=headers)
        return {o["name"]: result.as_numpy(o["name"]) for o in metadata["outputs"]}
    finally:
        client.close()


def onnxruntime_outputs(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    assert not pending, "a continuation line ends the Dockerfile"
    return instructions
