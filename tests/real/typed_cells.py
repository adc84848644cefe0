"""Every verb as a new user types it, on one kit model: the cells of the as-typed matrix.

Each verb runs as its ``--help`` example shows, as a ``ferry`` subprocess, with no ``--shape``,
``--input`` or ``--metric`` (issue 31: ferry finds what the user was not asked). A cell passes when
the verb exits 0 and what it wrote answers the task as the kit's judge says (against ONNX Runtime
on the same ONNX file, on the kit's realistic inputs); it is a clean refusal when the verb exits 2
or 3 with one ``error:`` line and no traceback; anything else fails, with the last error line.
``benchmarks/as_typed.py`` runs the whole matrix and writes what fails; ``test_as_typed.py`` is the
same matrix under pytest.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import kit_models

#: The verbs, in the order the matrix runs them (fast ones first).
VERBS = ("run", "serve", "ort-mobile", "optimize", "bench", "web", "tflite", "plan", "quantize")
PASS, REFUSED, FAIL = "pass", "refused", "fail"
#: Seconds a verb may take before its cell fails (on two shared cores).
TIMEOUT_S = 600.0
_FERRY = str(Path(sys.executable).parent / "ferry")
#: What the engines print that a user's terminal should never show.
_NOISE = ("Traceback", "[E:onnxruntime", "onnxruntime_src", "Exception from")


def tensor_models() -> list[str]:
    """The kit models the tensor verbs apply to: every one but the generative (GGUF) ones."""
    return kit_models.tensor_ids()


@dataclass
class Cell:
    """One verb on one model: ``status`` pass / refused / fail, ``detail`` the refusal's line,
    the failure's last error line or the judge's verdict, ``score`` the judge's worst score."""

    model: str
    verb: str
    status: str
    detail: str
    seconds: float
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Kit inputs in ``quantize``'s calibration file (a quarter held back to judge by).
CALIBRATION_SAMPLES = 8


def calibration_file(mid: str, out: Path) -> Path:
    """The kit's inputs as the ``.npz`` ``ferry quantize --data`` reads (one array per input,
    samples along the first axis): the data a user has, unlike sizes and a metric."""
    samples = [kit_models.feeds(mid, i) for i in range(CALIBRATION_SAMPLES)]
    file = out / "calib.npz"
    np.savez(file, **{k: np.concatenate([s[k] for s in samples]) for k in samples[0]})
    return file


def command(verb: str, model: Path, out: Path) -> list[str]:
    """The verb as its ``--help`` example types it (bench: few iterations; quantize with the
    kit's inputs as ``--data``, :func:`calibration_file`), writing into ``out``."""
    m = str(model)
    return {
        "run": ["run", m, "--random", "-o", str(out / "outputs")],
        "optimize": ["optimize", m, "-o", str(out / "model.opt.onnx")],
        "quantize": ["quantize", m, "-o", str(out / "model.int8.onnx"),
                     "--data", str(out / "calib.npz")],
        "plan": ["plan", m, "--backends", "auto"],
        "bench": ["bench", m, "--iterations", "10", "--warmup", "2"],
        "tflite": ["export", m, "--target", "tflite", "-o", str(out / "model.tflite"),
                   "--report", str(out / "tflite.json")],
        "web": ["export", m, "--target", "web", "-o", str(out / "site")],
        "ort-mobile": ["export", m, "--target", "ort-mobile", "-o", str(out / "mobile")],
        "serve": ["serve", m, "--port", "0"],
    }[verb]  # fmt: skip


def _env() -> dict[str, str]:
    # Unbuffered, so that serve's "serving on" line arrives while it serves; wide, so that one
    # error stays one line.
    return {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}


#: What a clean refusal names: an option to give (``--shape``, ``--data``, ``--force`` for a
#: quantized model that runs slower), or the nodes a target cannot run.
NAMES_WHAT_TO_GIVE = re.compile(r"--[a-z]|cannot be lowered")
#: A refusal that says ferry got it wrong is a failure: there is nothing for the user to give.
_NOT_A_REFUSAL = ("parity FAILED", "This is a bug", "does not compute")


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _last_error(stdout: str, stderr: str) -> str:
    lines = _error_lines(stderr) or _error_lines(stdout) or ["(no output)"]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line]
    return (errors or lines)[-1].strip()[:400]


def _verdict(rc: int, stdout: str, stderr: str) -> tuple[str, str] | None:
    """(status, detail) for an exit that settles the cell (a refusal or a failure); None: exit 0
    without noise, to be judged.

    Exit 2 with one ``error:`` line, or exit 3 (refused: over budget, slower, nothing to do) with
    its ``not written:`` line, is a clean refusal; a library's log lines on the terminal
    (``WARNING root: ...``) make it a failure.
    """
    noisy = any(n in stderr for n in _NOISE)
    if rc == 0 and not noisy:
        return None
    lines = _error_lines(stderr)
    logged = [line for line in lines if _LOG_LINE.match(line)]
    if rc in (2, 3) and not noisy and not logged:
        errors = [line for line in lines if line.startswith("error:")]
        if rc == 3 and not errors:
            errors = [ln for ln in _error_lines(stdout + "\n" + stderr) if "not written" in ln]
        if len(errors) == 1 and not any(w in errors[0] for w in _NOT_A_REFUSAL):
            more = len(lines) - 1 if errors[0] in lines else 0
            # A refusal that lists what it names (every unsupported node) on lines of its own.
            line = errors[0].strip() + (f" (+{more} lines)" if more else "")
            if NAMES_WHAT_TO_GIVE.search(line):
                return REFUSED, line
            return FAIL, f"refused, naming nothing to give: {line}"
    if logged:
        return FAIL, f"exit {rc}, a library's log on the terminal: {logged[0][:300]}"
    return FAIL, f"exit {rc}: {_last_error(stdout, stderr)}"


#: A Python logging line from a library (``WARNING root: ...``, ``WARNING onnxruntime.tools...``).
_LOG_LINE = re.compile(r"^(WARNING|INFO|DEBUG) [\w.]+: ")


def reference(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs from a plain ONNX Runtime session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # an exporter's unused initializers are not this check's news
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def _judge_all(
    mid: str,
    verb: str,
    path: Path,
    runner: Callable[[dict[str, np.ndarray]], Any],
    *,
    indices: tuple[int, ...] = (0, 1),
    budget: str | None = None,
    adapt: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> tuple[str, str, float | None]:
    """Judge ``runner`` against ONNX Runtime on ``path`` on the kit's inputs ``indices``
    (``budget``: the loss allowed, as :func:`kit_models.judged` takes it; ``adapt``: the kit
    inputs made fit for what the verb wrote, given to both)."""
    worst: float | None = None
    for index in indices:
        feeds = kit_models.feeds(mid, index)
        if adapt is not None:
            feeds = adapt(feeds)
        got = runner(feeds)
        try:
            verdicts = kit_models.judged(mid, verb, got, reference(path, feeds), budget=budget)
        except AssertionError as e:
            return FAIL, f"judge: {str(e).splitlines()[0][:300]}", None
        for v in verdicts:
            worst = v.score if worst is None else min(worst, v.score)
    return PASS, "judged", worst


def _judged_at_the_task(
    mid: str,
    path: Path,
    written: Path,
    indices: tuple[int, ...],
    kit_verdict: str,
) -> tuple[str, str, float | None]:
    """A lossy verb judged by ferry's inferred task judge (recomputed here, on the kit's held-back
    inputs, at quantize's default 1% loss) where the kit's coarser one fails: ferry judges a
    per-pixel or per-class probability by the decision at its threshold, not by cosine (issue
    31). Passes with the kit's figure named; fails when the task judge fails too."""
    from ferry.graph import load_model
    from ferry.optimizer._task import metric_spec, task_score

    feeds = [kit_models.feeds(mid, index) for index in indices]
    want = [reference(path, f) for f in feeds]
    spec = metric_spec(None, 0.99, load_model(path), want[0])
    worst = task_score(load_model(written), feeds, want, spec)
    line = str(spec.get("reason", spec.get("kind")))
    if worst < 0.99:
        return FAIL, f"{kit_verdict}; at the task ({line}) too: {worst}", worst
    return (
        PASS,
        f"judged at the task ({line}): {worst:.4f}; the kit's judge differs: {kit_verdict}",
        worst,
    )


def _ort_runner(file: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return reference(file, feeds)

    return run


def _defaults(path: Path) -> dict[str, np.ndarray]:
    """The values of ``path``'s inputs that have defaults (initializers of the same name: a
    converted streaming model's state), which a kit input leaves out."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    inputs = {i.name for i in graph.input}
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in inputs}


def _tflite_runner(
    out: Path, path: Path
) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    import json

    from ferry.mobile._litert import LiteRT

    report = json.loads((out / "tflite.json").read_text(encoding="utf-8"))
    # Exported without --nhwc-io: every tensor in the model's own order.
    inputs = [(io["name"], tuple(range(len(io["shape"])))) for io in report["inputs"]]
    outputs = [(io["name"], tuple(range(len(io["shape"])))) for io in report["outputs"]]
    runtime = LiteRT((out / "model.tflite").read_bytes(), "xnnpack", inputs, outputs)

    defaults = _defaults(path)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # The export keeps the ONNX input names; inputs with defaults take them, as in ONNX.
        return runtime.run({**defaults, **feeds})

    return run


def _fit_images(out: Path) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Kit images resized to the sizes the TFLite export fixed (found, not given): a page at
    224x224 where the kit's is 640x480 is still a realistic input to judge the export on (and
    the first tile of a round where the export's batch is 1)."""
    import json

    from skimage.transform import resize

    report = json.loads((out / "tflite.json").read_text(encoding="utf-8"))
    shapes = {io["name"]: tuple(io["shape"]) for io in report["inputs"]}

    def adapt(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fitted = {}
        for name, array in feeds.items():
            shape = shapes.get(name)
            if shape and array.ndim == 4 and array.dtype.kind == "f" and shape != array.shape:
                # A batch fixed smaller (one tile of a round) takes the first samples.
                array = array[: shape[0]]
                array = resize(array, shape, order=1, anti_aliasing=True).astype(array.dtype)
            fitted[name] = array
        return fitted

    return adapt


def _judge_product(mid: str, verb: str, path: Path, out: Path) -> tuple[str, str, float | None]:
    """Judge what ``verb`` wrote into ``out`` (exit 0), or check what it printed."""
    if verb == "run":
        bad = [
            f.stem
            for f in sorted((out / "outputs").glob("*.npy"))
            if (a := np.load(f, allow_pickle=False)).dtype.kind == "f" and not np.isfinite(a).all()
        ]
        if bad:
            return FAIL, f"outputs not finite on generated inputs: {', '.join(bad)}", None
        return PASS, "ran on generated inputs", None
    if verb == "optimize":
        return _judge_all(mid, "optimize", path, _ort_runner(out / "model.opt.onnx"))
    if verb == "quantize":
        # Judged on inputs it did not calibrate on, allowed quantize's default loss of 1%.
        runner = _ort_runner(out / "model.int8.onnx")
        held_back = (CALIBRATION_SAMPLES, CALIBRATION_SAMPLES + 1)
        status, detail, worst = _judge_all(
            mid, "quantize", path, runner, indices=held_back, budget="1%"
        )
        if status == FAIL:
            return _judged_at_the_task(mid, path, out / "model.int8.onnx", held_back, detail)
        return status, detail, worst
    if verb == "ort-mobile":
        (ort_file,) = sorted((out / "mobile").glob("*.ort"))
        return _judge_all(mid, "ort-mobile", path, _ort_runner(ort_file))
    if verb == "web":
        from ferry.web import run_bundle_in_node

        return _judge_all(mid, "web", path, lambda f: run_bundle_in_node(out / "site", f))
    if verb == "tflite":
        try:
            runner = _tflite_runner(out, path)
            return _judge_all(mid, "tflite", path, runner, adapt=_fit_images(out))
        except Exception as e:  # sizes the export fixed, LiteRT refusing: say so
            return FAIL, f"judge: {type(e).__name__}: {str(e).splitlines()[0][:300]}", None
    return PASS, "exit 0", None


def _serve(mid: str, path: Path, timeout: float) -> tuple[str, str, float | None]:
    """``ferry serve MODEL --port 0``: ready within ``timeout`` (warm-up included), then one
    inference per kit input through Triton's client, judged; stopped with Ctrl-C."""
    proc = subprocess.Popen(
        [_FERRY, *command("serve", path, Path())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    url = None
    deadline = time.monotonic() + timeout
    try:
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if match := re.search(r"serving on (http://\S+)", line):
                url = match.group(1)
                break
        if url is None:
            try:
                _, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                return FAIL, f"not serving after {timeout:.0f} s", None
            settled = _verdict(proc.returncode or 1, "", err)
            assert settled is not None
            return (*settled, None)
        import tritonclient.http as http
        from tritonclient.utils import np_to_triton_dtype

        client = http.InferenceServerClient(url.removeprefix("http://"), network_timeout=timeout)
        name = client.get_model_repository_index()[0]["name"]

        def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            inputs = []
            for key, array in feeds.items():
                tensor = http.InferInput(key, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer(name, inputs)
            outputs = result.get_response()["outputs"]
            return {o["name"]: result.as_numpy(o["name"]) for o in outputs}

        try:
            return _judge_all(mid, "ferry serve as typed", path, infer)
        except Exception as e:  # the server's answer to a kit input
            return FAIL, f"infer: {type(e).__name__}: {str(e).splitlines()[0][:300]}", None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_cell(mid: str, verb: str, path: Path, work: Path, timeout: float = TIMEOUT_S) -> Cell:
    """Run ``verb`` on the ONNX file ``path`` of kit model ``mid`` as typed, in folder ``work``."""
    out = work / mid / verb
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    if verb == "quantize":
        calibration_file(mid, out)
    if verb == "serve":
        status, detail, score = _serve(mid, path, timeout)
        return Cell(mid, verb, status, detail, time.monotonic() - start, score)
    try:
        done = subprocess.run(
            [_FERRY, *command(verb, path, out)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            cwd=out,
        )
    except subprocess.TimeoutExpired:
        return Cell(mid, verb, FAIL, f"timeout after {timeout:.0f} s", time.monotonic() - start)
    settled = _verdict(done.returncode, done.stdout, done.stderr)
    if settled is not None:
        return Cell(mid, verb, *settled, time.monotonic() - start)
    try:
        status, detail, score = _judge_product(mid, verb, path, out)
    except Exception as e:  # what the verb wrote cannot be read or run
        status, detail, score = FAIL, f"judge: {type(e).__name__}: {str(e)[:300]}", None
    return Cell(mid, verb, status, detail, time.monotonic() - start, score)


#: Who owns each class of failure (``/work/notes-h/s5-coord.md``'s helpers), by verb.
_OWNER_BY_VERB = {
    "optimize": "QUANTIZE",
    "quantize": "QUANTIZE",
    "tflite": "TFLITE",
    "web": "WEB+DEMO",
}
_INPUT_WORDS = ("--shape", "--input", "indices", "out of", "shape", "Concat", "Reshape", "finite")


def owner(cell: Cell) -> str:
    """Who fixes a failed cell: judges JUDGES', the verbs with an owner theirs, wrong sizes or
    ids INPUTS', the rest LEAD's."""
    if (
        (cell.verb == "quantize" and "judge" in cell.detail)
        or "cosine" in cell.detail
        or "accuracy budget" in cell.detail
    ):
        return "JUDGES"
    if cell.verb in _OWNER_BY_VERB:
        return _OWNER_BY_VERB[cell.verb]
    if any(w in cell.detail for w in _INPUT_WORDS):
        return "INPUTS"
    return "LEAD"
