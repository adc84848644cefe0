"""ferry's ONNX -> .tflite exporter against onnx2tf, run in LiteRT, on the kit's real models.

One process, one run. For each model (the kit's ONNX file; the kit's other models converted once
with ``ferry.convert``, Paddle through ``FERRY_PADDLE_PYTHON``), three ways to run it:

* ``ORT``: the ONNX model in ONNX Runtime CPU, default session options (its graph optimizations
  on, as users run it), intra-op threads = the usable cores;
* ``onnx2tf``: the peer tool's float32 ``.tflite``, made in its own environment
  (``scripts/onnx2tf-env.sh`` makes ``.venv-onnx2tf``: onnx2tf needs Python 3.12 and pins its own
  onnx, onnxruntime, numpy...) by its command line, one subprocess per model, on a COPY of the
  model in a work folder (onnx2tf rewrites the file it is given: onnxsim and op naming run in
  place; the summary counts it): ``onnx2tf -i model.onnx -o out -n -ois NAME:DIMS...`` (``-ois``:
  the kit's input shapes, which its README asks for when dims are dynamic; its onnxsim step
  applies them, so its venv's ``bin`` goes first on PATH, as when activated: without ``onnxsim``
  there it only warns and writes a dynamic-shape file) with its default backend
  ``flatbuffer_direct``; where that refuses the model, once more with ``-tb tf_converter``, as its
  README advises (the notes say so). The file is ``out/model_float32.tflite``;
* ``ferry``: ``ferry.mobile.export_tflite(model, out, precision="fp32", nhwc_io=False,
  verify=False)`` in this process (``--ferry-verify``: with its own check in LiteRT, as users get
  it by default; that time then counts in its conversion seconds). Where ferry's exporter is not
  importable its column says "n/a: ferry.mobile.export_tflite not available".

I/O layout, the same for both tools: by default the ``.tflite`` keeps the ONNX model's input and
output shapes (NCHW for the conv nets): ferry's ``nhwc_io=False``, and for onnx2tf
``-kat`` (keep_shape_absolutely_input_names) on every input; without it onnx2tf turns 3-D to 5-D
inputs channels-last. ``--nhwc`` compares the channels-last files instead: ferry's
``nhwc_io=True`` and onnx2tf's default. Either way the inputs are fed as each ``.tflite`` declares
them (an input whose shape is the ONNX one moved channels-last gets the kit's input transposed,
outside the timing; a dim left dynamic is resized to the kit's, as its users must) and outputs
laid out so are transposed back before they are judged; the notes list every input and output so
handled, and the Transposes cell marks the file with a dagger: onnx2tf, ``-kat`` or not, drops a
final Transpose now and then and hands that output over in another layout than the ONNX model's
(a 4-D map NHWC, a YOLOX head [1, 6, N] for [1, N, 6]), which saves it a Transpose its caller
then has to do.

Both ``.tflite`` files run in LiteRT in this process (``ai_edge_litert.interpreter.Interpreter``,
its default XNNPACK delegate, ``num_threads`` = the usable cores). Measured per model:

* latency: batch 1 on the kit's realistic input at the kit's shapes (``kit_models.feeds(mid,
  0)``: photographs, rendered text lines and pages, synthesized audio); the three, and a second
  ONNX Runtime session of the model ("noise": 1.00 on a quiet machine), timed in alternating
  blocks of calls (about 0.3 s each, each led by a few untimed calls: the previous engine's worker
  threads still spin), median per call; LiteRT's calls include ``set_tensor`` of every input,
  as ONNX Runtime's include its feed;
* accuracy: each ``.tflite``'s outputs against ONNX Runtime's on the model, on ``--samples`` kit
  inputs (``kit_models.feeds(mid, i)``), judged at the task by the kit's judge
  (``kit_models.entry(mid)["judge"]`` through ``ferry.parity.judge``: top-1 for the classifiers,
  the pixel mask for the text detector, argmax agreement for the CTC recognizer, cosine for the
  detectors' raw maps), and the largest absolute difference;
* TRANSPOSE ops left in each ``.tflite`` (read with ``ferry.tflite.read_tflite``, every
  subgraph; the operator histogram is in ``--json``), the pieces XNNPACK took each file in (a
  note where ferry's is more than one: the operators between run on LiteRT's own kernels),
  conversion seconds (onnx2tf's: its subprocess, Python start and imports included; ferry's: the
  call, ferry already imported), file sizes.

Goals (ferry issue 16), printed, never asserted: ferry's ``.tflite`` no slower than onnx2tf's
(within 3%, this machine's noise; where onnx2tf could not convert the model ferry's file counts
if it is accurate), no slower than ONNX Runtime on the conv nets (CONV_MODELS), fewer Transposes
than onnx2tf's (or none at all), and accurate by the kit's judge. Each as k/n, misses named.
A tool that fails on a model fills its cells with the first line of its error; the run goes on.

    bash scripts/onnx2tf-env.sh        # once: .venv-onnx2tf with onnx2tf (Python 3.12)
    python benchmarks/tflite_export.py [--quick] [--models a,b] [--nhwc] [--samples 3] [--work DIR]
                                [--json OUT] [--rounds 5] [--block-s 0.3] [--threads N]
                                [--onnx2tf PATH] [--onnx2tf-backend auto] [--ferry-verify]

Without onnx2tf's environment its columns say n/a and the script names the one to run.

The whole run (13 models, 3 samples each) takes about 3.5 minutes on 2 cores (converted kit models
kept in ``--work`` save 20 s the next time), ``--quick`` (3 models, 1 sample, 3 rounds of 0.1 s
blocks) about 15 seconds. Run it on a quiet machine: the load average is printed before and after
(with a warning when something else runs), and the noise column shows what other work did to the
timings: on a shared machine ratios within it of a goal settle nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path, and this file is named like the
# ``tflite`` schema package ferry's reader imports: the folder must not shadow it.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)
sys.path.insert(0, str(ROOT / "tests" / "real"))

import kit_models  # noqa: E402  (tests/real: the kit's manifest, inputs and judges)


def _sibling(name: str) -> Any:
    """A module of this folder (benchmarks/ is no package): optimizer.py's timing and sources."""
    spec = importlib.util.spec_from_file_location(
        f"ferry_bench_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


_opt = _sibling("optimizer")
alternate = _opt.alternate  # rotating blocks of calls, median per call
short = _opt.short
last_line = _opt.last_line
machine = _opt.machine
load_average = _opt.load_average
source = _opt.source  # the kit model as an ONNX file (converted once), its feeds and judge

#: The kit's float models: the conv nets, the recognizers (captcha_ocr: an LSTM; table: an
#: attention decoder in a Loop), the audio models.
MODELS = [
    "orientation",
    "open_nsfw",
    "ppocr_cls_paddle",
    "ppocr_det_paddle",
    "ppocr_rec_paddle",
    "captcha_det",
    "captcha_ocr",
    "layout",
    "table",
    "emotion_keras",
    "mtcnn_torch",
    "pitch_onnx",
    "dfn_enc",
]
QUICK_MODELS = ["orientation", "ppocr_cls_paddle", "emotion_keras"]
#: Convolutional networks, held to "no slower than ONNX Runtime" (as benchmarks/quantize.py
#: has them). Not: ppocr_rec (SVTR: attention blocks), captcha_ocr (an LSTM), table (SLANet),
#: the audio models.
CONV_MODELS = {
    "orientation",
    "open_nsfw",
    "ppocr_cls_paddle",
    "ppocr_det_paddle",
    "captcha_det",
    "layout",
    "emotion_keras",
    "mtcnn_torch",
}
#: Latency within this factor counts as no slower (this machine's noise).
NOISE = 1.03
BLOCK_S = 0.3
QUICK_BLOCK_S = 0.1
ROUNDS = 5
QUICK_ROUNDS = 3
SAMPLES = 3
QUICK_SAMPLES = 1
#: Seconds onnx2tf may take on one model (one backend).
PEER_TIMEOUT_S = 600
PEER_VENV = ROOT / ".venv-onnx2tf"
PEER_SCRIPT = "scripts/onnx2tf-env.sh"
FERRY_NA = "n/a: ferry.mobile.export_tflite not available"
TOOLS = ("onnx2tf", "ferry")


# ---------------------------------------------------------------------------------------------
# Making the .tflite files


@dataclass
class Made:
    """One tool's .tflite for one model, and what running it gave."""

    tool: str
    path: str = ""
    seconds: float | None = None
    bytes: int | None = None
    error: str | None = None  # could not be made
    note: str | None = None  # made, with a remark (another backend, a step it skipped)
    transposes: int | None = None
    ops: int | None = None
    partitions: int | None = None  # XNNPACK's delegate partitions (1: all of it in one piece)
    histogram: dict[str, int] = field(default_factory=dict)  # operators by type
    layout: list[str] = field(default_factory=list)  # inputs/outputs fed or read transposed
    moved: int = 0  # inputs and outputs not in the ONNX model's layout
    rewrote_input: bool = False  # changed the ONNX file it was given
    ms: float | None = None
    run_error: str | None = None
    accuracy: Accuracy | None = None


@dataclass
class Accuracy:
    passed: bool
    detail: str
    max_abs: float = float("nan")
    samples: int = 0

    def cell(self) -> str:
        diff = "nan" if math.isnan(self.max_abs) else f"{self.max_abs:.0e}"
        return ("ok" if self.passed else "FAIL") + f" {diff}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dims_arg(feeds: Mapping[str, np.ndarray]) -> list[str]:
    """onnx2tf's ``-ois`` values: every input at the kit's shape."""
    return [f"{k}:{','.join(str(d) for d in v.shape)}" for k, v in feeds.items()]


def first_error(text: str) -> str:
    """The line that says what went wrong in onnx2tf's output: its Python exception's, else its
    first ERROR line that is not boilerplate, else the last line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", ln)]
    if raised:
        return raised[-1][:300]
    told = [
        ln
        for ln in lines
        if ln.startswith("ERROR:") and "trace log" not in ln and "github.com" not in ln
    ]
    return (told[0] if told else last_line(text))[:300]


def run_onnx2tf(
    exe: Path, src: Path, folder: Path, feeds: Mapping[str, np.ndarray], args: argparse.Namespace
) -> Made:
    """onnx2tf on a copy of ``src`` in ``folder``; its default backend first, then (``auto``)
    tf_converter where that one refuses the model."""
    made = Made("onnx2tf")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model = folder / "model.onnx"
    shutil.copyfile(src, model)  # a writable copy: onnx2tf may rewrite its input
    for data in src.parent.glob(f"{src.stem}*.data"):  # external weights, if any, beside it
        shutil.copyfile(data, folder / data.name)
    before = sha256(model)
    cmd = [str(exe), "-i", model.name, "-o", "out", "-n", "-ois", *dims_arg(feeds)]
    if not args.nhwc:
        cmd += ["-kat", *feeds]
    # None: its default backend (flatbuffer_direct), then tf_converter as its README advises.
    backends: list[str | None] = (
        [None, "tf_converter"] if args.onnx2tf_backend == "auto" else [args.onnx2tf_backend]
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["CUDA_VISIBLE_DEVICES"] = "-1"  # TensorFlow (tf_converter) must not look for a GPU
    # As from its activated venv: onnx2tf runs the ``onnxsim`` command (where -ois takes effect)
    # and, without it on PATH, only warns and converts the unsimplified, still dynamic model.
    env["PATH"] = os.pathsep.join([str(exe.parent), env.get("PATH", "")])
    errors: list[str] = []
    warned: list[str] = []
    for backend in backends:
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        full = cmd + (["-tb", backend] if backend else [])
        start = time.perf_counter()
        try:
            done = subprocess.run(
                full, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=env, cwd=folder
            )
        except subprocess.TimeoutExpired:
            errors.append(f"{backend or 'default'}: timed out after {PEER_TIMEOUT_S} s")
            continue
        seconds = time.perf_counter() - start
        tflite = out / "model_float32.tflite"
        if done.returncode == 0 and tflite.is_file():
            made.path, made.seconds = str(tflite), seconds
            if "Failed to optimize the onnx file" in done.stdout + done.stderr:
                warned.append("its onnxsim step failed (it went on without)")
            if backend is not None and len(backends) > 1:
                made.note = f"-tb {backend} (its default backend failed: {errors[-1]})"
            break
        why = first_error(done.stderr + "\n" + done.stdout) or f"exit status {done.returncode}"
        errors.append(f"{why}" if backend is None else f"-tb {backend}: {why}")
    else:
        made.error = "; ".join(errors)
    made.rewrote_input = model.is_file() and sha256(model) != before
    if warned:
        made.note = "; ".join(([made.note] if made.note else []) + warned)
    return made


def ferry_exporter() -> tuple[Callable[..., Any] | None, str]:
    """``ferry.mobile.export_tflite``, or None and why not."""
    try:
        from ferry.mobile import export_tflite
    except Exception as e:  # absent, or broken while it is being written: the column says so
        return None, f"{FERRY_NA} ({short(e)})"
    return export_tflite, ""


def run_ferry(
    export: Callable[..., Any],
    src: Path,
    folder: Path,
    feeds: Mapping[str, np.ndarray],
    args: argparse.Namespace,
) -> Made:
    """``export_tflite`` on the model as a user calls it; the input must come out unchanged."""
    made = Made("ferry")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "ferry.tflite"
    out.unlink(missing_ok=True)
    before = sha256(src)
    kwargs: dict[str, Any] = {
        "precision": "fp32",
        "nhwc_io": args.nhwc,
        "verify": args.ferry_verify,
    }
    params = inspect.signature(export).parameters
    if "samples" in params:
        # The kit's input: its shapes fix the model's dynamic dims (and verify runs on it).
        kwargs["samples"] = [dict(feeds)]
    if "shapes" in params:
        kwargs["shapes"] = {k: list(v.shape) for k, v in feeds.items()}
    start = time.perf_counter()
    try:
        result = export(str(src), str(out), **kwargs)
    except Exception as e:  # ferry's failure is a cell, not the end of the run
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        # The first line; with the next where it announces a list (the first unsupported node).
        text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else "".join(lines[:1])
        made.error = f"{type(e).__name__}: {text}"[:300]
        return made
    made.seconds = time.perf_counter() - start
    made.path = str(getattr(result, "path", out))
    made.rewrote_input = sha256(src) != before
    return made


def inspect_tflite(made: Made) -> None:
    """Transposes and operators (ferry's reader, every subgraph) and the file's size."""
    from ferry.tflite import read_tflite

    path = Path(made.path)
    made.bytes = path.stat().st_size
    model = read_tflite(path.read_bytes(), str(path))
    ops = [op.opcode for sg in model.subgraphs for op in sg.operators]
    made.ops = len(ops)
    made.histogram = dict(Counter(ops).most_common())
    made.transposes = sum(1 for op in ops if op == "TRANSPOSE")


# ---------------------------------------------------------------------------------------------
# Engines


@dataclass
class Runner:
    """One model loaded in one engine: ``call()`` for timing, ``outputs(feeds)`` keyed by the
    ONNX model's output names, laid out as ONNX Runtime gives them."""

    call: Callable[[], object]
    outputs: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def ort_runner(path: Path, feeds: Mapping[str, np.ndarray], threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()  # default graph optimizations: what users run
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    first = dict(feeds)

    def outputs(f: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, dict(f)), strict=True))

    return Runner(lambda: session.run(None, first), outputs)


def channels_last(rank: int) -> tuple[int, ...]:
    """NCHW -> NHWC for any rank >= 3: (0, 2, ..., rank-1, 1)."""
    return (0, *range(2, rank), 1)


def _norm(name: str) -> str:
    """A name as converters mangle it: "serving_default_x:0" and "x" match."""
    name = re.sub(r"^serving_default_", "", name)
    name = re.sub(r":0$", "", name)
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def _fits(tfl: tuple[int, ...], onnx: tuple[int, ...]) -> tuple[int, ...] | None:
    """How a .tflite tensor of shape ``tfl`` (-1: a dynamic dim, as its shape signature has it)
    holds an ONNX tensor of shape ``onnx``: the permutation that takes the ONNX one to it (the
    identity: as it is; channels-last), or None when it cannot."""

    def same(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
        return len(a) == len(b) and all(x == y or x == -1 for x, y in zip(a, b, strict=True))

    if same(tuple(tfl), tuple(onnx)):
        return tuple(range(len(onnx)))
    if 3 <= len(onnx) <= 5:
        perm = channels_last(len(onnx))
        if same(tuple(tfl), tuple(onnx[p] for p in perm)):
            return perm
    return None


def bind(
    tfl: list[tuple[str, tuple[int, ...]]], onnx: list[tuple[str, tuple[int, ...]]]
) -> dict[str, tuple[int, tuple[int, ...] | None]]:
    """ONNX tensor name -> (position among the .tflite's, permutation or None): by name, then by
    a mangled name, then by the only shape that fits, then in order. Raises when one does not fit.
    """
    free = list(range(len(tfl)))
    pairs: dict[str, int] = {}
    for key in (lambda s: s, _norm):
        for name, _ in onnx:
            if name in pairs:
                continue
            hits = [i for i in free if key(tfl[i][0]) == key(name)]
            if len(hits) == 1:
                pairs[name] = hits[0]
                free.remove(hits[0])
    for name, shape in onnx:
        if name in pairs:
            continue
        hits = [i for i in free if _fits(tfl[i][1], shape) is not None]
        if len(hits) == 1 or (hits and len(free) == 1):
            pairs[name] = hits[0]
            free.remove(hits[0])
    for name, _ in onnx:
        if name not in pairs and free:
            pairs[name] = free.pop(0)
    out: dict[str, tuple[int, tuple[int, ...] | None]] = {}
    for name, shape in onnx:
        if name not in pairs:
            raise RuntimeError(f"the .tflite has {len(tfl)} tensors for {len(onnx)} ONNX ones")
        i = pairs[name]
        perm = _fits(tfl[i][1], shape)
        if perm is None:
            raise RuntimeError(
                f"{name}: the .tflite's {tfl[i][0]!r} is {list(tfl[i][1])}, ONNX's {list(shape)}"
            )
        out[name] = (i, None if perm == tuple(range(len(perm))) else perm)
    return out


def signature(detail: Mapping[str, Any]) -> tuple[int, ...]:
    """A LiteRT tensor's declared shape, -1 where a dim is dynamic."""
    sig = detail.get("shape_signature")
    dims = sig if sig is not None and len(sig) else detail["shape"]
    return tuple(int(x) for x in dims)


def litert_runner(
    path: Path,
    feeds: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    threads: int,
    made: Made,
) -> Runner:
    """The .tflite in LiteRT (its default XNNPACK delegate), inputs and outputs bound to the
    ONNX model's by name and shape; ``made.layout`` records what is fed or read transposed."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=threads)
    ins = interp.get_input_details()
    ins_bound = bind(
        [(d["name"], signature(d)) for d in ins],
        [(k, tuple(v.shape)) for k, v in feeds.items()],
    )
    # A .tflite left with dynamic dims is sized to the kit's input first, as its users must.
    for name, (i, perm) in ins_bound.items():
        shape = tuple(feeds[name].shape)
        target = [shape[p] for p in perm] if perm is not None else list(shape)
        if list(ins[i]["shape"]) != target:
            interp.resize_tensor_input(ins[i]["index"], target)
            made.layout.append(f"input {name} {list(signature(ins[i]))} resized to {target}")
    interp.allocate_tensors()
    ins = interp.get_input_details()
    made.partitions = sum(1 for op in interp._get_ops_details() if op["op_name"] == "DELEGATE")

    def prepare(f: Mapping[str, np.ndarray]) -> list[tuple[int, np.ndarray]]:
        arrays = []
        for name, (i, perm) in ins_bound.items():
            a = np.asarray(f[name])
            if perm is not None:
                a = a.transpose(perm)
            arrays.append((ins[i]["index"], np.ascontiguousarray(a, dtype=ins[i]["dtype"])))
        return arrays

    for name, (i, perm) in ins_bound.items():
        if perm is not None:
            made.layout.append(f"input {name} fed as {[int(d) for d in ins[i]['shape']]}")
            made.moved += 1
        if ins[i]["dtype"] != feeds[name].dtype:
            made.layout.append(f"input {name} fed as {np.dtype(ins[i]['dtype']).name}")

    first = prepare(feeds)

    def call() -> None:
        for index, a in first:
            interp.set_tensor(index, a)
        interp.invoke()

    # Outputs bound after a call: a .tflite may size its outputs when it runs.
    call()
    outs = interp.get_output_details()
    outs_bound = bind(
        [(d["name"], tuple(interp.get_tensor(d["index"]).shape)) for d in outs],
        [(k, tuple(v.shape)) for k, v in want.items()],
    )
    for name, (i, perm) in outs_bound.items():
        if perm is not None:
            read = [int(d) for d in interp.get_tensor(outs[i]["index"]).shape]
            made.layout.append(f"output {name} read as {read}")
            made.moved += 1

    def outputs(f: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        for index, a in prepare(f):
            interp.set_tensor(index, a)
        interp.invoke()
        got = {}
        for name, (i, perm) in outs_bound.items():
            a = interp.get_tensor(outs[i]["index"]).copy()
            if perm is not None:
                a = a.transpose(np.argsort(perm))
            got[name] = a
        return got

    return Runner(call, outputs)


def judged(
    mid: str, spec: Mapping[str, Any], got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]
) -> tuple[bool, str, float]:
    """The kit's judge on one sample: (passed, detail, largest absolute difference)."""
    from ferry.parity import judge

    spec = dict(spec)
    output = spec.get("output")
    if output is not None and output not in want:
        # The judged output by position, when a conversion renamed the outputs.
        names = [o["name"] for o in kit_models.entry(mid).get("outputs", [])]
        if output in names and names.index(output) < len(want):
            spec["output"] = list(want)[names.index(output)]
    diffs = []
    for name, w in want.items():
        g = np.asarray(got[name])
        if g.shape != w.shape:
            return False, f"{name}: shape {list(g.shape)}, ONNX Runtime's {list(w.shape)}", math.nan
        if g.size and g.dtype.kind in "biuf" and w.dtype.kind in "biuf":
            d = np.abs(g.astype(np.float64) - w.astype(np.float64))
            diffs.append(float(np.max(d)) if d.size else 0.0)
    worst = math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)
    try:
        verdicts = judge(spec)(dict(got), dict(want))
    except Exception as e:  # a judge that cannot read the outputs is a failed check, shown
        return False, f"judge: {short(e)}", worst
    failed = [v for v in verdicts if not v.passed]
    if failed:
        return False, "; ".join(f"{v.output}: {v.detail}" for v in failed), worst
    return True, "; ".join(v.detail for v in verdicts), worst


def accuracy(
    mid: str,
    spec: Mapping[str, Any],
    runner: Runner,
    samples: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
) -> Accuracy:
    """Every sample judged; the first failure's detail, else the first sample's."""
    first, failed, worst = "", "", 0.0
    for feeds, want in samples:
        ok, detail, diff = judged(mid, spec, runner.outputs(feeds), want)
        worst = math.nan if math.isnan(diff) or math.isnan(worst) else max(worst, diff)
        first = first or detail
        failed = failed or ("" if ok else detail)
    return Accuracy(not failed, failed or first, worst, len(samples))


# ---------------------------------------------------------------------------------------------
# One model


@dataclass
class Result:
    model: str
    origin: str = ""
    inputs: str = ""
    conv: bool = False
    ort_ms: float | None = None
    twin_ms: float | None = None
    made: dict[str, Made] = field(default_factory=dict)
    goals: dict[str, bool | None] = field(default_factory=dict)
    misses: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def bench_model(mid: str, work: Path, args: argparse.Namespace) -> Result:
    result = Result(mid, conv=mid in CONV_MODELS)
    src = source(mid, work)
    result.origin = src.origin
    result.inputs = ", ".join(
        f"{k}={'x'.join(map(str, v.shape))} {v.dtype}" for k, v in src.feeds.items()
    )
    print(f"\n== {mid} ({src.origin}): {result.inputs}", flush=True)
    folder = work / "tflite" / mid

    if args.onnx2tf is None:
        result.made["onnx2tf"] = Made("onnx2tf", error=f"n/a: no onnx2tf: bash {PEER_SCRIPT}")
    else:
        result.made["onnx2tf"] = run_onnx2tf(
            args.onnx2tf, src.path, folder / "onnx2tf", src.feeds, args
        )
    if args.export is None:
        result.made["ferry"] = Made("ferry", error=args.ferry_missing)
    else:
        result.made["ferry"] = run_ferry(args.export, src.path, folder, src.feeds, args)
    for made in result.made.values():
        if made.error is None:
            try:
                inspect_tflite(made)
            except Exception as e:
                made.error = f"unreadable: {short(e)}"
        state = made.error or f"{made.seconds:.1f} s, {made.transposes} Transposes"
        print(f"   {made.tool}: {state}" + (f" ({made.note})" if made.note else ""), flush=True)

    # The reference: ONNX Runtime on every sample.
    ort = ort_runner(src.path, src.feeds, args.threads)
    twin = ort_runner(src.path, src.feeds, args.threads)
    samples = []
    for i in range(args.samples):
        feeds = src.feeds if i == 0 else kit_models.feeds(mid, i)
        if {k: v.shape for k, v in feeds.items()} != {k: v.shape for k, v in src.feeds.items()}:
            continue  # a .tflite has the shapes it was made for
        samples.append((feeds, ort.outputs(feeds)))
    runners: dict[str, Runner] = {"ORT": ort, "twin": twin}
    for tool, made in result.made.items():
        if made.error is not None:
            continue
        try:
            runner = litert_runner(Path(made.path), src.feeds, samples[0][1], args.threads, made)
            made.accuracy = accuracy(mid, src.judge, runner, samples)
            runners[tool] = runner
        except Exception as e:
            made.run_error = short(e)
            print(f"   {tool}: LiteRT: {made.run_error}", flush=True)

    # The block's length from ONNX Runtime's speed.
    ort.call()
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < 0.05:
        ort.call()
        calls += 1
    block = max(1, min(2000, round(args.block_s / ((time.perf_counter() - start) / calls))))
    t = alternate({k: r.call for k, r in runners.items()}, args.rounds, block)
    result.ort_ms = t["ORT"] * 1000
    result.twin_ms = t["twin"] * 1000
    for tool, made in result.made.items():
        if tool in t:
            made.ms = t[tool] * 1000
    judge_goals(result)
    print("   " + row(result), flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Goals


def usable(made: Made) -> bool:
    """Made, ran, and right by the kit's judge: a file one could ship."""
    return made.ms is not None and made.accuracy is not None and made.accuracy.passed


def judge_goals(result: Result) -> None:
    """Per model: each goal True, False (with why in ``misses``) or None (not scored: ferry's
    exporter absent, onnx2tf's environment absent, not a conv net)."""
    me, peer = result.made["ferry"], result.made["onnx2tf"]
    g, miss = result.goals, result.misses
    if me.error is not None and me.error.startswith(FERRY_NA):
        g.update(dict.fromkeys(("peer", "ort", "transposes", "accuracy")))
        return
    no_peer = peer.error is not None and peer.error.startswith("n/a")
    scored = ["accuracy"] + ([] if no_peer else ["peer", "transposes"])
    scored += ["ort"] if result.conv else []
    g.update(dict.fromkeys(("peer", "ort", "transposes", "accuracy")))
    if me.error is not None or me.run_error is not None:
        # The error itself is in the notes.
        why = "ferry could not convert" if me.error is not None else "ferry's did not run"
        for k in scored:
            g[k], miss[k] = False, why
        return
    acc = me.accuracy
    g["accuracy"] = acc is not None and acc.passed
    if not g["accuracy"]:
        miss["accuracy"] = (acc.detail if acc else "not judged")[:120]
    if "peer" in scored:
        # Speed against onnx2tf: a peer file that did not run or is wrong is no rival.
        if usable(peer):
            assert me.ms is not None and peer.ms is not None
            ratio = me.ms / peer.ms
            g["peer"] = ratio <= NOISE and bool(g["accuracy"])
            if ratio > NOISE:
                miss["peer"] = f"{ratio:.2f}x"
            elif not g["accuracy"]:
                miss["peer"] = "ferry's is inaccurate"
        else:
            g["peer"] = bool(g["accuracy"])
            if not g["peer"]:
                miss["peer"] = "neither is usable"
    if "ort" in scored:
        assert me.ms is not None and result.ort_ms is not None
        ratio = me.ms / result.ort_ms
        g["ort"] = ratio <= NOISE
        if ratio > NOISE:
            miss["ort"] = f"{ratio:.2f}x ORT"
    if "transposes" in scored:
        assert me.transposes is not None
        if peer.transposes is None:  # onnx2tf made no file: ferry's counts as fewer
            g["transposes"] = True
        else:
            g["transposes"] = me.transposes == 0 or me.transposes < peer.transposes
            if not g["transposes"]:
                miss["transposes"] = f"{me.transposes} vs {peer.transposes}"


GOALS = [
    ("peer", f"ferry no slower than onnx2tf's (within {NOISE - 1:.0%})"),
    ("ort", f"ferry no slower than ONNX Runtime on conv nets (within {NOISE - 1:.0%})"),
    ("transposes", "fewer Transposes than onnx2tf's (or none)"),
    ("accuracy", "ferry's .tflite right by the kit's judge"),
]


# ---------------------------------------------------------------------------------------------
# Output


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


#: Characters of an error shown in a cell (the notes have the whole first line).
CELL_ERROR = 90


def ms_cell(made: Made, ort_ms: float | None) -> str:
    def clip(text: str) -> str:
        text = text.replace("|", "/")  # a table cell
        return text if len(text) <= CELL_ERROR else text[: CELL_ERROR - 3] + "..."

    if made.error is not None:
        return "n/a" if made.error.startswith("n/a") else f"failed: {clip(made.error)}"
    if made.ms is None:
        return f"LiteRT failed: {clip(made.run_error or '?')}"
    x = f" ({made.ms / ort_ms:.2f}x)" if ort_ms else ""
    return f"{made.ms:.2f}{x}"


def tool_cell(made: Made, text: Callable[[Made], str]) -> str:
    if made.error is not None:
        return "n/a" if made.error.startswith("n/a") else "-"
    return text(made)


def acc_cell(made: Made) -> str:
    if made.error is not None:
        return "n/a" if made.error.startswith("n/a") else "-"
    if made.accuracy is None:
        return "err"
    return made.accuracy.cell()


HEADER = (
    "| model | ORT ms | onnx2tf ms (x ORT) | ferry ms (x ORT) | ferry / onnx2tf | Transposes "
    "onnx2tf / ferry | accuracy onnx2tf / ferry | convert s onnx2tf / ferry | size onnx2tf / "
    "ferry | noise |\n|---|---:|---:|---:|---:|---|---|---|---|---:|"
)


def row(r: Result) -> str:
    if r.error is not None:
        return f"| {r.model} | error: {r.error} |" + " |" * 8
    peer, me = r.made["onnx2tf"], r.made["ferry"]
    ratio = f"{me.ms / peer.ms:.2f}" if me.ms and peer.ms else "-"
    if r.goals.get("peer") is False and me.ms and peer.ms:
        ratio = f"**{ratio}**"
    trans = [tool_cell(m, lambda m: f"{m.transposes}{'†' if m.moved else ''}") for m in (peer, me)]
    if r.goals.get("transposes") is False and me.transposes is not None:
        trans[1] = f"**{trans[1]}**"
    secs = [
        tool_cell(m, lambda m: f"{m.seconds or 0:.{2 if (m.seconds or 0) < 1 else 1}f}")
        for m in (peer, me)
    ]
    sizes = [tool_cell(m, lambda m: fmt_size(m.bytes)) for m in (peer, me)]
    noise = f"{r.twin_ms / r.ort_ms:.2f}" if r.ort_ms and r.twin_ms else "-"
    ort = f"{r.ort_ms:.2f}" if r.ort_ms is not None else "-"
    name = r.model + ("" if r.conv else "*")
    return (
        f"| {name} | {ort} | {ms_cell(peer, r.ort_ms)} | {ms_cell(me, r.ort_ms)} | {ratio} "
        f"| {' / '.join(trans)} | {acc_cell(peer)} / {acc_cell(me)} | {' / '.join(secs)} "
        f"| {' / '.join(sizes)} | {noise} |"
    )


def summary(results: list[Result]) -> list[str]:
    lines = []
    for key, text in GOALS:
        scored = [r for r in results if r.error is None and r.goals.get(key) is not None]
        if not scored:
            lines.append(f"goal: {text}: n/a")
            continue
        passed = [r for r in scored if r.goals[key]]
        line = f"goal: {text}: {len(passed)}/{len(scored)}"
        missed = [f"{r.model} ({r.misses.get(key, '?')})" for r in scored if not r.goals[key]]
        if missed:
            line += "; missed on " + ", ".join(missed)
        lines.append(line)
    if any(
        r.made.get("ferry") and (r.made["ferry"].error or "").startswith(FERRY_NA) for r in results
    ):
        lines.append(f"FERRY NOT MEASURED: {FERRY_NA}")
    if any(
        r.made.get("onnx2tf") and (r.made["onnx2tf"].error or "").startswith("n/a") for r in results
    ):
        lines.append(f"ONNX2TF NOT MEASURED (no onnx2tf environment: bash {PEER_SCRIPT})")
    peer_failed = [
        r.model
        for r in results
        if r.error is None
        and not usable(r.made["onnx2tf"])
        and not (r.made["onnx2tf"].error or "").startswith("n/a")
    ]
    if peer_failed:
        lines.append(
            f"onnx2tf gave no usable .tflite for: {', '.join(peer_failed)} (see the notes)"
        )
    for tool in TOOLS:
        ran = [r for r in results if r.error is None and r.made[tool].error is None]
        rewrote = [r.model for r in ran if r.made[tool].rewrote_input]
        if rewrote:
            where = "a copy here" if tool == "onnx2tf" else "the user's file"
            lines.append(
                f"{tool} rewrote the ONNX file it was given ({where}) on {len(rewrote)}/{len(ran)}"
                f" models: {', '.join(rewrote)}"
            )
    xs = [(r.twin_ms / r.ort_ms, r.model) for r in results if r.ort_ms and r.twin_ms]
    if xs:
        lo, hi = min(xs), max(xs)
        typical = statistics.median(abs(x - 1) for x, _ in xs)
        lines.append(
            f"noise: a second ONNX Runtime session timed alongside the first: off by {typical:.0%} "
            f"in the median, {lo[0]:.2f} ({lo[1]}) to {hi[0]:.2f} ({hi[1]}) at worst. Ratios "
            "closer than that to a goal are not settled by this run"
        )
    return lines


def notes(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        if r.error is not None:
            out.append(f"{r.model}: not measured: {r.error}")
            continue
        for made in r.made.values():
            who = f"{r.model} {made.tool}"
            if made.error is not None:
                if not made.error.startswith("n/a"):
                    out.append(f"{who}: could not convert: {made.error}")
                continue
            if made.note:
                out.append(f"{who}: {made.note}")
            if made.run_error:
                out.append(f"{who}: LiteRT: {made.run_error}")
            if made.layout:
                out.append(f"{who}: {'; '.join(made.layout)}")
            if made.accuracy is not None and not made.accuracy.passed:
                out.append(f"{who}: accuracy FAILED: {made.accuracy.detail[:200]}")
        pieces = {t: m.partitions for t, m in r.made.items() if m.partitions is not None}
        if pieces.get("ferry", 1) > 1:
            # Operators XNNPACK does not take split the graph; they run on LiteRT's own kernels.
            out.append(
                f"{r.model}: XNNPACK took the .tflite in "
                + ", ".join(f"{n} piece{'s' if n > 1 else ''} ({t})" for t, n in pieces.items())
            )
    return out


def peer_version(exe: Path) -> tuple[str | None, str]:
    """onnx2tf's version in its environment, or None and why not."""
    python = exe.parent / "python"
    if not exe.exists() or not python.exists():
        return None, f"no onnx2tf at {exe}"
    code = "from importlib.metadata import version as v; print(v('onnx2tf'), v('onnx'), v('onnxruntime'))"
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{python} does not run: {e}"
    if done.returncode != 0:
        return None, f"{python} lacks onnx2tf: {last_line(done.stderr)}"
    onnx2tf_v, onnx_v, ort_v = done.stdout.split()
    return f"onnx2tf {onnx2tf_v} (its onnx {onnx_v}, onnxruntime {ort_v})", ""


def pkg(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    every = [m for m in kit_models.ids() if kit_models.entry(m)["format"] != "tflite"]
    parser.add_argument("--models", default=None, help=f"kit ids (default: {','.join(MODELS)})")
    parser.add_argument(
        "--quick", action="store_true", help=f"{','.join(QUICK_MODELS)}, fewer and shorter blocks"
    )
    parser.add_argument("--nhwc", action="store_true", help="channels-last I/O for both tools")
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help=f"kit inputs judged (default {SAMPLES}, {QUICK_SAMPLES} quick)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"default {ROUNDS} ({QUICK_ROUNDS} quick)"
    )
    parser.add_argument(
        "--block-s", type=float, default=None, help=f"default {BLOCK_S} s ({QUICK_BLOCK_S} quick)"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument(
        "--onnx2tf",
        type=Path,
        default=None,
        help="onnx2tf's command (default: .venv-onnx2tf/bin/onnx2tf)",
    )
    parser.add_argument(
        "--onnx2tf-backend",
        choices=["auto", "flatbuffer_direct", "tf_converter"],
        default="auto",
        help="auto: its default backend, then tf_converter where that fails",
    )
    parser.add_argument(
        "--ferry-verify",
        action="store_true",
        help="let ferry verify its file in LiteRT (counts in its seconds)",
    )
    parser.add_argument(
        "--work", type=Path, default=None, help="keep converted models and .tflite files here"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = parser.parse_args(argv)

    models = [
        m for m in (args.models or ",".join(QUICK_MODELS if args.quick else MODELS)).split(",") if m
    ]
    unknown = [m for m in models if m not in every]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(every)})")
    if not kit_models.kit_ready():
        parser.error(f"the kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh")
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    args.block_s = args.block_s or (QUICK_BLOCK_S if args.quick else BLOCK_S)
    args.samples = max(1, args.samples or (QUICK_SAMPLES if args.quick else SAMPLES))
    paddle = ROOT / ".venv-paddle" / "bin" / "python"
    if "FERRY_PADDLE_PYTHON" not in os.environ and paddle.exists():
        os.environ["FERRY_PADDLE_PYTHON"] = str(paddle)

    described, info = machine()
    args.threads = args.threads or info["usable_cores"]
    load_before = os.getloadavg()
    started = time.perf_counter()
    print(described)
    layout = "channels-last I/O (--nhwc)" if args.nhwc else "the ONNX model's I/O shapes kept"
    print(
        f"ONNX Runtime {pkg('onnxruntime')} CPU: default session options, {args.threads} intra-op "
        f"threads; LiteRT {pkg('ai-edge-litert')}: default XNNPACK delegate, {args.threads} "
        f"threads; fp32, batch 1, {layout}; {args.rounds} rounds x blocks of ~{args.block_s} s; "
        f"{args.samples} kit sample(s) judged; load average {load_average()}"
    )
    if load_before[0] > 0.5 * info["usable_cores"]:
        print(
            f"WARNING: load average {load_before[0]:.2f} on {info['usable_cores']} cores: something "
            "else is running; the latencies below are noisy"
        )
    exe = (args.onnx2tf or PEER_VENV / "bin" / "onnx2tf").absolute()
    peer, why = peer_version(exe)
    args.onnx2tf = exe if peer else None
    if peer is None:
        print(
            f"ONNX2TF NOT MEASURED: {why}. Make its environment with: bash {PEER_SCRIPT} (or pass --onnx2tf PATH)"
        )
    else:
        flags = "-n -ois (kit shapes)" + ("" if args.nhwc else " -kat (every input)")
        print(f"peer: {peer}: {exe} {flags}, backend {args.onnx2tf_backend}")
    args.export, args.ferry_missing = ferry_exporter()
    if args.export is None:
        print(f"FERRY NOT MEASURED: {args.ferry_missing}")
    else:
        print(
            f"ferry: ferry.mobile.export_tflite(model, out, precision='fp32', nhwc_io={args.nhwc}, "
            f"verify={args.ferry_verify})"
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

    print(
        "\nms: LiteRT's median per call, (x ORT): relative to ONNX Runtime on the ONNX model (lower "
        "is faster); ferry / onnx2tf < 1: ferry's faster; accuracy: the kit's judge against ONNX "
        "Runtime on every sample, and the largest absolute difference; †: inputs or outputs in "
        "another layout than the ONNX model's (see the notes), the Transposes to restore it are not "
        "in the file; convert s: onnx2tf's subprocess, ferry's call; *: not a conv net; bold: a "
        "goal missed"
    )
    print(HEADER)
    for r in results:
        print(row(r))
    print()
    for line in summary(results):
        print(line)
    extra = notes(results)
    if extra:
        print("\nnotes:")
        for line in extra:
            print(f"  {line}")
    elapsed = time.perf_counter() - started
    print(
        f"\nmachine: {described}; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {load_average()}; {elapsed:.0f} s"
    )
    if args.json is not None:
        doc = {
            "machine": info,
            "settings": {
                "rounds": args.rounds,
                "block_s": args.block_s,
                "threads": args.threads,
                "samples": args.samples,
                "nhwc": args.nhwc,
                "onnx2tf": peer,
                "onnx2tf_backend": args.onnx2tf_backend,
                "ferry_verify": args.ferry_verify,
                "litert": pkg("ai-edge-litert"),
                "onnxruntime": pkg("onnxruntime"),
            },
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "seconds": elapsed,
            "results": [asdict(r) for r in results],
            "goals": summary(results),
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
