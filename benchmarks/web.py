"""In-browser latency of ferry's web bundle (onnxruntime-web, wasm) against ONNX Runtime native.

For each model, one bundle from ``ferry.web.export_web`` is served twice on 127.0.0.1: with the
cross-origin isolation headers (COOP/COEP: the page can use SharedArrayBuffer, so onnxruntime-web
runs its wasm kernels on threads) and without (one thread, as on most static hosts). Two headless
Chromium pages (Debian's ``chromium`` through ``chromedriver``: ``scripts/browser-env.sh``) open
them; the page's ``window.ferryBench(feeds, n)`` times ``n`` runs in the page and gives the
median. Against them: ONNX Runtime's Python API in this process on the same ``.onnx`` file and
inputs, with its default intra-op threads (one per core) and with one thread.

Modes alternate in blocks (native, native 1 thread, wasm threads, wasm 1 thread, then again for
``--rounds``) so drift on this shared machine hits them alike; each figure is the median of the
block medians. Printed: the table with the ratios wasm/native at equal thread counts, the
threads each side used (the page's worker count from Chromium's DevTools targets), and the
machine's load before and after.

Models: the zoo's ``digits_cnn`` (batch 1, a real digit), and from the real-model kit
(``scripts/fetch-kit.sh``) ``orientation`` (a 224x224 document classifier) and ``captcha_ocr``
(a CNN+LSTM CTC text recognizer at 64x160), on the kit's realistic inputs.

    python benchmarks/web.py [--iterations 30] [--rounds 3] [--models digits_cnn,orientation,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "web"))
sys.path.insert(0, str(ROOT / "tests" / "real"))

import browser  # noqa: E402  (tests/web/browser.py: the page harness)

MODELS = ("digits_cnn", "orientation", "captcha_ocr")


def model_and_feeds(name: str, folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The model's ONNX file and one realistic input at its real size."""
    if name == "digits_cnn":
        import onnx_ir as ir

        import ferry.zoo

        path = folder / "digits_cnn.onnx"
        ir.save(ferry.zoo.build("digits_cnn"), path)
        _, _, x_test, _ = ferry.zoo.digits_data()
        return path, {"input": np.ascontiguousarray(x_test[:1])}
    import kit_models

    if not kit_models.kit_ready():
        raise SystemExit(f"the real-model kit is not in {kit_models.KIT_DIR}: scripts/fetch-kit.sh")
    return kit_models.path(name), kit_models.feeds(name)


def native_block(session: object, feeds: dict[str, np.ndarray], n: int) -> float:
    """Median ms of ``n`` calls of an ``onnxruntime.InferenceSession``."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        session.run(None, feeds)  # type: ignore[attr-defined]
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _busy(seconds: float = 1.0) -> str:
    """The share of all cores busy over ``seconds`` (``/proc/stat``; Linux only): unlike the load
    average, it does not lag a minute behind (nor count this benchmark's own past runs)."""

    def sample() -> tuple[int, int]:
        with Path("/proc/stat").open(encoding="ascii") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    try:
        busy0, total0 = sample()
        time.sleep(seconds)
        busy1, total1 = sample()
    except OSError:
        return "n/a"
    return f"{100.0 * (busy1 - busy0) / max(1, total1 - total0):.0f}%"


def load() -> str:
    one, five, _ = os.getloadavg()
    return (
        f"cores busy {_busy()} (1 s), load average {one:.2f} (1 min), {five:.2f} (5 min) "
        f"on {os.cpu_count()} cores"
    )


def versions() -> str:
    import onnxruntime

    chromium = browser.find_chromium()
    chromium_version = (
        subprocess.run([chromium[0], "--version"], capture_output=True, text=True).stdout.strip()
        if not isinstance(chromium, str)
        else "no chromium"
    )
    return f"{chromium_version}; onnxruntime {onnxruntime.__version__} (Python); {platform.processor() or platform.machine()}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=30, help="calls per block (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="blocks per mode (default 3)")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()

    found = browser.find_chromium()
    if isinstance(found, str):
        print(f"web benchmark: {found}", file=sys.stderr)
        return 2
    if shutil.which("npm") is None:
        print(
            "web benchmark: npm not found (the exporter needs it): scripts/browser-env.sh",
            file=sys.stderr,
        )
        return 2
    import onnxruntime as ort

    from ferry.web import export_web

    print(versions())
    print(f"before: {load()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferry-web-bench-") as tmp:
        for name in args.models.split(","):
            folder = Path(tmp) / name
            folder.mkdir()
            model, feeds = model_and_feeds(name, folder)
            bundle = folder / "site"
            export_web(model, bundle, samples=feeds)
            native = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            native1 = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            with ExitStack() as stack:
                pages = {}
                for mode, isolate in (("wasm threads", True), ("wasm 1 thread", False)):
                    base = stack.enter_context(browser.serve_static(bundle, isolate=isolate))
                    page = stack.enter_context(browser.Page(base + "index.html", timeout=300))
                    page.ready()
                    page.run(feeds)  # warm-up: the first run compiles and allocates
                    pages[mode] = page
                for session in (native, native1):
                    session.run(None, feeds)
                threads = {
                    mode: 1 + len(page.workers()) for mode, page in pages.items()
                }  # the page's own thread + onnxruntime-web's pthread workers
                blocks: dict[str, list[float]] = {
                    "native": [], "native 1 thread": [], "wasm threads": [], "wasm 1 thread": []
                }  # fmt: skip
                for _ in range(args.rounds):
                    blocks["native"].append(native_block(native, feeds, args.iterations))
                    blocks["native 1 thread"].append(native_block(native1, feeds, args.iterations))
                    for mode, page in pages.items():
                        blocks[mode].append(page.bench(feeds, args.iterations))
            med = {mode: statistics.median(v) for mode, v in blocks.items()}
            shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
            rows.append((name, shape, med, threads))
            print(f"  {name}: done ({load()})", flush=True)

    print(f"after: {load()}")
    print(
        f"\nmedian ms of {args.iterations} calls per block, median of {args.rounds} blocks; "
        f"native = onnxruntime (Python) with its default intra-op threads ({os.cpu_count()} cores)"
    )
    header = (
        f"{'model':<12} {'input':<14} {'native':>8} {'native 1t':>9} {'wasm Nt':>8} {'wasm 1t':>8}"
        f" {'threads':>7} {'wasm/native':>11} {'wasm/native 1t':>14} {'threads gain':>12}"
    )
    print(header)
    print("-" * len(header))
    for name, shape, med, threads in rows:
        print(
            f"{name:<12} {shape:<14} {med['native']:8.3f} {med['native 1 thread']:9.3f}"
            f" {med['wasm threads']:8.3f} {med['wasm 1 thread']:8.3f}"
            f" {threads['wasm threads']:>3}/{threads['wasm 1 thread']:<3}"
            f" {med['wasm threads'] / med['native']:10.2f}x"
            f" {med['wasm 1 thread'] / med['native 1 thread']:13.2f}x"
            f" {med['wasm 1 thread'] / med['wasm threads']:11.2f}x"
        )
    print(
        "\nwasm/native: the page's latency over native ONNX Runtime's (threads vs default threads,"
        " 1 thread vs 1 thread); threads gain: wasm 1 thread over wasm threads. 'threads' is the"
        " page's threads with the isolation headers / without."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
