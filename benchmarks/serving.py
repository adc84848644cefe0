"""``ferry serve`` against NVIDIA Triton (PyTriton, ONNX Runtime inside), and against raw ORT.

One run: both servers up side by side, the same ONNX files, the same engine (ONNX Runtime, the same
intra-op threads per instance), the same dynamic batching settings, the same clients. For each model
and each concurrency (1, 8, 32), closed-loop clients send batch-1 requests for a few seconds to

* ``raw ORT``: an ``onnxruntime.InferenceSession`` in this process, called from N threads with
  the session options ferry's engine uses (the reference: no HTTP, no batching);
* ``ferry`` / ``ferry+batch``: ``ferry serve`` (its own process) with dynamic batching off
  (``max_batch_size`` 0) / on;
* ``triton`` / ``triton+batch``: Triton's C++ server through PyTriton, the model an ONNX Runtime
  session in PyTriton's Python callable, batching off / on with the same ``max_batch_size`` and
  ``max_queue_delay_microseconds``, one instance with the intra-op threads ferry gives its one.

Models: ``magika_like`` (a 1D CNN over 2048 int32 bytes, built here with onnx.helper from a
seeded RNG; about 3 ms a call on one thread and as much per row in a batch: batching does not help)
and the zoo's ``digits_cnn`` (0.05 ms a call: batching and the server's own cost decide);
``--models`` takes any zoo model too.

Clients: Triton's Python client (``tritonclient.http``, binary tensors, N greenlets over one
pooled client; its own cost counts, as it would for a user), and, when set up, Triton's C++ load
generator ``perf_analyzer`` on the batched modes, as a second opinion with a client that costs
little CPU (this machine has 2 cores, which the client shares with the servers).

gRPC: the modes ``ferry-grpc``, ``ferry-grpc+batch``, ``triton-grpc``, ``triton-grpc+batch`` (not
in the default ``--modes``) are the same servers over Triton's gRPC protocol (ferry: ``ferry serve
--grpc-port``): ``tritonclient.grpc`` with N requests in flight on one client (each answer sends
the next), and ``perf_analyzer -i grpc`` on the batched ones.

Modes alternate in blocks (raw, ferry, ..., then reversed, ...) so drift on this shared machine
hits them alike. Printed per cell: requests/s, p50 and p99 latency, throughput over raw ORT's, the
server's CPU time per request (``srv us``: its process tree, from /proc), for ferry the part of it
its event loop thread spends (``loop us``: HTTP parsing and writing, codec, request checks,
batcher, executor hand-offs, asyncio: ferry's per-request Python cost, which one core bounds),
and this process's (the client's) CPU per request (``cli us``). Then ferry/Triton per concurrency and the goals: at c=32 ferry's
throughput at least Triton's with a p99 no worse (every model, batched and plain), and dynamic
batching at least doubles ferry's throughput on digits_cnn. The exit status is 1 when a goal is
missed.

    python benchmarks/serving.py [--seconds 3] [--rounds 2] [--concurrency 1,8,32]
                                 [--models magika_like,digits_cnn] [--modes raw,ferry,...]
                                 [--delay-us 100] [--instances 1] [--server process|thread]
                                 [--perf-analyzer auto|off] [--py-spy OUT_DIR]

Triton and perf_analyzer come from ``bash scripts/triton-bench-env.sh`` (``.venv-triton``, or
``$FERRY_TRITON_PYTHON`` / ``$FERRY_PERF_ANALYZER``); without them the benchmark runs ferry and raw
ORT alone and says so. ``--py-spy DIR`` samples ``ferry serve`` with py-spy during its c=32
batched blocks and prints where its time goes (py-spy must be installed: ``pip install py-spy``).

This file is also the Triton worker: ``.venv-triton/bin/python benchmarks/serving.py
triton-server SPEC.json`` (it imports neither ferry nor anything ``.venv-triton`` lacks at the top).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRITON_VENV = ROOT / ".venv-triton"
CONCURRENCY = (1, 8, 32)
MODES = ("raw ORT", "ferry", "ferry+batch", "triton", "triton+batch")
# The same servers over Triton's gRPC protocol (tritonclient.grpc; perf_analyzer -i grpc).
MODES += ("ferry grpc", "ferry grpc+batch", "triton grpc", "triton grpc+batch")
MODE_KEYS = {"raw": "raw ORT", "ferry": "ferry", "ferry+batch": "ferry+batch"}
MODE_KEYS.update({"triton": "triton", "triton+batch": "triton+batch"})
MODE_KEYS.update({f"{m.replace(' ', '-')}": m for m in MODES if "grpc" in m})
#: The modes perf_analyzer also drives (the batched ones), each with the mode it is compared to.
PA_MODES = {
    "ferry+batch": "triton+batch",
    "triton+batch": None,
    "ferry grpc+batch": "triton grpc+batch",
    "triton grpc+batch": None,
}
MAX_BATCH = 32
BATCH_GOAL = 2.0  # dynamic batching on digits_cnn at c=32, ferry+batch over ferry
DEFAULT_MODELS = "magika_like,digits_cnn"
MAGIKA_LEN = 2048
MAGIKA_CLASSES = 100


# ---------------------------------------------------------------------------------------------
# models


@dataclass
class BenchModel:
    name: str
    path: Path
    feeds: dict[str, np.ndarray]  # one request: batch 1
    output: str


def build_magika_like(directory: Path) -> Path:
    """A Magika-like content-type classifier: int32 bytes [batch, 2048] -> Gather (an embedding of
    257 x 64) -> Conv1d 64->128 k8 s4, ReLU -> Conv1d 128->192 k5, ReLU, MaxPool 2 -> Conv1d
    192->256 k3, ReLU -> global max pool -> Dense 256->256, ReLU -> Dense 256->100 -> Softmax.

    Seeded weights, the same file every time. About 3 ms per row on one core, at any batch size.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(20260)

    def weight(name: str, *shape: int, scale: float | None = None) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        array = rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))
        return numpy_helper.from_array(array.astype(np.float32), name)

    emb, c1, c2, c3, hidden = 64, 128, 192, 256, 256
    initializers = [
        weight("embedding", 257, emb, scale=1.0),
        weight("conv1.w", c1, emb, 8),
        weight("conv1.b", c1, scale=0.1),
        weight("conv2.w", c2, c1, 5),
        weight("conv2.b", c2, scale=0.1),
        weight("conv3.w", c3, c2, 3),
        weight("conv3.b", c3, scale=0.1),
        # Gemm computes x @ W: W is [in, out]
        weight("dense1.w", c3, hidden),
        weight("dense1.b", hidden, scale=0.1),
        weight("dense2.w", hidden, MAGIKA_CLASSES),
        weight("dense2.b", MAGIKA_CLASSES, scale=0.1),
    ]
    node = helper.make_node
    nodes = [
        node("Gather", ["embedding", "bytes"], ["embedded"], axis=0),  # [B, 2048, emb]
        node("Transpose", ["embedded"], ["channels"], perm=[0, 2, 1]),  # [B, emb, 2048]
        node(
            "Conv",
            ["channels", "conv1.w", "conv1.b"],
            ["c1"],
            kernel_shape=[8],
            strides=[4],
            pads=[2, 2],
        ),
        node("Relu", ["c1"], ["r1"]),
        node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], kernel_shape=[5], pads=[2, 2]),
        node("Relu", ["c2"], ["r2"]),
        node("MaxPool", ["r2"], ["p2"], kernel_shape=[2], strides=[2]),
        node("Conv", ["p2", "conv3.w", "conv3.b"], ["c3"], kernel_shape=[3], pads=[1, 1]),
        node("Relu", ["c3"], ["r3"]),
        node("GlobalMaxPool", ["r3"], ["pooled"]),
        node("Flatten", ["pooled"], ["flat"]),
        node("Gemm", ["flat", "dense1.w", "dense1.b"], ["h"]),
        node("Relu", ["h"], ["hr"]),
        node("Gemm", ["hr", "dense2.w", "dense2.b"], ["logits"]),
        node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "magika_like",
        [helper.make_tensor_value_info("bytes", TensorProto.INT32, ["batch", MAGIKA_LEN])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", MAGIKA_CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "magika_like.onnx"
    onnx.save(model, path)
    return path


def prepare_models(names: list[str], directory: Path) -> list[BenchModel]:
    models = []
    for name in names:
        if name == "magika_like":
            path = build_magika_like(directory)
            data = np.random.default_rng(0).integers(0, 256, (1, MAGIKA_LEN), dtype=np.int32)
            models.append(BenchModel(name, path, {"bytes": data}, "probs"))
        else:
            from ferry import zoo

            path = zoo.save(name, directory, dynamic_batch=True)
            spec = zoo.get_spec(name)
            models.append(
                BenchModel(name, path, zoo.example_inputs(name, batch=1), spec.output_name)
            )
    return models


# ---------------------------------------------------------------------------------------------
# measurements


@dataclass
class Cell:
    """Latencies (seconds), the time they were collected over, and CPU seconds, summed across
    blocks."""

    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    loop_cpu: float = 0.0  # ferry's event loop thread
    has_server_cpu: bool = False
    has_loop_cpu: bool = False

    def add(self, block: Block) -> None:
        self.latencies.extend(block.latencies)
        self.seconds += block.seconds
        self.client_cpu += block.client_cpu
        if block.server_cpu is not None:
            self.server_cpu += block.server_cpu
            self.has_server_cpu = True
        if block.loop_cpu is not None:
            self.loop_cpu += block.loop_cpu
            self.has_loop_cpu = True

    @property
    def count(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1e3 if self.latencies else float("nan")

    def per_request_us(self, seconds: float, present: bool = True) -> float:
        return seconds / self.count * 1e6 if present and self.count else float("nan")


@dataclass
class Block:
    latencies: list[float]
    seconds: float
    client_cpu: float = 0.0
    server_cpu: float | None = None
    loop_cpu: float | None = None


def raw_block(
    session: Any, feeds: dict[str, np.ndarray], concurrency: int, seconds: float
) -> Block:
    """N threads calling ``session.run`` back to back for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    start = time.perf_counter()
    deadline = start + seconds

    def loop(mine: list[float]) -> None:
        run = session.run
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline:
                return
            run(None, feeds)
            mine.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(lat,)) for lat in latencies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return Block([x for lat in latencies for x in lat], elapsed)


class ServeClient:
    """Closed-loop tritonclient requests from N greenlets over one pooled client.

    tritonclient.http is gevent-based: N greenlets in one thread keep N requests in flight with
    far less overhead than N OS threads, each with a client of its own, on two cores.
    """

    def __init__(self, url: str, concurrency: int) -> None:
        import tritonclient.http as httpclient

        self.client = httpclient.InferenceServerClient(
            url.removeprefix("http://"), concurrency=concurrency, network_timeout=120
        )
        self.concurrency = concurrency
        self._http = httpclient

    def block(
        self, model: str, feeds: dict[str, np.ndarray], output: str, seconds: float
    ) -> tuple[list[float], float]:
        import gevent
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, array in feeds.items():
            tensor = self._http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inputs.append(tensor.set_data_from_numpy(array, binary_data=True))
        outputs = [self._http.InferRequestedOutput(output, binary_data=True)]
        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + seconds

        def loop() -> None:
            while True:
                t0 = time.perf_counter()
                if t0 >= deadline:
                    return
                self.client.infer(model, inputs, outputs=outputs).as_numpy(output)
                latencies.append(time.perf_counter() - t0)

        greenlets = [gevent.spawn(loop) for _ in range(self.concurrency)]
        gevent.joinall(greenlets, raise_error=True)
        return latencies, time.perf_counter() - start

    def close(self) -> None:
        self.client.close()


class GrpcServeClient:
    """Closed-loop ``tritonclient.grpc`` requests, N in flight on one client: each answer (on
    grpc's callback thread) sends the next request, as N synchronous clients would."""

    def __init__(self, address: str, concurrency: int) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(address)
        self.concurrency = concurrency
        self._grpc = grpcclient

    def block(
        self, model: str, feeds: dict[str, np.ndarray], output: str, seconds: float
    ) -> tuple[list[float], float]:
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, array in feeds.items():
            tensor = self._grpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            inputs.append(tensor.set_data_from_numpy(array))
        outputs = [self._grpc.InferRequestedOutput(output)]
        latencies: list[float] = []
        errors: list[Any] = []
        lock = threading.Lock()
        left = [self.concurrency]
        finished = threading.Event()
        start = time.perf_counter()
        deadline = start + seconds

        def send() -> None:
            t0 = time.perf_counter()
            if t0 >= deadline or errors:
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        finished.set()
                return
            # tritonclient calls back with keywords: callback(result=..., error=...)
            self.client.async_infer(
                model,
                inputs,
                lambda result, error: answered(t0, result, error),
                outputs=outputs,
            )

        def answered(t0: float, result: Any, error: Any) -> None:
            try:
                if error is not None:
                    errors.append(error)
                else:
                    result.as_numpy(output)
                    latencies.append(time.perf_counter() - t0)
            except Exception as e:  # on grpc's thread: lost otherwise, and the loop with it
                errors.append(e)
            send()

        for _ in range(self.concurrency):
            send()
        finished.wait()
        if errors:
            raise SystemExit(f"tritonclient.grpc failed on {model}: {errors[0]}")
        return latencies, time.perf_counter() - start

    def close(self) -> None:
        self.client.close()


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of ``pid`` and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        child = int(entry.name)
        children.setdefault(int(fields[1]), []).append(child)
        times[child] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += times.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


@dataclass
class Server:
    """A running server: its URL, the process whose tree does its work (None: in this process)."""

    kind: str  # "ferry" or "triton"
    url: str
    pid: int | None
    #: ferry's event loop thread (HTTP, codec, batcher: its Python per request), when found
    loop_tid: int | None = None
    #: where it serves Triton's gRPC protocol (``host:port``)
    grpc: str | None = None

    def cpu(self) -> float | None:
        return _tree_cpu(self.pid) if self.pid is not None else None

    def loop_cpu(self) -> float | None:
        if self.pid is None or self.loop_tid is None:
            return None
        try:
            stat = Path(f"/proc/{self.pid}/task/{self.loop_tid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_EPOLL_SYSCALLS = {"232", "281", "441"}  # x86_64: epoll_wait, epoll_pwait, epoll_pwait2


def find_loop_thread(pid: int) -> int | None:
    """The thread of an idle ``ferry serve`` that waits in epoll: its one event loop (the other
    threads, the engines' and the main one, wait on locks). None when not exactly one does."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with suppress(OSError):
            if (task / "syscall").read_text().split(" ", 1)[0] in _EPOLL_SYSCALLS:
                found.append(int(task.name))
    return found[0] if len(found) == 1 else None


def served_block(
    server: Server,
    client: ServeClient | GrpcServeClient,
    model: str,
    bench: BenchModel,
    seconds: float,
) -> Block:
    cpu0, loop0, client0 = server.cpu(), server.loop_cpu(), time.process_time()
    latencies, elapsed = client.block(model, bench.feeds, bench.output, seconds)
    client1 = time.process_time()
    cpu1, loop1 = server.cpu(), server.loop_cpu()
    return Block(
        latencies,
        elapsed,
        client1 - client0,
        None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        None if loop0 is None or loop1 is None else loop1 - loop0,
    )


# ---------------------------------------------------------------------------------------------
# perf_analyzer


def find_perf_analyzer() -> str | None:
    """$FERRY_PERF_ANALYZER, else scripts/triton-bench-env.sh's wrapper; None when neither runs."""
    binary = os.environ.get("FERRY_PERF_ANALYZER") or str(TRITON_VENV / "bin" / "perf_analyzer")
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return binary if done.returncode == 0 else None


@dataclass
class PaResult:
    throughput: float
    p50_ms: float
    p99_ms: float


def perf_analyzer_run(
    binary: str,
    url: str,
    model: str,
    bench: BenchModel,
    concurrency: int,
    batched: bool,
    workdir: Path,
    window_ms: int,
    protocol: str = "http",
) -> PaResult | str:
    """One perf_analyzer measurement (its own stabilising windows); the result or why it failed."""
    data_file = workdir / f"{bench.name}-{'b' if batched else 'p'}.json"
    if not data_file.exists():
        entry = {
            name: {
                "content": array.reshape(-1).tolist(),
                "shape": list(array.shape[1:] if batched else array.shape),
            }
            for name, array in bench.feeds.items()
        }
        data_file.write_text(json.dumps({"data": [entry]}))
    report = workdir / f"pa-{model}-{concurrency}-{protocol}.csv"
    command = [
        binary,
        "-m",
        model,
        "-u",
        url.removeprefix("http://"),
        "-i",
        protocol,
        "--concurrency-range",
        str(concurrency),
        "--input-data",
        str(data_file),
        "--measurement-interval",
        str(window_ms),
        "--max-trials",
        "5",
        "--stability-percentage",
        "25",
        "-f",
        str(report),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0 or not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return f"exit {done.returncode}: {' / '.join(tail)}"
    with report.open() as f:
        row = next(csv.DictReader(f))
    return PaResult(
        float(row["Inferences/Second"]),
        float(row["p50 latency"]) / 1e3,
        float(row["p99 latency"]) / 1e3,
    )


# ---------------------------------------------------------------------------------------------
# the servers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_repository(repo: Path, models: list[BenchModel], delay_us: int, instances: int) -> None:
    """``repo/<name>_plain`` (no batching) and ``repo/<name>_batched`` for each model."""
    for bench in models:
        # instances 0: no instance_group, each server's own default (ferry decides per model)
        group = {"instance_group": [{"count": instances}]} if instances else {}
        configs = {
            f"{bench.name}_plain": {"max_batch_size": 0, **group},
            f"{bench.name}_batched": {
                "max_batch_size": MAX_BATCH,
                "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
                **group,
            },
        }
        for model, config in configs.items():
            (repo / model / "1").mkdir(parents=True)
            shutil.copyfile(bench.path, repo / model / "1" / "model.onnx")
            (repo / model / "config.json").write_text(json.dumps(config))


def server_threads(url: str, model: str) -> int:
    """The intra-op threads ferry gave each instance of ``model`` (from its /config)."""
    import httpx

    config = httpx.get(f"{url}/v2/models/{model}/config", timeout=10).json()
    value = config.get("parameters", {}).get("ferry_intra_op_threads", {}).get("string_value")
    return int(value) if value else available_cores()


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _stop(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_ready(
    url: str, process: subprocess.Popen[Any] | None, what: str, log: Path, models: list[str]
) -> None:
    """Until the server and every one of ``models`` are ready (PyTriton's server says ready
    before it has bound its models)."""
    import httpx

    deadline = time.monotonic() + 180
    waiting = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with suppress(httpx.TransportError):
            while waiting and httpx.get(url + waiting[0], timeout=2).status_code == 200:
                waiting.pop(0)
            if not waiting:
                return
        time.sleep(0.2)
    raise SystemExit(f"{what} at {url} was not ready after 180 s:\n{log.read_text()[-3000:]}")


@contextmanager
def ferry_server(repo: Path, kind: str, logs: Path) -> Iterator[Server]:
    """``ferry serve`` on ``repo``, as its own process or in a thread of this one."""
    if kind == "thread":
        from ferry.serving import GrpcServer, ServerThread, create_app

        app = create_app(repo)
        with ServerThread(app, host="127.0.0.1", port=0) as thread, GrpcServer(app, port=0) as g:
            yield Server("ferry", str(thread.url), None, grpc=g.address)
        return
    port, grpc_port = _free_port(), _free_port()
    log = logs / "ferry.log"
    command = [sys.executable, "-m", "ferry.cli.main", "serve", str(repo), "--port", str(port)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--grpc-port", str(grpc_port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, "ferry serve", log, [])
        time.sleep(0.5)  # idle: its event loop waits in epoll
        grpc = f"127.0.0.1:{grpc_port}"
        yield Server("ferry", url, process.pid, find_loop_thread(process.pid), grpc=grpc)
    finally:
        _stop(process)


def find_triton_python() -> str | None:
    """$FERRY_TRITON_PYTHON, else .venv-triton's; None when it cannot import PyTriton and ORT."""
    python = os.environ.get("FERRY_TRITON_PYTHON") or str(TRITON_VENV / "bin" / "python")
    check = "import pytriton.triton, onnxruntime"
    try:
        done = subprocess.run([python, "-c", check], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if done.returncode == 0 else None


@contextmanager
def triton_server(
    python: str,
    models: list[BenchModel],
    threads: int,
    delay_us: int,
    instances: int,
    logs: Path,
) -> Iterator[Server]:
    """Triton (PyTriton) serving ``<name>_plain`` and ``<name>_batched`` for each model."""
    port = _free_port()
    spec = {
        "http_port": port,
        "grpc_port": _free_port(),
        "metrics_port": _free_port(),
        "models": [
            {
                "name": f"{bench.name}_{kind}",
                "path": str(bench.path),
                "max_batch_size": MAX_BATCH if kind == "batched" else 0,
                "delay_us": delay_us,
                # instances 0: Triton's defaults, one instance with ONNX Runtime's own thread
                # count (every core), as a user who writes no config gets
                "threads": threads if instances else 0,
                "instances": instances or 1,
            }
            for bench in models
            for kind in ("plain", "batched")
        ],
    }
    spec_file = logs / "triton-spec.json"
    spec_file.write_text(json.dumps(spec))
    log = logs / "triton.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "triton-server", str(spec_file)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, "the Triton worker", log, [m["name"] for m in spec["models"]])
        yield Server("triton", url, process.pid, grpc=f"127.0.0.1:{spec['grpc_port']}")
    finally:
        with suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]  # the worker stops Triton
        _stop(process, timeout=60)


def triton_worker(spec_file: str) -> int:
    """Run in .venv-triton's Python: Triton (PyTriton) with each model an ORT session."""
    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import (
        DEFAULT_PROTECTED_ENDPOINTS,
        Triton,
        TritonConfig,
        TritonSecurityConfig,
    )

    spec = json.loads(Path(spec_file).read_text())
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=spec["http_port"],
        grpc_address="127.0.0.1",
        grpc_port=spec["grpc_port"],
        metrics_port=spec["metrics_port"],
        exit_timeout_secs=5,
        log_verbose=0,
    )
    types = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64}

    def make(model: dict[str, Any]) -> tuple[Callable[..., Any], list[Tensor], list[Tensor]]:
        # ferry's ONNX Runtime session options (ferry.backends._onnxruntime.session_options)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(model["threads"])
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(model["path"], options, providers=["CPUExecutionProvider"])
        run = getattr(session, "_sess", session).run  # as ferry's engine calls it
        names = [o.name for o in session.get_outputs()]
        batched = model["max_batch_size"] > 0

        def shape(dims: list[Any]) -> tuple[int, ...]:
            dims = dims[1:] if batched else dims
            return tuple(d if isinstance(d, int) else -1 for d in dims)

        inputs = [
            Tensor(name=i.name, dtype=types[i.type], shape=shape(i.shape))
            for i in session.get_inputs()
        ]
        outputs = [
            Tensor(name=o.name, dtype=types[o.type], shape=shape(o.shape))
            for o in session.get_outputs()
        ]
        if batched:

            @batch
            def infer(**feeds: np.ndarray) -> dict[str, np.ndarray]:
                return dict(zip(names, run(names, feeds, None)))

            return infer, inputs, outputs

        def infer_each(requests: list[Any]) -> list[dict[str, np.ndarray]]:
            return [dict(zip(names, run(names, dict(r.data), None))) for r in requests]

        return infer_each, inputs, outputs

    # PyTriton restricts the statistics API to its own token; perf_analyzer reads it.
    security = TritonSecurityConfig(
        restricted_endpoints=[e for e in DEFAULT_PROTECTED_ENDPOINTS if e != "statistics"]
    )
    with Triton(config=config, security_config=security) as triton:
        for model in spec["models"]:
            # one callable (an ORT session) per instance, as Triton's instance_group count
            made = [make(model) for _ in range(int(model.get("instances", 1)))]
            _, inputs, outputs = made[0]
            batched = model["max_batch_size"] > 0
            triton.bind(
                model_name=model["name"],
                infer_func=[infer for infer, _, _ in made],
                inputs=inputs,
                outputs=outputs,
                config=ModelConfig(
                    batching=batched,
                    max_batch_size=model["max_batch_size"] if batched else 0,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=model["delay_us"]),
                ),
            )
        triton.run()
        print("triton ready", flush=True)
        sys.stdin.read()  # until the benchmark closes our stdin
    return 0


# ---------------------------------------------------------------------------------------------
# profiling


PY_SPY_RATE = 250
PROFILE_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (category, substrings of a frame): a sample goes to the first category, from the leaf up,
    # whose substring one of its frames has
    ("engine run (ORT)", ("onnxruntime/capi", "run (ferry/backends/", "run_items (ferry/serving")),
    ("codec (decode/encode)", ("ferry/serving/_codec.py",)),
    (
        "request path (_infer_core, prepare, checks)",
        ("ferry/serving/_app.py", "ferry/serving/_scheduler.py", "ferry/runtime/"),
    ),
    ("batcher", ("ferry/serving/_batcher.py",)),
    ("metrics/stats", ("ferry/serving/_metrics.py", "prometheus_client")),
    ("body read (ferry/serving/_http.py)", ("ferry/serving/_http.py",)),
    ("HTTP parse/write (uvicorn, httptools)", ("uvicorn/", "httptools")),
    ("starlette", ("starlette/",)),
    (
        "executor hop (concurrent.futures, call_soon_threadsafe)",
        ("concurrent/futures", "call_soon_threadsafe", "_write_to_self", "run_in_executor"),
    ),
    # uvloop runs the loop in C: a sample whose leaf-most Python frame is the runner is uvloop's
    # own code (socket reads and writes, epoll, calling callbacks), kernel time included
    (
        "event loop, native (uvloop/libuv: socket I/O, epoll, dispatch)",
        ("asyncio/runners.py", "run_forever (", "run_until_complete ("),
    ),
    ("event loop, Python (asyncio tasks, futures, queues)", ("asyncio/", "uvloop")),
)


def _thread_kind(root: str) -> str:
    name = root.partition(": ")[2] or root
    if name == "ferry-server":
        return "event loop"
    if name.startswith("ferry-load"):
        return "loader"
    if name.startswith("ferry-"):
        return "engine"
    return "main" if name == "MainThread" else "other"


def summarize_profile(raw: Path, rate: int, seconds: float) -> list[tuple[str, float, str, float]]:
    """py-spy raw samples (on-CPU only, ``--threads``) by thread kind and category.

    Each sample goes to the category of its leaf-most frame that one names. Returns rows
    ``(thread kind, cores it kept busy, category, share of that thread's samples)``.
    """
    counts: dict[str, dict[str, int]] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        category = "other Python"
        for frame in reversed(frames[1:]):
            found = next(
                (name for name, needles in PROFILE_CATEGORIES if any(x in frame for x in needles)),
                None,
            )
            if found:
                category = found
                break
        mine = counts.setdefault(_thread_kind(frames[0]), {})
        mine[category] = mine.get(category, 0) + int(n)
    rows = []
    for kind, mine in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(mine.values())
        for category, n in sorted(mine.items(), key=lambda kv: -kv[1]):
            rows.append((kind, total / (rate * seconds), category, n / total))
    return rows


@contextmanager
def py_spy(pid: int | None, out: Path | None, seconds: float) -> Iterator[Path | None]:
    """py-spy record the ferry process while the block runs (nothing without ``out``)."""
    if out is None or pid is None:
        yield None
        return
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = out / f"ferry-{pid}-{int(time.time())}.txt"
    process = subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--threads",
            "--rate",
            str(PY_SPY_RATE),
            "--duration",
            str(max(1, int(seconds))),
            "--output",
            str(raw),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield raw
    finally:
        try:
            _, errors = process.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            process.kill()
            errors = "timed out"
        if process.returncode != 0:
            print(f"py-spy failed ({process.returncode}): {errors.strip()[-500:]}")


# ---------------------------------------------------------------------------------------------
# the run


def measure_model(
    bench: BenchModel,
    servers: dict[str, Server],
    modes: tuple[str, ...],
    seconds: float,
    rounds: int,
    concurrencies: tuple[int, ...],
    threads: int,
    profile_dir: Path | None,
) -> tuple[dict[tuple[str, int], Cell], list[tuple[Path, int]]]:
    import onnxruntime as ort

    from ferry.backends._onnxruntime import session_options

    raw = ort.InferenceSession(
        str(bench.path), session_options({"threads": threads}), providers=["CPUExecutionProvider"]
    )
    cells: dict[tuple[str, int], Cell] = {}
    profiles: list[tuple[Path, int]] = []
    for concurrency in concurrencies:
        clients: dict[str, ServeClient | GrpcServeClient] = {
            kind: GrpcServeClient(server.url, concurrency)
            if kind.endswith("grpc")
            else ServeClient(server.url, concurrency)
            for kind, server in servers.items()
        }

        def served(mode: str, client: ServeClient | GrpcServeClient) -> Callable[[float], Block]:
            server = servers[mode.split("+")[0]]
            model = f"{bench.name}_{'batched' if mode.endswith('+batch') else 'plain'}"
            return lambda s: served_block(server, client, model, bench, s)

        blocks: dict[str, Callable[[float], Block]] = {
            mode: (lambda s, c=concurrency: raw_block(raw, bench.feeds, c, s))
            if mode == "raw ORT"
            else served(mode, clients[mode.split("+")[0]])
            for mode in modes
        }
        for mode in modes:  # warm up: first calls allocate arenas and open connections
            blocks[mode](min(0.5, seconds))
        for mode in modes:
            cells[(mode, concurrency)] = Cell()
        for r in range(rounds):
            order = modes if r % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                profiling = (
                    profile_dir is not None
                    and mode == "ferry+batch"
                    and concurrency == max(concurrencies)
                    and r == 0
                )
                with py_spy(
                    servers["ferry"].pid if profiling else None,
                    profile_dir,
                    seconds / rounds,
                ) as raw_out:
                    cells[(mode, concurrency)].add(blocks[mode](seconds / rounds))
                if raw_out is not None:
                    profiles.append((raw_out, max(1, int(seconds / rounds))))
        for client in clients.values():
            client.close()
    return cells, profiles


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["triton-server"]:
        return triton_worker(argv[1])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell, over all rounds")
    parser.add_argument("--rounds", type=int, default=2, help="alternating blocks per cell")
    parser.add_argument(
        "--server",
        choices=("process", "thread"),
        default="process",
        help="ferry serve as its own process (as deployed) or a thread of this one",
    )
    parser.add_argument(
        "--delay-us",
        type=int,
        default=100,
        help="max_queue_delay_microseconds of the batched models (both servers)",
    )
    parser.add_argument(
        "--models", default=DEFAULT_MODELS, help="magika_like and/or zoo model names"
    )
    parser.add_argument("--modes", default="raw,ferry,ferry+batch,triton,triton+batch")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument(
        "--instances",
        type=int,
        default=0,
        help="instance_group count of the models on both servers, with ferry's intra-op threads "
        "on both; 0 (default): each server's defaults (ferry decides per model; Triton runs one "
        "instance on ONNX Runtime's default threads, every core)",
    )
    parser.add_argument(
        "--perf-analyzer",
        choices=("auto", "off"),
        default="auto",
        help="also drive the batched modes with perf_analyzer when it is set up",
    )
    parser.add_argument(
        "--pa-window-ms",
        type=int,
        default=1000,
        help="perf_analyzer's measurement window (it takes 3+ of them)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile ferry serve with py-spy in its c=max batched blocks",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    unknown = [m for m in args.modes.split(",") if m.strip() not in MODE_KEYS]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {sorted(MODE_KEYS)}")
    modes = tuple(m for m in MODES if m in {MODE_KEYS[k.strip()] for k in args.modes.split(",")})
    if args.server == "thread" and args.py_spy:
        parser.error("--py-spy needs --server process")

    import onnxruntime as ort

    import ferry

    triton_python = find_triton_python() if any(m.startswith("triton") for m in modes) else None
    if any(m.startswith("triton") for m in modes) and triton_python is None:
        print(
            "Triton: not set up (bash scripts/triton-bench-env.sh, or $FERRY_TRITON_PYTHON); "
            "measuring ferry alone"
        )
        modes = tuple(m for m in modes if not m.startswith("triton"))
    pa = find_perf_analyzer() if args.perf_analyzer == "auto" else None
    load1 = os.getloadavg()[0]
    print(
        f"ferry {ferry.__version__}, onnxruntime {ort.__version__}, {os.cpu_count()} CPUs "
        f"(load average {load1:.2f} at start), fp32, batch-1 requests; "
        + (
            f"{args.instances} instance(s) per model on both servers"
            if args.instances
            else "each server's default instances and threads"
        )
    )
    print(
        f"ferry serve in a {args.server}; Triton: {'PyTriton in ' + triton_python if triton_python else 'off'}; "
        f"client: tritonclient.http binary tensors, closed loop, "
        f"{args.seconds:g} s per cell in {args.rounds} alternating blocks; "
        f"perf_analyzer: {pa or 'off'}; batched models: max_batch_size {MAX_BATCH}, "
        f"max_queue_delay {args.delay_us} us"
    )
    results: dict[str, dict[tuple[str, int], Cell]] = {}
    pa_results: dict[tuple[str, str, int], PaResult | str] = {}
    profiles: dict[str, list[tuple[Path, int]]] = {}
    started = time.perf_counter()
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = prepare_models(names, work / "models")
        repo = work / "repo"
        build_repository(repo, models, args.delay_us, args.instances)
        with ferry_server(repo, args.server, work) as ferry_srv:
            threads = server_threads(ferry_srv.url, f"{models[0].name}_plain")
            if args.instances:
                print(
                    f"each engine instance (raw ORT's, ferry's, Triton's) runs {threads} "
                    "intra-op thread(s)"
                )
            else:
                print(
                    f"ferry gave {models[0].name}'s instances {threads} intra-op thread(s) each "
                    "(raw ORT runs that); Triton runs ONNX Runtime's default (every core)"
                )
            with contextlib_optional(
                triton_python is not None,
                lambda: triton_server(
                    triton_python, models, threads, args.delay_us, args.instances, work
                ),  # type: ignore[arg-type]
            ) as triton_srv:
                servers = {"ferry": ferry_srv}
                if triton_srv is not None:
                    servers["triton"] = triton_srv
                for kind, srv in list(servers.items()):  # the same server over gRPC
                    if srv.grpc is not None and any(m.startswith(f"{kind} grpc") for m in modes):
                        servers[f"{kind} grpc"] = dataclasses.replace(srv, url=srv.grpc)
                for bench in models:
                    results[bench.name], profiles[bench.name] = measure_model(
                        bench,
                        servers,
                        modes,
                        args.seconds,
                        args.rounds,
                        concurrencies,
                        threads,
                        args.py_spy,
                    )
                    if pa is None:
                        continue
                    for mode in PA_MODES:
                        if mode not in modes:
                            continue
                        server = servers[mode.split("+")[0]]
                        for concurrency in concurrencies:
                            pa_results[(bench.name, mode, concurrency)] = perf_analyzer_run(
                                pa,
                                server.url,
                                f"{bench.name}_batched",
                                bench,
                                concurrency,
                                True,
                                work,
                                args.pa_window_ms,
                                "grpc" if "grpc" in mode else "http",
                            )
    load2 = os.getloadavg()[0]
    return report(results, pa_results, profiles, modes, concurrencies, started, load1, load2)


@contextmanager
def contextlib_optional(enabled: bool, factory: Callable[[], Any]) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    with factory() as value:
        yield value


def _f(value: float, width: int, digits: int = 0) -> str:
    return f"{'-':>{width}}" if value != value else f"{value:>{width}.{digits}f}"


def report(
    results: dict[str, dict[tuple[str, int], Cell]],
    pa_results: dict[tuple[str, str, int], PaResult | str],
    profiles: dict[str, list[tuple[Path, int]]],
    modes: tuple[str, ...],
    concurrencies: tuple[int, ...],
    started: float,
    load1: float,
    load2: float,
) -> int:
    header = (
        f"{'model':<12}{'mode':<18}{'conc':>5}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'vs raw':>7}"
        f"{'srv us':>8}{'loop us':>8}{'cli us':>8}"
    )
    print()
    print("tritonclient.http, .grpc for the grpc modes (srv us: server CPU per request, all its")
    print("processes; loop us: ferry's event loop thread CPU per request; cli us: this client's")
    print("CPU per request)")
    print(header)
    print("-" * len(header))
    for name, cells in results.items():
        for concurrency in concurrencies:
            raw = cells.get(("raw ORT", concurrency))
            reference = raw.throughput if raw else float("nan")
            for mode in modes:
                cell = cells[(mode, concurrency)]
                ratio = cell.throughput / reference if reference else float("nan")
                srv = cell.per_request_us(cell.server_cpu, cell.has_server_cpu)
                loop = cell.per_request_us(cell.loop_cpu, cell.has_loop_cpu)
                cli = float("nan") if mode == "raw ORT" else cell.per_request_us(cell.client_cpu)
                print(
                    f"{name:<12}{mode:<18}{concurrency:>5}{cell.throughput:>8.0f}"
                    f"{cell.percentile(50):>8.2f}{cell.percentile(99):>8.2f}{_f(ratio, 7, 2)}"
                    f"{_f(srv, 8)}{_f(loop, 8)}{_f(cli, 8)}"
                )
    misses: list[str] = []  # the goal against Triton
    batch_misses: list[str] = []  # dynamic batching's own goal
    pairs = [
        (f, t)
        for f, t in (
            ("ferry", "triton"),
            ("ferry+batch", "triton+batch"),
            ("ferry grpc", "triton grpc"),
            ("ferry grpc+batch", "triton grpc+batch"),
        )
        if f in modes and t in modes
    ]
    if pairs:
        print()
        print("ferry / Triton (tritonclient.http)")
        head = f"{'model':<12}{'pair':<26}{'conc':>5}{'ferry/s':>9}{'triton/s':>9}{'ratio':>7}"
        head += f"{'p99 ferry':>10}{'p99 triton':>11}"
        print(head)
        print("-" * len(head))
        for name, cells in results.items():
            for f, t in pairs:
                for concurrency in concurrencies:
                    a, b = cells[(f, concurrency)], cells[(t, concurrency)]
                    ratio = a.throughput / b.throughput if b.throughput else float("nan")
                    p99a, p99b = a.percentile(99), b.percentile(99)
                    print(
                        f"{name:<12}{f + ' / ' + t:<26}{concurrency:>5}{a.throughput:>9.0f}"
                        f"{b.throughput:>9.0f}{ratio:>7.2f}{p99a:>10.2f}{p99b:>11.2f}"
                    )
                    if concurrency == max(concurrencies) and not (ratio >= 1.0 and p99a <= p99b):
                        misses.append(
                            f"{name} {f} vs {t} at c={concurrency}: {ratio:.2f}x, "
                            f"p99 {p99a:.2f} vs {p99b:.2f} ms"
                        )
    if pa_results:
        print()
        print("perf_analyzer (Triton's C++ load generator), batched models")
        head = f"{'model':<12}{'mode':<18}{'conc':>5}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'ferry/triton':>13}"
        print(head)
        print("-" * len(head))
        for name in results:
            for concurrency in concurrencies:
                for mode, versus in PA_MODES.items():
                    got = pa_results.get((name, mode, concurrency))
                    if got is None:
                        continue
                    if isinstance(got, str):
                        print(f"{name:<12}{mode:<18}{concurrency:>5}  failed: {got}")
                        continue
                    other = pa_results.get((name, versus, concurrency)) if versus else None
                    ratio = (
                        got.throughput / other.throughput
                        if isinstance(other, PaResult)
                        else float("nan")
                    )
                    print(
                        f"{name:<12}{mode:<18}{concurrency:>5}{got.throughput:>8.0f}"
                        f"{got.p50_ms:>8.2f}{got.p99_ms:>8.2f}{_f(ratio, 13, 2)}"
                    )
    for name, raws in profiles.items():
        for raw, seconds in raws:
            if not raw.exists():
                print(f"\npy-spy: no profile of {name} ({raw} missing)")
                continue
            print(
                f"\nwhere ferry serve's time goes: {name}, ferry+batch at c={max(concurrencies)}"
                f" (py-spy samples, {raw})"
            )
            shown = None
            for thread, cores, category, share in summarize_profile(raw, PY_SPY_RATE, seconds):
                if cores < 0.01:
                    continue
                if thread != shown:
                    print(f"  {thread} thread: on CPU {cores:.2f} of a core")
                    shown = thread
                if share >= 0.005:
                    print(f"    {category:<64}{share:>6.1%}")
    if (
        "digits_cnn" in results
        and ("ferry", 32) in results["digits_cnn"]
        and ("ferry+batch", 32) in results["digits_cnn"]
    ):
        cells = results["digits_cnn"]
        speedup = cells[("ferry+batch", 32)].throughput / cells[("ferry", 32)].throughput
        print(f"\ndynamic batching at c=32 on digits_cnn: {speedup:.2f}x (goal >= {BATCH_GOAL:g})")
        if speedup < BATCH_GOAL:
            batch_misses.append(f"dynamic batching on digits_cnn: {speedup:.2f}x")
    print(
        f"load average {load1:.2f} at start, {load2:.2f} at the end; "
        f"total {time.perf_counter() - started:.0f} s"
    )
    if pairs:
        top = max(concurrencies)
        verdict = "met" if not misses else "missed"
        print(f"goal: ferry >= Triton at c={top} with a p99 no worse: {verdict}")
    for miss in misses + batch_misses:
        print(f"  missed: {miss}")
    return 1 if misses or batch_misses else 0


if __name__ == "__main__":
    sys.exit(main())
