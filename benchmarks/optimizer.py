"""ferry's graph optimizer against onnxsim and onnxslim on the kit's real models and the zoo.

One process, one run. For each model, four variants of one ONNX file:

* ``orig``: the model as it is (the kit's ONNX file; the kit's other models converted once with
  ``ferry.convert``, Paddle through ``FERRY_PADDLE_PYTHON``; the zoo's models as exported);
* ``ferry``: ``ferry.optimizer.optimize(path, level="extended", target=None, verify=False,
  measure=False)`` (``--level``, ``--target``; ``--verify`` / ``--measure`` let it check its result
  on the kit's inputs and keep the input when the result computes something else or runs slower,
  as users get it by default);
* ``sim``: ``onnxsim.simplify(model)`` with its defaults;
* ``slim``: ``onnxslim.slim(model)`` with its defaults;

and with ``--static`` two more, told the kit's input shapes: ``ferry-s``
(``optimize(path, fix_shapes=...)``) and ``sim-s`` (onnxsim with ``overwrite_input_shapes`` and
``test_input_shapes``). The peers run in their own environment (``scripts/optimizer-peers-env.sh``
makes ``.venv-optpeers``), one subprocess per tool and model; their files are written next to
ferry's in the work folder.

Measured per variant:

* nodes: the main graph's nodes, Constant nodes included (ferry lifts constants into
  initializers; onnxsim and onnxslim keep some as nodes), and the file's size;
* latency: ONNX Runtime CPU with its default session options (its own graph optimizations on, as
  users run it; intra-op threads = the usable cores) and OpenVINO CPU
  (``compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})``), batch 1 on the kit's
  realistic inputs at the kit's shapes; per engine the variants are timed in alternating blocks
  of calls (about 0.3 s each, each led by a few untimed calls: the previous variant's worker
  threads still spin), median per call, printed as a ratio to the original. A second session of
  the original is timed with them ("noise": 1.00 on a quiet machine);
* parity: each variant's outputs against the original's on the same inputs in the same engine,
  judged at the task by the kit's judge (``ferry.parity.judge``; the zoo: top-1 for the
  classifiers, cosine >= 0.999 for the transformer block), and the largest absolute difference.
  A variant that drops or adds graph inputs fails parity whatever its outputs: folding inputs
  that have defaults in initializers (a streaming model's state) into constants takes away what
  the caller may feed.

Goals (issue: the optimizer), printed, never asserted: on every model ferry's node count <= the
best peer's, its ONNX Runtime latency no worse than the best peer's (within 3%, this machine's
noise), and parity held. The "best peer" is the best of onnxsim and onnxslim among the variants
that loaded, ran and kept parity.

    bash scripts/optimizer-peers-env.sh     # once: .venv-optpeers with onnxsim and onnxslim
    python benchmarks/optimizer.py [--quick] [--models a,b,zoo:mlp] [--static] [--work DIR]
                                   [--json OUT] [--rounds 5] [--block-s 0.3] [--threads N]
                                   [--level extended] [--target T] [--verify] [--measure]
                                   [--peers PYTHON] [--no-openvino]

Without the peers' environment the peers' columns say so and the goals hold ferry against the
original only.

The whole run takes about 10 minutes on 2 cores (``--quick``: about a third of that, fewer and
shorter blocks). Run it on a quiet machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real"))

import kit_models  # noqa: E402  (tests/real: the kit's manifest, inputs and judges)

#: Latency within this factor of the best peer's counts as no worse (this machine's noise).
NOISE = 1.03
#: Seconds a block of calls lasts at least (``--quick``: QUICK_BLOCK_S).
BLOCK_S = 0.3
QUICK_BLOCK_S = 0.1
ROUNDS = 5
QUICK_ROUNDS = 3
#: Seconds one peer may take on one model.
PEER_TIMEOUT_S = 600
PEERS_VENV = ROOT / ".venv-optpeers"
PEERS_SCRIPT = "scripts/optimizer-peers-env.sh"
ZOO = "zoo:"
#: The zoo's models as the kit would judge them.
ZOO_JUDGES: dict[str, dict[str, Any]] = {
    "digits_cnn": {"kind": "top1"},
    "mlp": {"kind": "top1"},
    "mobilenet_v2": {"kind": "top1"},
    "transformer_block": {"kind": "cosine", "min": 0.999},
}
BASE = ["orig", "ferry", "sim", "slim"]
STATIC = ["ferry-s", "sim-s"]
PEERS = {"sim": "onnxsim", "slim": "onnxslim", "sim-s": "onnxsim"}
#: Whom each ferry variant is held against in the goals.
RIVALS = {"ferry": ["sim", "slim"], "ferry-s": ["sim-s"]}

# Runs in the peers' environment: ``python -c PEER_WORKER TOOL SRC DST SHAPES_JSON``; prints one
# line ``@@result {json}`` last. Loading counts in the time, as it does for ferry (path in, model
# out); saving does not.
PEER_WORKER = r"""
import json, sys, time
tool, src, dst, shapes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
import onnx
if tool == "onnxsim":
    import onnxsim
else:
    import onnxslim
start = time.perf_counter()
model = onnx.load(src)
if tool == "onnxsim":
    kw = {"overwrite_input_shapes": shapes, "test_input_shapes": shapes} if shapes else {}
    out, ok = onnxsim.simplify(model, **kw)
    if not ok:
        raise SystemExit("onnxsim: its own check failed")
else:
    out = onnxslim.slim(model)
seconds = time.perf_counter() - start
big = out.ByteSize() > 1_900_000_000
onnx.save(out, dst, save_as_external_data=big)
print("@@result " + json.dumps({"seconds": seconds}))
"""

PEER_VERSIONS = r"""
import json
from importlib.metadata import version
import onnx, onnxruntime, onnxsim, onnxslim
print(json.dumps({k: version(k) for k in ("onnxsim", "onnxslim", "onnx", "onnxruntime")}))
"""


# ---------------------------------------------------------------------------------------------
# ferry's optimizer


def ferry_optimize(
    path: Path,
    fix_shapes: dict[str, list[int]] | None,
    feeds: dict[str, np.ndarray],
    args: argparse.Namespace,
) -> tuple[Any, str | None]:
    """``ferry.optimizer.optimize`` on the file: (the ``onnx_ir.Model``, why ferry refused its
    own result, if it did: then the model is the input, as a user gets it)."""
    from ferry.optimizer import optimize

    result = optimize(str(path), **optimize_kwargs(fix_shapes, feeds, args))
    REPORTS[str(path), bool(fix_shapes)] = result.report.to_dict()
    refused = result.report.refused
    return result.model, (f"refused: {refused}" if refused else None)


#: ferry's own reports, by (model file, shapes fixed), for ``--json``.
REPORTS: dict[tuple[str, bool], dict[str, Any]] = {}


def optimize_kwargs(
    fix_shapes: dict[str, list[int]] | None,
    feeds: dict[str, np.ndarray] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The arguments this run gives ``optimize``."""
    kwargs: dict[str, Any] = {
        "level": args.level,
        "target": args.target,
        "verify": args.verify,
        "measure": args.measure,
    }
    if fix_shapes is not None:
        kwargs["fix_shapes"] = fix_shapes
    if (args.verify or args.measure) and feeds is not None:
        kwargs["example_inputs"] = feeds
    return kwargs


def ferry_optimizer_name(args: argparse.Namespace) -> str:
    given = optimize_kwargs(None, None, args)
    return f"ferry.optimizer.optimize({', '.join(f'{k}={v!r}' for k, v in given.items())})"


# ---------------------------------------------------------------------------------------------
# The models


@dataclass
class Source:
    mid: str
    path: Path
    feeds: dict[str, np.ndarray]
    judge: dict[str, Any]
    origin: str


def source(mid: str, work: Path) -> Source:
    """The model as an ONNX file with its inputs and judge. Converted kit models and exported zoo
    models are kept in ``work``: a ``--work`` folder given again skips the conversion."""
    if mid.startswith(ZOO):
        from ferry import zoo

        name = mid[len(ZOO) :]
        out = work / "zoo" / f"{name}.onnx"
        origin = "zoo, exported earlier"
        if not out.is_file():
            start = time.perf_counter()
            zoo.save(name, out.parent)
            origin = f"zoo, exported in {time.perf_counter() - start:.0f} s"
        feeds = zoo.example_inputs(name, batch=1)
        return Source(mid, out, feeds, dict(ZOO_JUDGES[name]), origin)
    entry = kit_models.entry(mid)
    feeds = kit_models.feeds(mid)
    if entry["format"] == "onnx":
        return Source(mid, kit_models.path(mid), feeds, dict(entry["judge"]), "onnx")
    out = work / f"{mid}.onnx"
    origin = f"{entry['format']}, converted earlier"
    if not out.is_file():
        start = time.perf_counter()
        kit_models.convert(mid, out)
        origin = f"{entry['format']}, converted in {time.perf_counter() - start:.0f} s"
    return Source(mid, out, feeds, dict(entry["judge"]), origin)


def graph_stats(path: Path) -> tuple[int, int, int, list[str]]:
    """(nodes in the main graph, of them Constant, bytes on disk with external data, the graph's
    inputs, those with a default in an initializer included)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    nodes = len(proto.graph.node)
    constants = sum(1 for n in proto.graph.node if n.op_type == "Constant")
    size = path.stat().st_size
    locations = {
        e.value
        for t in proto.graph.initializer
        for e in t.external_data
        if e.key == "location" and t.data_location == onnx.TensorProto.EXTERNAL
    }
    size += sum((path.parent / loc).stat().st_size for loc in locations)
    return nodes, constants, size, [i.name for i in proto.graph.input]


# ---------------------------------------------------------------------------------------------
# Peers


def peer_versions(python: Path) -> tuple[dict[str, str] | None, str]:
    """The peers' versions in their environment, or None and why not."""
    if not python.exists():
        return None, f"no peer environment at {python}"
    try:
        done = subprocess.run(
            [str(python), "-c", PEER_VERSIONS], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{python} does not run: {e}"
    if done.returncode != 0:
        return None, f"{python} lacks onnxsim/onnxslim: {last_line(done.stderr)}"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def run_peer(
    python: Path, tool: str, src: Path, dst: Path, shapes: dict[str, list[int]] | None
) -> float:
    """Run ``tool`` on ``src`` into ``dst`` in the peers' environment; its seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    cmd = [str(python), "-c", PEER_WORKER, tool, str(src), str(dst), json.dumps(shapes or {})]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=env, cwd=dst.parent
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {PEER_TIMEOUT_S} s") from None
    results = [ln for ln in done.stdout.splitlines() if ln.startswith("@@result ")]
    if done.returncode != 0 or not results:
        why = last_line(done.stderr) or last_line(done.stdout) or f"exit status {done.returncode}"
        if done.returncode < 0:
            why = f"killed by signal {-done.returncode}; {why}"
        raise RuntimeError(why)
    return float(json.loads(results[-1][len("@@result ") :])["seconds"])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ---------------------------------------------------------------------------------------------
# Engines, timing, parity


def alternate(fns: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in rotating blocks of ``block`` calls
    (forward, then backward, so no function always follows the same one).

    Each block starts with a tenth of a block (at least one call) left untimed: the previous
    engine's worker threads still spin for a moment after its last call and slow the next one's
    first calls. One block each to warm up."""
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


@dataclass
class Runner:
    """One variant loaded in one engine: ``call()`` for timing, ``outputs()`` for parity."""

    call: Callable[[], object]
    outputs: Callable[[], dict[str, np.ndarray]]


def ort_runner(path: Path, feeds: dict[str, np.ndarray], threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()  # default graph optimizations: what users run
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def outputs() -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, feeds), strict=True))

    return Runner(lambda: session.run(None, feeds), outputs)


def ov_runner(path: Path, feeds: dict[str, np.ndarray], threads: int | None) -> tuple[Runner, str]:
    """The runner and what OpenVINO says it compiled: precision and threads."""
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()
    ports = {name: i for i, port in enumerate(compiled.inputs) for name in port.get_names()}
    missing = [k for k in feeds if k not in ports]
    if missing:
        raise RuntimeError(f"OpenVINO's compiled model has no input {missing[0]!r}")
    tensors = [
        (ports[k], ov.Tensor(np.ascontiguousarray(v), shared_memory=True)) for k, v in feeds.items()
    ]
    names = [next(iter(o.get_names()), f"output_{i}") for i, o in enumerate(compiled.outputs)]

    def call() -> None:
        for i, tensor in tensors:
            request.set_input_tensor(i, tensor)
        request.infer()

    def outputs() -> dict[str, np.ndarray]:
        call()
        return {n: request.get_output_tensor(i).data.copy() for i, n in enumerate(names)}

    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = getattr(precision, "get_type_name", lambda: str(precision))()
    ran = f"{name}, {compiled.get_property('INFERENCE_NUM_THREADS')} threads"
    return Runner(call, outputs), ran


@dataclass
class Parity:
    passed: bool
    detail: str
    max_abs: float = float("nan")
    problem: str = ""  # why no difference was taken: "shape", "outputs"

    def cell(self) -> str:
        if self.problem:
            diff = f" {self.problem}"
        elif math.isnan(self.max_abs):
            diff = " nan"  # NaN in the outputs (or a comparison that never ran)
        elif self.max_abs == 0:
            diff = " 0"
        else:
            diff = f" {self.max_abs:.0e}"
        return ("ok" if self.passed else "FAIL") + diff


def interface_change(v: Variant, orig: Variant) -> Parity | None:
    """A variant that drops or adds graph inputs is another model, whatever its outputs on the
    kit's inputs: an input with a default in an initializer (a streaming model's state) is one the
    caller may feed, and folding it into a constant takes that away."""
    dropped = [n for n in orig.inputs if n not in v.inputs]
    added = [n for n in v.inputs if n not in orig.inputs]
    if not dropped and not added:
        return None
    parts = []
    if dropped:
        parts.append(
            f"drops {len(dropped)} input(s) the caller may feed ({', '.join(dropped[:3])}...)"
        )
    if added:
        parts.append(f"adds input(s) {', '.join(added[:3])}")
    return Parity(False, "; ".join(parts), problem="inputs")


def parity(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], spec: Mapping[str, Any]
) -> Parity:
    """``got`` against the original's ``want`` (the original's output names, or in its order),
    judged as the kit judges the model."""
    from ferry.parity import judge

    if len(got) != len(want):
        return Parity(False, f"{len(got)} outputs, the original has {len(want)}", problem="outputs")
    if set(got) != set(want):
        got = dict(zip(want, got.values(), strict=True))  # renamed: in the original's order
    diffs = []
    for name, w in want.items():
        g = np.asarray(got[name])
        w = np.asarray(w)
        if g.shape != w.shape:
            return Parity(
                False,
                f"{name}: shape {list(g.shape)}, the original's {list(w.shape)}",
                problem="shape",
            )
        if g.size and g.dtype.kind in "biuf" and w.dtype.kind in "biuf":
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            # Equal values (infinities included) and NaN where the original has NaN differ by 0;
            # a NaN the original does not have makes the difference NaN.
            same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
            diffs.append(float(np.max(np.where(same, 0.0, np.abs(g64 - w64)))))
    worst = float("nan") if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)
    try:
        verdicts = judge(dict(spec))(got, want)
    except Exception as e:  # a judge that cannot read the outputs is a failed parity, shown
        return Parity(False, f"judge: {type(e).__name__}: {e}", worst)
    failed = [v for v in verdicts if not v.passed]
    if failed:
        return Parity(False, "; ".join(f"{v.output}: {v.detail}" for v in failed), worst)
    return Parity(True, "; ".join(v.detail for v in verdicts), worst)


# ---------------------------------------------------------------------------------------------
# One model


@dataclass
class Variant:
    name: str
    path: str = ""
    nodes: int | None = None
    constants: int | None = None
    bytes: int | None = None
    optimize_s: float | None = None
    error: str | None = None  # could not be made
    note: str | None = None  # made, with a remark (ferry refused its own result)
    report: dict[str, Any] | None = None  # ferry's own OptimizeReport
    inputs: list[str] = field(default_factory=list)
    ort_ms: float | None = None
    ort_error: str | None = None
    ort_parity: Parity | None = None
    ov_ms: float | None = None
    ov_error: str | None = None
    ov_parity: Parity | None = None


@dataclass
class Result:
    model: str
    origin: str = ""
    inputs: str = ""
    variants: dict[str, Variant] = field(default_factory=dict)
    ov_ran: str = ""
    ort_on: bool = True
    ov_on: bool = True
    goals: dict[str, bool | None] = field(default_factory=dict)
    misses: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def short(e: BaseException) -> str:
    """The error in one line, without the engines' source locations."""
    text = str(e)
    # OpenVINO: "Exception from src/...cpp:132:" and "Check '...' failed at src/...cpp:151:" lines.
    text = re.sub(r"(Exception from|Check '[^\n]*' failed at) \S+:\d+:\s*", "", text)
    # ONNX Runtime: "[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model from PATH failed:".
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : ", "", text)
    text = re.sub(r"Load model from \S+ failed:\s*", "", text)
    text = " ".join(text.split())
    return f"{type(e).__name__}: {text[:240]}"


def make_variants(
    src: Source, folder: Path, names: list[str], args: argparse.Namespace
) -> dict[str, Variant]:
    shapes = {k: list(v.shape) for k, v in src.feeds.items()}
    variants = {"orig": Variant("orig", str(src.path))}
    for name in names[1:]:
        v = Variant(name, str(folder / f"{name}.onnx"))
        variants[name] = v
        static = shapes if name in STATIC else None
        out = Path(v.path)
        out.unlink(missing_ok=True)
        try:
            if name.startswith("ferry"):
                from ferry.graph import save_model

                start = time.perf_counter()
                model, v.note = ferry_optimize(src.path, static, src.feeds, args)
                v.optimize_s = time.perf_counter() - start
                v.report = REPORTS.get((str(src.path), bool(static)))
                save_model(model, out)
            elif args.peers_python is None:
                v.error = f"no peers: bash {PEERS_SCRIPT}"
                continue
            else:
                v.optimize_s = run_peer(args.peers_python, PEERS[name], src.path, out, static)
        except Exception as e:  # one tool's failure is a cell in the table, not the end of the run
            v.error = short(e)
            continue
    # A second session of the original, timed with the others: this run's noise.
    variants["twin"] = Variant("twin", str(src.path))
    for v in variants.values():
        if v.error is None:
            try:
                v.nodes, v.constants, v.bytes, v.inputs = graph_stats(Path(v.path))
            except Exception as e:
                v.error = f"unreadable: {short(e)}"
    return variants


def time_engine(
    engine: str,
    variants: dict[str, Variant],
    src: Source,
    args: argparse.Namespace,
    result: Result,
) -> None:
    """Load every variant in ``engine``, check its outputs against the original's, then time the
    ones that ran in one run of alternating blocks."""
    runners: dict[str, Runner] = {}
    outs: dict[str, dict[str, np.ndarray]] = {}
    for name, v in variants.items():
        if v.error is not None:
            continue
        try:
            if engine == "ort":
                runner = ort_runner(Path(v.path), src.feeds, args.ort_threads)
            else:
                runner, ran = ov_runner(Path(v.path), src.feeds, args.threads)
                result.ov_ran = result.ov_ran or ran
            outs[name] = runner.outputs()
            runners[name] = runner
        except Exception as e:
            setattr(v, f"{engine}_error", short(e))
    want = outs.get("orig")
    if want is not None:
        for name, got in outs.items():
            if name != "orig":
                changed = interface_change(variants[name], variants["orig"])
                verdict = changed or parity(got, want, src.judge)
                setattr(variants[name], f"{engine}_parity", verdict)
    if not runners:
        return
    # The block's length from one variant's speed (the original's when it runs).
    probe = runners.get("orig") or next(iter(runners.values()))
    probe.call()
    start = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - start < 0.05:
        probe.call()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    block = max(1, min(2000, round(args.block_s / per_call)))
    t = alternate({k: r.call for k, r in runners.items()}, args.rounds, block)
    for name, seconds in t.items():
        setattr(variants[name], f"{engine}_ms", seconds * 1000)
    del runners, outs


def bench_model(mid: str, work: Path, args: argparse.Namespace) -> Result:
    result = Result(mid)
    src = source(mid, work)
    result.origin = src.origin
    result.ov_on = args.openvino
    result.inputs = ", ".join(
        f"{k}={'x'.join(map(str, v.shape))} {v.dtype}" for k, v in src.feeds.items()
    )
    print(f"\n== {mid} ({src.origin}): {result.inputs}", flush=True)
    folder = work / "variants" / mid.replace(":", "_")
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result.variants = make_variants(src, folder, args.variants, args)
    made = time.perf_counter() - start
    for v in result.variants.values():
        if v.error:
            print(f"   {v.name}: could not be made: {v.error}")
    print(f"   variants made in {made:.0f} s", flush=True)
    for engine in ["ort"] + (["ov"] if args.openvino else []):
        start = time.perf_counter()
        time_engine(engine, result.variants, src, args, result)
        print(f"   {engine} timed in {time.perf_counter() - start:.0f} s", flush=True)
    judge_goals(result)
    print("   " + row(result, args.variants), flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Goals


def valid(v: Variant) -> bool:
    """Made, ran in ONNX Runtime and kept parity there: a fair rival."""
    return (
        v.error is None
        and v.ort_ms is not None
        and v.ort_parity is not None
        and v.ort_parity.passed
    )


def judge_goals(result: Result) -> None:
    """Per ferry variant: nodes, ORT and OV latency against the best valid rival, and parity."""
    vs = result.variants
    for mine, rivals in RIVALS.items():
        if mine not in vs:
            continue
        me = vs[mine]
        fair = [vs[r] for r in rivals if r in vs and valid(vs[r])]
        sfx = "" if mine == "ferry" else f" ({mine})"
        if me.error is not None:
            for g in ("nodes", "ort", "ov", "parity"):
                result.goals[g + sfx] = False
                result.misses[g + sfx] = "ferry's optimizer failed"
            continue
        # Nodes: against the best valid peer; none valid, against the original.
        rival = min(fair, key=lambda v: v.nodes or 0) if fair else vs["orig"]
        ok = me.nodes is not None and rival.nodes is not None and me.nodes <= rival.nodes
        result.goals["nodes" + sfx] = ok
        if not ok:
            result.misses["nodes" + sfx] = f"{me.nodes} > {rival.name} {rival.nodes}"
        for engine in ("ort", "ov"):
            mine_ms = getattr(me, f"{engine}_ms")
            timed = [v for v in fair if getattr(v, f"{engine}_ms") is not None]
            if not timed:
                timed = [vs["orig"]] if getattr(vs["orig"], f"{engine}_ms") is not None else []
            if not timed and mine_ms is None:
                result.goals[engine + sfx] = None  # the engine runs none of them
                continue
            if mine_ms is None:
                result.goals[engine + sfx] = False
                result.misses[engine + sfx] = (
                    f"ferry's did not run: {str(getattr(me, f'{engine}_error'))[:60]}"
                )
                continue
            if not timed:
                result.goals[engine + sfx] = True  # only ferry's runs
                continue
            best = min(timed, key=lambda v: getattr(v, f"{engine}_ms"))
            ratio = mine_ms / getattr(best, f"{engine}_ms")
            result.goals[engine + sfx] = ratio <= NOISE
            if ratio > NOISE:
                result.misses[engine + sfx] = f"{ratio:.2f}x {best.name}"
        p = me.ort_parity
        result.goals["parity" + sfx] = p is not None and p.passed
        if p is None:
            result.misses["parity" + sfx] = f"not run: {str(me.ort_error)[:60]}"
        elif not p.passed:
            result.misses["parity" + sfx] = p.detail[:120]


# ---------------------------------------------------------------------------------------------
# Output


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def cells(values: list[str]) -> str:
    return " / ".join(values)


def ms_cells(result: Result, engine: str, names: list[str]) -> tuple[str, str]:
    """(original's ms, the others' ratios to it)."""
    vs = result.variants
    if not getattr(result, f"{engine}_on"):
        return "off", cells(["off"] * (len(names) - 1))
    base = getattr(vs["orig"], f"{engine}_ms")
    orig = f"{base:.2f}" if base is not None else "err"
    ratios = []
    for n in names[1:]:
        v = vs[n]
        ms = getattr(v, f"{engine}_ms")
        if v.error is not None:
            ratios.append("-")
        elif ms is None:
            ratios.append("err")
        elif base is None:
            ratios.append(f"{ms:.2f}ms")
        else:
            ratios.append(f"{ms / base:.2f}")
    return orig, cells(ratios)


def parity_cell(v: Variant) -> str:
    if v.error is not None:
        return "-"
    if v.ort_parity is None:
        return "err"
    text = v.ort_parity.cell()
    if v.ort_parity.passed and v.ov_parity is not None and not v.ov_parity.passed:
        text += " (OV FAIL)"
    return text


def header(names: list[str]) -> str:
    rest = " / ".join(names[1:])
    return (
        f"| model | nodes {' / '.join(names)} | size {' / '.join(names)} | ORT ms orig "
        f"| ORT x {rest} | OV ms orig | OV x {rest} | parity {rest} | optimize s {rest} "
        "| noise ORT / OV |\n"
        "|---|---|---|---:|---|---:|---|---|---|---|"
    )


def row(result: Result, names: list[str]) -> str:
    if result.error is not None:
        return f"| {result.model} | error: {result.error} |" + " |" * 8
    vs = result.variants

    def nodes(v: Variant) -> str:
        if v.error is not None:
            return "n/a" if v.error.startswith("no peers") else "err"
        text = str(v.nodes) + ("*" if v.note else "")
        return (
            f"**{text}**"
            if v.name in RIVALS and result.goals.get(goal_key("nodes", v.name)) is False
            else text
        )

    ort_ms, ort_x = ms_cells(result, "ort", names)
    ov_ms, ov_x = ms_cells(result, "ov", names)
    opt = cells(["-" if vs[n].optimize_s is None else f"{vs[n].optimize_s:.1f}" for n in names[1:]])
    return (
        f"| {result.model} | {cells([nodes(vs[n]) for n in names])} "
        f"| {cells([fmt_size(vs[n].bytes) for n in names])} | {ort_ms} | {ort_x} | {ov_ms} | {ov_x} "
        f"| {cells([parity_cell(vs[n]) for n in names[1:]])} | {opt} "
        f"| {noise_cell(result, 'ort')} / {noise_cell(result, 'ov')} |"
    )


def noise(result: Result, engine: str) -> float | None:
    """The original's second session against its first: 1.0 on a quiet machine."""
    a = getattr(result.variants["orig"], f"{engine}_ms")
    b = getattr(result.variants["twin"], f"{engine}_ms")
    return b / a if a and b else None


def noise_cell(result: Result, engine: str) -> str:
    x = noise(result, engine)
    return "-" if x is None else f"{x:.2f}"


def goal_key(goal: str, variant: str) -> str:
    return goal if variant == "ferry" else f"{goal} ({variant})"


def summary(results: list[Result], names: list[str]) -> list[str]:
    lines = []
    goals = [
        ("nodes", "nodes <= best peer"),
        ("ort", f"ORT latency no worse than best peer (within {NOISE - 1:.0%} noise)"),
        ("ov", f"OV latency no worse than best peer (within {NOISE - 1:.0%} noise)"),
        ("parity", "parity"),
    ]
    for mine in [n for n in names if n in RIVALS]:
        parts, misses = [], []
        for g, text in goals:
            key = goal_key(g, mine)
            scored = [r for r in results if r.error is None and r.goals.get(key) is not None]
            passed = [r for r in scored if r.goals[key]]
            missed = [f"{r.model} ({r.misses.get(key, '?')})" for r in scored if not r.goals[key]]
            parts.append(f"{text}: {len(passed)}/{len(scored)}" if scored else f"{text}: -")
            if missed:
                misses.append(f"  {g} missed on {', '.join(missed)}")
        rivals = " and ".join(RIVALS[mine])
        lines.append(f"goals, {mine} against {rivals}: " + "; ".join(parts))
        lines += misses
    if any((v.error or "").startswith("no peers") for r in results for v in r.variants.values()):
        lines.append(
            f"PEERS NOT MEASURED (no peer environment: bash {PEERS_SCRIPT}): the goals above "
            "hold ferry against the original only"
        )
    spread = []
    for engine, label in (("ort", "ORT"), ("ov", "OV")):
        xs = [(x, r.model) for r in results if r.error is None and (x := noise(r, engine))]
        if xs:
            lo, hi = min(xs), max(xs)
            typical = statistics.median(abs(x - 1) for x, _ in xs)
            spread.append(
                f"{label} off by {typical:.0%} in the median, {lo[0]:.2f} ({lo[1]}) to "
                f"{hi[0]:.2f} ({hi[1]}) at worst"
            )
    if spread:
        lines.append(
            "noise: a second session of the original, timed alongside the first: "
            + "; ".join(spread)
            + ". Latency ratios closer than that to a goal are not settled by this run"
        )
    return lines


def notes(results: list[Result]) -> list[str]:
    """Errors and parity failures, a line each."""
    out = []
    for r in results:
        if r.error is not None:
            out.append(f"{r.model}: not measured: {r.error}")
            continue
        for v in r.variants.values():
            if v.name == "twin":  # the original again
                continue
            if v.error is not None and not v.error.startswith("no peers"):
                out.append(f"{r.model} {v.name}: could not be made: {v.error}")
                continue
            if v.note:
                out.append(f"{r.model} {v.name}: {v.note}")
            if v.ort_error:
                out.append(f"{r.model} {v.name}: ONNX Runtime: {v.ort_error}")
            if v.ov_error:
                out.append(f"{r.model} {v.name}: OpenVINO: {v.ov_error}")
            ort = v.ort_parity if v.ort_parity is not None and not v.ort_parity.passed else None
            ov = v.ov_parity if v.ov_parity is not None and not v.ov_parity.passed else None
            if ort and ov and ort.detail == ov.detail:
                where = "ONNX Runtime and OpenVINO"
                out.append(f"{r.model} {v.name}: parity FAILED in {where}: {ort.detail}")
                continue
            if ort:
                out.append(f"{r.model} {v.name}: parity FAILED in ONNX Runtime: {ort.detail}")
            if ov:
                out.append(f"{r.model} {v.name}: parity FAILED in OpenVINO: {ov.detail}")
    return out


def machine() -> tuple[str, dict[str, Any]]:
    """The machine and engine versions, as ``ferry bench`` describes a device."""
    from ferry.bench import device_info

    info = device_info()
    versions = [f"ferry {info['ferry']}"] + [
        f"{e['name']} {e['version']}" for e in info["engines"] if e["available"]
    ]
    return (
        f"{info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), {', '.join(versions)}",
        info,
    )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from ferry import zoo

    every = kit_models.ids() + [ZOO + n for n in zoo.names()]
    parser.add_argument("--models", default=",".join(every), help="kit ids and zoo:NAME")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter blocks")
    parser.add_argument(
        "--static", action="store_true", help="also ferry and onnxsim told the shapes"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"default {ROUNDS} ({QUICK_ROUNDS} quick)"
    )
    parser.add_argument(
        "--block-s", type=float, default=None, help=f"default {BLOCK_S} s ({QUICK_BLOCK_S} quick)"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument("--level", default="extended", help="ferry's optimization level")
    parser.add_argument("--target", default=None, help="ferry's target engine")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="let ferry check its result's outputs (on the kit's inputs) and refuse a mismatch",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="let ferry time its result (on the kit's inputs) and refuse a slower one",
    )
    parser.add_argument("--peers", type=Path, default=None, help="the peers' Python")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false")
    parser.add_argument(
        "--work", type=Path, default=None, help="keep converted models and variants here"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args(argv)

    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in every]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(every)})")
    if any(not m.startswith(ZOO) for m in models) and not kit_models.kit_ready():
        parser.error(f"the kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh")
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    args.block_s = args.block_s or (QUICK_BLOCK_S if args.quick else BLOCK_S)
    args.variants = BASE + (STATIC if args.static else [])
    paddle = ROOT / ".venv-paddle" / "bin" / "python"
    if "FERRY_PADDLE_PYTHON" not in os.environ and paddle.exists():
        os.environ["FERRY_PADDLE_PYTHON"] = str(paddle)

    described, info = machine()
    args.ort_threads = args.threads or info["usable_cores"]
    load_before = os.getloadavg()
    started = time.perf_counter()
    print(described)
    print(
        f"ONNX Runtime CPU: default session options, {args.ort_threads} intra-op threads; "
        f"OpenVINO CPU: f32 hint, {args.threads or 'default'} threads; batch 1; "
        f"{args.rounds} rounds x blocks of ~{args.block_s} s per engine; "
        f"load average {load_average()}"
    )
    if load_before[0] > 0.5 * info["usable_cores"]:
        print(
            f"WARNING: load average {load_before[0]:.2f} on {info['usable_cores']} cores: something "
            "else is running; the latencies below are noisy"
        )
    print(f"ferry: {ferry_optimizer_name(args)}")
    args.peers_python = None
    peers_python = args.peers or PEERS_VENV / "bin" / "python"
    versions, why = peer_versions(peers_python)
    if versions is None:
        print(
            f"PEERS NOT MEASURED: {why}. Make their environment with: bash {PEERS_SCRIPT} "
            "(or pass --peers PYTHON); their columns say so below"
        )
    else:
        args.peers_python = peers_python
        print(
            f"peers ({peers_python}): onnxsim {versions['onnxsim']}, onnxslim {versions['onnxslim']} "
            f"(onnx {versions['onnx']}, onnxruntime {versions['onnxruntime']}), default arguments"
        )

    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for mid in models:
            try:
                results.append(bench_model(mid, work, args))
            except Exception as e:  # one model's failure must not end the run
                traceback.print_exc()
                print(f"{mid}: ERROR {short(e)}", flush=True)
                results.append(Result(mid, error=short(e)))

    names = args.variants
    print(
        "\nnodes: the main graph's, Constant nodes included; x: latency relative to the original "
        "(lower is faster); parity: the kit's judge in ONNX Runtime against the original, and "
        "the largest absolute difference; bold: ferry above the best peer; *: ferry refused its "
        "own result and kept the input (see the notes)"
    )
    print(header(names))
    for r in results:
        print(row(r, names))
    print()
    for line in summary(results, names):
        print(line)
    extra = notes(results)
    if extra:
        print("\nnotes:")
        for line in extra:
            print(f"  {line}")
    ov_ran = sorted({r.ov_ran for r in results if r.ov_ran})
    load_after = load_average()
    elapsed = time.perf_counter() - started
    print(
        f"\nmachine: {described}; OpenVINO ran {', '.join(ov_ran) or '-'}; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {load_after}; {elapsed:.0f} s"
    )
    if args.json is not None:
        doc = {
            "machine": info,
            "settings": {
                "rounds": args.rounds,
                "block_s": args.block_s,
                "ort_threads": args.ort_threads,
                "ov_threads": args.threads,
                "ov_ran": ov_ran,
                "ferry": ferry_optimizer_name(args),
                "level": args.level,
                "target": args.target,
                "peers": versions,
                "variants": names,
            },
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "seconds": elapsed,
            "results": [asdict(r) for r in results],
            "goals": summary(results, names),
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
