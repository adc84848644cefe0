"""Each backend through ferry against the same engine used raw, and ``auto`` against the field.

One process, one run, zoo models at batch 1 (fp32 unless a row says otherwise):

* overhead: ``ferry.load(model, backends=[b])`` against engine b's own API on the same file with
  the same settings, timed in alternating blocks (DESIGN.md, Measuring). Goal: <= 1.05.
* auto: the plan ``backends="auto"`` picks, timed against plain ONNX Runtime fp32 and against the
  best single-engine configuration, again in alternating blocks.

    python benchmarks/backends.py [--rounds 60] [--block 20] [--threads N] [--models a,b]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path: a module here named like a package
# would shadow it.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import ferry
from ferry import zoo
from ferry.backends import get_backend, known_backends
from ferry.errors import FerryError
from ferry.graph import load_model, prepare
from ferry.plan import Plan

GOAL = 1.05


def alternate(fns: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in rotating blocks of ``block`` calls."""
    for fn in fns.values():
        for _ in range(block * 3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else reversed(order):
            start = time.perf_counter()
            for _ in range(block):
                fns[name]()
            times[name].append((time.perf_counter() - start) / block)
    return {name: statistics.median(t) for name, t in times.items()}


def raw_runner(backend: str, path: Path, threads: int | None) -> Callable[[dict[str, Any]], object]:
    """The engine's own API on the model file, configured as ferry's adapter configures it."""
    if backend == "onnxruntime":
        import onnxruntime as ort

        from ferry.backends._onnxruntime import session_options

        sess = ort.InferenceSession(
            str(path),
            session_options({"threads": threads} if threads else {}),
            providers=["CPUExecutionProvider"],
        )
        return lambda feeds: sess.run(None, feeds)
    if backend == "openvino":
        # The adapter first: it raises BackendUnavailableError, naming the extra, without openvino.
        from ferry.backends._openvino import compile_config

        ov = importlib.import_module("openvino")

        compiled = ov.Core().compile_model(
            str(path), "CPU", compile_config({"threads": threads} if threads else {})
        )
        request = compiled.create_infer_request()
        ports = {name: i for i, port in enumerate(compiled.inputs) for name in port.get_names()}
        outputs = range(len(compiled.outputs))

        # The fastest raw pattern we found that still hands back arrays the caller owns, as ferry
        # does: inputs wrapped without a copy, one synchronous infer, outputs copied out of the
        # request's buffers (infer(dict) costs ~10 us more per call on small models).
        def run(feeds: dict[str, Any]) -> object:
            for name, value in feeds.items():
                request.set_input_tensor(ports[name], ov.Tensor(value, shared_memory=True))
            request.infer()
            return [request.get_output_tensor(i).data.copy() for i in outputs]

        return run
    if backend == "litert":
        # LiteRT runs .tflite files, not ONNX: the raw side is the interpreter on the file
        # ferry's lowering writes for this model (what a user would get from ferry export),
        # with XNNPACK and the same thread count.
        from ai_edge_litert import interpreter as litert

        from ferry.backends._litert import _cores, lower_partition
        from ferry.graph import graph_inputs, shape_of

        model = load_model(path)
        fixed = {
            v.name or "": tuple(d if isinstance(d, int) else 1 for d in shape_of(v) or ())
            for v in graph_inputs(model)
        }
        interp = litert.Interpreter(
            model_content=lower_partition(model, fixed), num_threads=threads or _cores()
        )
        interp.allocate_tensors()
        ins = {d["name"]: d["index"] for d in interp.get_input_details()}
        outs = [d["index"] for d in interp.get_output_details()]

        def run_litert(feeds: dict[str, Any]) -> object:
            for name, value in feeds.items():
                interp.set_tensor(ins[name], value)
            interp.invoke()
            return [interp.get_tensor(i) for i in outs]

        return run_litert
    raise FerryError(f"no raw runner for {backend}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", default=",".join(zoo.names()))
    parser.add_argument("--auto-budget", type=float, default=5.0)
    args = parser.parse_args(argv)

    engines = []
    for name in known_backends():
        try:
            backend = get_backend(name)
        except FerryError as e:
            print(f"{name}: not measured ({e})")
            continue
        engines.append(name)
        print(
            f"{name} {backend.version} on {backend.device}, precisions {', '.join(backend.precisions)}"
        )
    print(
        f"threads={args.threads or 'engine default'}, {args.rounds} rounds x {args.block} calls, batch 1"
    )
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        print(
            f"\n{'overhead':<12}{'model':<20}{'raw us':>10}{'ferry us':>10}{'ratio':>8}   goal <= {GOAL}"
        )
        for model_name in args.models.split(","):
            path = zoo.save(model_name, tmp)
            feeds = zoo.example_inputs(model_name, batch=1)
            for engine in engines:
                try:
                    raw = raw_runner(engine, path, args.threads)
                except FerryError:
                    continue
                plan = Plan.whole_graph(prepare(load_model(path)), engine)
                session = ferry.load(path, plan=plan, threads=args.threads)
                t = alternate(
                    {
                        "raw": lambda raw=raw, f=feeds: raw(f),
                        "ferry": lambda s=session, f=feeds: s.run(f),
                    },
                    args.rounds,
                    args.block,
                )
                ratio = t["ferry"] / t["raw"]
                worst = max(worst, ratio)
                print(
                    f"{engine:<12}{model_name:<20}{t['raw'] * 1e6:>10.1f}{t['ferry'] * 1e6:>10.1f}{ratio:>8.3f}"
                )

        print(
            f"\n{'auto':<20}{'chosen':<26}{'auto us':>10}{'ORT fp32':>10}{'best single':>26}{'vs ORT':>8}{'vs best':>8}"
        )
        from ferry.runtime import auto_plan

        for model_name in args.models.split(","):
            path = Path(tmp) / f"{model_name}.onnx"
            model = prepare(load_model(path))
            feeds = zoo.example_inputs(model_name, batch=1)
            choice = auto_plan(
                model, budget_s=args.auto_budget, feeds=feeds, threads=args.threads, cache=False
            )
            singles = [c for c in choice.candidates if c.passed and len(c.plan.backends) == 1]
            best = min(singles, key=lambda c: c.latency_ms)
            sessions = {
                "auto": ferry.load(model, plan=choice.plan, threads=args.threads),
                "ort": ferry.load(model, threads=args.threads),
                "best": ferry.load(model, plan=best.plan, threads=args.threads),
            }
            t = alternate(
                {k: (lambda s=s, f=feeds: s.run(f)) for k, s in sessions.items()},
                args.rounds,
                args.block,
            )
            best_text = f"{best.label} {t['best'] * 1e6:.1f}"
            print(
                f"{model_name:<20}{choice.label:<26}{t['auto'] * 1e6:>10.1f}{t['ort'] * 1e6:>10.1f}"
                f"{best_text:>26}{t['auto'] / t['ort']:>8.3f}{t['auto'] / t['best']:>8.3f}"
            )
    print(f"\nworst overhead ratio {worst:.3f}: goal {'met' if worst <= GOAL else 'NOT met'}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
