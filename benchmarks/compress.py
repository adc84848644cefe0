"""Pruning and distillation on real data: the issue's two cases, measured in one run.

* digits: the zoo's digits CNN, 50% of its channels removed (exact counts, ``multiple=1``) then
  distilled from the original on the unlabeled training digits; accuracy on the 360 real
  held-out test digits (with their labels) before, after pruning and after distillation.
* orientation: the kit's PP-LCNet document orientation classifier, 30% of its channels removed
  (counts kept multiples of the CPU's channel block) then distilled on unlabeled photographs
  (crops of those scikit-image and scikit-learn ship, four rotations each); top-1 agreement with
  the original on 64 rendered document pages none of the stages saw.

For each: MACs, weights' size, and ONNX Runtime latency (1 and 2 threads, the variants timed in
alternating blocks, median, ``ferry.runtime.block_medians``) against the original.

    python benchmarks/compress.py [--epochs-digits 12] [--epochs-orientation 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on sys.path: a module here named like a package
# would shadow it.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(ROOT / "tests" / "real"))

import ferry  # noqa: E402
from ferry.optimizer._task import model_bytes  # noqa: E402
from ferry.optimizer.prune import macs  # noqa: E402
from ferry.runtime import block_medians  # noqa: E402


def _latencies(models: dict[str, Any], feed: dict[str, np.ndarray]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {name: {} for name in models}
    for threads in (1, 2):
        sessions = {name: ferry.load(m, threads=threads) for name, m in models.items()}
        medians = block_medians([lambda s=s: s.run(feed) for s in sessions.values()], 6.0)
        for name, seconds in zip(sessions, medians):
            out[name][threads] = seconds * 1000
    return out


def _table(
    title: str, models: dict[str, Any], score_name: str, scores: dict[str, float], feed: Any
) -> None:
    times = _latencies(models, feed)
    base = times["original"]
    print(f"\n{title}")
    print(
        f"{'model':<22}{score_name:>12}{'MMACs':>9}{'weights':>10}"
        f"{'ms 1t':>8}{'x':>6}{'ms 2t':>8}{'x':>6}"
    )
    for name, model in models.items():
        size = model_bytes(model) / 1e6
        t1, t2 = times[name][1], times[name][2]
        print(
            f"{name:<22}{scores[name]:>12.4f}{macs(model) / 1e6:>9.2f}{size:>8.2f}MB"
            f"{t1:>8.3f}{base[1] / t1:>6.2f}{t2:>8.3f}{base[2] / t2:>6.2f}"
        )


def digits(epochs: int) -> None:
    from ferry import zoo
    from ferry.zoo._specs import get_spec

    name = get_spec("digits_cnn").input_name
    model = zoo.build("digits_cnn")
    x_train = zoo.digits_data()[0]
    feeds = [{name: x_train[i : i + 1]} for i in range(len(x_train))]
    start = time.perf_counter()
    pruned = ferry.prune(model, sparsity=0.5, multiple=1, criterion="activation", data=feeds)
    result = ferry.compress(
        model,
        recipe=f"prune:channel=0.5:multiple=1,distill:epochs={epochs}:lr=0.003",
        data=feeds,
        metric="top1",
        budget="3%",
    )
    seconds = time.perf_counter() - start

    def accuracy(m: Any) -> float:
        session = ferry.load(m)
        return zoo.digits_accuracy(lambda f: session.run(f), batch_size=1)

    models = {"original": model, "pruned 50%": pruned.model, "pruned + distilled": result.model}
    scores = {k: accuracy(m) for k, m in models.items()}
    _table(
        f"digits CNN, 360 real test digits ({seconds:.0f} s to prune and distill, "
        f"{result.report.held_back} held-back training digits judged it: "
        f"{'accepted' if result.accepted else result.report.refused})",
        models,
        "accuracy",
        scores,
        {name: x_train[:1]},
    )


def orientation(epochs: int) -> None:
    import kit_models
    from ferry.graph import load_model

    model = load_model(kit_models.path("orientation"))
    photos = [{"x": x} for x in kit_models.unlabeled_images(224, crops=12, pages=0)]
    pages = kit_models.rotated_pages(224, 16, first=100)
    start = time.perf_counter()
    result = ferry.compress(
        model,
        recipe=f"prune:channel=0.3,distill:epochs={epochs}",
        data=photos,
        metric="cosine",
        budget="5%",
    )
    seconds = time.perf_counter() - start
    pruned = ferry.prune(model, sparsity=0.3, criterion="activation", data=photos[::2])
    l1 = ferry.prune(model, sparsity=0.3)
    reference = ferry.load(model)
    want = np.array([reference.run({"x": p})["fetch_name_0"].argmax() for p in pages])

    def agreement(m: Any) -> float:
        session = ferry.load(m)
        got = np.array([session.run({"x": p})["fetch_name_0"].argmax() for p in pages])
        return float(np.mean(got == want))

    models = {
        "original": model,
        "pruned 30% (l1)": l1.model,
        "pruned 30% (activ.)": pruned.model,
        "pruned + distilled": result.model,
    }
    scores = {k: agreement(m) for k, m in models.items()}
    _table(
        f"orientation (PP-LCNet), top-1 agreement on 64 unseen pages ({len(photos)} photos, "
        f"{seconds:.0f} s to compress; "
        f"{'accepted' if result.accepted else result.report.refused})",
        models,
        "agreement",
        scores,
        {"x": pages[0]},
    )
    for line in result.report.lines():
        print("  " + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs-digits", type=int, default=12)
    parser.add_argument("--epochs-orientation", type=int, default=8)
    args = parser.parse_args(argv)
    import os

    print(f"load average {os.getloadavg()[0]:.2f} at the start; ONNX Runtime CPU, batch 1")
    digits(args.epochs_digits)
    orientation(args.epochs_orientation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
