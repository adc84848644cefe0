"""Bench results out: a comparison table, CSV, JSON, and the ``benchmarks`` of an artifact's report.

Every function takes the results document of :func:`ferry.bench.run_bench` (or of a remote
agent: the same document).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ferry.errors import FerryError

__all__ = [
    "REPORT_FILE",
    "accuracy_cell",
    "budget_summary",
    "check_results",
    "device_summary",
    "errors",
    "notes",
    "outside_budget",
    "partition_lines",
    "save_to_artifact",
    "table",
    "to_csv",
    "write_csv",
    "write_json",
]

#: The artifact's report file; bench results go under its ``benchmarks`` key.
REPORT_FILE = "ferry.json"
_ARTIFACT_MODEL = "model.onnx"

_CONFIG_KEYS = (
    "label",
    "backend",
    "precision",
    "batch",
    "threads",
    "baseline",
    "requested",
    "fastest",
    "fastest_within_budget",
    "accuracy",
    "inputs",
    "plan",
    "cold_start_s",
    "first_run_ms",
    "warm_start_s",
    "rss_before_load_mb",
    "peak_rss_mb",
    "iterations",
    "latency_ms",
    "latency_percentiles_ms",
    "throughput",
    "partitions",
    "ratio_to_ort_fp32",
    "note",
    "error",
)
_LATENCY_KEYS = ("p50", "p90", "p99", "mean", "std", "min", "max")
#: Keys added within schema 1, and what a document written before them reads as (not judged).
_ADDED_CONFIG_KEYS: dict[str, Any] = {"accuracy": None, "fastest_within_budget": False}


def check_results(data: Any) -> dict[str, Any]:
    """``data`` if it is a results document of a schema this ferry reads, else FerryError.

    Checks the shape, not the figures: every key of the schema is present (figures may be null).
    Keys added to schema 1 later (``accuracy``, ``fastest_within_budget``, ``settings.accuracy``)
    are filled in, as not judged, in a document written before them (an older agent's).
    """
    from ferry.bench._runner import SCHEMA

    if not isinstance(data, dict):
        raise FerryError("bench results must be a JSON object")
    if data.get("schema") != SCHEMA:
        raise FerryError(
            f"bench results have schema {data.get('schema')!r}; this ferry reads {SCHEMA!r}"
        )
    for key in ("created", "model", "device", "settings", "configurations"):
        if key not in data:
            raise FerryError(f"bench results lack {key!r}")
    if isinstance(data["settings"], dict):
        data["settings"].setdefault("accuracy", None)
    for i, config in enumerate(data["configurations"]):
        if isinstance(config, dict):
            for key, value in _ADDED_CONFIG_KEYS.items():
                config.setdefault(key, value)
        missing = [k for k in _CONFIG_KEYS if k not in config]
        if missing:
            raise FerryError(f"bench configuration {i} lacks {', '.join(missing)}")
        latency = config["latency_ms"]
        if latency is not None and any(k not in latency for k in _LATENCY_KEYS):
            raise FerryError(f"bench configuration {i} has incomplete latency_ms")
    return data


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _count(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def accuracy_cell(row: dict[str, Any]) -> str:
    """A configuration's accuracy in a table: the worst judge score, and ``ok`` within the
    budget or ``out`` outside it (``-`` when not judged).

    The score is cut (not rounded) to 5 decimals, so a score just under a threshold never reads
    as the threshold itself (0.998996 is 0.99899, not 0.99900).
    """
    accuracy = row.get("accuracy")
    if not accuracy:
        return "-"
    worst = float(accuracy["worst"])
    shown = math.floor(worst * 1e5) / 1e5 if math.isfinite(worst) else worst
    return f"{shown:.5f} {'ok' if accuracy['passed'] else 'out'}"


def _marker(row: dict[str, Any]) -> str:
    """``*`` fastest within the budget at its batch; ``!`` fastest, but not within it."""
    if row.get("fastest_within_budget"):
        return "*"
    return "!" if row["fastest"] else " "


#: Columns of the full table; the compact one (narrow terminals) keeps those marked True.
_COLUMNS = (
    # (full header, compact header or None when the compact table leaves it out)
    ("configuration", "configuration"),
    ("batch", "batch"),
    ("cold ms", "cold ms"),
    ("warm ms", None),
    ("p50 ms", "p50 ms"),
    ("p90 ms", None),
    ("p99 ms", None),
    ("mean ms", None),
    ("std ms", None),
    ("min ms", None),
    ("samples/s", "samples/s"),
    ("peak RSS MiB", None),
    ("p50 vs ORT", "vs ORT"),
    ("samples/s vs ORT", None),
    ("accuracy", "accuracy"),
)


def table(results: dict[str, Any], *, compact: bool = False) -> Any:
    """A rich Table: one row per configuration; at each batch the fastest within the accuracy
    budget is starred (``*``), and the fastest overall marked ``!`` when it is not within it.

    Latency is per call (one batch); ``vs ORT`` columns are ratios to plain ONNX Runtime fp32 at
    the same batch (p50: below 1 is faster; samples/s: above 1 is faster); ``accuracy`` is the
    worst judge score against ONNX Runtime fp32 and whether it is within the budget
    (:func:`accuracy_cell`). ``compact`` keeps the columns that fit 80 characters:
    configuration, batch, cold start, p50, samples/s, the p50 ratio and accuracy.
    """
    from rich.markup import escape
    from rich.table import Table

    shown = [i for i, (_, short) in enumerate(_COLUMNS) if short or not compact]
    out = Table(box=None, pad_edge=False)
    for i in shown:
        full, short = _COLUMNS[i]
        out.add_column(
            short if compact and short else full,
            no_wrap=True,
            justify="left" if i == 0 else "right",
        )
    last_batch = None
    for row in results["configurations"]:
        if last_batch is not None and row["batch"] != last_batch:
            out.add_section()
        last_batch = row["batch"]
        label = escape(row["label"])
        if row["plan"] and row["plan"].get("chosen"):
            label += f" ({escape(row['plan']['chosen'])})"
        if row["plan"] and row["plan"]["partitions"] > 1:
            label += f" [{row['plan']['partitions']} parts]"
        marker = _marker(row)
        label = f"[bold]{marker} {label}[/bold]" if marker == "*" else f"{marker} {label}"
        if row["error"]:
            out.add_row(label, str(row["batch"]), "[red]failed[/red]")
            continue
        lat = row["latency_ms"] or {}
        ratio = row["ratio_to_ort_fp32"] or {}
        cold, warm = row["cold_start_s"], row["warm_start_s"]
        cells = [
            label,
            str(row["batch"]),
            _ms(None if cold is None else cold * 1000),
            _ms(None if warm is None else warm * 1000),
            *(_ms(lat.get(k)) for k in ("p50", "p90", "p99", "mean", "std", "min")),
            _count(row["throughput"]),
            _count(row["peak_rss_mb"]),
            _ratio(ratio.get("p50")),
            _ratio(ratio.get("throughput")),
            accuracy_cell(row),
        ]
        out.add_row(*(cells[i] for i in shown))
    return out


def budget_summary(results: dict[str, Any]) -> str:
    """The budget the configurations were judged by, in words: ``cosine >= 0.999, argmax_seq
    >= 0.99 against onnxruntime fp32 on the batch-1 inputs`` (empty when not judged)."""
    accuracy = results["settings"].get("accuracy")
    if not accuracy:
        return ""
    parts = []
    for spec in accuracy["budget"]:
        kind = spec.get("kind")
        least = spec.get("min", spec.get("min_agreement"))
        what = f"{kind}@{spec['threshold']:g}" if kind == "mask" else str(kind)
        parts.append(f"{what} >= {least:g}" if isinstance(least, (int, float)) else what)
    return (
        f"{', '.join(parts)} against {accuracy['reference']} on the batch-{accuracy['batch']} "
        "inputs"
    )


def outside_budget(results: dict[str, Any]) -> list[str]:
    """One line per target outside the accuracy budget: each failed judgement's detail."""
    seen: dict[str, str] = {}
    for row in results["configurations"]:
        accuracy = row.get("accuracy")
        if not accuracy or accuracy["passed"] or row["label"] in seen:
            continue
        failed = [j for j in accuracy["judgements"] if not j["passed"]]
        seen[row["label"]] = "; ".join(f"{j['output']}: {j['detail']}" for j in failed)
    return [f"{label}: {detail}" for label, detail in seen.items()]


def notes(results: dict[str, Any]) -> list[str]:
    """One line per target with a note (an engine that took no node...), once, not per batch."""
    return _once_per_label(results, "note")


def partition_lines(results: dict[str, Any]) -> list[str]:
    """One line per split configuration: each partition's engine, size and mean time."""
    lines = []
    for row in results["configurations"]:
        if not row["partitions"]:
            continue
        parts = ", ".join(
            f"#{p['index']} {p['backend']} {p['nodes']} node{'s' if p['nodes'] != 1 else ''} "
            f"{_ms(p['mean_ms'])} ms"
            for p in row["partitions"]
        )
        lines.append(f"{row['label']} batch {row['batch']}: {parts}")
    return lines


def errors(results: dict[str, Any]) -> list[str]:
    """One line per configuration that failed (once per target, not per batch)."""
    return _once_per_label(results, "error")


def _once_per_label(results: dict[str, Any], key: str) -> list[str]:
    """``label: row[key]`` for the first row of each label where it is set."""
    seen: dict[str, str] = {}
    for row in results["configurations"]:
        if row[key] and row["label"] not in seen:
            seen[row["label"]] = row[key]
    return [f"{label}: {message}" for label, message in seen.items()]


def device_summary(device: dict[str, Any]) -> str:
    """``AMD EPYC, 2 cores, 23.4 GiB, Linux-...; onnxruntime 1.32.0, openvino 2026.4``."""
    memory = device.get("memory_mb")
    cores = device.get("usable_cores") or device.get("cores")
    parts = [str(device.get("cpu")), f"{cores} cores"]
    if memory:
        parts.append(f"{memory / 1024:.1f} GiB")
    engines = ", ".join(
        f"{e['name']} {e['version']}" for e in device.get("engines", []) if e.get("available")
    )
    host = device.get("hostname")
    return f"{host + ': ' if host else ''}{', '.join(parts)}; {engines}"


_CSV_COLUMNS = (
    "label",
    "backend",
    "precision",
    "batch",
    "threads",
    "baseline",
    "requested",
    "fastest",
    "plan_partitions",
    "plan_backends",
    "plan_chosen",
    "inputs",
    "cold_start_s",
    "first_run_ms",
    "warm_start_s",
    "rss_before_load_mb",
    "peak_rss_mb",
    "iterations",
    *(f"{k}_ms" for k in _LATENCY_KEYS),
    "throughput",
    *(f"ratio_{k}" for k in ("p50", "p90", "p99", "mean", "throughput", "cold_start", "peak_rss")),
    "partitions",
    "note",
    "error",
    # Added within schema 1: at the end, so that columns read by position stay where they were.
    "fastest_within_budget",
    "accuracy_passed",
    "accuracy_worst",
)


def to_csv(results: dict[str, Any]) -> str:
    """The configurations as CSV, one row each; empty cells for figures not measured.

    ``partitions`` reads ``index:backend:nodes:mean_ms`` joined by ``;``; ``inputs``
    ``name=1x3x224x224`` joined by ``;``.
    """
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in results["configurations"]:
        plan = row["plan"] or {}
        lat = row["latency_ms"] or {}
        ratio = row["ratio_to_ort_fp32"] or {}
        flat: dict[str, Any] = {
            k: row[k]
            for k in (
                "label",
                "backend",
                "precision",
                "batch",
                "threads",
                "baseline",
                "requested",
                "fastest",
                "cold_start_s",
                "first_run_ms",
                "warm_start_s",
                "rss_before_load_mb",
                "peak_rss_mb",
                "iterations",
                "throughput",
                "note",
                "error",
                "fastest_within_budget",
            )
        }
        accuracy = row["accuracy"] or {}
        flat.update(
            accuracy_passed=accuracy.get("passed"),
            accuracy_worst=accuracy.get("worst"),
            plan_partitions=plan.get("partitions"),
            plan_backends="+".join(plan.get("backends", [])),
            plan_chosen=plan.get("chosen"),
            inputs=";".join(f"{n}={'x'.join(map(str, dims))}" for n, dims in row["inputs"].items()),
            partitions=";".join(
                f"{p['index']}:{p['backend']}:{p['nodes']}:{p['mean_ms']}"
                for p in row["partitions"] or []
            ),
        )
        flat.update({f"{k}_ms": lat.get(k) for k in _LATENCY_KEYS})
        flat.update({f"ratio_{k}": v for k, v in ratio.items()})
        writer.writerow({k: "" if v is None else v for k, v in flat.items()})
    return buf.getvalue()


def _write_text(text: str, path: str | os.PathLike[str]) -> None:
    from ferry.graph import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_csv(results: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write :func:`to_csv` atomically."""
    _write_text(to_csv(results), path)


def write_json(results: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the document as indented JSON, atomically."""
    _write_text(json.dumps(results, indent=2) + "\n", path)


def _device_key(device: dict[str, Any]) -> list[Any]:
    return [device.get("hostname"), device.get("cpu"), device.get("cores")]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (POSIX), so read-merge-writes do not interleave."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the write itself is still atomic
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def save_to_artifact(results: dict[str, Any], artifact: str | os.PathLike[str]) -> Path:
    """Store ``results`` in ``artifact/ferry.json`` under ``benchmarks``; return that file.

    ``benchmarks`` is a list of results documents, one per device (hostname, CPU, cores) and
    schema (``ferry bench`` and ``ferry bench --generate`` each keep theirs): a new run replaces
    the previous one from the same device and of the same schema and keeps the others'. The rest of
    ``ferry.json`` is kept as it was; the file is created when missing and replaced atomically,
    under a lock on the folder so that two runs saving at once both land.

    Raises:
        FerryError: ``artifact`` is not an artifact folder (a folder holding ``model.onnx``),
            the results are for another model, or ``ferry.json`` is not a JSON object.
    """
    folder = Path(artifact)
    model = folder / _ARTIFACT_MODEL
    if not folder.is_dir() or not model.is_file():
        raise FerryError(
            f"saving bench results needs an artifact folder (a folder holding {_ARTIFACT_MODEL}); "
            f"{folder} is {'a folder without it' if folder.is_dir() else 'not a folder'}: put the "
            f"model in a folder as {_ARTIFACT_MODEL} and bench the folder"
        )
    from ferry.bench._generate import GENERATE_SCHEMA, check_generate_results

    if isinstance(results, dict) and results.get("schema") == GENERATE_SCHEMA:
        check_generate_results(results)
    else:
        check_results(results)
    from ferry.bench._runner import file_sha256

    digest = file_sha256(model)
    if results["model"].get("sha256") != digest:
        raise FerryError(
            f"these bench results are for another model than {model} (its sha256 differs); "
            "bench the artifact itself"
        )
    report = folder / REPORT_FILE
    with _locked(folder):
        data: dict[str, Any] = {}
        if report.exists():
            try:
                data = json.loads(report.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise FerryError(f"{report} is not valid JSON ({e}); fix or remove it") from e
            if not isinstance(data, dict):
                raise FerryError(f"{report} is not a JSON object; fix or remove it")
        runs = data.get("benchmarks", [])
        if not isinstance(runs, list):
            raise FerryError(f"{report}: 'benchmarks' is not a list; fix or remove it")
        # One run per device and kind of run (``--generate``'s schema is its own).
        key = [*_device_key(results["device"]), results["schema"]]
        runs = [
            r
            for r in runs
            if not isinstance(r, dict)
            or [*_device_key(r.get("device", {})), r.get("schema")] != key
        ]
        runs.append(results)
        data["benchmarks"] = runs
        _write_text(json.dumps(data, indent=2) + "\n", report)
    return report
