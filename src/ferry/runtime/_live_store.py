"""What live placement learned, kept: one JSON file per model, offer, machine and bucket of input
sizes (``live-<model key>-<bucket key>.json`` beside auto's choices and the pays verdicts), so a
new load starts the buckets it knows on their plan at once (:mod:`ferry.runtime._live`).

A model loaded from an artifact ferry made (its ``ferry.json`` exists) keeps the same records in
it too, under ``"placement": {"live": [...]}``, each with its key: the artifact carries its
learned plans to another cache on the same kind of machine (a key names the machine, so a copy
on another CPU or engine version starts on ONNX Runtime and learns again)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from ferry.errors import FerryError
from ferry.parity import Budget
from ferry.plan import Plan
from ferry.runtime._auto import _budget_key
from ferry.runtime._measure import machine_fingerprint, save_verdict, verdicts_dir

__all__ = [
    "Learned",
    "live_key",
    "read_artifact_learned",
    "read_learned",
    "save_artifact_learned",
    "save_learned",
]

logger = logging.getLogger(__name__)

#: The field of an artifact's ``ferry.json`` that keeps what live placement learned.
ARTIFACT_FIELD = "placement"


@dataclasses.dataclass(frozen=True)
class Learned:
    """One bucket's outcome: the plan that pays there (None: ONNX Runtime alone keeps it), its
    label, both latencies measured and the bucket's state in words."""

    bucket: dict[str, list[int]]
    plan: Plan | None
    label: str
    plan_ms: float | None
    alone_ms: float | None
    state: str


def live_key(
    model: ir.Model,
    names: Sequence[str],
    candidate: Plan | None,
    precision: str | None,
    accuracy: Budget | None,
    threads: int | None,
) -> str:
    """The key of everything learned for ``model`` offered ``names`` (the placed ``candidate``,
    None for auto) on this machine."""
    digest = hashlib.sha256()
    digest.update(ir.to_proto(model).SerializeToString(deterministic=True))
    plan = None if candidate is None else candidate.to_dict()
    settings = [list(names), plan, precision, _budget_key(accuracy), threads]
    digest.update(json.dumps([settings, machine_fingerprint()], default=str).encode())
    return digest.hexdigest()[:24]


def save_learned(key: str, learned: Learned) -> None:
    """Keep ``learned`` under ``key`` (a folder that cannot be written only warns)."""
    path = verdicts_dir() / f"live-{key}-{_bucket_key(learned.bucket)}.json"
    save_verdict(path, _record(learned), "live placement's choice")


def save_artifact_learned(model_file: Path | None, key: str, learned: Learned) -> None:
    """Keep ``learned`` in the artifact ``model_file`` belongs to as well (``ferry.json``'s
    ``"placement"``), replacing the record of the same key and bucket. Only an artifact ferry made
    is written (its ``ferry.json`` exists), whole or not at all; a failure only logs."""
    report = _artifact_report(model_file)
    if report is None:
        return
    from ferry.graph import atomic_path

    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            return
        field = data.get(ARTIFACT_FIELD)
        field = dict(field) if isinstance(field, dict) else {}
        bucket = _bucket_key(learned.bucket)
        records = [
            r
            for r in field.get("live") or []
            if isinstance(r, dict)
            and not (r.get("key") == key and _bucket_key(r.get("bucket") or {}) == bucket)
        ]
        records.append({"key": key, "model": model_file.name, **_record(learned)})  # type: ignore[union-attr]
        field["live"] = records
        data[ARTIFACT_FIELD] = field
        with atomic_path(report) as tmp:
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    except (OSError, ValueError, TypeError, AttributeError) as e:
        logger.warning("cannot keep live placement's choice in %s: %s", report, e)


def read_artifact_learned(model_file: Path | None, key: str, limit: int) -> list[Learned]:
    """Up to ``limit`` buckets the artifact ``model_file`` belongs to keeps under ``key``."""
    report = _artifact_report(model_file)
    if report is None:
        return []
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        records = data[ARTIFACT_FIELD]["live"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    found = []
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict) and record.get("key") == key:
            learned = _learned_of(record)
            if learned is not None:
                found.append(learned)
    return found[:limit]


def read_learned(key: str, limit: int) -> list[Learned]:
    """Up to ``limit`` buckets learned under ``key``; unreadable records are skipped."""
    try:
        paths = sorted(verdicts_dir().glob(f"live-{key}-*.json"))
    except OSError:
        return []
    found = []
    for path in paths[:limit]:
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        learned = _learned_of(data)
        if learned is not None:
            found.append(learned)
    return found


def _learned_of(data: Any) -> Learned | None:
    """A record read back; None when it is malformed (skipped, never an error)."""
    try:
        bucket = {str(n): [int(d) for d in s] for n, s in data["bucket"].items()}
        plan = None if data["plan"] is None else Plan.from_dict(data["plan"])
        return Learned(
            bucket,
            plan,
            str(data.get("label", "")),
            _number(data.get("plan_ms")),
            _number(data.get("alone_ms")),
            str(data.get("state", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, FerryError):
        return None


def _record(learned: Learned) -> dict[str, Any]:
    data = dataclasses.asdict(learned)
    data["plan"] = None if learned.plan is None else learned.plan.to_dict()
    return data


def _bucket_key(bucket: dict[str, Any]) -> str:
    sizes = json.dumps(sorted(bucket.items())).encode()
    return hashlib.sha256(sizes).hexdigest()[:16]


def _artifact_report(model_file: Path | None) -> Path | None:
    """The ``ferry.json`` of the artifact ``model_file`` belongs to, None when there is none."""
    if model_file is None:
        return None
    report = Path(model_file).parent / "ferry.json"
    return report if report.is_file() else None


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
