"""ferry's int8 quantization against ONNX Runtime's quantize_static and NNCF on the kit's vision and
OCR models.

One process, one run, one set of samples. For each model (the kit's ONNX file, or the kit's other
models converted once with ``ferry.convert``, Paddle through ``FERRY_PADDLE_PYTHON``), the kit's
realistic inputs (``tests/real/kit/inputs.py``: rendered pages and text lines, photographs, a face)
are split into calibration samples, given to every quantizer alike, and held-back samples no
quantizer sees, on which each variant is judged. The variants:

* ``fp32``: the model as it is;
* ``ort-static``: ONNX Runtime's documented usage with its defaults:
  ``onnxruntime.quantization.shape_inference.quant_pre_process(fp32, pre)`` (the pre-processing
  step the ONNX Runtime quantization docs ask for: symbolic shape inference, ORT's graph
  optimizations, ONNX shape inference), then ``quantize_static(pre, out, reader)`` with every other
  argument at its default (QDQ, int8 activations and weights, per-tensor, MinMax);
* ``nncf``: ``nncf.quantize(onnx.load(fp32), nncf.Dataset(samples))`` with its defaults (mixed
  preset, per-channel weights, bias correction), in its own environment
  (``scripts/quantize-peers-env.sh`` makes ``.venv-quantpeers``), one subprocess per model;
* ``ferry-ort`` / ``ferry-ov``: ``ferry.quantize(fp32, data=samples, target="onnxruntime")`` and
  ``target="openvino"``, otherwise defaults; each engine runs the model ferry made for it. When
  ferry refuses its own result it hands back the float model, and that is what is measured.

Measured per variant:

* accuracy: the variant's outputs against the float model's in the same engine on every held-back
  sample, judged at the task by the kit's judge (``ferry.parity.judge``: argmax agreement over the
  sequence for the CTC recognizers, the pixel mask's agreement for the text detector, cosine for
  the detectors' raw maps, top-1 for the classifiers); the judge's score averaged over the samples
  (the least over a model's judged outputs), and whether every sample passed the kit's threshold;
* latency: ONNX Runtime CPU with its default session options (intra-op threads = the usable
  cores) and OpenVINO CPU (``compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})``:
  the float model in f32, not bf16; quantized layers run int8 kernels whatever the hint), batch 1,
  on a held-back sample. Per engine the variants are timed in alternating blocks of calls (about
  0.3 s each, each led by a few untimed calls), median per call, printed as speedup over the
  float model (fp32 ms / variant ms). A second session of the float model is timed with them
  ("noise": 1.00 on a quiet machine);
* size: the file's bytes.

Goals (issue 15, quantization), printed, never asserted:

* ferry never less accurate than either peer (per engine, on the held-back samples; a peer that
  could not quantize the model is no rival);
* on the conv models (CONV_MODELS), ferry's int8 at least 1.5x faster than fp32 on the engine where
  it is fastest;
* never a slower model handed back: ferry's result no slower than fp32 on its engine (within 3%,
  this machine's noise);
* the CTC recognizer ppocr_rec_paddle: argmax agreement >= 98%.

    bash scripts/quantize-peers-env.sh     # once: .venv-quantpeers with NNCF
    python benchmarks/quantize.py [--quick] [--models a,b] [--calibration 8] [--held 8]
                                  [--work DIR] [--json OUT] [--rounds 5] [--block-s 0.3]
                                  [--threads N] [--peers PYTHON] [--no-openvino]

Without the peers' environment NNCF's columns say n/a and the script says how to make it.

The whole run takes about 15 minutes on 2 cores (``--quick``: three models, 4 + 4 samples, shorter
blocks). Run it on a quiet machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import logging
import os
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


def _sibling(name: str) -> Any:
    """A module of this folder (benchmarks/ is no package): optimizer.py's timing and engines."""
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

#: The kit's models with image inputs and float weights (the int8 ones are quantized already).
MODELS = [
    "ppocr_det_paddle",
    "ppocr_rec_paddle",
    "ppocr_cls_paddle",
    "orientation",
    "open_nsfw",
    "captcha_det",
    "captcha_ocr",
    "layout",
    "table",
    "emotion_keras",
    "mtcnn_torch",
]
QUICK_MODELS = ["ppocr_rec_paddle", "ppocr_cls_paddle", "orientation"]
#: Convolutional networks, held to the speedup goal. Not: ppocr_rec (SVTR: attention blocks and a
#: CTC head), captcha_ocr (an LSTM), table (SLANet: an attention decoder run step by step).
CONV_MODELS = {
    "ppocr_det_paddle",
    "ppocr_cls_paddle",
    "orientation",
    "open_nsfw",
    "captcha_det",
    "layout",
    "emotion_keras",
    "mtcnn_torch",
}
#: Goal: the least argmax agreement of the CTC recognizer.
CTC_MODEL, CTC_LEAST = "ppocr_rec_paddle", 0.98
#: Goal: the least speedup over fp32 of ferry's int8 on the conv models (on its best engine).
SPEEDUP = 1.5
#: Latency within this factor of fp32's counts as no slower (this machine's noise).
NOISE = 1.03
#: A score this much under a peer's still counts as equal (cosines differ in the 5th digit).
SCORE_TOL = 1e-4
CALIBRATION, HELD = 8, 8
QUICK_CALIBRATION, QUICK_HELD = 4, 4
BLOCK_S, QUICK_BLOCK_S = 0.3, 0.1
ROUNDS, QUICK_ROUNDS = 5, 3
PEER_TIMEOUT_S = 600
PEERS_VENV = ROOT / ".venv-quantpeers"
PEERS_SCRIPT = "scripts/quantize-peers-env.sh"

QUANTIZERS = ["ort-static", "nncf", "ferry-ort", "ferry-ov"]
#: What each engine runs: the float model twice (the second: noise), the peers, ferry's for it.
ENGINES = {
    "ort": ["fp32", "twin", "ort-static", "nncf", "ferry-ort"],
    "ov": ["fp32", "twin", "ort-static", "nncf", "ferry-ov"],
}
FERRY = {"ort": "ferry-ort", "ov": "ferry-ov"}
PEERS = ["ort-static", "nncf"]

# Runs in the peers' environment: ``python -c NNCF_WORKER SRC DST SAMPLES.npz``; prints one line
# ``@@result {json}`` last. Loading the model counts in the time, as it does for the others.
NNCF_WORKER = r"""
import json, sys, time
src, dst, npz = sys.argv[1:4]
import numpy as np
import onnx
import nncf
with np.load(npz) as z:
    names = json.loads(str(z["__names__"]))
    count = int(z["__count__"])
    samples = [{n: z[f"s{i}_{j}"] for j, n in enumerate(names)} for i in range(count)]
start = time.perf_counter()
model = onnx.load(src)
out = nncf.quantize(model, nncf.Dataset(samples))
seconds = time.perf_counter() - start
onnx.save(out, dst, save_as_external_data=out.ByteSize() > 1_900_000_000)
print("@@result " + json.dumps({"seconds": seconds}))
"""

PEER_VERSIONS = r"""
import json
from importlib.metadata import version
import nncf, onnx, onnxruntime
print(json.dumps({k: version(k) for k in ("nncf", "onnx", "onnxruntime")}))
"""


# ---------------------------------------------------------------------------------------------
# The samples


def recipe_period(mid: str) -> int | None:
    """How many distinct samples the kit's recipes give the model (None: as many as asked)."""
    periods = []
    for spec in kit_models.entry(mid)["inputs"]:
        fn, args = spec["recipe"]["fn"], spec["recipe"].get("args", {})
        if fn in ("photo", "face"):  # four photographs; four crops of the face
            periods.append(4)
        elif fn == "text_line":
            periods.append(6 if args.get("captcha") else 8)  # the kit's codes; its phrases
        elif fn not in ("text_page", "scene_text"):  # seeded by the index: unbounded
            periods.append(1)
    return min(periods) if periods else None


def render(
    mid: str, index: int, *, text: str | None = None, mirror: bool = False
) -> dict[str, np.ndarray]:
    """The kit's recipe for the model's inputs (as ``kit_models.feeds``), with other text for a
    text line, or mirrored left to right."""
    if text is None and not mirror:
        return kit_models.feeds(mid, index=index)
    recipes = kit_models._inputs._RECIPES
    out = {}
    for spec in kit_models.entry(mid)["inputs"]:
        fn = recipes[spec["recipe"]["fn"]]
        kwargs = dict(spec["recipe"].get("args", {}))
        kwargs["index"] = index
        params = inspect.signature(fn).parameters
        if text is not None and "text" in params:
            kwargs["text"] = text
        if "kit_dir" in params:
            kwargs["kit_dir"] = kit_models.KIT_DIR
        array = np.asarray(fn(**kwargs))
        if mirror:
            array = np.flip(array, axis=-2 if kwargs.get("layout") == "NHWC" else -1)
        array = array.reshape(spec["shape"]).astype(spec["dtype"], copy=False)
        out[spec["name"]] = np.ascontiguousarray(array)
    return out


def extra_texts(captcha: bool, count: int) -> list[str]:
    """Text-line texts beyond the kit's own: short letter-digit codes like the kit's captchas, or
    four-word pieces of the kit's sentences."""
    inputs = kit_models._inputs
    if captcha:
        rng = np.random.default_rng(15)
        alphabet = "abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
        return ["".join(rng.choice(list(alphabet), 5)) for _ in range(count)]
    words = [w for s in inputs._SENTENCES for w in s.rstrip(".").split()]
    pieces = [" ".join(words[i : i + 4]) for i in range(0, len(words) - 3, 4)]
    return (pieces * (count // max(1, len(pieces)) + 1))[:count]


def samples(mid: str, n_cal: int, n_held: int) -> tuple[list[dict], list[dict], str]:
    """(calibration samples, held-back samples, how they were made). No sample, and for the
    photographs no photograph, is in both."""
    period = recipe_period(mid)
    if period is None:  # pages, scenes: each index its own
        cal = [render(mid, i) for i in range(n_cal)]
        held = [render(mid, i) for i in range(n_cal, n_cal + n_held)]
        return cal, held, f"kit indices 0-{n_cal - 1} / {n_cal}-{n_cal + n_held - 1}"
    fns = {s["recipe"]["fn"] for s in kit_models.entry(mid)["inputs"]}
    if fns == {"text_line"}:
        # Judged on the kit's own lines; calibrated on other lines the kit's recipe renders.
        captcha = any(
            s["recipe"].get("args", {}).get("captcha") for s in kit_models.entry(mid)["inputs"]
        )
        held = [render(mid, i) for i in range(min(n_held, period))]
        texts = extra_texts(captcha, n_cal + max(0, n_held - period))
        held += [render(mid, 0, text=t) for t in texts[n_cal:]]
        cal = [render(mid, 0, text=t) for t in texts[:n_cal]]
        return (
            cal,
            held,
            f"calibration: {n_cal} other lines; held back: the kit's {len(held)} lines",
        )
    # Four photographs (or face crops), each also mirrored: the first half calibrates.
    half = period // 2
    cal_idx, held_idx = range(half), range(half, period)
    cal = [render(mid, i, mirror=m) for m in (False, True) for i in cal_idx][:n_cal]
    held = [render(mid, i, mirror=m) for m in (False, True) for i in held_idx][:n_held]
    return (
        cal,
        held,
        (
            f"kit images {cal_idx[0]}-{cal_idx[-1]} / {held_idx[0]}-{held_idx[-1]} and their mirror "
            f"images ({len(cal)} / {len(held)}: the recipe has {period})"
        ),
    )


# ---------------------------------------------------------------------------------------------
# The quantizers


def ferry_quantize_fn() -> tuple[Callable[..., Any], str]:
    """``ferry.quantize`` and its name in the header."""
    from ferry.optimizer.quantize import quantize

    return quantize, "ferry.quantize"


class _Reader:
    """ONNX Runtime's calibration data reader over a list of feed dicts (its protocol:
    ``get_next`` until None)."""

    def __init__(self, data: list[dict]) -> None:
        self.it = iter(data)

    def get_next(self) -> dict | None:
        return next(self.it, None)


def ferry_kwargs(mid: str, args: argparse.Namespace) -> dict[str, Any]:
    """ferry's arguments beyond the model, data and target: none by default; with ``--metric kit``
    the kit's judge as ferry's metric (as a user who knows the task would give it)."""
    if args.metric != "kit":
        return {}
    spec = kit_models.entry(mid)["judge"]
    kind = spec["kind"]
    if kind == "mask":
        return {"metric": f"mask@{spec.get('threshold', 0.5)}"}
    return {"metric": {"argmax_seq": "seq"}.get(kind, kind)}


def pre_process(src: Path, dst: Path) -> tuple[Path, str | None]:
    """ONNX Runtime's quantization pre-processing, as its docs give it: ``quant_pre_process`` with
    its defaults; where its symbolic shape inference gives up (the converted Paddle models),
    again without that step (``skip_symbolic_shape=True``, as its help suggests for models that
    are not transformers); where that fails too, the model as it is. (the file, a note)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(dst))
        return dst, None
    except Exception as e:
        first = short(e)[:80]
    try:
        quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)
        return dst, f"quant_pre_process: {first}; done with skip_symbolic_shape=True"
    except Exception as e:
        return src, f"quant_pre_process failed ({first}; {short(e)[:80]}): quantized without it"


def ort_static(src: Path, dst: Path, data: list[dict]) -> str | None:
    """ONNX Runtime's documented usage, defaults: pre-process, then quantize_static. A note when
    pre-processing needed a second try or was left out."""
    from onnxruntime.quantization import quantize_static

    pre, note = pre_process(src, dst.with_suffix(".pre.onnx"))
    try:
        quantize_static(str(pre), str(dst), _Reader(data))
    finally:
        if pre != src:
            pre.unlink(missing_ok=True)
    return note


def peer_versions(python: Path) -> tuple[dict[str, str] | None, str]:
    """NNCF's version in its environment, or None and why not."""
    if not python.exists():
        return None, f"no peer environment at {python}"
    try:
        done = subprocess.run(
            [str(python), "-c", PEER_VERSIONS], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{python} does not run: {e}"
    if done.returncode != 0:
        return None, f"{python} lacks nncf: {last_line(done.stderr)}"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def run_nncf(python: Path, src: Path, dst: Path, data: list[dict]) -> float:
    """NNCF in its environment on ``src`` into ``dst``; its seconds."""
    npz = dst.with_suffix(".samples.npz")
    names = list(data[0])
    arrays = {f"s{i}_{j}": feed[n] for i, feed in enumerate(data) for j, n in enumerate(names)}
    np.savez(npz, __names__=np.array(json.dumps(names)), __count__=np.array(len(data)), **arrays)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    cmd = [str(python), "-c", NNCF_WORKER, str(src), str(dst), str(npz)]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S, env=env, cwd=dst.parent
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {PEER_TIMEOUT_S} s") from None
    finally:
        npz.unlink(missing_ok=True)
    results = [ln for ln in done.stdout.splitlines() if ln.startswith("@@result ")]
    if done.returncode != 0 or not results:
        why = last_line(done.stderr) or last_line(done.stdout) or f"exit status {done.returncode}"
        if done.returncode < 0:
            why = f"killed by signal {-done.returncode}; {why}"
        raise RuntimeError(why)
    return float(json.loads(results[-1][len("@@result ") :])["seconds"])


# ---------------------------------------------------------------------------------------------
# One model


@dataclass
class Accuracy:
    score: float  # the judge's score, averaged over the held-back samples
    passed: int  # samples that passed the kit's threshold
    samples: int
    metric: str
    threshold: float
    detail: str = ""  # the worst sample's verdict

    @property
    def ok(self) -> bool:
        return self.passed == self.samples

    def cell(self) -> str:
        return f"{self.score:.4f}" + ("" if self.ok else "!")


@dataclass
class Variant:
    name: str
    path: str = ""
    bytes: int | None = None
    quantize_s: float | None = None
    error: str | None = None  # could not be made
    note: str | None = None  # made, with a remark
    refused: str | None = None  # ferry refused its result and handed back the float model
    report: dict[str, Any] | None = None  # ferry's QuantizeReport
    ort_ms: float | None = None
    ort_error: str | None = None
    ort_acc: Accuracy | None = None
    ov_ms: float | None = None
    ov_error: str | None = None
    ov_acc: Accuracy | None = None


@dataclass
class Result:
    model: str
    origin: str = ""
    inputs: str = ""
    samples: str = ""
    variants: dict[str, Variant] = field(default_factory=dict)
    ov_ran: str = ""
    ov_on: bool = True
    goals: dict[str, bool | None] = field(default_factory=dict)
    misses: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def source(mid: str, work: Path) -> tuple[Path, str]:
    """The model as an ONNX file; converted models are kept in ``work`` (reused when there)."""
    entry = kit_models.entry(mid)
    if entry["format"] == "onnx":
        return kit_models.path(mid), "onnx"
    out = work / f"{mid}.onnx"
    if out.is_file():
        return out, f"{entry['format']}, converted earlier"
    start = time.perf_counter()
    kit_models.convert(mid, out)
    return out, f"{entry['format']}, converted in {time.perf_counter() - start:.0f} s"


def file_bytes(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    size = path.stat().st_size
    locations = {
        e.value
        for t in proto.graph.initializer
        for e in t.external_data
        if e.key == "location" and t.data_location == onnx.TensorProto.EXTERNAL
    }
    return size + sum((path.parent / loc).stat().st_size for loc in locations)


def make_variants(
    mid: str, src: Path, folder: Path, cal: list[dict], args: argparse.Namespace
) -> dict[str, Variant]:
    variants = {"fp32": Variant("fp32", str(src)), "twin": Variant("twin", str(src))}
    for name in QUANTIZERS:
        v = Variant(name, str(folder / f"{name}.onnx"))
        variants[name] = v
        out = Path(v.path)
        out.unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            if name == "ort-static":
                v.note = ort_static(src, out, cal)
                v.quantize_s = time.perf_counter() - start
            elif name == "nncf":
                if args.peers_python is None:
                    v.error = f"n/a: no NNCF environment (bash {PEERS_SCRIPT})"
                    continue
                v.quantize_s = run_nncf(args.peers_python, src, out, cal)
            else:
                from ferry.graph import save_model

                target = "onnxruntime" if name == "ferry-ort" else "openvino"
                result = args.ferry_quantize(
                    str(src), data=cal, target=target, **ferry_kwargs(mid, args)
                )
                v.quantize_s = time.perf_counter() - start
                report = result.report
                v.report = report.to_dict() if hasattr(report, "to_dict") else None
                v.refused = getattr(report, "refused", None)
                save_model(result.model, out)
        except Exception as e:  # one tool's failure is a cell in the table, not the end of the run
            if args.verbose:
                traceback.print_exc()
            v.error = short(e)
            continue
        print(
            f"   {name}: made in {v.quantize_s:.1f} s" + (f" ({v.note})" if v.note else ""),
            flush=True,
        )
    for v in variants.values():
        if v.error is None:
            try:
                v.bytes = file_bytes(Path(v.path))
            except Exception as e:
                v.error = f"unreadable: {short(e)}"
    return variants


def accuracy(mid: str, got: list[dict], want: list[dict]) -> Accuracy:
    """The kit's judge on each held-back sample: the mean score, and how many passed."""
    from ferry.parity import judge

    spec = dict(kit_models.entry(mid)["judge"])
    scores, passed, worst, threshold = [], 0, None, float("nan")
    for g, w in zip(got, want, strict=True):
        if set(g) != set(w):
            g = dict(zip(w, g.values(), strict=True))  # renamed: in the float model's order
        s = dict(spec)
        if s.get("output") is not None and s["output"] not in w:  # a converter renamed it
            names = [o["name"] for o in kit_models.entry(mid)["outputs"]]
            s["output"] = list(w)[names.index(s["output"])]
        verdicts = judge(s)(g, w)
        score = min(v.score for v in verdicts)
        threshold = min(v.threshold for v in verdicts)
        scores.append(score)
        passed += all(v.passed for v in verdicts)
        bad = min(verdicts, key=lambda v: v.score)
        if worst is None or score < worst[0]:
            worst = (score, f"{bad.output}: {bad.detail}")
    return Accuracy(
        statistics.fmean(scores),
        passed,
        len(scores),
        spec["kind"],
        threshold,
        worst[1] if worst else "",
    )


def run_engine(
    engine: str,
    mid: str,
    variants: dict[str, Variant],
    held: list[dict],
    args: argparse.Namespace,
    result: Result,
) -> None:
    """Load the engine's variants, judge each on the held-back samples against fp32 in the same
    engine, then time those that ran in one run of alternating blocks."""
    runners: dict[str, Callable[[], object]] = {}
    outs: dict[str, list[dict]] = {}
    for name in ENGINES[engine]:
        v = variants[name]
        if v.error is not None:
            continue
        try:
            loaded = load(engine, Path(v.path), args)
            if engine == "ov":
                result.ov_ran = result.ov_ran or loaded.ran
            if name != "twin":
                outs[name] = [loaded.run(feed) for feed in held]
            runners[name] = loaded.call_for(held[0])
        except Exception as e:
            if args.verbose:
                traceback.print_exc()
            setattr(v, f"{engine}_error", short(e))
            runners.pop(name, None)
    want = outs.get("fp32")
    if want is not None:
        for name, got in outs.items():
            if name != "fp32":
                try:
                    setattr(variants[name], f"{engine}_acc", accuracy(mid, got, want))
                except Exception as e:
                    setattr(variants[name], f"{engine}_error", f"judge: {short(e)}")
    if not runners:
        return
    probe = runners.get("fp32") or next(iter(runners.values()))
    probe()
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < 0.05:
        probe()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    block = max(1, min(2000, round(args.block_s / per_call)))
    t = alternate(runners, args.rounds, block)
    for name, seconds in t.items():
        setattr(variants[name], f"{engine}_ms", seconds * 1000)


@dataclass
class Loaded:
    """One variant loaded in one engine: ``run(feed)`` for its outputs, ``call_for(feed)`` a
    function of no arguments for timing (the inputs bound once, as users would)."""

    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    call_for: Callable[[Mapping[str, np.ndarray]], Callable[[], object]]
    ran: str = ""


def load(engine: str, path: Path, args: argparse.Namespace) -> Loaded:
    """``path`` in ONNX Runtime (default session options, the usable cores) or OpenVINO (CPU,
    f32 hint), as benchmarks/optimizer.py loads it."""
    if engine == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()  # default graph optimizations: what users run
        options.intra_op_num_threads = args.ort_threads
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]

        def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, session.run(None, dict(feed)), strict=True))

        def call_for(feed: Mapping[str, np.ndarray]) -> Callable[[], object]:
            bound = dict(feed)
            return lambda: session.run(None, bound)

        return Loaded(run, call_for)

    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if args.threads:
        config["INFERENCE_NUM_THREADS"] = args.threads
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()
    ports = {name: i for i, port in enumerate(compiled.inputs) for name in port.get_names()}
    out_names = [next(iter(o.get_names()), f"output_{i}") for i, o in enumerate(compiled.outputs)]

    def bind(feed: Mapping[str, np.ndarray]) -> Callable[[], None]:
        missing = [k for k in feed if k not in ports]
        if missing:
            raise RuntimeError(f"OpenVINO's compiled model has no input {missing[0]!r}")
        tensors = [
            (ports[k], ov.Tensor(np.ascontiguousarray(v), shared_memory=True))
            for k, v in feed.items()
        ]

        def call() -> None:
            for i, tensor in tensors:
                request.set_input_tensor(i, tensor)
            request.infer()

        return call

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        bind(feed)()
        return {n: request.get_output_tensor(i).data.copy() for i, n in enumerate(out_names)}

    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = getattr(precision, "get_type_name", lambda: str(precision))()
    ran = f"{name}, {compiled.get_property('INFERENCE_NUM_THREADS')} threads"
    return Loaded(run, bind, ran)


def bench_model(mid: str, work: Path, args: argparse.Namespace) -> Result:
    result = Result(mid)
    src, result.origin = source(mid, work)
    result.ov_on = args.openvino
    cal, held, result.samples = samples(mid, args.calibration, args.held)
    result.inputs = ", ".join(
        f"{k}={'x'.join(map(str, v.shape))} {v.dtype}" for k, v in held[0].items()
    )
    print(f"\n== {mid} ({result.origin}): {result.inputs}; samples: {result.samples}", flush=True)
    folder = work / "quantized" / mid
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    logging.disable(logging.WARNING)  # the quantizers' per-tensor chatter
    # ONNX Runtime's symbolic shape inference, when it gives up, leaves sym_shape_infer_temp.onnx
    # and its external data in the working folder: give it one that goes away.
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="quantize-bench-") as scratch:
        os.chdir(scratch)
        try:
            result.variants = make_variants(mid, src, folder, cal, args)
        finally:
            os.chdir(cwd)
            logging.disable(logging.NOTSET)
    for v in result.variants.values():
        if v.error:
            print(f"   {v.name}: could not be made: {v.error}")
        if v.refused:
            print(
                f"   {v.name}: ferry refused its result (handed back the float model): {v.refused}"
            )
    print(f"   variants made in {time.perf_counter() - start:.0f} s", flush=True)
    for engine in ["ort"] + (["ov"] if args.openvino else []):
        start = time.perf_counter()
        run_engine(engine, mid, result.variants, held, args, result)
        print(f"   {engine} judged and timed in {time.perf_counter() - start:.0f} s", flush=True)
    judge_goals(result)
    print("   " + row(result), flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Goals


def speedup(result: Result, engine: str, name: str) -> float | None:
    base = getattr(result.variants["fp32"], f"{engine}_ms")
    ms = getattr(result.variants[name], f"{engine}_ms")
    return base / ms if base and ms else None


def judge_goals(result: Result) -> None:
    vs = result.variants
    engines = ["ort"] + (["ov"] if result.ov_on else [])
    # Accuracy: per engine, ferry's score against each peer's that ran there.
    ok, misses = True, []
    for engine in engines:
        mine = getattr(vs[FERRY[engine]], f"{engine}_acc")
        for peer in PEERS:
            theirs = getattr(vs[peer], f"{engine}_acc")
            if theirs is None:
                continue
            if mine is None:
                ok = False
                misses.append(f"{FERRY[engine]} not judged in {engine}")
                break
            if mine.score < theirs.score - SCORE_TOL:
                ok = False
                misses.append(f"{engine}: {mine.score:.4f} < {peer} {theirs.score:.4f}")
    result.goals["accuracy"] = ok
    if misses:
        result.misses["accuracy"] = "; ".join(misses)
    # Speed on the conv models: ferry's int8 at least SPEEDUP x fp32 on its best engine.
    if result.model in CONV_MODELS:
        best = [(x, e) for e in engines if (x := speedup(result, e, FERRY[e])) is not None]
        if not best:
            result.goals["speedup"] = False
            result.misses["speedup"] = "ferry's models did not run"
        else:
            x, e = max(best)
            result.goals["speedup"] = x >= SPEEDUP
            if x < SPEEDUP:
                refused = vs[FERRY[e]].refused
                why = " (refused: float model handed back)" if refused else ""
                result.misses["speedup"] = f"best {x:.2f}x on {e}{why}"
    # Never slower: ferry's model on its engine against fp32 there.
    slower = []
    for engine in engines:
        x = speedup(result, engine, FERRY[engine])
        if x is not None and 1 / x > NOISE:
            slower.append(f"{engine} {1 / x:.2f}x fp32's time")
    result.goals["not slower"] = not slower
    if slower:
        result.misses["not slower"] = "; ".join(slower)
    if result.model == CTC_MODEL:
        scores = [
            (a.score, e) for e in engines if (a := getattr(vs[FERRY[e]], f"{e}_acc")) is not None
        ]
        low = [f"{e} {s:.4f}" for s, e in scores if s < CTC_LEAST]
        result.goals["ctc"] = bool(scores) and not low
        if not result.goals["ctc"]:
            result.misses["ctc"] = ", ".join(low) or "not judged"


# ---------------------------------------------------------------------------------------------
# Output


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def header() -> str:
    return (
        "| model | metric | acc ORT ort-static / nncf / ferry | acc OV ort-static / nncf / ferry "
        "| ORT fp32 ms | ORT x ort-static / nncf / ferry | OV fp32 ms | OV x ort-static / nncf / ferry "
        "| size fp32 / ort-static / nncf / ferry-ort / ferry-ov | quantize s ort-static / nncf / "
        "ferry-ort / ferry-ov | noise ORT / OV |\n"
        "|---|---|---|---|---:|---|---:|---|---|---|---|"
    )


def row(result: Result) -> str:
    if result.error is not None:
        return f"| {result.model} | error: {result.error} |" + " |" * 9
    vs = result.variants

    def acc(name: str, engine: str) -> str:
        v = vs[name]
        if v.error is not None:
            return "n/a" if v.error.startswith("n/a") else "-"
        a = getattr(v, f"{engine}_acc")
        if a is None:
            return "err"
        text = a.cell() + ("*" if v.refused else "")
        if name == FERRY[engine] and result.goals.get("accuracy") is False:
            text = f"**{text}**"
        return text

    def ms(engine: str) -> str:
        if engine == "ov" and not result.ov_on:
            return "off"
        base = getattr(vs["fp32"], f"{engine}_ms")
        return "err" if base is None else f"{base:.2f}"

    def x(name: str, engine: str) -> str:
        if engine == "ov" and not result.ov_on:
            return "off"
        v = vs[name]
        if v.error is not None:
            return "n/a" if v.error.startswith("n/a") else "-"
        s = speedup(result, engine, name)
        return "err" if s is None else f"{s:.2f}" + ("*" if v.refused else "")

    def noise(engine: str) -> str:
        n = noise_of(result, engine)
        return "-" if n is None else f"{n:.2f}"

    metric = kit_models.entry(result.model)["judge"]["kind"]
    trio = {e: ["ort-static", "nncf", FERRY[e]] for e in ("ort", "ov")}
    sizes = " / ".join(fmt_size(vs[n].bytes) for n in ["fp32", *QUANTIZERS])
    qs = " / ".join(
        "-" if vs[n].quantize_s is None else f"{vs[n].quantize_s:.0f}" for n in QUANTIZERS
    )
    return (
        f"| {result.model} | {metric} | {' / '.join(acc(n, 'ort') for n in trio['ort'])} "
        f"| {' / '.join(acc(n, 'ov') for n in trio['ov'])} | {ms('ort')} "
        f"| {' / '.join(x(n, 'ort') for n in trio['ort'])} | {ms('ov')} "
        f"| {' / '.join(x(n, 'ov') for n in trio['ov'])} | {sizes} | {qs} | {noise('ort')} / {noise('ov')} |"
    )


def noise_of(result: Result, engine: str) -> float | None:
    a = getattr(result.variants["fp32"], f"{engine}_ms")
    b = getattr(result.variants["twin"], f"{engine}_ms")
    return b / a if a and b else None


def summary(results: list[Result], nncf_missing: bool) -> list[str]:
    goals = [
        ("accuracy", "ferry never less accurate than either peer"),
        ("speedup", f"conv models: ferry's int8 >= {SPEEDUP}x fp32 on its best engine"),
        ("not slower", f"never a slower model handed back (within {NOISE - 1:.0%} noise)"),
        ("ctc", f"{CTC_MODEL} argmax agreement >= {CTC_LEAST:.0%}"),
    ]
    parts, misses = [], []
    for g, text in goals:
        scored = [r for r in results if r.error is None and r.goals.get(g) is not None]
        passed = [r for r in scored if r.goals[g]]
        missed = [f"{r.model} ({r.misses.get(g, '?')})" for r in scored if not r.goals[g]]
        parts.append(f"{text}: {len(passed)}/{len(scored)}" if scored else f"{text}: -")
        if missed:
            misses.append(f"  {g} missed on {', '.join(missed)}")
    lines = ["goals: " + "; ".join(parts), *misses]
    # A refusal hands back fp32: as accurate as fp32 and no slower, so say how often it happened.
    handed = []
    for name in FERRY.values():
        made = [r for r in results if r.error is None and r.variants[name].error is None]
        if made:
            int8 = [r for r in made if not r.variants[name].refused]
            handed.append(f"{name} {len(int8)}/{len(made)}")
    if handed:
        lines.append(
            "ferry handed back a quantized model (not refused) on: "
            + ", ".join(handed)
            + " of the models it quantized; refused ones are fp32 (*), accurate and no faster"
        )
    if nncf_missing:
        lines.append(
            f"NNCF NOT MEASURED (no peer environment: bash {PEERS_SCRIPT}): the accuracy goal above "
            "holds ferry against ONNX Runtime's quantize_static only"
        )
    spread = []
    for engine, label in (("ort", "ORT"), ("ov", "OV")):
        xs = [(n, r.model) for r in results if r.error is None and (n := noise_of(r, engine))]
        if xs:
            lo, hi = min(xs), max(xs)
            typical = statistics.median(abs(n - 1) for n, _ in xs)
            spread.append(
                f"{label} off by {typical:.0%} in the median, {lo[0]:.2f} ({lo[1]}) to {hi[0]:.2f} ({hi[1]}) at worst"
            )
    if spread:
        lines.append(
            "noise: a second session of fp32, timed alongside the first: "
            + "; ".join(spread)
            + ". Speedups closer than that to a goal are not settled by this run"
        )
    return lines


def notes(results: list[Result]) -> list[str]:
    out = []
    for r in results:
        if r.error is not None:
            out.append(f"{r.model}: not measured: {r.error}")
            continue
        if "recipe has" in r.samples:
            out.append(f"{r.model}: samples: {r.samples}")
        for v in r.variants.values():
            if v.name in ("fp32", "twin"):
                if v.ort_error or v.ov_error:
                    out.append(
                        f"{r.model} {v.name}: {v.ort_error or ''} {v.ov_error or ''}".rstrip()
                    )
                continue
            if v.error is not None:
                if not v.error.startswith("n/a"):
                    out.append(f"{r.model} {v.name}: could not be made: {v.error}")
                continue
            if v.note:
                out.append(f"{r.model} {v.name}: {v.note}")
            if v.refused:
                out.append(
                    f"{r.model} {v.name}: ferry refused its result, handed back fp32: {v.refused}"
                )
            for engine, label in (("ort", "ONNX Runtime"), ("ov", "OpenVINO")):
                err = getattr(v, f"{engine}_error")
                if err:
                    out.append(f"{r.model} {v.name}: {label}: {err}")
                a = getattr(v, f"{engine}_acc")
                if a is not None and not a.ok:
                    out.append(
                        f"{r.model} {v.name}: {label}: {a.samples - a.passed}/{a.samples} held-back "
                        f"samples under the kit's {a.metric} threshold {a.threshold}; worst: {a.detail[:140]}"
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=None, help=f"kit ids (default: {','.join(MODELS)})")
    parser.add_argument(
        "--quick", action="store_true", help="three models, fewer samples, shorter blocks"
    )
    parser.add_argument(
        "--calibration", type=int, default=None, help=f"calibration samples (default {CALIBRATION})"
    )
    parser.add_argument(
        "--held", type=int, default=None, help=f"held-back samples (default {HELD})"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"default {ROUNDS} ({QUICK_ROUNDS} quick)"
    )
    parser.add_argument(
        "--block-s", type=float, default=None, help=f"default {BLOCK_S} s ({QUICK_BLOCK_S} quick)"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    parser.add_argument("--peers", type=Path, default=None, help="the Python of NNCF's environment")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false")
    parser.add_argument(
        "--work", type=Path, default=None, help="keep converted and quantized models here"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument(
        "--metric",
        choices=["default", "kit"],
        default="default",
        help="ferry's metric: its default, or the kit's judge (top1, cosine, mask@t, seq)",
    )
    parser.add_argument("--verbose", action="store_true", help="print tracebacks")
    args = parser.parse_args(argv)

    models = [
        m for m in (args.models or ",".join(QUICK_MODELS if args.quick else MODELS)).split(",") if m
    ]
    unknown = [m for m in models if m not in kit_models.ids()]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(kit_models.ids())})")
    if not kit_models.kit_ready():
        parser.error(f"the kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh")
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    args.block_s = args.block_s or (QUICK_BLOCK_S if args.quick else BLOCK_S)
    args.calibration = args.calibration or (QUICK_CALIBRATION if args.quick else CALIBRATION)
    args.held = args.held or (QUICK_HELD if args.quick else HELD)
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
    args.ferry_quantize, ferry_name = ferry_quantize_fn()
    given = "metric=<the kit's judge>, " if args.metric == "kit" else ""
    print(
        f"ferry: {ferry_name}(model, data=calibration, target='onnxruntime' | 'openvino', "
        f"{given}other arguments default)"
    )
    import onnxruntime

    print(
        f"ort-static: onnxruntime {onnxruntime.__version__} quant_pre_process(model) then "
        "quantize_static(model, out, reader), defaults (QDQ, S8S8, per-tensor, MinMax)"
    )
    args.peers_python = None
    peers_python = args.peers or PEERS_VENV / "bin" / "python"
    versions, why = peer_versions(peers_python)
    if versions is None:
        print(
            f"NNCF NOT MEASURED: {why}. Make its environment with: bash {PEERS_SCRIPT} "
            "(or pass --peers PYTHON); its columns say n/a below"
        )
    else:
        args.peers_python = peers_python
        print(
            f"nncf ({peers_python}): nncf {versions['nncf']} (onnx {versions['onnx']}, onnxruntime "
            f"{versions['onnxruntime']}): nncf.quantize(model, nncf.Dataset(calibration)), defaults"
        )
    print(
        f"samples: {args.calibration} for calibration (the same to every quantizer), {args.held} held back for judging"
    )

    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()  # absolute: the quantizers run elsewhere
        work.mkdir(parents=True, exist_ok=True)
        for mid in models:
            try:
                results.append(bench_model(mid, work, args))
            except Exception as e:  # one model's failure must not end the run
                traceback.print_exc()
                print(f"{mid}: ERROR {short(e)}", flush=True)
                results.append(Result(mid, error=short(e)))

    print(
        "\nacc: the kit's judge of each variant against fp32 in the same engine on the held-back "
        "samples, its score averaged over them (!: some sample under the kit's threshold; bold: "
        "ferry under a peer); x: speedup over fp32 in that engine (fp32 ms / variant ms, higher is "
        "faster); ferry: ferry-ort in ORT, ferry-ov in OV; *: ferry refused its result and handed "
        "back fp32; n/a: the peer's environment is missing"
    )
    print(header())
    for r in results:
        print(row(r))
    print()
    nncf_missing = args.peers_python is None
    for line in summary(results, nncf_missing):
        print(line)
    extra = notes(results)
    if extra:
        print("\nnotes:")
        for line in extra:
            print(f"  {line}")
    ov_ran = sorted({r.ov_ran for r in results if r.ov_ran})
    elapsed = time.perf_counter() - started
    print(
        f"\nmachine: {described}; OpenVINO ran {', '.join(ov_ran) or '-'}; load average before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after {load_average()}; {elapsed:.0f} s"
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
                "calibration": args.calibration,
                "held": args.held,
                "ferry": ferry_name,
                "ferry_metric": args.metric,
                "nncf": versions,
            },
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "seconds": elapsed,
            "results": [asdict(r) for r in results],
            "goals": summary(results, nncf_missing),
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
