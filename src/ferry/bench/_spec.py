"""What ``ferry bench`` is asked to measure: the :class:`BenchSpec` (validated, and carried as JSON
to a child process or a remote agent) and the :class:`Target` engine setups it names, the
ONNX Runtime fp32 baseline always among them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.errors import BackendUnavailableError, InvalidInputError

if TYPE_CHECKING:
    from ferry.plan import Plan
    from ferry.runtime import Session

__all__ = ["BASELINE", "BenchSpec", "Progress", "Target", "resolve_targets"]

#: The configuration every other one is compared with.
BASELINE = ("onnxruntime", "fp32")
_AUTO = "auto"

#: Progress callback: ``(stage, done, total)``; stage is a short description of what runs now.
Progress = Callable[[str, float, float], None]


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """What to measure. Everything but the input arrays: it travels to an agent as JSON.

    Attributes:
        backends: engines to compare (``"auto"`` too); ONNX Runtime fp32 is added as the baseline.
        precisions: precisions to run each engine in; None: every precision it offers.
        batches: batch sizes; None: the batch the inputs have.
        threads: intra-op threads for every engine; None: the engine's default (all cores).
        warmup: untimed calls per configuration before timing.
        iterations: timed calls per configuration.
        duration_s: seconds of timed calls per configuration (with ``iterations``: whichever
            comes first).
        shapes: shapes of generated inputs, for symbolic dims (the batch dim is set by
            ``batches`` when given).
        seed: seed of generated inputs.
        isolate: measure cold start and peak memory in a fresh process per target.
        force_cpu: op types or node names kept on ONNX Runtime when partitioning.
        accuracy: the accuracy budget every configuration is judged by against ONNX Runtime
            fp32: judge specs (:func:`ferry.parity.judge`, e.g. from
            :func:`ferry.parity.parse_budget`; ``custom`` cannot travel as JSON); None:
            :data:`ferry.parity.DEFAULT_BUDGET`.
    """

    backends: tuple[str, ...] = ("onnxruntime",)
    precisions: tuple[str, ...] | None = None
    batches: tuple[int, ...] | None = None
    threads: int | None = None
    warmup: int = 10
    iterations: int | None = 100
    duration_s: float | None = None
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    isolate: bool = True
    force_cpu: tuple[str, ...] = ()
    accuracy: tuple[Mapping[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise InvalidInputError naming the first field that is wrong."""
        if not self.backends or not all(isinstance(b, str) and b.strip() for b in self.backends):
            raise InvalidInputError("backends: name at least one engine, e.g. onnxruntime")
        if self.precisions is not None and (
            not self.precisions or not all(isinstance(p, str) and p for p in self.precisions)
        ):
            raise InvalidInputError("precisions: give at least one, e.g. fp32")
        if self.batches is not None and (
            not self.batches or not all(_is_int(b) and b >= 1 for b in self.batches)
        ):
            raise InvalidInputError(
                f"batches must be positive integers, e.g. 1,8; got {self.batches!r}"
            )
        if self.threads is not None and not (_is_int(self.threads) and self.threads >= 1):
            raise InvalidInputError(f"threads must be a positive integer, got {self.threads!r}")
        if not (_is_int(self.warmup) and self.warmup >= 0):
            raise InvalidInputError(f"warmup must be 0 or more, got {self.warmup!r}")
        if self.iterations is None and self.duration_s is None:
            raise InvalidInputError("give iterations, duration_s or both")
        if self.iterations is not None and not (_is_int(self.iterations) and self.iterations >= 1):
            raise InvalidInputError(f"iterations must be 1 or more, got {self.iterations!r}")
        if self.duration_s is not None and not (
            isinstance(self.duration_s, (int, float))
            and not isinstance(self.duration_s, bool)
            and math.isfinite(self.duration_s)
            and self.duration_s > 0
        ):
            raise InvalidInputError(f"duration_s must be positive, got {self.duration_s!r}")
        for name, dims in self.shapes.items():
            if not isinstance(name, str) or not all(_is_int(d) and d >= 0 for d in dims):
                raise InvalidInputError(f"shapes: bad shape {dims!r} for input {name!r}")
        if not _is_int(self.seed):
            raise InvalidInputError(f"seed must be an integer, got {self.seed!r}")
        if self.accuracy is not None:
            _check_budget(self.accuracy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": list(self.backends),
            "precisions": None if self.precisions is None else list(self.precisions),
            "batches": None if self.batches is None else list(self.batches),
            "threads": self.threads,
            "warmup": self.warmup,
            "iterations": self.iterations,
            "duration_s": self.duration_s,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "seed": self.seed,
            "isolate": self.isolate,
            "force_cpu": list(self.force_cpu),
            # Only when given: an agent of an older ferry refuses keys it does not know.
            **({} if self.accuracy is None else {"accuracy": [dict(a) for a in self.accuracy]}),
        }

    @classmethod
    def from_dict(cls, data: Any) -> BenchSpec:
        """The spec a JSON object describes (keys as :meth:`to_dict` writes; all optional).

        Raises:
            InvalidInputError: not an object, an unknown key, or a value of the wrong type.
        """
        if not isinstance(data, dict):
            raise InvalidInputError("the bench spec must be a JSON object")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InvalidInputError(
                f"unknown bench spec key {', '.join(map(repr, unknown))}; "
                f"known keys: {', '.join(sorted(fields))}"
            )
        kw: dict[str, Any] = {}
        try:
            for key in ("backends", "precisions", "force_cpu"):
                if data.get(key) is not None:
                    value = data[key]
                    if isinstance(value, str) or not isinstance(value, list):
                        raise TypeError(f"{key} must be a list of strings")
                    kw[key] = tuple(str(v) for v in value)
            if data.get("batches") is not None:
                if not isinstance(data["batches"], list):
                    raise TypeError("batches must be a list of integers")
                kw["batches"] = tuple(data["batches"])
            if "shapes" in data:
                if not isinstance(data["shapes"], dict):
                    raise TypeError("shapes must map input names to lists of dims")
                kw["shapes"] = {str(k): tuple(v) for k, v in data["shapes"].items()}
            if data.get("accuracy") is not None:
                value = data["accuracy"]
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    raise TypeError(
                        'accuracy must be a list of judge specs, e.g. [{"kind": "cosine", '
                        '"min": 0.999}]'
                    )
                kw["accuracy"] = tuple(dict(v) for v in value)
            for key in ("threads", "warmup", "iterations", "duration_s", "seed", "isolate"):
                if key in data:
                    kw[key] = data[key]
        except TypeError as e:
            raise InvalidInputError(f"bad bench spec: {e}") from e
        if "isolate" in kw and not isinstance(kw["isolate"], bool):
            raise InvalidInputError("isolate must be true or false")
        if "iterations" not in kw and kw.get("duration_s") is not None:
            kw["iterations"] = None
        return cls(**kw)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_budget(specs: Any) -> None:
    """Refuse a budget that is not judge specs that travel as JSON, naming what is wrong."""
    from ferry.parity import judge

    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence) or not specs:
        raise InvalidInputError(
            "accuracy: give judge specs, e.g. ({'kind': 'cosine', 'min': 0.999},), or None for "
            "the default budget"
        )
    for spec in specs:
        if not isinstance(spec, Mapping):
            raise InvalidInputError(f"accuracy: each judge spec must be a mapping, got {spec!r}")
        if spec.get("kind") == "custom":
            raise InvalidInputError(
                "accuracy: a 'custom' judge (a function) cannot travel as JSON; use cosine, "
                "top1, argmax_seq or mask"
            )
        judge(spec)  # an unknown kind or setting names the known ones
        try:
            json.dumps(dict(spec), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"accuracy: judge spec {spec!r} is not plain JSON: {e}") from e


@dataclasses.dataclass
class Target:
    """An engine setup to measure: backend and precision, its plan, or why it cannot run."""

    backend: str
    precision: str
    baseline: bool = False
    requested: bool = True
    plan: Plan | None = None
    chosen: str | None = None
    note: str | None = None
    error: str | None = None
    cold_start_s: float | None = None
    first_run_ms: float | None = None
    warm_start_s: float | None = None
    rss_before_load_mb: float | None = None
    peak_rss_mb: dict[int, float | None] = dataclasses.field(default_factory=dict)
    accuracy: dict[str, Any] | None = None
    session: Session | None = None

    @property
    def label(self) -> str:
        return _AUTO if self.backend == _AUTO else f"{self.backend} {self.precision}"


def resolve_targets(spec: BenchSpec) -> list[Target]:
    """The targets ``spec`` asks for, baseline first, without building anything.

    An engine that is known but not installed here becomes a target with ``error`` set (reported,
    not fatal).

    Raises:
        InvalidInputError: an unknown backend, or a precision that none of the engines asked for
            offers (naming what each offers).
    """
    from ferry.backends import get_backend, known_backends

    targets: list[Target] = []
    offered: dict[str, tuple[str, ...]] = {}
    known = known_backends()
    for name in dict.fromkeys(b.strip() for b in spec.backends):
        if name == _AUTO:
            targets.append(Target(_AUTO, _AUTO))
            continue
        if name not in known:
            raise InvalidInputError(
                f"unknown backend {name!r}; known backends: {', '.join(known)} (or auto)"
            )
        try:
            backend = get_backend(name)
        except BackendUnavailableError as e:
            for precision in spec.precisions or ("fp32",):
                targets.append(Target(name, precision, error=str(e)))
            continue
        offered[name] = tuple(backend.precisions)
        for precision in spec.precisions or backend.precisions:
            if precision in backend.precisions:
                targets.append(Target(name, precision))
    for precision in spec.precisions or ():
        if offered and not any(precision in p for p in offered.values()):
            what = "; ".join(f"{n} offers {', '.join(p)}" for n, p in offered.items())
            raise InvalidInputError(
                f"precision {precision!r} is not offered by "
                f"{'the engine' if len(offered) == 1 else 'any engine'} asked for ({what})"
            )
    baseline = [t for t in targets if (t.backend, t.precision) == BASELINE]
    if baseline:
        baseline[0].baseline = True
        targets.remove(baseline[0])
        targets.insert(0, baseline[0])
    else:
        targets.insert(0, Target(*BASELINE, baseline=True, requested=False))
    return targets
