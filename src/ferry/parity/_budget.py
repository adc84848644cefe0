"""Accuracy budgets: what a reduced-precision or re-placed configuration may lose against its
reference, as judge specs (:func:`ferry.parity.judge`) applied per output."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry._state_names import STATE_OUTPUT_PREFIX
from ferry.errors import InvalidInputError
from ferry.parity._compare import compare_outputs
from ferry.parity._judges import Judgement, judge

__all__ = ["DEFAULT_BUDGET", "Budget", "BudgetVerdict", "parse_budget", "within_budget"]
# Accuracy budgets: what a reduced-precision or re-placed configuration may lose


#: The default budget: every output keeps a cosine similarity of at least 0.999 to the reference,
#: and the argmax over its last axis (a classifier's top-1, a sequence's tokens) agrees at 99%
#: of the positions.
DEFAULT_BUDGET: tuple[dict[str, Any], ...] = (
    {"kind": "cosine", "min": 0.999},
    {"kind": "argmax_seq", "min_agreement": 0.99},
)


@dataclasses.dataclass(frozen=True)
class BudgetVerdict:
    """How a configuration's outputs fared against a budget: every judgement, and whether all
    passed. ``worst`` is the lowest score (the figure tables show)."""

    judgements: tuple[Judgement, ...]

    @property
    def passed(self) -> bool:
        return all(j.passed for j in self.judgements)

    @property
    def worst(self) -> float:
        return min((j.score for j in self.judgements), default=1.0)

    def summary(self) -> str:
        failed = [j for j in self.judgements if not j.passed]
        if not failed:
            return f"within budget (worst score {self.worst:.6g})"
        return "outside budget: " + "; ".join(f"{j.output}: {j.detail}" for j in failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "worst": self.worst,
            "judgements": [j.to_dict() for j in self.judgements],
        }


#: A budget: judge specs (see :func:`judge`), one spec, or a function ``(got, want) -> bool |
#: float`` judged per output (a score passes at >= 1 for bools, else at >= its ``min``).
Budget = Sequence[Mapping[str, Any]] | Mapping[str, Any] | Callable[..., Any]


def parse_budget(text: str) -> list[dict[str, Any]]:
    """``--accuracy`` text as judge specs: ``"cosine=0.9995,top1=0.98"``; ``top1`` and ``argmax``
    are the argmax agreement over the last axis, ``cosine`` the similarity, ``mask@0.5=0.99``
    the agreement of the masks at that threshold.

    Raises:
        InvalidInputError: an unknown kind or a value that is not a number in [0, 1].
    """
    specs: list[dict[str, Any]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, sep, value = item.partition("=")
        try:
            least = float(value) if sep else None
        except ValueError:
            least = -1.0
        if least is not None and not 0.0 <= least <= 1.0:
            raise InvalidInputError(f"--accuracy {item!r}: the value must be a number in [0, 1]")
        kind = kind.strip()
        if kind == "cosine":
            specs.append({"kind": "cosine", "min": 0.999 if least is None else least})
        elif kind in ("top1", "argmax", "argmax_seq"):
            specs.append({"kind": "argmax_seq", "min_agreement": 0.99 if least is None else least})
        elif kind.startswith("mask@"):
            try:
                threshold = float(kind.removeprefix("mask@"))
            except ValueError:
                raise InvalidInputError(
                    f"--accuracy {item!r}: mask@THRESHOLD needs a number"
                ) from None
            specs.append(
                {
                    "kind": "mask",
                    "threshold": threshold,
                    "min_agreement": 0.99 if least is None else least,
                }
            )
        else:
            raise InvalidInputError(
                f"--accuracy {item!r}: unknown measure {kind!r}; use cosine, top1 (or argmax) "
                "and mask@THRESHOLD, each =MIN, e.g. cosine=0.999,top1=0.99"
            )
    if not specs:
        raise InvalidInputError("--accuracy is empty; e.g. cosine=0.999,top1=0.99")
    return specs


def within_budget(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], budget: Budget | None = None
) -> BudgetVerdict:
    """Judge ``got`` against the reference ``want`` with every judge of ``budget`` (default
    :data:`DEFAULT_BUDGET`). Floats and small integers (8- and 16-bit: quantized values, whose
    last bit may round either way across engines) are judged; wider integers, booleans and
    strings (labels, ids, masks) must be equal. The argmax measures apply only where the last
    axis has two or more entries, and not to recurrent state (``state_out:*`` outputs: the
    values carried to the next call, not scores; their cosine is judged).

    A spec naming its ``output`` (as :func:`ferry.parity.infer_judge` gives them) judges that
    output alone, with the outputs it reads (a ``boxes`` judge's scores and labels); when every
    spec names one, the outputs none names are not judged (an auxiliary output, recurrent state:
    the inferred judge said why).
    """
    if callable(budget):
        specs: list[Mapping[str, Any]] = [{"kind": "custom", "function": budget}]
    elif budget is None:
        specs = list(DEFAULT_BUDGET)
    elif isinstance(budget, Mapping):
        specs = [budget]
    else:
        specs = list(budget)
    judgements: list[Judgement] = []
    named = [spec for spec in specs if spec.get("output") is not None]
    for spec in named:
        judgements.extend(judge(spec)(got, want))
    specs = [spec for spec in specs if spec.get("output") is None]
    for name in got if specs else ():
        g, w = np.asarray(got[name]), np.asarray(want[name])
        quantized = g.dtype.kind in "iu" and g.dtype.itemsize <= 2
        if g.dtype.kind not in "fc" and g.dtype.name != "bfloat16" and not quantized:
            report = compare_outputs({name: g}, {name: w}, strict=False)
            (out,) = report.outputs
            score = 1.0 - out.mismatched / max(g.size, 1)
            judgements.append(Judgement("exact", name, score, 1.0, out.passed, out.describe()))
            continue
        for spec in specs:
            argmax = spec.get("kind") in ("argmax_seq", "top1")
            if argmax and (g.ndim == 0 or g.shape[-1] < 2 or name.startswith(STATE_OUTPUT_PREFIX)):
                continue
            judgements.extend(judge({**spec, "output": name})({name: g}, {name: w}))
    return BudgetVerdict(tuple(judgements))
