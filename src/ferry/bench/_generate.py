"""``ferry bench --generate``: a generative artifact measured as a language model is used.

For each engine x precision asked for (ONNX Runtime fp32 always), in a fresh process per
configuration (``python -m ferry.bench._worker generate JOB OUT``, one after the other, so one
engine's threads run at a time and the peak RSS is that configuration's alone), the artifact's
:class:`ferry.generate._loop.DecoderSession` is loaded and, after one untimed warm-up
generation, generates ``repeats`` times from a fixed prompt of exactly ``prompt_tokens`` tokens
(a public-domain English passage tokenized without special tokens, repeated and cut to the
count) exactly ``new_tokens`` new tokens by greedy decoding: the eos ids are ignored so that
every run makes the same number of steps. Each run gives

* ``ttft_ms``: from the call to the first new token (the prefill of the whole prompt in one
  graph call, and choosing the first token),
* ``prefill_tokens_per_s``: prompt tokens / that time,
* ``decode_tokens_per_s``: the ``new_tokens - 1`` following steps / their time (each a graph
  call, choosing the token and detokenizing it, as ``ferry generate`` streams),

reported as the median, min and max over the runs (and each run's value). Peak RSS is the
process's high-water mark after the runs (interpreter and engine libraries included:
``rss_before_load_mb`` says how much of it they are); ``load_s`` is the session's load.

Each engine must run the whole graph: one that takes only part of it (the rest falling back to
ONNX Runtime, a boundary crossed every token) is reported as an error naming where the graph was
placed, not timed. Whether it can is found out by loading, not assumed from the ops' domains:
OpenVINO reads several of ONNX Runtime's ``com.microsoft`` ops (MatMulNBits,
GroupQueryAttention...).

The results document (``schema`` ``"ferry.bench.generate/1"``)::

    {
      "schema", "created", "device",
      "model": {"name", "path", "sha256", "precision", "architecture", "custom_domains": [...]},
      "settings": {"backends", "precisions", "threads", "prompt_tokens", "new_tokens",
                   "repeats", "warmup", "isolated", "prompt", "eos"},
      "configurations": [{
        "label", "backend", "precision", "threads", "baseline", "requested",
        "skipped": str | null,          # why this engine cannot run the graph
        "load_s", "rss_before_load_mb", "peak_rss_mb", "prompt_tokens", "new_tokens",
        "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s":
            {"median", "min", "max", "runs": [...]} | null,
        "note", "error"
      }]
    }
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.bench._spec import _AUTO, BenchSpec, Progress, Target, resolve_targets
from ferry.errors import FerryError, InvalidInputError

__all__ = [
    "GENERATE_SCHEMA",
    "GenerateSpec",
    "check_generate_results",
    "custom_domains",
    "generate_lines",
    "generate_table",
    "measure_job",
    "measure_safely",
    "prompt_ids",
    "run_generate_bench",
]

GENERATE_SCHEMA = "ferry.bench.generate/1"
# A child measuring one configuration is killed after this long.
_CHILD_TIMEOUT_S = 1800.0
_STANDARD_DOMAINS = frozenset({"", "ai.onnx"})
_FIGURES = ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")
_CONFIG_KEYS = (
    "label",
    "backend",
    "precision",
    "threads",
    "baseline",
    "requested",
    "skipped",
    "load_s",
    "rss_before_load_mb",
    "peak_rss_mb",
    "prompt_tokens",
    "new_tokens",
    *_FIGURES,
    "note",
    "error",
)
#: The prompt's text (Lewis Carroll, Alice's Adventures in Wonderland, 1865: public domain),
#: tokenized and repeated to the prompt's length: ordinary words, the same tokens every run.
PASSAGE = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it, 'and what is the use of a book,' thought Alice "
    "'without pictures or conversations?' So she was considering in her own mind (as well as "
    "she could, for the hot day made her feel very sleepy and stupid), whether the pleasure of "
    "making a daisy-chain would be worth the trouble of getting up and picking the daisies, "
    "when suddenly a White Rabbit with pink eyes ran close by her. "
)


@dataclasses.dataclass(frozen=True)
class GenerateSpec:
    """What ``--generate`` measures.

    Attributes:
        backends: engines (ONNX Runtime fp32 is added as the baseline); ``auto`` is refused.
        precisions: the engines' precisions; None: every one each offers.
        threads: intra-op threads; None: the engine's default.
        prompt_tokens: the prompt's length in tokens (>= 1).
        new_tokens: new tokens per run (>= 2: one decode step at least).
        repeats: timed generations per configuration.
        warmup: untimed generations first.
        isolate: each configuration in a fresh process (else all in this one: no peak RSS).
    """

    backends: tuple[str, ...] = ("onnxruntime",)
    precisions: tuple[str, ...] | None = None
    threads: int | None = None
    prompt_tokens: int = 128
    new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    isolate: bool = True

    def __post_init__(self) -> None:
        for name, least in (("prompt_tokens", 1), ("new_tokens", 2), ("repeats", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidInputError(f"{name} must be an integer >= {least}, got {value!r}")
        if _AUTO in self.backends:
            raise InvalidInputError(
                "--generate measures named engines (e.g. onnxruntime,openvino), not auto"
            )
        # The rest (threads, backends, precisions) as ferry bench checks them.
        BenchSpec(backends=self.backends, precisions=self.precisions, threads=self.threads)


def custom_domains(model_file: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The op types of each non-standard domain the graph uses (``{"com.microsoft":
    ["MatMulNBits", ...]}``), read without the weights."""
    import onnx

    proto = onnx.load(str(model_file), load_external_data=False)
    found: dict[str, set[str]] = {}
    graphs = [proto.graph, *(f for f in proto.functions)]
    for graph in graphs:
        for node in graph.node:
            if node.domain not in _STANDARD_DOMAINS:
                found.setdefault(node.domain, set()).add(node.op_type)
    return {d: sorted(ops) for d, ops in sorted(found.items())}


def prompt_ids(tokenizer: Any, count: int) -> list[int]:
    """Exactly ``count`` token ids: :data:`PASSAGE` tokenized without special tokens, repeated
    and cut."""
    ids = list(tokenizer.encode(PASSAGE, add_special_tokens=False).ids)
    if not ids:
        raise InvalidInputError("the artifact's tokenizer gives no tokens for an English passage")
    return (ids * (count // len(ids) + 1))[:count]


def run_generate_bench(
    folder: str | os.PathLike[str],
    spec: GenerateSpec | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure a generative artifact folder as ``spec`` says; the results document (module
    docstring).

    Raises:
        InvalidInputError: ``folder`` is not a generative artifact, or the prompt and the new
            tokens do not fit its context. A configuration that fails on its own is reported in
            the results.
    """
    from ferry.bench._device import device_info
    from ferry.bench._runner import file_sha256
    from ferry.generate._artifact import MODEL_FILE, read_generative_manifest
    from ferry.generate._loop import is_generative_artifact

    spec = spec or GenerateSpec()
    report = progress or (lambda stage, done, total: None)
    path = Path(folder)
    if not is_generative_artifact(path):
        raise InvalidInputError(
            f"--generate measures generative artifacts (a folder `ferry convert model.gguf -o "
            f"DIR` writes); {path} is not one: bench it without --generate"
        )
    report("reading the model", 0, 1)
    manifest = read_generative_manifest(path) or {}
    model_file = path / MODEL_FILE
    domains = custom_domains(model_file)
    targets = resolve_targets(
        BenchSpec(backends=spec.backends, precisions=spec.precisions, threads=spec.threads)
    )
    job = {
        "folder": str(path),
        "threads": spec.threads,
        "prompt_tokens": spec.prompt_tokens,
        "new_tokens": spec.new_tokens,
        "repeats": spec.repeats,
        "warmup": spec.warmup,
    }
    configs = []
    for i, target in enumerate(targets):
        report(f"generating: {target.label}", i, len(targets))
        skipped = None
        out: dict[str, Any] = {}
        if target.error is None and skipped is None:
            run = {**job, "backend": target.backend, "precision": target.precision}
            if spec.isolate:
                out = _in_child(run)
            else:
                # This process's high-water mark is everything it ever ran, not this engine's.
                out = {**measure_safely(run), "peak_rss_mb": None, "rss_before_load_mb": None}
        configs.append(_config_dict(target, spec, skipped, out))
    report("done", len(targets), len(targets))
    return {
        "schema": GENERATE_SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "name": path.name,
            "path": str(path),
            "sha256": file_sha256(model_file),
            "precision": manifest.get("precision"),
            "architecture": manifest.get("architecture"),
            "custom_domains": list(domains),
        },
        "device": device_info(),
        "settings": {
            "backends": list(spec.backends),
            "precisions": None if spec.precisions is None else list(spec.precisions),
            "threads": spec.threads,
            "prompt_tokens": spec.prompt_tokens,
            "new_tokens": spec.new_tokens,
            "repeats": spec.repeats,
            "warmup": spec.warmup,
            "isolated": spec.isolate,
            "prompt": "a fixed English passage (Alice's Adventures in Wonderland) tokenized "
            "without special tokens, repeated and cut to prompt_tokens",
            "eos": "ignored: greedy decoding of exactly new_tokens tokens",
        },
        "configurations": configs,
    }


def _config_dict(
    target: Target, spec: GenerateSpec, skipped: str | None, out: dict[str, Any]
) -> dict[str, Any]:
    return {
        "label": target.label,
        "backend": target.backend,
        "precision": target.precision,
        "threads": spec.threads,
        "baseline": target.baseline,
        "requested": target.requested,
        "skipped": skipped,
        "load_s": out.get("load_s"),
        "rss_before_load_mb": out.get("rss_before_load_mb"),
        "peak_rss_mb": out.get("peak_rss_mb"),
        "prompt_tokens": out.get("prompt_tokens"),
        "new_tokens": out.get("new_tokens"),
        **{k: out.get(k) for k in _FIGURES},
        "note": target.note,
        "error": target.error or out.get("error"),
    }


def _in_child(job: dict[str, Any]) -> dict[str, Any]:
    """``measure_job`` in a fresh process (``python -m ferry.bench._worker generate``)."""
    with tempfile.TemporaryDirectory(prefix="ferry-bench-generate-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ferry.bench._worker",
                    "generate",
                    str(job_file),
                    str(out_file),
                ],
                capture_output=True,
                text=True,
                timeout=_CHILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"generating took over {_CHILD_TIMEOUT_S:.0f} s; gave up"}
        try:
            out: dict[str, Any] = json.loads(out_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return {"error": f"the process measuring it died: {tail[0]}"}
    return out


def measure_safely(job: dict[str, Any]) -> dict[str, Any]:
    """:func:`measure_job`, a failure reported as the configuration's error."""
    try:
        return measure_job(job)
    except FerryError as e:
        return {"error": str(e)}
    except Exception as e:  # an engine's failure is this configuration's, not the run's
        return {"error": f"{type(e).__name__}: {e}"}


def measure_job(job: dict[str, Any]) -> dict[str, Any]:
    """Load the artifact on one engine and time its generations (the worker's ``generate``
    mode; keys as the configuration's in the module docstring)."""
    from ferry.bench._device import peak_rss_mb
    from ferry.generate._loop import DecoderSession, Generation, TokenEvent

    n, m = int(job["prompt_tokens"]), int(job["new_tokens"])
    out: dict[str, Any] = {"rss_before_load_mb": peak_rss_mb()}
    start = time.perf_counter()
    decoder = DecoderSession.from_folder(
        job["folder"],
        backends=[job["backend"]],
        precision=job["precision"],
        threads=job["threads"],
        cache_dir=False,
    )
    out["load_s"] = time.perf_counter() - start
    placed = decoder.session.plan.backends
    if len(decoder.session.plan.partitions) != 1 or placed != [job["backend"]]:
        raise InvalidInputError(
            f"{job['backend']} does not run the whole decoder (placed on {', '.join(placed)}); "
            "convert with --flavour standard for plain ONNX ops"
        )
    if decoder.context_length is not None and n + m > decoder.context_length:
        raise InvalidInputError(
            f"{n} prompt tokens + {m} new tokens exceed the model's context of "
            f"{decoder.context_length} tokens"
        )
    # Exactly m tokens every run: an eos the model happens to choose does not end it.
    decoder.eos_ids = frozenset()
    ids = prompt_ids(decoder.tokenizer, n)
    runs: dict[str, list[float]] = {k: [] for k in _FIGURES}
    for i in range(int(job["warmup"]) + int(job["repeats"])):
        stamps: list[float] = []
        result: Generation | None = None
        start = time.perf_counter()
        for event in decoder.generate(ids=ids, max_new_tokens=m, stream=True):
            if isinstance(event, TokenEvent):
                stamps.append(time.perf_counter())
            else:
                result = event
        if result is None or len(result.ids) != m or len(stamps) != m:
            got = len(stamps) if result is None else len(result.ids)
            raise FerryError(f"the decoder made {got} new tokens, not {m}")
        if i < int(job["warmup"]):
            continue
        first = stamps[0] - start
        runs["ttft_ms"].append(first * 1000)
        runs["prefill_tokens_per_s"].append(n / first)
        runs["decode_tokens_per_s"].append((m - 1) / (stamps[-1] - stamps[0]))
        out["prompt_tokens"], out["new_tokens"] = result.prompt_tokens, len(result.ids)
    out.update({k: _spread(v) for k, v in runs.items()})
    out["peak_rss_mb"] = peak_rss_mb()
    del decoder
    gc.collect()
    out["error"] = None
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def check_generate_results(data: Any) -> dict[str, Any]:
    """``data`` if it is a ``--generate`` results document, else FerryError (its shape, not
    its figures)."""
    if not isinstance(data, dict) or data.get("schema") != GENERATE_SCHEMA:
        raise FerryError(f"not a {GENERATE_SCHEMA!r} results document")
    for key in ("created", "model", "device", "settings", "configurations"):
        if key not in data:
            raise FerryError(f"bench results lack {key!r}")
    for i, config in enumerate(data["configurations"]):
        missing = [k for k in _CONFIG_KEYS if not isinstance(config, dict) or k not in config]
        if missing:
            raise FerryError(f"bench configuration {i} lacks {', '.join(missing)}")
    return data


def _cell(figure: dict[str, Any] | None) -> str:
    """``median (min-max)``, to about 3 significant digits; ``-`` when not measured."""
    if not figure:
        return "-"
    median = abs(figure["median"])
    fmt = f"{{:.{0 if median >= 100 else 1 if median >= 10 else 2}f}}"
    if len(figure.get("runs", ())) < 2:
        return fmt.format(figure["median"])
    return (
        f"{fmt.format(figure['median'])} ({fmt.format(figure['min'])}-{fmt.format(figure['max'])})"
    )


#: The table's columns.
COLUMNS = (
    "configuration",
    "prompt",
    "new",
    "TTFT ms",
    "prefill tok/s",
    "decode tok/s",
    "peak RSS MiB",
    "load s",
)


def generate_table(results: dict[str, Any]) -> Any:
    """A rich Table, one row per configuration: the median and (min-max) over the runs of time
    to first token and prefill and decode tokens/s, peak RSS and load time; the fastest decode
    is starred. A skipped or failed configuration says so in its row."""
    from rich.markup import escape
    from rich.table import Table

    out = Table(box=None, pad_edge=False)
    for i, name in enumerate(COLUMNS):
        out.add_column(name, no_wrap=True, justify="left" if i == 0 else "right")
    rates = [
        (r["decode_tokens_per_s"]["median"], j)
        for j, r in enumerate(results["configurations"])
        if r["decode_tokens_per_s"]
    ]
    best = max(rates)[1] if rates else None
    for j, row in enumerate(results["configurations"]):
        label = f"{'*' if j == best else ' '} {escape(row['label'])}"
        if row["skipped"]:
            out.add_row(label, "", "", "[yellow]skipped[/yellow]")
            continue
        if row["error"]:
            out.add_row(label, "", "", "[red]failed[/red]")
            continue
        rss, load = row["peak_rss_mb"], row["load_s"]
        out.add_row(
            label,
            str(row["prompt_tokens"]),
            str(row["new_tokens"]),
            _cell(row["ttft_ms"]),
            _cell(row["prefill_tokens_per_s"]),
            _cell(row["decode_tokens_per_s"]),
            "-" if rss is None else f"{rss:,.0f}",
            "-" if load is None else f"{load:.2f}",
        )
    return out


def generate_lines(results: dict[str, Any]) -> list[str]:
    """The lines under the table: why each skipped or failed configuration is so, the notes,
    and how it was measured."""
    # One line per reason, naming every configuration it holds for (an engine's precisions).
    said: dict[tuple[str, str], list[str]] = {}
    for row in results["configurations"]:
        for key in ("skipped", "error", "note"):
            if row[key]:
                said.setdefault((key, row[key]), []).append(row["label"])
    lines = [
        f"{'failed' if key == 'error' else key}: {', '.join(labels)}: {text}"
        for (key, text), labels in said.items()
    ]
    s = results["settings"]
    how = (
        "peak RSS and load in a fresh process per configuration"
        if s["isolated"]
        else "all in one process (no peak RSS)"
    )
    lines.append(
        f"median (min-max) of {s['repeats']} generations after {s['warmup']} warm-up: "
        f"{s['prompt_tokens']} prompt tokens ({s['prompt']}), {s['new_tokens']} new tokens "
        f"by greedy decoding, eos ignored; TTFT = prefill + the first token; decode tok/s = "
        f"the {s['new_tokens'] - 1} later tokens / their time; threads: "
        f"{s['threads'] or 'default'}; {how}. * = fastest decode."
    )
    return lines
