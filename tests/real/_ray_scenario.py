"""The Ray Serve scale-out scenario, run by tests/real/test_ray_serve.py in a private network
namespace (``unshare -rn``: only a loopback interface, so every port Ray opens is on 127.0.0.1).

Usage: python _ray_scenario.py REPO PORT OUT.json MODEL...

With the ``ferry`` command of this interpreter: deploys REPO's models with 2 replicas (ferry starts
the local Ray cluster), drives them with tritonclient under bounded concurrent load and checks every
answer against ONNX Runtime on the same file (the kit's task judge), rescales to 3 and then to 1
replica while the load runs, runs perf_analyzer when given one ($FERRY_PERF_ANALYZER), removes the
deployment, stops the cluster, and writes what it saw to OUT.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.http as http
from tritonclient.utils import np_to_triton_dtype

sys.path.insert(0, str(Path(__file__).parent))
import kit_models

CLIENTS = 4  # concurrent clients
PHASE_S = 6.0  # seconds the steady phase runs at most
PER_CLIENT = 40  # requests a client sends at most in the steady phase
RESCALE_MAX_S = 300.0  # a rescaling phase's clients run until told to stop, or this long


def ferry(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "ferry"), "deploy", "ray", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


class Load:
    """Clients sending kit inputs to every model, each answer judged against ONNX Runtime."""

    def __init__(self, url: str, models: dict[str, str], kit_ids: dict[str, str]) -> None:
        self.url = url
        self.cases: list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]] = []
        for model, path in models.items():
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            for index in (0, 1):
                feeds = kit_models.feeds(kit_ids[model], index)
                want = dict(zip(names, session.run(names, feeds)))
                self.cases.append((model, feeds, want))
        self.kit_ids = kit_ids
        self.sent = 0
        self.failures: list[str] = []
        self.mismatches: list[str] = []
        self._lock = threading.Lock()

    def run(self, stop: threading.Event | None = None) -> None:
        threads = [threading.Thread(target=self._client, args=(i, stop)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _client(self, seed: int, stop: threading.Event | None) -> None:
        client = http.InferenceServerClient(self.url.removeprefix("http://"), network_timeout=60)
        # Steady: a few seconds and a few requests. Rescaling: until the rescale is over.
        deadline = time.monotonic() + (PHASE_S if stop is None else RESCALE_MAX_S)
        limit = PER_CLIENT if stop is None else 10**6
        try:
            for i in range(limit):
                if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
                    break
                model, feeds, want = self.cases[(seed + i) % len(self.cases)]
                try:
                    got = self._infer(client, model, feeds, list(want))
                except Exception as e:
                    with self._lock:
                        self.sent += 1
                        self.failures.append(f"{model}: {type(e).__name__}: {e}"[:300])
                    continue
                with self._lock:
                    self.sent += 1
                try:
                    kit_models.judged(self.kit_ids[model], "ray serve", got, want)
                except AssertionError as e:
                    with self._lock:
                        self.mismatches.append(f"{model}: {e}"[:300])
        finally:
            client.close()

    @staticmethod
    def _infer(
        client: Any, model: str, feeds: dict[str, np.ndarray], outputs: list[str]
    ) -> dict[str, np.ndarray]:
        inputs = []
        for name, array in feeds.items():
            tensor = http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        wanted = [http.InferRequestedOutput(n, binary_data=True) for n in outputs]
        result = client.infer(model, inputs, outputs=wanted)
        return {n: result.as_numpy(n) for n in outputs}


def replicas_running() -> dict[str, int]:
    from ray import serve

    out = {}
    for name, app in serve.status().applications.items():
        if name.startswith("ferry-"):
            states = app.deployments["FerryModel"].replica_states
            out[name] = int(states.get("RUNNING", 0))
    return out


def wait_replicas(count: int, timeout: float = 240) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        seen = replicas_running()
        if seen and all(n == count for n in seen.values()):
            return seen
        time.sleep(0.5)
    return seen


def rescale_under_load(load: Load, replicas: int, repo: str, port: int) -> dict[str, Any]:
    stop = threading.Event()
    driver = threading.Thread(target=load.run, args=(stop,))
    before = load.sent
    driver.start()
    time.sleep(1.0)
    done = ferry(
        repo, "--replicas", str(replicas), "--replica-cpus", "0.25", "--http-port", str(port)
    )
    seen = wait_replicas(replicas)
    time.sleep(2.0)  # serve on the new replica set a while before stopping the clients
    stop.set()
    driver.join()
    return {
        "exit": done.returncode,
        "output": (done.stdout + done.stderr)[-2000:],
        "replicas": seen,
        "requests": load.sent - before,
    }


def main() -> None:
    repo, port, out_path, *kit_ids = sys.argv[1:]
    port_n = int(port)
    url = f"http://127.0.0.1:{port_n}"
    report: dict[str, Any] = {}
    try:
        started = time.monotonic()
        done = ferry(
            repo, "--replicas", "2", "--replica-cpus", "0.25", "--http-port", port, timeout=400
        )
        report["deploy"] = {
            "exit": done.returncode,
            "output": (done.stdout + done.stderr)[-3000:],
            "seconds": round(time.monotonic() - started, 1),
        }
        if done.returncode != 0:
            return
        import ray

        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        report["replicas_at_start"] = replicas_running()
        models = {mid: str(Path(repo) / mid / "1" / "model.onnx") for mid in kit_ids}
        load = Load(url, models, {mid: mid for mid in kit_ids})
        client = http.InferenceServerClient(url.removeprefix("http://"))
        report["server_ready"] = client.is_server_ready()
        report["index"] = client.get_model_repository_index()
        report["metadata"] = {m: client.get_model_metadata(m) for m in kit_ids}
        client.close()
        load.run()
        report["steady"] = {"requests": load.sent}
        report["scale_up"] = rescale_under_load(load, 3, repo, port_n)
        report["scale_down"] = rescale_under_load(load, 1, repo, port_n)
        report["requests"] = load.sent
        report["failures"] = load.failures
        report["mismatches"] = load.mismatches
        analyzer = os.environ.get("FERRY_PERF_ANALYZER")
        if analyzer:
            run = subprocess.run(
                [analyzer, "-m", kit_ids[0], "-x", "1", "-u", f"127.0.0.1:{port_n}", "-i", "http",
                 "--concurrency-range", "2", "--measurement-interval", "1000",
                 "--max-trials", "3", "--stability-percentage", "100"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            report["perf_analyzer"] = {
                "exit": run.returncode,
                "output": run.stdout[-3000:] + run.stderr[-1500:],
            }
        down = ferry("--down")
        report["down"] = {"exit": down.returncode, "output": down.stdout + down.stderr}
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(f"{url}/v2/models/{kit_ids[0]}/ready", timeout=10)
            report["after_down"] = 200
        except urllib.error.HTTPError as e:
            report["after_down"] = e.code
        except OSError as e:
            report["after_down"] = str(e)
        report["status_after_down"] = replicas_running()
    except Exception:
        report["error"] = traceback.format_exc()
    finally:
        stop = subprocess.run(
            [str(Path(sys.executable).parent / "ray"), "stop", "--force"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        report["ray_stop"] = stop.returncode
        Path(out_path).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
