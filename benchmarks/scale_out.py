"""ferry on Ray Serve on one machine: 1 vs 2 replicas, and the cost of Ray Serve's proxy.

One run measures, with Triton's C++ load generator ``perf_analyzer`` (closed loop, batch-1
requests, binary tensors over HTTP):

1. throughput and latency of the kit's orientation classifier (PP-LCNet, ``x`` [N,3,224,224]
   float32, a rendered text page; about 3.7 ms a call on one thread: compute-bound) deployed with
   ``ferry deploy ray --threads 1 --replica-cpus 1`` at 1 and at 2 replicas (rescaled in place),
   dynamic batching as ferry's default config gives it, at a few concurrencies;
2. the per-request cost of Ray Serve's proxy: p50 latency at concurrency 1 through Ray Serve
   (1 replica) against ``ferry serve`` alone running the model with the same engine (1 instance,
   1 intra-op thread), on a tiny model (x[batch,4] + const, built here) and on orientation;
3. ``ferry serve`` alone (one process) on orientation at the same concurrencies, both as a user
   gets it (ferry's scheduler gives a compute-bound model 2 instances on 2 cores) and with 1
   instance of 1 thread (what one Ray replica runs): the baseline Ray is compared against on one
   machine.

Everything runs at once on one machine: ``ferry serve`` (its own process) and the Ray cluster
(started by ``ferry deploy ray``: GCS, raylet, Serve's controller and HTTP proxy, the replicas) are
both up, and blocks of requests alternate between them (A, B, C, then C, B, A, ...) so that drift
on this shared machine hits them alike. The cluster runs in a private network namespace
(``unshare``: loopback only, so nothing listens outside it; and a private PID namespace, so
``ray stop --force`` at the end stops this run's Ray and no one else's): the benchmark re-executes
itself inside one. The client shares the cores with the servers: on a 2-core machine, 2 replicas
cannot reach 2x one replica's throughput, and the printout says how busy the cores were.

    python benchmarks/scale_out.py [--seconds 1] [--rounds 2] [--overhead-rounds 3]
                                   [--concurrency 1,2,4,8] [--max-other 0.25] [--retries 12]

``--seconds`` is perf_analyzer's measurement window; a block is 3 windows (the fewest it takes),
each cell ``--rounds`` blocks. The run tells its own CPU from other processes' (its PID namespace's
processes against /proc/stat): a block during which others took more than ``--max-other`` cores is
measured again, the quietest attempt kept, ``--retries`` times in all at most.

perf_analyzer comes from ``bash scripts/triton-bench-env.sh --perf-analyzer-only``
(``.venv-triton/bin/perf_analyzer``, or ``$FERRY_PERF_ANALYZER``); Ray from ``pip install
'ferry[ray]'``; the orientation model from the kit (``scripts/fetch-kit.sh``). The exit status is 1
when a request or a perf_analyzer run failed (perf_analyzer's exit status, a request with no
answer, a non-2xx inference answer in Ray Serve's access log), whatever the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NETNS_ENV = "FERRY_BENCH_NETNS"
CONCURRENCY = (1, 2, 4, 8)
#: perf_analyzer's stability check needs 3 windows; it reports (and exports) those 3.
WINDOWS = 3
TINY = "tiny"
ORIENT = "orientation"
ORIENT_1X1 = "orientation_1x1"  # ferry serve's copy run as one Ray replica runs it
DEPLOY_TIMEOUT_S = 300
BLOCK_TIMEOUT_S = 120

CPU_HEAD = f"{'busy':>7}{'other':>7}{'ms/req':>9}"
# the throughput configurations (labels)
RAY1, RAY2 = "ray, 1 replica", "ray, 2 replicas"
SERVE_DEFAULT, SERVE_1X1 = "ferry serve", "ferry serve 1x1"


# ---------------------------------------------------------------------------------------------
# the private namespaces


def reexec_in_namespace(argv: Sequence[str]) -> int:
    """Run this script again inside ``unshare``'s user, network and PID namespaces, with loopback
    up; returns its exit status (or 2 when no namespace can be had)."""
    unshare = shutil.which("unshare")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not Path(ip).exists():
        print("needs unshare (util-linux) and ip (iproute2) for a loopback-only Ray cluster")
        return 2
    # sh stays the namespace's first process (it reaps the daemons Ray orphans); when it exits,
    # after this script, the kernel ends whatever is left in the namespace: no Ray outlives it.
    inner = [sys.executable, str(Path(__file__).resolve()), *argv]
    wrap = [unshare, "-rnpf", "--mount-proc", "sh", "-c", f'{ip} link set lo up && "$@"', "sh"]
    kind = "pid"
    probe = subprocess.run([*wrap, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:  # no PID namespace: the network one alone, as the Ray tests use
        kind = "net"
        wrap = [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]
        probe = subprocess.run([*wrap, "true"], capture_output=True, text=True, check=False)
        if probe.returncode != 0:
            print(f"unprivileged network namespaces are not allowed here: {probe.stderr.strip()}")
            return 2
    process = subprocess.Popen([*wrap, *inner], env={**os.environ, NETNS_ENV: kind})
    while True:
        try:
            return process.wait()
        except KeyboardInterrupt:  # the run got Ctrl-C too: let it stop Ray and report
            continue


# ---------------------------------------------------------------------------------------------
# models and inputs


def tiny_model() -> Any:
    """x[batch, 4] float32 -> Add 1 -> y (tests/serving/_serving_models.py's add_const)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    const = numpy_helper.from_array(np.full(4, 1.0, np.float32), "k")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "k"], ["y"], name="add")],
        "add_const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [const],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def orientation_input() -> tuple[Path, np.ndarray]:
    """The kit's orientation model and its kit input (a rendered text page, [1,3,224,224])."""
    sys.path.insert(0, str(ROOT / "tests" / "real"))
    import kit_models

    path = kit_models.path(ORIENT)
    if not path.is_file():
        raise SystemExit(f"the kit's orientation model is missing ({path}): scripts/fetch-kit.sh")
    return path, kit_models.feeds(ORIENT)["x"]


@dataclass
class Setup:
    ray_orient: Path  # repositories deployed on Ray (one model each)
    ray_tiny: Path
    serve_repo: Path  # ferry serve's repository
    data: dict[str, Path]  # model -> perf_analyzer input folder
    feeds: dict[str, np.ndarray]  # model -> one batch-1 request


def prepare(work: Path) -> Setup:
    import onnx

    orient_path, orient_x = orientation_input()
    tiny_x = np.array([[0.5, -1.0, 2.0, 3.25]], np.float32)
    repos = {"ray_orient": work / "ray-orient", "ray_tiny": work / "ray-tiny"}
    serve_repo = work / "serve"

    def put(repo: Path, name: str, source: Path | None, config: dict[str, Any] | None) -> None:
        (repo / name / "1").mkdir(parents=True)
        target = repo / name / "1" / "model.onnx"
        if source is None:
            onnx.save(tiny_model(), target)
        else:
            shutil.copyfile(source, target)
        if config is not None:
            (repo / name / "config.json").write_text(json.dumps(config))

    one = {"instance_group": [{"count": 1}]}  # ferry serve then gives it 1 intra-op thread
    put(repos["ray_orient"], ORIENT, orient_path, None)
    put(repos["ray_tiny"], TINY, None, None)
    put(serve_repo, ORIENT, orient_path, None)  # ferry's defaults: its scheduler decides
    put(serve_repo, ORIENT_1X1, orient_path, one)
    put(serve_repo, TINY, None, one)
    data = {}
    for name, x in ((ORIENT, orient_x), (TINY, tiny_x)):
        folder = work / "data" / name
        folder.mkdir(parents=True)
        x[0].astype(np.float32).tofile(folder / "x")  # one batch element: perf_analyzer adds -b 1
        data[name] = folder
    data[ORIENT_1X1] = data[ORIENT]
    feeds = {ORIENT: orient_x, ORIENT_1X1: orient_x, TINY: tiny_x}
    return Setup(repos["ray_orient"], repos["ray_tiny"], serve_repo, data, feeds)


# ---------------------------------------------------------------------------------------------
# measuring


def find_perf_analyzer() -> str:
    binary = os.environ.get("FERRY_PERF_ANALYZER") or str(ROOT / ".venv-triton/bin/perf_analyzer")
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(
            f"perf_analyzer does not run ({binary}: {e}); set it up with "
            "`bash scripts/triton-bench-env.sh --perf-analyzer-only` or set $FERRY_PERF_ANALYZER"
        ) from None
    if done.returncode != 0:
        raise SystemExit(f"perf_analyzer does not run ({binary}): {done.stderr.strip()[-300:]}")
    return binary


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is counted in user already
    return total - idle, total


def run_cpu_seconds() -> float | None:
    """CPU seconds of every process of this run (its PID namespace: the client, ferry serve, the
    Ray cluster, this script), the dead included (their time is in their reaper's children
    times); None without a PID namespace of our own (/proc then shows the whole machine)."""
    if os.environ.get(NETNS_ENV) != "pid":
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


class Probe:
    """The machine's cores busy while a block runs, and the part of it that is not this run."""

    def __init__(self) -> None:
        self.jiffies = cpu_jiffies()
        self.ours = run_cpu_seconds()
        self.wall = time.monotonic()

    def stop(self) -> tuple[float, float]:
        """(cores busy, of which other processes than this run's; nan when unknown)."""
        busy1, total1 = cpu_jiffies()
        ours = run_cpu_seconds()
        busy0, total0 = self.jiffies
        cores = os.cpu_count() or 1
        busy = (busy1 - busy0) / (total1 - total0) * cores if total1 > total0 else float("nan")
        wall = time.monotonic() - self.wall
        if ours is None or self.ours is None or wall <= 0:
            return busy, float("nan")
        return busy, max(0.0, busy - (ours - self.ours) / wall)


class BlockError(Exception):
    pass


@dataclass
class Block:
    latencies: list[float]  # seconds
    seconds: float  # the windows' span
    busy_cores: float  # the machine's cores busy on average while it ran (all processes)
    other_cores: float  # of which processes not this run's


@dataclass
class Target:
    label: str
    host: str  # host:port
    model: str


@dataclass
class Cell:
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    busy: list[float] = field(default_factory=list)
    other: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, block: Block) -> None:
        self.latencies.extend(block.latencies)
        self.seconds += block.seconds
        self.busy.append(block.busy_cores)
        self.other.append(block.other_cores)

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else float("nan")

    def ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1e3 if self.latencies else float("nan")

    @property
    def cores(self) -> float:
        return float(np.mean(self.busy)) if self.busy else float("nan")

    @property
    def other_cores(self) -> float:
        return float(np.mean(self.other)) if self.other else float("nan")

    @property
    def cpu_ms(self) -> float:
        """This run's CPU (client, servers, Ray) per request, in ms."""
        return (self.cores - self.other_cores) / self.throughput * 1e3

    def cpu_columns(self) -> str:
        return f"{fmt(self.cores, 7, 2)}{fmt(self.other_cores, 7, 2)}{fmt(self.cpu_ms, 9, 2)}"


class Runner:
    def __init__(
        self,
        binary: str,
        work: Path,
        data: dict[str, Path],
        window_ms: int,
        max_other: float = float("inf"),
        retries: int = 0,
    ) -> None:
        self.binary = binary
        self.work = work
        self.data = data
        self.window_ms = window_ms
        self.max_other = max_other
        self.retries_left = retries
        self.retried = 0
        self.runs = 0
        self.failures: list[str] = []

    def command(self, target: Target, concurrency: int, window_ms: int, export: Path) -> list[str]:
        return [
            self.binary,
            "-m", target.model,
            "-u", target.host,
            "-i", "http",
            # the version, so that perf_analyzer reads the server's statistics by it: behind Ray's
            # proxy, its reads before and after a window may reach different replicas, whose
            # counts then seem not to grow ("failed to find the requested model version")
            "-x", "1",
            "--concurrency-range", str(concurrency),
            "--input-data", str(self.data[target.model]),
            "--measurement-interval", str(window_ms),
            # every run reports its first 3 windows: blocks of a fixed length, alternated by us
            "--max-trials", str(WINDOWS),
            "--stability-percentage", "1000",
            "--profile-export-file", str(export),
        ]  # fmt: skip

    def block(self, target: Target, concurrency: int, window_ms: int | None = None) -> Block:
        """One perf_analyzer run: every request's latency over its 3 windows.

        Raises:
            BlockError: perf_analyzer failed, or a request got no answer.
        """
        self.runs += 1
        export = self.work / f"pa-{self.runs}.json"
        command = self.command(target, concurrency, window_ms or self.window_ms, export)
        probe = Probe()
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise BlockError(f"perf_analyzer ran past {BLOCK_TIMEOUT_S} s") from None
        busy, other = probe.stop()
        where = f"{target.label} / {target.model} at c={concurrency}"
        if done.returncode != 0 or not export.exists():
            lines = (done.stdout + done.stderr).strip().splitlines()
            errors = [line.strip() for line in lines if "error" in line.lower()][:3]
            tail = " / ".join(errors or lines[-3:])
            raise BlockError(f"{where}: perf_analyzer exit {done.returncode}: {tail}")
        experiment = json.loads(export.read_text())["experiments"][0]
        export.unlink()
        requests = experiment["requests"]
        missing = sum(1 for r in requests if not r.get("response_timestamps"))
        if missing:
            raise BlockError(f"{where}: {missing} of {len(requests)} requests got no response")
        if not requests:
            raise BlockError(f"{where}: no request completed in the windows")
        bounds = experiment["window_boundaries"]
        latencies = [(r["response_timestamps"][-1] - r["timestamp"]) / 1e9 for r in requests]
        return Block(latencies, (bounds[-1] - bounds[0]) / 1e9, busy, other)

    def measure(self, cell: Cell, target: Target, concurrency: int) -> None:
        """A block into ``cell``; measured again (up to twice, while the run's budget of retries
        lasts) when other processes than this run's took more than ``max_other`` cores during
        it, and the quietest attempt kept."""
        try:
            best = self.block(target, concurrency)
            for _ in range(2):
                if not (best.other_cores > self.max_other and self.retries_left > 0):
                    break
                self.retries_left -= 1
                self.retried += 1
                again = self.block(target, concurrency)
                if again.other_cores < best.other_cores:
                    best = again
            cell.add(best)
        except BlockError as e:
            cell.errors.append(str(e))
            self.failures.append(str(e))
            print(f"  failed: {e}", flush=True)


# ---------------------------------------------------------------------------------------------
# the servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: Any = None, timeout: float = 30) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_ready(
    url: str, models: Sequence[str], what: str, process: Any = None, log: Path | None = None
) -> None:
    """Until the server and ``models`` are ready; SystemExit with ``log``'s tail when not."""

    def tail() -> str:
        return log.read_text()[-3000:] if log is not None and log.exists() else ""

    deadline = time.monotonic() + 180
    waiting = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
    while waiting and time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}:\n{tail()}")
        try:
            with urllib.request.urlopen(url + waiting[0], timeout=5) as response:
                if response.status == 200:
                    waiting.pop(0)
                    continue
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    if waiting:
        raise SystemExit(f"{what} at {url} was not ready after 180 s:\n{tail()}")


def start_ferry_serve(repo: Path, logs: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = logs / "ferry-serve.log"
    ferry = Path(sys.executable).parent / "ferry"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(ferry), "serve", str(repo), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, [ORIENT, ORIENT_1X1, TINY], "ferry serve", process, log)
    return process, url


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def ferry_deploy(*args: str) -> tuple[float, str]:
    """``ferry deploy ray ARGS``: seconds it took, and its output. SystemExit when it fails."""
    command = [str(Path(sys.executable).parent / "ferry"), "deploy", "ray", *args]
    started = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S + 60, check=False
    )
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise SystemExit(
            f"`ferry deploy ray {' '.join(args)}` failed ({done.returncode}):\n{output}"
        )
    keep_notices(output, "ferry deploy ray")
    return time.monotonic() - started, output


NOTICES: list[str] = []  # Ray's warnings seen on the way, printed at the end


def keep_notices(text: str, where: str) -> None:
    for line in text.splitlines():
        if any(word in line.lower() for word in ("warn", "error", "fail")):
            NOTICES.append(f"{where}: {line.strip()[:300]}")


@contextmanager
def native_stderr_to(log: Path) -> Iterator[None]:
    """fd 2 into ``log`` (Ray's C++ core writes its notices there, not through logging)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("a") as out:
        os.dup2(out.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def scan_logs(work: Path) -> list[str]:
    """Warnings and errors in Ray Serve's logs (controller, proxy, replicas) and ferry serve's
    (kept as notices), and the proxy's access log: every response that is not 2xx is a notice, an
    inference request's a failure (returned)."""
    failures: list[str] = []
    # session_latest links to this run's one session folder: each file once
    logs = sorted({p.resolve() for p in (work / "ray").glob("**/session_*/logs/serve/*.log")})
    logs.append(work / "ferry-serve.log")
    for log in logs:
        if log.is_symlink() or not log.is_file():
            continue
        seen: dict[str, int] = {}
        answered: dict[tuple[str, str], int] = {}
        for line in log.read_text(errors="replace").splitlines():
            if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                # drop the timestamp and ids: one entry per kind of message
                key = line.split(" -- ", 1)[-1].strip()[:200]
                seen[key] = seen.get(key, 0) + 1
            access = ACCESS.search(line) if log.name.startswith("proxy_") else None
            if access is not None and not access["status"].startswith("2"):
                key2 = (f"{access['method']} {access['path']}", access["status"])
                answered[key2] = answered.get(key2, 0) + 1
        for key, count in seen.items():
            NOTICES.append(f"{log.name}: {key}" + (f" (x{count})" if count > 1 else ""))
        for (request, status), count in answered.items():
            line = f"Ray Serve's proxy answered {status} to {request} {count} time(s)"
            NOTICES.append(line)
            if request.startswith("POST /v2/models/"):  # Ray logs the route: an inference
                failures.append(line)
    return failures


#: Ray Serve's access log line, which names the route: ``... -- POST /v2/models/tiny 200 5.1ms``.
ACCESS = re.compile(r" -- (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}) ")


def replica_states(app: str) -> dict[str, int]:
    from ray import serve

    found = serve.status().applications.get(app)
    if found is None:
        return {}
    return {str(k): int(v) for k, v in found.deployments["FerryModel"].replica_states.items()}


def wait_replicas(app: str, count: int, timeout: float = 120) -> dict[str, int]:
    """Until ``app`` has ``count`` RUNNING replicas and none starting or stopping."""
    deadline = time.monotonic() + timeout
    states: dict[str, int] = {}
    while time.monotonic() < deadline:
        states = replica_states(app)
        if states.get("RUNNING") == count and sum(states.values()) == count:
            return states
        time.sleep(0.25)
    raise SystemExit(f"{app} did not settle at {count} replicas in {timeout:.0f} s: {states}")


def model_config(url: str, model: str) -> dict[str, Any]:
    config: dict[str, Any] = http_json(f"{url}/v2/models/{model}/config")
    return config


def describe(config: dict[str, Any]) -> str:
    params = config.get("parameters", {})
    threads = params.get("ferry_intra_op_threads", {}).get("string_value", "?")
    count = sum(g.get("count", 1) for g in config.get("instance_group", [])) or 1
    batching = config.get("dynamic_batching")
    batch = (
        f"dynamic batching max_batch_size {config.get('max_batch_size')}, "
        f"max_queue_delay {batching.get('max_queue_delay_microseconds')} us"
        if batching
        else f"no dynamic batching (max_batch_size {config.get('max_batch_size')})"
    )
    return f"{count} instance(s) x {threads} intra-op thread(s), {batch}"


def check_answers(url: str, models: Sequence[str], feeds: dict[str, np.ndarray]) -> None:
    """One JSON request per model; the tiny model's answer must be x + 1, orientation's top-1
    class that of ONNX Runtime in this process."""
    import onnxruntime as ort

    for model in models:
        x = feeds[model]
        body = {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        }
        answer = http_json(f"{url}/v2/models/{model}/infer", body, timeout=60)["outputs"][0]
        got = np.asarray(answer["data"], np.float32).reshape(answer["shape"])
        if model == TINY:
            ok = bool(np.allclose(got, x + 1.0))
        else:
            path = orientation_input()[0]
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            want = session.run(None, {"x": x})[0]
            ok = int(got.argmax()) == int(want.argmax())
        if not ok:
            raise SystemExit(f"{url}: {model} answered {got.ravel()[:8]}: not the model's answer")


# ---------------------------------------------------------------------------------------------
# facts


def machine_facts() -> list[str]:
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = "?"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    load = os.getloadavg()
    return [
        f"machine: {model}; os.cpu_count() {os.cpu_count()}, nproc {nproc}, affinity {affinity} "
        f"cores; memory {mem}; {platform.system()} {platform.release()}",
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min) at start"
        + ("" if load[0] < 0.5 else "  <- NOT a quiet machine: figures below are noisier"),
    ]


def versions(binary: str) -> str:
    import onnxruntime as ort
    import ray

    import ferry

    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    pa = ((done.stdout + done.stderr).strip().splitlines() or ["perf_analyzer ?"])[0]
    return (
        f"ferry {ferry.__version__}, Ray {ray.__version__}, onnxruntime {ort.__version__}, "
        f"{pa}, Python {platform.python_version()}"
    )


# ---------------------------------------------------------------------------------------------
# the run


def fmt(value: float, width: int, digits: int = 0) -> str:
    return f"{'-':>{width}}" if value != value else f"{value:>{width}.{digits}f}"


def ratio(a: float, b: float) -> float:
    return a / b if b and a == a and b == b else float("nan")


def run(args: argparse.Namespace, binary: str, work: Path) -> int:
    started = time.monotonic()
    concurrencies: tuple[int, ...] = args.concurrency
    window_ms = round(args.seconds * 1000)
    for line in machine_facts():
        print(line)
    print(versions(binary))
    if os.environ.get(NETNS_ENV) == "pid":
        print(
            "namespaces: `unshare -rnpf --mount-proc` (loopback only: nothing listens outside; "
            "a PID namespace of its own: `ray stop --force` stops this run's Ray only)"
        )
    else:
        print(
            "namespaces: `unshare -rn` (loopback only: nothing listens outside; no PID namespace: "
            "`ray stop --force` at the end stops every Ray on this machine, and the CPU of other "
            "processes than this run's is not told apart)"
        )
    setup = prepare(work)
    runner = Runner(binary, work, setup.data, window_ms, args.max_other, args.retries)
    serve_proc, serve_url = start_ferry_serve(setup.serve_repo, work)
    ray_port = free_port()
    ray_url = f"http://127.0.0.1:{ray_port}"
    common = ["--threads", "1", "--http-port", str(ray_port)]
    try:
        seconds, _ = ferry_deploy(
            str(setup.ray_orient), "--replicas", "1", "--replica-cpus", "1", *common
        )
        print(f"ray: `ferry deploy ray` started a local cluster and 1 replica in {seconds:.1f} s")
        # Ray's CPUs are a reservation, not a pin: the tiny model's replica reserves none, so
        # orientation's two 1-CPU replicas still fit the 2-CPU cluster beside it.
        seconds, _ = ferry_deploy(
            str(setup.ray_tiny), "--replicas", "1", "--replica-cpus", "0", *common
        )
        print(f"ray: the tiny model's replica deployed in {seconds:.1f} s")
        import ray

        log = work / "ray-driver.log"
        with native_stderr_to(log):
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        keep_notices(log.read_text(), "ray.init (this script, to read replica counts)")
        resources = ray.cluster_resources()
        wait_replicas(f"ferry-{ORIENT}", 1)
        wait_replicas(f"ferry-{TINY}", 1)
        wait_ready(ray_url, [ORIENT, TINY], "Ray Serve")
        check_answers(ray_url, [ORIENT, TINY], setup.feeds)
        check_answers(serve_url, [ORIENT, ORIENT_1X1, TINY], setup.feeds)
        print(f"ray cluster: {resources.get('CPU', 0):g} CPUs (its default: the machine's cores)")
        print()
        print("settings")
        print(
            f"  Ray Serve: `ferry deploy ray REPO --replicas 1|2 --threads 1 --replica-cpus 1` "
            f"(orientation), `--replicas 1 --threads 1 --replica-cpus 0` (tiny); proxy {ray_url}"
        )
        for model in (ORIENT, TINY):
            print(f"    {model}: each replica {describe(model_config(ray_url, model))}")
        print(f"  ferry serve: one process, `ferry serve REPO --port P` ({serve_url})")
        for model in (ORIENT, ORIENT_1X1, TINY):
            print(f"    {model}: {describe(model_config(serve_url, model))}")
        print(
            f"  client: perf_analyzer over HTTP, binary tensors, batch-1 requests, closed loop; "
            f"blocks of {WINDOWS} windows of {window_ms} ms; concurrency {list(concurrencies)}"
        )
        print(
            "  inputs: orientation a rendered text page [1,3,224,224] (the kit's input), "
            "tiny [[0.5,-1,2,3.25]]; every answer checked once before measuring"
        )
        print(
            f"  rounds: throughput {args.rounds} block(s) per cell, overhead "
            f"{args.overhead_rounds}; configurations alternate in blocks, order reversed "
            "each round"
        )
        print(
            f"  a block during which other processes took more than {args.max_other:g} cores is "
            f"measured again, the quietest attempt kept (at most {args.retries} in the run)"
        )
        print(
            f"  CPU columns: 'busy', the machine's cores in use while a block ran (of "
            f"{os.cpu_count()}); 'other', the part of it not this run's (other users' processes); "
            "'ms/req', this run's CPU per request (client, servers, Ray's own processes)"
        )
        print(flush=True)

        ray_t = {m: Target("ray", ray_url.removeprefix("http://"), m) for m in (ORIENT, TINY)}
        serve_host = serve_url.removeprefix("http://")
        print("warming up (connections, first batches)...", flush=True)
        for target in (
            *ray_t.values(),
            *(Target("ferry serve", serve_host, m) for m in (ORIENT, ORIENT_1X1, TINY)),
        ):
            for concurrency in sorted({1, max(concurrencies)}):
                try:
                    runner.block(target, concurrency, window_ms=200)
                except BlockError as e:
                    runner.failures.append(f"warm-up: {e}")
                    print(f"  failed: {e}")

        # 2. Ray Serve's proxy against ferry serve alone, concurrency 1
        overhead: dict[tuple[str, str], Cell] = {}
        pairs = {
            TINY: (Target("ferry serve", serve_host, TINY), ray_t[TINY]),
            ORIENT: (Target("ferry serve", serve_host, ORIENT_1X1), ray_t[ORIENT]),
        }
        print("measuring the proxy's overhead at concurrency 1...", flush=True)
        for r in range(args.overhead_rounds):
            for model, (serve_t, ray_target) in pairs.items():
                order = (serve_t, ray_target) if r % 2 == 0 else (ray_target, serve_t)
                for target in order:
                    cell = overhead.setdefault((model, target.label), Cell())
                    runner.measure(cell, target, 1)

        # 1 and 3. throughput: Ray at 1 and 2 replicas, ferry serve
        cells: dict[tuple[str, int], Cell] = {}
        serve_targets = {
            SERVE_DEFAULT: Target(SERVE_DEFAULT, serve_host, ORIENT),
            SERVE_1X1: Target(SERVE_1X1, serve_host, ORIENT_1X1),
        }
        rescales: list[tuple[int, float]] = []
        replicas = 1

        def measure_config(label: str, target: Target, r: int) -> None:
            order = concurrencies if r % 2 == 0 else tuple(reversed(concurrencies))
            for concurrency in order:
                runner.measure(cells.setdefault((label, concurrency), Cell()), target, concurrency)

        def rescale(count: int) -> None:
            t0 = time.monotonic()
            seconds, _ = ferry_deploy(
                str(setup.ray_orient), "--replicas", str(count), "--replica-cpus", "1", *common
            )
            wait_replicas(f"ferry-{ORIENT}", count)
            total = time.monotonic() - t0
            rescales.append((count, total))
            print(
                f"  rescaled to {count} replica(s): `ferry deploy ray` {seconds:.1f} s, "
                f"settled in {total:.1f} s",
                flush=True,
            )
            # the new replica set's first requests (proxy connections, the new replica's batcher)
            for concurrency in sorted({1, max(concurrencies)}):
                runner.block(ray_t[ORIENT], concurrency, window_ms=200)

        print("measuring throughput...", flush=True)
        for r in range(args.rounds):
            label = RAY1 if replicas == 1 else RAY2
            measure_config(label, Target(label, ray_t[ORIENT].host, ORIENT), r)
            serve_order = (SERVE_DEFAULT, SERVE_1X1) if r % 2 == 0 else (SERVE_1X1, SERVE_DEFAULT)
            for name in serve_order:
                measure_config(name, serve_targets[name], r)
            replicas = 3 - replicas
            try:
                rescale(replicas)
            except BlockError as e:
                runner.failures.append(f"after rescaling: {e}")
                print(f"  failed: {e}")
            label = RAY1 if replicas == 1 else RAY2
            measure_config(label, Target(label, ray_t[ORIENT].host, ORIENT), r)
        final_states = replica_states(f"ferry-{ORIENT}")
        runner.failures.extend(scan_logs(work))
        report(
            overhead,
            cells,
            concurrencies,
            runner.failures,
            rescales,
            final_states,
            runner.retried,
            time.monotonic() - started,
        )
    finally:
        stop_process(serve_proc)
    return 1 if runner.failures else 0


def report(
    overhead: dict[tuple[str, str], Cell],
    cells: dict[tuple[str, int], Cell],
    concurrencies: tuple[int, ...],
    failures: list[str],
    rescales: list[tuple[int, float]],
    final_states: dict[str, int],
    retried: int,
    elapsed: float,
) -> None:
    cores = os.cpu_count() or 1
    print()
    print("throughput: orientation, batch-1 requests (perf_analyzer, closed loop)")
    head = (
        f"{'server':<18}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}{CPU_HEAD}"
    )
    print(head)
    print("-" * len(head))
    labels = (RAY1, RAY2, SERVE_DEFAULT, SERVE_1X1)
    for label in labels:
        for concurrency in concurrencies:
            cell = cells.get((label, concurrency), Cell())
            print(
                f"{label:<18}{concurrency:>5}{fmt(cell.throughput, 9)}{fmt(cell.ms(50), 9, 2)}"
                f"{fmt(cell.ms(99), 9, 2)}{len(cell.latencies):>10}{cell.cpu_columns()}"
                + (f"  ({len(cell.errors)} block(s) failed)" if cell.errors else "")
            )
    print()
    print("proxy overhead: concurrency 1, the same engine (1 instance x 1 intra-op thread)")
    head = (
        f"{'model':<13}{'server':<13}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'requests':>10}"
        f"{CPU_HEAD}"
    )
    print(head)
    print("-" * len(head))
    for model in (TINY, ORIENT):
        for label in ("ferry serve", "ray"):
            cell = overhead.get((model, label), Cell())
            print(
                f"{model:<13}{label:<13}{fmt(cell.throughput, 8)}{fmt(cell.ms(50), 9, 3)}"
                f"{fmt(cell.ms(99), 9, 3)}{len(cell.latencies):>10}{cell.cpu_columns()}"
            )

    def tp(label: str, concurrency: int) -> float:
        return cells.get((label, concurrency), Cell()).throughput

    print()
    print("summary")
    print(
        f"  this machine has {cores} cores, shared by perf_analyzer, Ray's proxy, controller, GCS "
        "and raylet, and the replicas (and ferry serve, idle while Ray is measured): 2 replicas "
        "cannot reach 2x one replica's throughput here, and the proxy's own CPU comes out of the "
        "replicas' share"
    )
    parts = [f"c={c} {ratio(tp(RAY2, c), tp(RAY1, c)):.2f}x" for c in concurrencies]
    best1 = max((tp(RAY1, c) for c in concurrencies), default=float("nan"))
    best2 = max((tp(RAY2, c) for c in concurrencies), default=float("nan"))
    print(f"  Ray Serve, 2 replicas / 1 replica, req/s: {', '.join(parts)}")
    print(
        f"    best: {best2:.0f} vs {best1:.0f} req/s = {ratio(best2, best1):.2f}x "
        "(ideal on 2 idle cores: 2x)"
    )
    best_serve = max((tp(SERVE_DEFAULT, c) for c in concurrencies), default=float("nan"))
    parts = [f"c={c} {ratio(tp(RAY2, c), tp(SERVE_DEFAULT, c)):.2f}x" for c in concurrencies]
    print(
        "  Ray Serve (2 replicas) / ferry serve (one process, its defaults), req/s: "
        + ", ".join(parts)
    )
    print(f"    best: {best2:.0f} vs {best_serve:.0f} req/s = {ratio(best2, best_serve):.2f}x")
    parts = [f"c={c} {ratio(tp(RAY1, c), tp(SERVE_1X1, c)):.2f}x" for c in concurrencies]
    print(f"  Ray Serve (1 replica) / ferry serve 1x1 (the same engine), req/s: {', '.join(parts)}")
    top = max(concurrencies)
    cpu = {label: cells.get((label, top), Cell()).cpu_ms for label in (RAY1, RAY2, SERVE_DEFAULT)}
    print(
        f"  CPU per request at c={top} (this run's processes, client included): Ray "
        f"{cpu[RAY1]:.1f} ms (1 replica), {cpu[RAY2]:.1f} ms (2 replicas); ferry serve "
        f"{cpu[SERVE_DEFAULT]:.1f} ms"
    )
    print(
        f"    so {cores} cores can answer at most {cores * 1e3 / cpu[RAY1]:.0f} req/s through Ray "
        f"Serve (1 replica), {cores * 1e3 / cpu[RAY2]:.0f} (2 replicas), whatever the replica "
        f"count, and {cores * 1e3 / cpu[SERVE_DEFAULT]:.0f} through ferry serve"
    )
    for model in (TINY, ORIENT):
        ray_cell = overhead.get((model, "ray"), Cell())
        serve_cell = overhead.get((model, "ferry serve"), Cell())
        a, b = ray_cell.ms(50), serve_cell.ms(50)
        diff = a - b
        shown = f"{diff * 1e3:+.0f} us" if abs(diff) < 1 else f"{diff:+.2f} ms"
        print(
            f"  proxy overhead, {model}, p50 at c=1: Ray {a:.3f} ms vs ferry serve {b:.3f} ms: "
            f"{shown} a request, {ratio(a, b):.2f}x; CPU {ray_cell.cpu_ms:.2f} vs "
            f"{serve_cell.cpu_ms:.2f} ms a request"
        )
    others = [v for c in (*cells.values(), *overhead.values()) for v in c.other if v == v]
    if others:
        quiet = max(others) < 0.25
        print(
            f"  other processes than this run's used {np.mean(others):.2f} cores on average "
            f"during the blocks, {max(others):.2f} at most: "
            + ("a quiet machine" if quiet else "NOT a quiet machine, the figures are pessimistic")
            + (f" ({retried} block(s) measured again for it)" if retried else "")
        )
    if rescales:
        shown = ", ".join(f"to {n}: {s:.1f} s" for n, s in rescales)
        print(f"  rescaling in place under no load (deploy + replicas settled): {shown}")
    load = os.getloadavg()
    print(
        f"  load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end (this run's own "
        f"load included); final replica states {final_states}; total {elapsed:.0f} s"
    )
    for notice in dict.fromkeys(NOTICES):
        print(f"  notice: {notice}")
    if failures:
        print(f"  FAILED: {len(failures)} block(s)")
        for failure in failures:
            print(f"    {failure}")
    else:
        print("  no failed requests")


def parse_concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 1,2,4,8; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrencies must be 1 or more; got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        help="perf_analyzer's measurement window; a block is 3 windows (default 1)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="blocks per throughput cell (default 2)"
    )
    parser.add_argument(
        "--overhead-rounds", type=int, default=3, help="blocks per overhead cell (default 3)"
    )
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.25,
        help="a block during which other processes than this run's took more cores than this is "
        "measured again, the quietest attempt kept (default 0.25)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=12,
        help="blocks measured again at most in the whole run (default 12)",
    )
    parser.add_argument(
        "--concurrency",
        type=parse_concurrency,
        default=CONCURRENCY,
        help="closed-loop concurrencies of the throughput part (default 1,2,4,8)",
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.overhead_rounds < 1 or args.retries < 0:
        parser.error("--seconds must be positive, the rounds at least 1, --retries 0 or more")
    if not os.environ.get(NETNS_ENV):
        return reexec_in_namespace(argv)
    # SIGTERM (a timeout, say) ends the run through the finally blocks: Ray is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    binary = find_perf_analyzer()
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        print(f"Ray Serve is not installed ({e}): pip install 'ferry[ray]'")
        return 2
    with tempfile.TemporaryDirectory(prefix="ferry-scale-") as tmp:
        work = Path(tmp)
        # Ray's sockets and logs in this run's folder (unix socket paths must stay short)
        os.environ["RAY_TMPDIR"] = str(work / "ray")
        (work / "ray").mkdir()
        try:
            return run(args, binary, work)
        finally:
            stop_ray()


def stop_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception as e:  # the cluster is stopped below whatever the driver says
        print(f"ray.shutdown: {e}")
    ray_cli = Path(sys.executable).parent / "ray"
    done = subprocess.run(
        [str(ray_cli), "stop", "--force"], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        print(f"`ray stop --force` failed ({done.returncode}): {done.stderr.strip()[-500:]}")


if __name__ == "__main__":
    sys.exit(main())
