"""Comparing outputs: the one tolerance contract, task-level judges, and the judge a model's task
calls for.

- :func:`compare_outputs` (``_compare``): elementwise, ``|got - want| <= atol + rtol * |want|``,
  the contract every numeric comparison goes through.
- :func:`judge` (``_judges``): does the *task* come out the same? (top-1 class, cosine, mask,
  argmax sequence, matched boxes, labels).
- :func:`within_budget` (``_budget``): what a reduced-precision or re-placed configuration may
  lose, as judge specs applied per output.
- :func:`infer_judge` (``_infer``): the judge a model's outputs and graph tail call for, when
  the user named none (a classifier's top-1, a CTC recognizer's argmax sequence, a segmenter's
  per-pixel class, a detector's boxes, an encoder's cosine).
"""

from __future__ import annotations

from ferry.parity._budget import (
    DEFAULT_BUDGET,
    Budget,
    BudgetVerdict,
    parse_budget,
    within_budget,
)
from ferry.parity._compare import (
    OutputParity,
    ParityReport,
    Tolerance,
    compare_outputs,
    default_tolerance,
)
from ferry.parity._infer import default_budget, infer_judge, task_judge_at
from ferry.parity._judges import JUDGE_KINDS, Judge, Judgement, judge

__all__ = [
    "DEFAULT_BUDGET",
    "JUDGE_KINDS",
    "Budget",
    "BudgetVerdict",
    "Judge",
    "Judgement",
    "OutputParity",
    "ParityReport",
    "Tolerance",
    "compare_outputs",
    "default_budget",
    "default_tolerance",
    "infer_judge",
    "judge",
    "parse_budget",
    "task_judge_at",
    "within_budget",
]
