"""Placement on the kit's real models (issue 32): ONNX Runtime fp32, every candidate ``auto``
measures, ``auto``'s choice, an explicit ``openvino,onnxruntime`` load, and live placement
(the same engines, no sizes given), on all 23 kit models at their kit sizes.

One process, one run: every model of the real-model kit (``scripts/fetch-kit.sh``) on the kit's
own inputs as they are (photos, rendered pages and text lines, audio; batch and sizes as the kit
gives them). ONNX models run as they are; the others are converted once per run with
``ferry.convert`` (``--work DIR`` keeps them across runs; Paddle needs ``FERRY_PADDLE_PYTHON``).
The generative ``smollm2`` (GGUF) is converted to ferry's decoder artifact and its ONNX graph
timed on one prefill call: the kit's first chat prompt with an empty past (see
``_placement_models.prefill_feeds``; it is listed as skipped, with the reason, when those inputs
cannot be built from the graph's).

For each model:

1. ``auto_plan(model, feeds=..., budget_s=--budget, cache=False)`` measures its candidates (ONNX
   Runtime fp32, each engine at each precision it offers, the engines combined) and judges each
   against ONNX Runtime fp32.
2. Every candidate that ran (``ferry.load(path, plan=...)``), the explicit load
   (``ferry.load(path, backends="openvino,onnxruntime", example_inputs=feeds)``: its pays check may
   run one engine alone instead) and the placed plan forced (the same with ``check_pays=False``)
   are timed together by ferry's own block timer (``ferry.runtime._measure.block_stats``: rounds
   of blocks, each after the other engines' threads went quiet, until the ranking holds or
   ``--time-budget`` is spent), each figure with its noise (the spread of the medians of the
   run's thirds). Configurations running the same plan are timed once; candidates outside the
   accuracy budget are listed with auto's own figures, not timed again. The two loads are
   judged as auto judges its candidates (``ferry.parity.default_budget`` against ONNX Runtime).
3. Live: the model loaded with ``backends="openvino,onnxruntime"`` and no sizes (in a cache folder
   of its own, so it measures as a first load would) and fed the kit's inputs call by call
   (``--live-gap`` apart; 0: back to back, so the learner measures while calls run, as a busy
   server's would) until ``placement_settled()``: the calls it took, the plan it ended on,
   and whether that is the fastest of ONNX Runtime alone, the placed plan and OpenVINO whole in
   this benchmark's timing (ties within the noise count either way). Models whose sizes are all
   fixed (but the batch) load without live placement: "fixed sizes".

Goals (issue 32), printed PASS/FAIL per model and overall, never asserted:

* best: auto <= 1.03 x the fastest configuration within the accuracy budget;
* ORT: auto >= 0.97 x ONNX Runtime fp32's speed (auto ms <= ORT ms / 0.97);
* explicit: the explicit ``openvino,onnxruntime`` load >= 0.95 x the faster engine alone's speed
  (ONNX Runtime on the model as given, and OpenVINO where it takes the whole model within the
  accuracy budget); a load whose answers are outside the budget fails whatever its speed.

"ONNX Runtime" is auto's baseline: fp32, or the model as typed for a reduced-precision source
(``onnxruntime int8 (QDQ)``).

A miss smaller than the two figures' noise is printed ``FAIL (within noise)``.

    python benchmarks/placement.py [--models a,b] [--budget 5] [--time-budget 6] [--threads N]
                                   [--work DIR] [--live-max-s 60] [--live-gap 0] [--json OUT]

Run it on a quiet machine: the load average before and after (and at each model) is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ferry
from _placement_live import Live, cache_folder, live_column
from _placement_models import (
    Prepared,
    describe_plan,
    kit_models,
    prepare_model,
    signature,
)
from ferry.errors import FerryError
from ferry.graph import load_model, prepare
from ferry.parity import default_budget, within_budget
from ferry.runtime import auto_plan
from ferry.runtime._measure import block_stats, tie_tolerance

# A module in this folder named like a package would shadow it: the helpers above are
# imported, the folder leaves the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

#: best: auto's time over the fastest configuration's within the accuracy budget, at most.
GOAL_BEST = 1.03
#: ORT: auto's speed relative to ONNX Runtime fp32 (ORT ms / auto ms), at least.
GOAL_ORT = 0.97
#: explicit: the explicit load's speed relative to the faster engine alone, at least.
GOAL_EXPLICIT = 0.95
EXPLICIT = "openvino,onnxruntime"
OV = "openvino fp32"
LOADED = "load ov,ort"
PLACED = "placed ov,ort (forced)"


@dataclasses.dataclass
class Config:
    """One configuration timed (or an alias of one running the same plan)."""

    label: str
    partitions: str
    ms: float = float("nan")
    noise: float = float("nan")
    same_as: str | None = None
    auto_ms: float | None = None
    auto_noise: float | None = None
    worst: float | None = None
    within_budget: bool | None = None
    error: str | None = None


@dataclasses.dataclass
class Goal:
    """One goal's ratio (higher or lower is better as ``at_most`` says), its noise and verdict."""

    ratio: float
    noise: float
    bound: float
    at_most: bool
    #: The figure's configuration answers outside the accuracy budget: fails whatever its speed.
    wrong: bool = False

    @property
    def passed(self) -> bool:
        fast = self.ratio <= self.bound if self.at_most else self.ratio >= self.bound
        return fast and not self.wrong

    def verdict(self) -> str:
        if self.passed:
            return "PASS"
        if self.wrong:
            return "FAIL (answers outside the accuracy budget)"
        miss = abs(self.ratio - self.bound) / self.bound
        return "FAIL (within noise)" if miss <= self.noise else "FAIL"

    def text(self) -> str:
        sign = "<=" if self.at_most else ">="
        return f"{self.ratio:.3f} +-{self.noise:.1%} (goal {sign} {self.bound})  {self.verdict()}"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed, "verdict": self.verdict()}


@dataclasses.dataclass
class Result:
    """One model's figures, for the summary and ``--json``."""

    model: str
    origin: str = ""
    inputs: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    what: str = ""
    load_average: str = ""
    skipped: str | None = None
    error: str | None = None
    configs: list[Config] = dataclasses.field(default_factory=list)
    auto: str = ""
    baseline: str = ""
    fastest: str = ""
    faster_alone: str = ""
    explicit_plan: str = ""
    goals: dict[str, Goal] = dataclasses.field(default_factory=dict)
    live: Live | None = None
    live_expected: list[str] = dataclasses.field(default_factory=list)
    live_match: bool | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    def config(self, label: str) -> Config:
        c = next(c for c in self.configs if c.label == label)
        return c if c.same_as is None else self.config(c.same_as)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["goals"] = {k: g.to_dict() for k, g in self.goals.items()}
        out["live"] = None if self.live is None else self.live.to_dict()
        return out


def ratio_goal(num: Config, den: Config, bound: float, *, at_most: bool) -> Goal:
    """``num.ms / den.ms`` against ``bound``, with the two figures' noises combined."""
    return Goal(num.ms / den.ms, math.hypot(num.noise, den.noise), bound, at_most)


def timed(
    sessions: dict[str, Any], feeds: dict[str, Any], budget_s: float, baseline: str
) -> tuple[dict[str, tuple[float, float, int]], dict[str, str]]:
    """Each session's (ms, noise, blocks) from one :func:`block_stats` run; a session that
    fails on a later call (random ops drawing other sizes) is left out with its error and the
    rest timed again."""
    errors: dict[str, str] = {}

    def call(key: str, session: Any) -> Any:
        try:
            return session.run(dict(feeds))
        except FerryError as e:
            errors[key] = str(e)
            raise

    while True:
        live = {k: s for k, s in sessions.items() if k not in errors}
        runs = [(lambda k=k, s=s: call(k, s)) for k, s in live.items()]
        try:
            stats = block_stats(runs, budget_s)
        except FerryError:
            if not set(errors) - set(sessions).difference(live) or baseline in errors:
                raise
            continue
        return {
            k: (st.median_s * 1000, st.noise, st.rounds) for k, st in zip(live, stats, strict=True)
        }, errors


def bench_model(prep: Prepared, args: argparse.Namespace, scratch: Path) -> Result:
    assert prep.path is not None
    path, feeds = prep.path, prep.feeds
    result = Result(prep.mid, prep.origin, what=prep.what, load_average=load_average())
    result.inputs = {k: list(v.shape) for k, v in feeds.items()}
    result.seconds["convert"] = prep.convert_s
    sizes = describe_feeds(feeds)
    print(f"\n== {prep.mid} ({prep.origin}): {sizes}; {prep.what}", flush=True)
    print(f"load average {result.load_average}")

    start = time.perf_counter()
    model = prepare(load_model(path))
    choice = auto_plan(
        model,
        feeds=feeds,
        budget_s=args.budget,
        threads=args.threads,
        cache=False,
        source_path=path,
    )
    result.auto = choice.label
    # auto's reference: ONNX Runtime on the model as given ("onnxruntime fp32", or as typed).
    result.baseline = choice.candidates[0].label
    result.seconds["auto"] = time.perf_counter() - start
    print(
        f"auto measured {len(choice.candidates)} candidates in {result.seconds['auto']:.0f} s "
        f"({choice.judge}); chose {choice.label}"
    )

    start = time.perf_counter()
    sessions: dict[str, Any] = {}
    seen: dict[Any, str] = {}

    def add(config: Config, session: Any) -> None:
        result.configs.append(config)
        sig = signature(session.plan)
        if sig in seen:
            config.same_as = seen[sig]
        else:
            seen[sig] = config.label
            sessions[config.label] = session

    for c in choice.candidates:
        config = Config(c.label, describe_plan(c.plan))
        if c.error is not None:
            config.error = c.error
            result.configs.append(config)
            continue
        config.auto_ms, config.auto_noise = c.latency_ms, c.noise
        config.worst = None if c.accuracy is None else float(c.accuracy.worst)
        config.within_budget = c.passed
        if not c.passed:
            # Not a configuration the goals can pick: listed with auto's own figures only.
            config.error = "outside the accuracy budget: not timed again"
            result.configs.append(config)
            continue
        add(config, ferry.load(path, plan=c.plan, threads=args.threads))
    # The two loads are judged as auto judges its candidates: against ONNX Runtime fp32 at the
    # default budget (an engine whose answers are wrong is no engine to be faster than).
    expected = sessions[result.baseline].run(dict(feeds))
    budget, _ = default_budget(model, expected)
    loaded = ferry.load(path, backends=EXPLICIT, example_inputs=feeds, threads=args.threads)
    forced = ferry.load(
        path, backends=EXPLICIT, example_inputs=feeds, threads=args.threads, check_pays=False
    )
    result.explicit_plan = describe_plan(loaded.plan)
    for label, session in ((LOADED, loaded), (PLACED, forced)):
        verdict = within_budget(session.run(dict(feeds)), expected, budget)
        config = Config(label, describe_plan(session.plan))
        config.worst, config.within_budget = float(verdict.worst), verdict.passed
        add(config, session)
    del model, expected
    result.seconds["build"] = time.perf_counter() - start

    start = time.perf_counter()
    figures, errors = timed(sessions, feeds, args.time_budget, result.baseline)
    result.seconds["timing"] = time.perf_counter() - start
    blocks = max((f[2] for f in figures.values()), default=0)
    for config in result.configs:
        if config.label in figures:
            config.ms, config.noise, _ = figures[config.label]
        elif config.label in errors:
            config.error = f"failed while timed: {errors[config.label]}"
    print(
        f"timed {len(figures)} configurations ({len(result.configs)} listed): {blocks} rounds "
        f"in {result.seconds['timing']:.0f} s (time budget {args.time_budget} s)"
    )
    sessions.clear()
    del loaded, forced, choice
    gc.collect()

    goals(result)
    print_model(result)

    if args.live_max_s > 0:
        start = time.perf_counter()
        result.live = live_column(
            path,
            feeds,
            scratch / "live" / prep.mid,
            backends=EXPLICIT,
            threads=args.threads,
            max_s=args.live_max_s,
            gap_s=args.live_gap,
        )
        result.seconds["live"] = time.perf_counter() - start
        judge_live(result)
        print(live_line(result))
    total = sum(result.seconds.values())
    phases = ", ".join(f"{k} {v:.0f}" for k, v in result.seconds.items())
    print(f"seconds: {phases}; total {total:.0f}", flush=True)
    return result


def describe_feeds(feeds: dict[str, Any], shown: int = 4) -> str:
    """``name=1x3x224x224 float32, ...``: the first ``shown`` inputs, then how many more (a
    decoder's 60 past inputs are one line's worth of nothing new)."""
    words = [f"{k}={'x'.join(map(str, v.shape))} {v.dtype}" for k, v in feeds.items()]
    more = f", and {len(words) - shown} more like the last" if len(words) > shown + 1 else ""
    return ", ".join(words[: shown if more else None]) + more


def goals(result: Result) -> None:
    """The fastest within budget, the faster engine alone, and the three goals."""
    ort = result.config(result.baseline)
    measured = [
        c
        for c in result.configs
        if c.auto_ms is not None
        and c.within_budget
        and c.error is None
        and math.isfinite(result.config(c.label).ms)
    ]
    fastest = min(measured, key=lambda c: result.config(c.label).ms)
    result.fastest = fastest.label
    auto = result.config(result.auto)
    alone = [ort]
    ov = ov_whole(result)
    if ov is not None:
        alone.append(result.config(ov))
    faster = min(alone, key=lambda c: c.ms)
    result.faster_alone = faster.label
    loaded = result.config(LOADED)
    result.goals = {
        "best": ratio_goal(auto, result.config(fastest.label), GOAL_BEST, at_most=True),
        "ort": ratio_goal(ort, auto, GOAL_ORT, at_most=False),
        "explicit": ratio_goal(faster, loaded, GOAL_EXPLICIT, at_most=False),
    }
    result.goals["explicit"].wrong = loaded.within_budget is False


def ov_whole(result: Result) -> str | None:
    """OpenVINO alone as this run has it: OpenVINO fp32, else the placed plan (a source typed
    in another precision runs on OpenVINO as typed), where it takes the whole model within the
    accuracy budget; None where it does not."""
    for label in (OV, PLACED):
        c = next((c for c in result.configs if c.label == label), None)
        if c is None or c.error is not None or c.partitions != "1 ov" or not c.within_budget:
            continue
        if math.isfinite(result.config(label).ms):
            return label
    return None


def judge_live(result: Result) -> None:
    """Which of ONNX Runtime alone, the placed plan and OpenVINO whole this run timed fastest
    (with those tied to it within their noise), and whether live placement ended on one."""
    live = result.live
    if live is None or not live.live or live.error is not None:
        return
    options = {"onnxruntime": result.baseline}
    if result.config(PLACED).within_budget:
        options["placed"] = PLACED  # a plan outside the budget is right to be left
    ov = ov_whole(result)
    if ov is not None:
        options["openvino"] = ov
    best = min((result.config(label) for label in options.values()), key=lambda c: c.ms)
    result.live_expected = [
        k
        for k, label in options.items()
        if result.config(label).ms
        <= best.ms * (1 + tie_tolerance(result.config(label).noise, best.noise))
    ]
    if live.plan == "onnxruntime":
        ended = "onnxruntime"
    elif live.plan == "openvino" and "openvino" in options:
        ended = "openvino"
    else:
        ended = "placed" if "placed" in options else "openvino" if "openvino" in options else ""
    if not ended:
        result.live_match = False  # it ended on a plan outside the accuracy budget
        return
    # Configurations running one plan are one figure (the placed plan may be OpenVINO whole).
    expected = {result.config(options[k]).label for k in result.live_expected}
    result.live_match = result.config(options[ended]).label in expected


def print_model(result: Result) -> None:
    ort = result.config(result.baseline)
    w = max(len(c.label) for c in result.configs) + 2
    print(
        f"{'configuration':<{w}}{'partitions':>12}{'ms':>10}{'noise':>8}{'x ORT':>8}"
        f"{'auto saw':>10}{'worst':>10}  {'budget':<8}marks"
    )
    for c in result.configs:
        if c.error is not None and c.auto_ms is not None:
            worst = f"{c.worst:.6f}" if c.worst is not None else ""
            print(
                f"{c.label:<{w}}{c.partitions:>12}{'-':>10}{'':>8}{'':>8}{c.auto_ms:>10.3f}"
                f"{worst:>10}  {'OUTSIDE':<8}{c.error[:120]}"
            )
            continue
        if c.error is not None:
            print(f"{c.label:<{w}}{c.partitions:>12}  error: {c.error.splitlines()[0][:200]}")
            continue
        figure = result.config(c.label)
        marks = [m for m, on in (("fastest", c.label == result.fastest),
                                 ("<- auto", c.label == result.auto)) if on]  # fmt: skip
        if c.same_as is not None:
            marks.append(f"(same plan as {c.same_as})")
        saw = f"{c.auto_ms:.3f}" if c.auto_ms is not None else ""
        worst = f"{c.worst:.6f}" if c.worst is not None else ""
        budget = "" if c.within_budget is None else "within" if c.within_budget else "OUTSIDE"
        print(
            f"{c.label:<{w}}{c.partitions:>12}{figure.ms:>10.3f}{figure.noise:>8.1%}"
            f"{ort.ms / figure.ms:>8.3f}{saw:>10}{worst:>10}  {budget:<8}{' '.join(marks)}"
        )
    g = result.goals
    print(f"best: auto {result.auto} / fastest {result.fastest}: {g['best'].text()}")
    print(f"ORT: auto x {result.baseline}: {g['ort'].text()}")
    print(
        f"explicit: load {EXPLICIT} ({result.explicit_plan}) x {result.faster_alone} alone: "
        f"{g['explicit'].text()}"
    )


def live_line(result: Result) -> str:
    live = result.live
    if live is None:
        return "live: not run (--live-max-s 0)"
    if not live.live:
        return f"live: not live: {live.state}"
    if live.error is not None:
        return f"live: {live.calls} calls in {live.seconds:.1f} s; {live.error}"
    until = "until settled" if live.settled else "without settling (then waited)"
    learner = ""
    if live.plan_ms and live.alone_ms:
        learner = f"; it measured {live.plan_ms:.3f} ms vs ONNX Runtime {live.alone_ms:.3f} ms"
    verdict = {True: "matches", False: "DIFFERS", None: "?"}[result.live_match]
    return (
        f"live: {live.calls} calls in {live.seconds:.1f} s {until}; ended on {live.plan} "
        f"({live.state}{learner}); fastest here: {' or '.join(result.live_expected)} -> {verdict}"
    )


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


def summary(results: list[Result]) -> None:
    w = max([len(x) for r in results for x in (r.fastest, r.auto)] + [20]) + 2
    print(
        f"\n{'model':<22}{'ORT ms':>9}{'noise':>7}  {'fastest':<{w}}{'ms':>9}  "
        f"{'auto':<{w}}{'/fast':>7}{'xORT':>7}{'expl':>7}  {'live':<34}{'s':>5}"
    )
    for r in results:
        if r.skipped is not None or r.error is not None:
            why = f"SKIPPED {r.skipped}" if r.skipped is not None else f"ERROR {r.error}"
            print(f"{r.model:<22}  {why}")
            continue
        ort, fastest = r.config(r.baseline), r.config(r.fastest)
        g = r.goals
        print(
            f"{r.model:<22}{ort.ms:>9.3f}{ort.noise:>7.1%}  {r.fastest:<{w}}{fastest.ms:>9.3f}  "
            f"{r.auto:<{w}}{g['best'].ratio:>7.3f}{g['ort'].ratio:>7.3f}"
            f"{g['explicit'].ratio:>7.3f}  {live_cell(r):<34}{sum(r.seconds.values()):>5.0f}"
        )
    print(
        "(/fast: auto ms / fastest ms, goal <= 1.03; xORT: ORT ms / auto ms, goal >= 0.97; "
        "expl: faster-alone ms / explicit ms, goal >= 0.95)"
    )
    measured = [r for r in results if r.skipped is None and r.error is None]
    for key, text in (
        ("best", f"auto within {GOAL_BEST - 1:.0%} of the fastest within budget"),
        ("ort", f"auto never below {GOAL_ORT}x ONNX Runtime on the model as given"),
        ("explicit", f"explicit {EXPLICIT} never below {GOAL_EXPLICIT}x the faster engine alone"),
    ):
        failed = [f"{r.model} ({r.goals[key].verdict()})" for r in measured
                  if not r.goals[key].passed]  # fmt: skip
        line = f"{key}: {text}: {'FAIL' if failed else 'PASS'}"
        print(line + (f" -- {', '.join(failed)}" if failed else ""))
    lives = [r for r in measured if r.live is not None and r.live.live]
    if lives:
        differs = [r.model for r in lives if r.live_match is False]
        print(
            f"live: {len(lives)} models placed live; calls until settled: "
            + ", ".join(f"{r.model} {r.live.calls}" for r in lives if r.live is not None)
            + (f"; ended elsewhere than the fastest: {', '.join(differs)}" if differs else "")
        )
    for r in results:
        if r.skipped is not None:
            print(f"skipped {r.model}: {r.skipped}")
        if r.error is not None:
            print(f"not measured {r.model}: {r.error}")


def live_cell(r: Result) -> str:
    if r.live is None:
        return "-"
    if not r.live.live:
        return "fixed sizes" if r.live.state.startswith("fixed") else "not live (see above)"
    if r.live.error is not None:
        return "not settled"
    match = {True: "ok", False: "DIFFERS", None: "?"}[r.live_match]
    return f"{r.live.calls} calls {r.live.plan} {match}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(kit_models.ids()))
    parser.add_argument("--budget", type=float, default=5.0, help="auto's timing budget, s")
    parser.add_argument(
        "--time-budget", type=float, default=6.0, help="this benchmark's timing budget per model"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", type=Path, default=None, help="keep converted models here")
    parser.add_argument(
        "--live-max-s", type=float, default=60.0, help="seconds of live calls at most (0: skip)"
    )
    parser.add_argument("--live-gap", type=float, default=0.0, help="seconds between live calls")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)

    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in kit_models.MANIFEST]
    if unknown:
        parser.error(f"not kit models: {', '.join(unknown)} (known: {', '.join(kit_models.ids())})")
    if not kit_models.kit_ready():
        parser.error(f"the kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: the folder {args.json.parent} does not exist")

    load_before = load_average()
    started = time.perf_counter()
    print(machine())
    print(
        f"threads={args.threads or 'engine default'}, auto budget {args.budget} s, time budget "
        f"{args.time_budget} s, live: at most {args.live_max_s} s of calls {args.live_gap} s "
        f"apart; load average {load_before}"
    )
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        work = args.work or scratch / "models"
        work.mkdir(parents=True, exist_ok=True)
        # A fresh cache: the pays check and the engines compiled in this run, not an earlier one.
        with cache_folder(scratch / "cache"):
            for mid in models:
                results.append(run_one(mid, work, args, scratch))
                gc.collect()
    elapsed = time.perf_counter() - started
    summary(results)
    load_after = load_average()
    print(
        f"\nmachine: {machine()}; load average before {load_before}, after {load_after}; "
        f"{elapsed:.0f} s"
    )
    if args.json is not None:
        data = {
            "machine": machine(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "load_average": {"before": load_before, "after": load_after},
            "seconds": elapsed,
            "goals": {"best": GOAL_BEST, "ort": GOAL_ORT, "explicit": GOAL_EXPLICIT},
            "models": [r.to_dict() for r in results],
        }
        args.json.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def run_one(mid: str, work: Path, args: argparse.Namespace, scratch: Path) -> Result:
    """One model's result; its failure is printed and recorded, never the end of the run."""
    try:
        prep = prepare_model(mid, work)
        if prep.skipped is not None:
            print(f"\n== {mid} ({prep.origin}): SKIPPED: {prep.skipped}", flush=True)
            return Result(mid, prep.origin, skipped=prep.skipped)
        return bench_model(prep, args, scratch)
    except Exception as e:  # one model's failure must not end the run
        traceback.print_exc()
        print(f"{mid}: ERROR {type(e).__name__}: {e}", flush=True)
        return Result(mid, error=f"{type(e).__name__}: {str(e)[:160]}")


if __name__ == "__main__":
    sys.exit(main())
