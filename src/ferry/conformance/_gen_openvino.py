"""The OpenVINO rule generator: ONNX's node test cases run through ferry's OpenVINO adapter, as rules.

It writes ``ferry/backends/_openvino_rules.py``: the ops OpenVINO's CPU plugin runs correctly,
with the opsets, input and output dtypes, constant inputs and dynamic-dim support under which it
does. Every form of every single-node case (:mod:`~ferry.conformance._openvino_forms`) runs in
the room's crash-isolated pool; rules are derived from the verdicts and every claim is checked
against them (:mod:`~ferry.conformance._openvino_derive`). When a form the derived rules accept
failed, there is no table (and nothing is written). Run it after upgrading openvino or onnx (it takes hours)::

    python -m ferry.conformance rules openvino [--jobs 2] [--results runs.json] [--reuse runs.json]
    ruff format src/ferry/backends/_openvino_rules.py

(``--op Relu --out -`` runs one op's forms and prints the partial table: a smoke run.)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ferry.conformance._cases import ConformanceCase
from ferry.conformance._openvino_derive import derive, emit, observe, verify
from ferry.conformance._openvino_forms import Form, forms_of, run_form, single_node_cases
from ferry.conformance._pool import Lost, WorkerPool

__all__ = ["JOB_TIMEOUT", "regenerate", "run_all"]

logger = logging.getLogger(__name__)

#: Seconds one form may take before its worker is killed and the form counted as a timeout.
JOB_TIMEOUT = 120.0
#: Seconds between progress lines.
_PROGRESS_EVERY = 30.0


def run_all(
    cases: list[ConformanceCase], forms: dict[int, Form], workers: int
) -> dict[int, dict[str, Any]]:
    """Run forms in worker processes; a worker that dies or hangs costs only its form.

    Args:
        cases: the cases the forms index.
        forms: the forms to run, by key (their index in the list of every form).
        workers: worker processes (0: in this process, for debugging).

    Returns:
        Each form's verdict by key (``crash`` or ``timeout`` for a form whose worker was lost).
    """
    keys = list(forms)
    tasks = [(cases[forms[key].case], forms[key]) for key in keys]
    pool = WorkerPool(
        _run_task,
        size=workers,
        timeout=JOB_TIMEOUT,
        label="OpenVINO rule generator worker",
        quiet=True,
    )
    done: dict[int, dict[str, Any]] = {}
    last_report = time.monotonic()
    for position, outcome in pool.run(tasks):
        done[keys[position]] = {"verdict": outcome.kind} if isinstance(outcome, Lost) else outcome
        if time.monotonic() - last_report > _PROGRESS_EVERY:
            last_report = time.monotonic()
            logger.info("  %d/%d forms run", len(done), len(tasks))
    return done


def _run_task(state: None, task: tuple[ConformanceCase, Form]) -> dict[str, Any]:
    """Run one form; a bug in the harness or an escape from the engine is an ``error`` verdict."""
    case, form = task
    try:
        return run_form(case, form)
    except Exception as e:
        return {"verdict": "error", "why": f"{type(e).__name__}: {str(e)[:300]}"}


def regenerate(
    *,
    jobs: int = 2,
    results: Path | None = None,
    reuse: Path | None = None,
    rerun: Collection[str] = (),
    ops: Collection[str] | None = None,
) -> tuple[int, str | None]:
    """Run (or reload) every form, derive the rules and check them: the table's source.

    Args:
        jobs: worker processes.
        results: save every form's verdict here (JSON).
        reuse: derive from verdicts saved by an earlier ``results`` instead of running.
        rerun: with ``reuse``: run these op types' forms again.
        ops: only these op types' forms (a smoke run); None: every op.

    Returns:
        ``(status, text)``: 0 and the table's source, or 1 and None when a form the derived
        rules accept failed (the problems are logged).
    """
    import onnx
    import openvino

    cases = single_node_cases()
    every = forms_of(cases)

    def of(wanted: Collection[str] | None) -> dict[int, Form]:
        return {
            k: f
            for k, f in enumerate(every)
            if wanted is None or cases[f.case].model.graph.node[0].op_type in wanted
        }

    forms = of(ops)
    if reuse is not None:
        saved = json.loads(reuse.read_text())
        done = {int(k): v for k, v in saved["verdicts"].items() if int(k) in forms}
        if rerun:
            again = {k: f for k, f in of(set(rerun)).items() if k in forms}
            logger.info("running %d forms of %s again", len(again), sorted(rerun))
            done.update(run_all(cases, again, jobs))
    else:
        logger.info("%d single-node cases, %d forms, %d workers", len(cases), len(forms), jobs)
        start = time.monotonic()
        done = run_all(cases, forms, jobs)
        logger.info("ran in %.0f s", time.monotonic() - start)
    if results is not None:
        saved_forms = [dataclasses.asdict(f) | {"name": cases[f.case].name} for f in every]
        results.write_text(json.dumps({"verdicts": done, "forms": saved_forms}, indent=0))
    observations = [
        ob
        for key, form in forms.items()
        if (ob := observe(cases[form.case], form, done[key])) is not None
    ]
    max_opset = onnx.defs.onnx_opset_version()
    rules, excluded = derive(observations, max_opset)
    ran = sum(1 for r in done.values() if r["verdict"] not in ("absent",))
    passed = sum(1 for r in done.values() if r["verdict"] == "pass")
    claimed = len({(r.get("domain", ""), r["op"]) for r in rules})
    summary = (
        f"\nopenvino {openvino.__version__}, onnx {onnx.__version__} (opset {max_opset}): "
        f"{len(cases)} single-node test cases,\n{ran} forms run, {passed} passed; "
        f"{claimed} ops claimed in {len(rules)} rules, {len(excluded)} ops with cases left out."
    )
    problems, gaps = verify(cases, forms=every, done=done, rules=rules)
    if problems:
        logger.error("%d failing forms are accepted by the derived rules:", len(problems))
        for problem in problems:
            logger.error("  %s", problem)
        return 1, None
    logger.info("%s", summary.strip())
    return 0, emit(rules, excluded, summary, gaps)
