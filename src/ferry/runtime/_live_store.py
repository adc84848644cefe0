"""What live placement learned, kept: one JSON file per model, offer, machine and bucket of input
sizes (``live-<model key>-<bucket key>.json`` beside auto's choices and the pays verdicts), so a
new load starts the buckets it knows on their plan at once (:mod:`ferry.runtime._live`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from ferry.errors import FerryError
from ferry.parity import Budget
from ferry.plan import Plan
from ferry.runtime._auto import _budget_key
from ferry.runtime._measure import machine_fingerprint, save_verdict, verdicts_dir

__all__ = ["Learned", "live_key", "read_learned", "save_learned"]


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
    sizes = json.dumps(sorted(learned.bucket.items())).encode()
    path = verdicts_dir() / f"live-{key}-{hashlib.sha256(sizes).hexdigest()[:16]}.json"
    data = dataclasses.asdict(learned)
    data["plan"] = None if learned.plan is None else learned.plan.to_dict()
    save_verdict(path, data, "live placement's choice")


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
            bucket = {str(n): [int(d) for d in s] for n, s in data["bucket"].items()}
            plan = None if data["plan"] is None else Plan.from_dict(data["plan"])
            found.append(
                Learned(
                    bucket,
                    plan,
                    str(data.get("label", "")),
                    _number(data.get("plan_ms")),
                    _number(data.get("alone_ms")),
                    str(data.get("state", "")),
                )
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, FerryError):
            continue
    return found


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
