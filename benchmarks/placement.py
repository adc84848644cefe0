"""Placement on the kit's real models: ONNX Runtime fp32, every candidate ``auto`` measures,
``auto``'s choice and an explicit ``["openvino", "onnxruntime"]`` plan, timed side by side.

One process, one run, every model of the real-model kit (``scripts/fetch-kit.sh``) at batch 1 on
the kit's realistic inputs (photos, rendered pages and text lines, audio), ONNX models as they
are, the others converted once per run with ``ferry.convert`` (Paddle needs
``FERRY_PADDLE_PYTHON``). The vision models run at their native sizes: PP-OCR det 640x640 (the
kit's page recipe rendered at that size; the kit itself feeds 640x480), layout 800x608, open_nsfw
224, captcha_det 416, orientation 224 (the kit's own sizes); the sequence and audio models,
recurrent state included (wakeword: its state inputs keep their defaults), on the kit's inputs as
they are.

For each model, ``auto_plan(model, feeds=..., cache=False)`` measures its candidates (ONNX
Runtime fp32, each engine at each precision it offers, the engines combined) and judges each
against ONNX Runtime fp32 with the default accuracy budget. Then ONNX Runtime fp32, every
candidate that ran (``ferry.load(path, plan=candidate.plan)``) and the explicit plan as
``ferry.load(path, backends="openvino,onnxruntime", example_inputs=feeds)`` runs it (load()
checks whether a split pays and may run ONNX Runtime alone) are timed again in one run of
alternating blocks of calls, each led by a few untimed calls (see ``alternate``), so every ratio
printed comes from the same run; auto's figure is its chosen candidate's. The table also shows
what auto itself measured when it chose ("auto saw"). A fresh ferry cache folder is used, so the
split check is measured in this run, not read from an earlier one.

Goals (issue 12), printed PASS/FAIL per model and overall (printed, never asserted):

* (a) auto <= 1.05 x the fastest configuration within the default accuracy budget;
* (b) auto <= 1.03 x ONNX Runtime fp32;
* (c) the explicit ``openvino,onnxruntime`` load <= 1.05 x the faster of the two engines alone
  (ONNX Runtime fp32 and OpenVINO fp32 run whole; ONNX Runtime alone where OpenVINO does not
  take the model whole).

    python benchmarks/placement.py [--models a,b] [--budget 5] [--rounds 20] [--block N]
                                   [--threads N] [--work DIR]

Run it on a quiet machine: the load average before and after is printed with the results.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ferry
from ferry.graph import load_model, prepare
from ferry.plan import Plan
from ferry.runtime import auto_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))

import kit_models

#: (a) auto against the fastest configuration within the accuracy budget.
GOAL_BEST = 1.05
#: (b) auto against ONNX Runtime fp32.
GOAL_ORT = 1.03
#: (c) the explicit [openvino, onnxruntime] load against the faster engine alone.
GOAL_EXPLICIT = 1.05
#: Native (height, width) of the vision models, where they are not the kit's own sizes already.
NATIVE = {
    "ppocr_det_paddle": (640, 640),
    "layout": (800, 608),
    "open_nsfw": (224, 224),
    "captcha_det": (416, 416),
    "orientation": (224, 224),
}
EXPLICIT = ["openvino", "onnxruntime"]
ORT = "onnxruntime fp32"
#: Seconds a block of calls lasts at least when --block is not given.
BLOCK_S = 0.2
SHORT = {"onnxruntime": "ort", "openvino": "ov"}


def alternate(fns: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in rotating blocks of ``block`` calls
    (forward, then backward, so no function always follows the same one).

    Each block starts with a tenth of a block (at least one call) left untimed: the previous
    engine's worker threads still spin for a moment after its last call, and on few cores they
    slow the next engine's first calls (a wake-word model timed at 3x its speed right after ONNX
    Runtime); a deployment runs one engine and never sees that. One block each to warm up."""
    lead = max(1, block // 10)
    for fn in fns.values():
        for _ in range(block):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            for _ in range(lead):
                fns[name]()
            start = time.perf_counter()
            for _ in range(block):
                fns[name]()
            times[name].append((time.perf_counter() - start) / block)
    return {name: statistics.median(t) for name, t in times.items()}


def native_feeds(mid: str) -> tuple[dict[str, np.ndarray], str]:
    """The kit's inputs for ``mid``, a vision model's at its native size: the kit's own recipe
    (the same page, photo or scene) rendered at that size. Also says what was used."""
    feeds = kit_models.feeds(mid)
    size = NATIVE.get(mid)
    spec = kit_models.entry(mid)["inputs"][0]
    args = spec["recipe"].get("args", {})
    if size is None or (args.get("h"), args.get("w")) == size:
        return feeds, "the kit's inputs"
    import inputs as kit_inputs  # the kit's own module, on sys.path through kit_models

    h, w = size
    array = getattr(kit_inputs, spec["recipe"]["fn"])(**{**args, "h": h, "w": w})
    feeds[spec["name"]] = np.ascontiguousarray(np.asarray(array, dtype=spec["dtype"]))
    return feeds, (
        f"the kit's {spec['recipe']['fn']} recipe rendered at {h}x{w} "
        f"(the kit feeds {args.get('h')}x{args.get('w')})"
    )


def onnx_path(mid: str, work: Path) -> tuple[Path, str]:
    """The model as an ONNX file: the kit's own, or converted into ``work`` (kept there: a
    ``--work`` folder given again skips the conversion)."""
    if kit_models.entry(mid)["format"] == "onnx":
        return kit_models.path(mid), "onnx"
    out = work / f"{mid}.onnx"
    fmt = kit_models.entry(mid)["format"]
    if out.is_file():
        return out, f"{fmt}, converted earlier in {work}"
    start = time.perf_counter()
    kit_models.convert(mid, out)
    return out, f"{fmt}, converted in {time.perf_counter() - start:.0f} s"


def describe_plan(plan: Plan) -> str:
    """Partitions and engines: ``1 ov``, ``7 ov4+ort3``."""
    counts: dict[str, int] = {}
    for p in plan.partitions:
        counts[p.backend] = counts.get(p.backend, 0) + 1
    if len(counts) == 1:
        return f"{len(plan.partitions)} {SHORT.get(plan.partitions[0].backend, plan.partitions[0].backend)}"
    engines = "+".join(f"{SHORT.get(b, b)}{n}" for b, n in counts.items())
    return f"{len(plan.partitions)} {engines}"


def cuts(plan: Plan) -> list[tuple[str, tuple[str, ...]]]:
    """The plan's partitions without their options: which engine runs which nodes."""
    return [(p.backend, p.nodes) for p in plan.partitions]


def whole_on(plan: Plan, backend: str) -> bool:
    return len(plan.partitions) == 1 and plan.partitions[0].backend == backend


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@dataclass
class Result:
    """One model's figures for the summary."""

    model: str
    ort_ms: float = float("nan")
    auto: str = ""
    auto_x: float = float("nan")
    best: str = ""
    best_x: float = float("nan")
    explicit_x: float = float("nan")
    twin: float = float("nan")
    goals: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def bench_model(mid: str, work: Path, args: argparse.Namespace) -> Result:
    result = Result(mid)
    path, origin = onnx_path(mid, work)
    feeds, used = native_feeds(mid)
    sizes = ", ".join(f"{k}={'x'.join(map(str, v.shape))} {v.dtype}" for k, v in feeds.items())
    print(f"\n== {mid} ({origin}): {sizes}; {used}", flush=True)

    model = prepare(load_model(path))
    start = time.perf_counter()
    choice = auto_plan(model, feeds=feeds, budget_s=args.budget, threads=args.threads, cache=False)
    print(
        f"auto measured {len(choice.candidates)} candidates in {time.perf_counter() - start:.0f} s"
    )
    candidates = [c for c in choice.candidates if c.error is None]
    sessions = {c.label: ferry.load(path, plan=c.plan, threads=args.threads) for c in candidates}
    explicit_label = "load ov,ort"
    explicit = ferry.load(path, backends=EXPLICIT, example_inputs=feeds, threads=args.threads)
    sessions[explicit_label] = explicit

    ort_auto_ms = choice.candidates[0].latency_ms
    block = args.block or max(2, min(1000, round(BLOCK_S * 1000 / ort_auto_ms)))
    start = time.perf_counter()
    t = alternate(
        {k: (lambda s=s: s.run(dict(feeds))) for k, s in sessions.items()}, args.rounds, block
    )
    ms = {k: v * 1000 for k, v in t.items()}
    print(
        f"timed {len(sessions)} configurations: {args.rounds} rounds x {block} calls "
        f"in {time.perf_counter() - start:.0f} s"
    )

    ort_ms = ms[ORT]
    passing = [c for c in candidates if c.passed]
    best = min(passing, key=lambda c: ms[c.label])
    auto_ms = ms[choice.label]

    print(
        f"{'configuration':<22}{'partitions':>14}{'ms':>10}{'x ORT':>8}{'auto saw':>10}"
        f"{'worst':>10}  {'budget':<8}marks"
    )
    for c in choice.candidates:
        marks = " ".join(
            m for m, on in (("fastest", c is best), ("<- auto", c.label == choice.label)) if on
        )
        worst = f"{c.accuracy.worst:.6f}" if c.accuracy is not None else "-"
        if c.error is not None:
            print(f"{c.label:<22}{describe_plan(c.plan):>14}  error: {c.error[:200]}")
            continue
        budget = "within" if c.passed else "OUTSIDE"
        print(
            f"{c.label:<22}{describe_plan(c.plan):>14}{ms[c.label]:>10.3f}{ms[c.label] / ort_ms:>8.3f}"
            f"{c.latency_ms:>10.3f}{worst:>10}  {budget:<8}{marks}"
        )
    ov_fp32 = next((c for c in candidates if c.label == "openvino fp32"), None)
    placed = ov_fp32.plan if ov_fp32 is not None else None
    note = ""
    if whole_on(explicit.plan, "onnxruntime") and placed is not None:
        note = (
            f"load() ran ONNX Runtime alone: OpenVINO's plan ({describe_plan(placed)}) did not pay"
        )
    elif whole_on(explicit.plan, "openvino"):
        note = "OpenVINO took the whole model"
    print(
        f"{explicit_label:<22}{describe_plan(explicit.plan):>14}{ms[explicit_label]:>10.3f}"
        f"{ms[explicit_label] / ort_ms:>8.3f}{'':>10}{'':>10}  {'':<8}{note}"
    )

    # The explicit load runs the same plan as a candidate (OpenVINO whole, or ONNX Runtime alone):
    # two sessions of one plan timed apart, a measure of this run's noise.
    twin = next((c for c in candidates if cuts(c.plan) == cuts(explicit.plan)), None)
    if twin is not None:
        result.twin = ms[explicit_label] / ms[twin.label]
        print(f"same plan as {twin.label}, timed apart: {result.twin:.3f} (noise)")

    # (a) and (b): auto against the fastest within budget and against ONNX Runtime fp32.
    a = auto_ms / ms[best.label]
    b = auto_ms / ort_ms
    # (c): the explicit load against the faster of the two engines run alone.
    alone = {"onnxruntime": ort_ms}
    if ov_fp32 is not None and whole_on(ov_fp32.plan, "openvino"):
        alone["openvino"] = ms[ov_fp32.label]
    faster = min(alone, key=lambda k: alone[k])
    c_ratio = ms[explicit_label] / alone[faster]
    goals = {"a": a <= GOAL_BEST, "b": b <= GOAL_ORT, "c": c_ratio <= GOAL_EXPLICIT}
    c_note = ""
    if "openvino" not in alone:
        c_note = " (OpenVINO does not take it whole: ONNX Runtime is the only engine alone)"
    if not goals["c"] and whole_on(explicit.plan, "openvino") and alone["openvino"] > ort_ms:
        c_note += (
            f" -- load() kept OpenVINO whole: OpenVINO fp32 {alone['openvino']:.3f} ms, "
            f"ONNX Runtime fp32 {ort_ms:.3f} ms"
        )
    print(
        f"(a) auto {choice.label} / fastest within budget {best.label}: {a:.3f} "
        f"(goal <= {GOAL_BEST})  {verdict(goals['a'])}"
    )
    print(f"(b) auto / ONNX Runtime fp32: {b:.3f} (goal <= {GOAL_ORT})  {verdict(goals['b'])}")
    print(
        f"(c) explicit {','.join(EXPLICIT)} / {faster} alone: {c_ratio:.3f} "
        f"(goal <= {GOAL_EXPLICIT})  {verdict(goals['c'])}{c_note}"
    )
    result.ort_ms = ort_ms
    result.auto = choice.label
    result.auto_x = ort_ms / auto_ms
    result.best = best.label
    result.best_x = ort_ms / ms[best.label]
    result.explicit_x = ort_ms / ms[explicit_label]
    result.goals = goals
    if c_note:
        result.notes.append(f"(c){c_note}")
    return result


def machine() -> str:
    """The machine and engine versions, as ``ferry bench`` describes a device."""
    from ferry.bench import device_info

    info = device_info()
    versions = [f"ferry {info['ferry']}"] + [
        f"{e['name']} {e['version']}" for e in info["engines"] if e["available"]
    ]
    return f"{info['cpu']}, {info['cores']} cores, {', '.join(versions)}"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(kit_models.ids()))
    parser.add_argument("--budget", type=float, default=5.0, help="auto's timing budget, s")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--block", type=int, default=None, help=f"calls per block (default: >= {BLOCK_S} s)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", type=Path, default=None, help="keep converted models here")
    args = parser.parse_args(argv)

    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in kit_models.MANIFEST]
    if unknown:
        parser.error(f"not kit models: {', '.join(unknown)} (known: {', '.join(kit_models.ids())})")
    if not kit_models.kit_ready():
        parser.error(f"the kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh")

    load_before = load_average()
    started = time.perf_counter()
    print(machine())
    print(
        f"threads={args.threads or 'engine default'}, auto budget {args.budget} s, "
        f"{args.rounds} rounds x {args.block or 'about ' + str(BLOCK_S) + ' s of'} calls, batch 1, "
        f"load average {load_before}"
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        # A fresh cache: the split check measured in this run, not read from an earlier one.
        os.environ["FERRY_CACHE_DIR"] = str(Path(tmp) / "cache")
        work = args.work or Path(tmp) / "models"
        work.mkdir(parents=True, exist_ok=True)
        for mid in models:
            try:
                results.append(bench_model(mid, work, args))
            except Exception as e:  # one model's failure must not end the run
                traceback.print_exc()
                print(f"{mid}: ERROR {type(e).__name__}: {e}", flush=True)
                results.append(Result(mid, error=f"{type(e).__name__}: {str(e)[:120]}"))

    print(
        f"\n{'model':<22}{'ORT ms':>10}  {'auto':<20}{'auto x':>8}  {'best':<20}{'best x':>8}"
        f"{'[ov,ort] x':>12}  goals a b c"
    )
    for r in results:
        if r.error is not None:
            print(f"{r.model:<22}  ERROR {r.error}")
            continue
        goals = " ".join(verdict(r.goals[g]) for g in "abc")
        print(
            f"{r.model:<22}{r.ort_ms:>10.3f}  {r.auto:<20}{r.auto_x:>8.3f}  {r.best:<20}"
            f"{r.best_x:>8.3f}{r.explicit_x:>12.3f}  {goals}"
        )
    print("(x: speed relative to ONNX Runtime fp32, higher is faster)")
    measured = [r for r in results if r.error is None]
    for g, text in (
        ("a", f"auto within {GOAL_BEST - 1:.0%} of the fastest within budget"),
        ("b", f"auto never slower than ONNX Runtime fp32 by more than {GOAL_ORT - 1:.0%}"),
        ("c", f"explicit [ov,ort] within {GOAL_EXPLICIT - 1:.0%} of the faster engine alone"),
    ):
        failed = [r.model for r in measured if not r.goals[g]]
        line = f"({g}) {text}: {verdict(not failed)}"
        print(line + (f" -- failed on {', '.join(failed)}" if failed else ""))
    twins = [(abs(np.log(r.twin)), r) for r in measured if np.isfinite(r.twin)]
    if twins:
        _, r = max(twins, key=lambda t: t[0])
        print(
            f"noise: one plan in two sessions timed {r.twin:.3f} apart at worst ({r.model}); "
            "ratios closer than that to a goal are not settled by this run"
        )
    for r in measured:
        for note in r.notes:
            print(f"    {r.model}: {note}")
    errors = [r.model for r in results if r.error is not None]
    if errors:
        print(f"not measured (errors): {', '.join(errors)}")
    print(
        f"\nmachine: {machine()}; load average before {load_before}, after {load_average()}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
