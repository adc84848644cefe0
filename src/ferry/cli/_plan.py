"""``ferry plan``: how a model splits across engines, why, and whether each piece computes right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import (
    build_feeds,
    console,
    input_options,
    model_argument,
    parse_tolerance,
    run_feeds,
    split_pairs,
    write_json,
)


@click.command("plan")
@model_argument
@click.option(
    "--backends",
    default="onnxruntime",
    show_default=True,
    metavar="NAMES|auto",
    help="Engines in priority order, comma-separated; 'auto' measures each engine at each "
    "precision (and their split plans) at the sizes you give and picks the fastest within the "
    "accuracy budget.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Show every node's placement and why other engines did not take it.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the plan (and what --explain/--verify found) as JSON.",
)
@click.option(
    "--verify",
    is_flag=True,
    help="Run each partition on its engine against ONNX Runtime; bisect a failing one to its first diverging node.",
)
@click.option(
    "--tolerance",
    metavar="ATOL[,RTOL]",
    help="Element tolerance for --verify (default: by dtype).",
)
@click.option(
    "--accuracy",
    metavar="BUDGET",
    help="Judge by an accuracy budget instead of the element tolerance: --verify judges each "
    "partition, auto each candidate, e.g. cosine=0.9995,top1=0.98 (measures: cosine, top1 or "
    "argmax, mask@THRESHOLD), or 'default' (cosine=0.999,top1=0.99, which auto uses unless told).",
)
@click.option(
    "--min-partition-size",
    type=click.IntRange(min=1),
    default=None,
    help="Smallest partition worth handing to an engine.",
)
@click.option(
    "--force-cpu",
    multiple=True,
    metavar="OP|NODE",
    help="Keep this op type or node on ONNX Runtime (repeatable).",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0.1),
    default=20.0,
    show_default=True,
    help="Seconds auto spends timing candidates.",
)
@click.option("--exact", is_flag=True, help="auto: consider fp32 configurations only.")
@click.option(
    "--remeasure",
    is_flag=True,
    help="auto: measure again, ignoring (and replacing) the cached choice.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Save the plan as JSON (ferry.load(model, plan=Plan.load(path))).",
)
@input_options
def command(
    model: Path,
    backends: str,
    explain: bool,
    as_json: bool,
    verify: bool,
    tolerance: str | None,
    accuracy: str | None,
    min_partition_size: int | None,
    force_cpu: tuple[str, ...],
    budget: float,
    exact: bool,
    remeasure: bool,
    output: Path | None,
    input_files: tuple[str, ...],
    shapes: tuple[str, ...],
    seed: int,
) -> None:
    """Partition MODEL across engines and show the plan.

    \b
    Examples:
      ferry plan model.onnx --backends openvino,onnxruntime --explain
      ferry plan model.onnx --backends openvino --force-cpu Softmax --verify
      ferry plan model.onnx --backends auto --shape x=1,3,640,640 -o plan.json
    """
    from ferry.backends import DEFAULT_MIN_PARTITION_SIZE
    from ferry.graph import load_model, prepare
    from ferry.runtime import load, make_plan

    work = prepare(load_model(model))
    tol = parse_tolerance(tolerance)
    budget_specs = _budget(accuracy)
    result: dict[str, Any] = {}
    session = load(work)
    auto = backends.strip() == "auto"
    if tolerance is not None and not verify:
        raise click.UsageError("--tolerance is for --verify (auto judges by --accuracy)")
    if accuracy is not None and not (verify or auto):
        raise click.UsageError("--accuracy is for --verify and --backends auto")
    auto_shapes = None
    if auto:
        feeds, auto_shapes, how = _auto_inputs(session, model, input_files, shapes, seed)
    else:
        if exact or remeasure:
            raise click.UsageError("--exact and --remeasure are for --backends auto")
        feeds, how = build_feeds(session, input_files, shapes, seed, random=True)
        run_feeds(session, feeds, how)  # fail here, saying which sizes to give, not mid-plan
    if how:
        result["inputs_found"] = how
        if not as_json:
            console.print(f"inputs: {escape(how)}")
    made = make_plan(
        work,
        backends,
        force_cpu=force_cpu,
        min_partition_size=min_partition_size or DEFAULT_MIN_PARTITION_SIZE,
        feeds=feeds if auto_shapes is None else None,
        shapes=auto_shapes,
        accuracy=budget_specs,
        exact=exact,
        remeasure=remeasure,
        budget_s=budget,
        explain_placement=True,
    )
    plan, report = made.plan, made.report
    if made.auto is not None:
        result["auto"] = made.auto.to_dict()
        if not as_json:
            _print_auto(made.auto)
    result["plan"] = plan.to_dict()
    cost = None
    if report is not None:
        cost = report.cost({name: list(np.shape(a)) for name, a in feeds.items()})
        result["boundary_bytes"] = cost.boundary_bytes
        result["cost"] = cost.to_dict()
        if explain:
            result["nodes"] = [
                {
                    "node": v.node,
                    "op": v.op_type,
                    "backend": v.backend,
                    "partition": v.partition,
                    "reasons": dict(v.reasons),
                    "note": v.note,
                }
                for v in report.nodes
            ]
    if not as_json:
        _print_plan(plan, report, cost, explain)
    if verify:
        from ferry.runtime import verify_plan

        checks = verify_plan(work, plan, feeds, tolerance=tol, budget=budget_specs)
        result["verify"] = [c.to_dict() for c in checks]
        if not as_json:
            _print_checks(checks)
    if output is not None:
        plan.save(output)
        if not as_json:
            console.print(f"saved the plan to {escape(str(output))}")
    if as_json:
        write_json(result, "-")
    if verify and not all(c["passed"] for c in result["verify"]):
        from ferry.errors import ExecutionError

        raise ExecutionError(
            "verification failed: a partition does not match ONNX Runtime (see above)"
        )


def _auto_inputs(
    session: Any, model: Path, input_files: tuple[str, ...], shapes: tuple[str, ...], seed: int
) -> tuple[dict[str, Any], dict[str, tuple[int, ...]] | None, str]:
    """What auto measures at: the ``--input`` files (found data at the ``--shape`` sizes for
    inputs without one), or, given no files, the sizes: ``--shape``, else those saved in the
    artifact, else sizes found to run (:func:`ferry.runtime.found_inputs`; an error naming the
    dims to give when none does). Returns the feeds (for --verify too), the sizes when no
    file was given, and how the generated inputs were found (empty when none were)."""
    from ferry.graph import resolve_model_file
    from ferry.runtime import artifact_shapes, found_inputs, load_npy, parse_shape

    files = split_pairs(input_files, "--input")
    names = {s.name for s in session.inputs}
    unknown = sorted(set(files) - names)
    if unknown:
        raise click.UsageError(f"--input names unknown input {', '.join(map(repr, unknown))}")
    feeds = {name: load_npy(path, name) for name, path in files.items()}
    sizes = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    if not feeds and not sizes:
        sizes = dict(artifact_shapes(resolve_model_file(model)) or {})
    rest = [s for s in session.inputs if s.name not in feeds]
    how = ""
    if rest:
        found = found_inputs(
            session, {k: v for k, v in sizes.items() if k not in feeds}, given=feeds, seed=seed
        )
        feeds.update({s.name: found.feeds[s.name] for s in rest})
        sizes = dict(found.shapes)
        how = found.how
    return feeds, (None if files else sizes), how


def _budget(text: str | None) -> list[dict[str, Any]] | None:
    from ferry.parity import DEFAULT_BUDGET, parse_budget

    if text is None:
        return None
    if text.strip() == "default":
        return [dict(spec) for spec in DEFAULT_BUDGET]
    return parse_budget(text)


def _print_plan(plan: Any, report: Any, cost: Any, explain: bool) -> None:
    table = Table("#", "backend", "nodes", "ops", "inputs", "outputs", box=None)
    for index, p in enumerate(plan.partitions):
        ops = _op_summary(report, p) if report is not None else ""
        table.add_row(
            str(index),
            p.backend,
            str(len(p.nodes)),
            escape(ops),
            escape(_names(p.inputs)),
            escape(_names(p.outputs)),
        )
    console.print(table)
    if cost is not None:
        at = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in cost.shapes.items())
        console.print(f"cost: {escape(cost.summary())}" + (f" at {escape(at)}" if at else ""))
        for warning in cost.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if explain and report is not None:
        nodes = Table("node", "op", "runs on", "why not elsewhere", box=None)
        for v in report.nodes:
            why = "; ".join(f"{name}: {reason}" for name, reason in v.reasons.items())
            if v.note:
                why = f"{why}; {v.note}" if why else v.note
            nodes.add_row(
                escape(v.node), escape(v.op_type), f"{v.backend} #{v.partition}", escape(why)
            )
        console.print(nodes)


def _op_summary(report: Any, partition: Any) -> str:
    members = set(partition.nodes)
    counts: dict[str, int] = {}
    for v in report.nodes:
        if v.node in members:
            counts[v.op_type] = counts.get(v.op_type, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:4]
    more = "" if len(counts) <= 4 else ", ..."
    return ", ".join(f"{op} x{n}" for op, n in top) + more


def _names(names: tuple[str, ...], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "") if names else "-"


def _print_auto(choice: Any) -> None:
    at = ", ".join(f"{name}={'x'.join(map(str, dims))}" for name, dims in choice.inputs.items())
    table = Table(
        "candidate", "partitions", "latency ms", "noise", "speedup", "accuracy", "ok", "", box=None
    )
    for row in choice.table:
        accuracy = row["accuracy"]
        table.add_row(
            escape(row["label"]),
            str(row["partitions"]),
            "-" if row["latency_ms"] is None else f"{row['latency_ms']:.3f}",
            "-" if row.get("noise") is None else f"±{row['noise']:.1%}",
            "-" if row["speedup"] is None else f"{row['speedup']:.2f}x",
            "-" if accuracy is None else f"{accuracy['worst']:.6g}",
            "error" if row["error"] else ("yes" if row["passed"] else "NO"),
            "<- chosen" if row["label"] == choice.label else "",
        )
    how = "cached choice, measured" if choice.from_cache else "measured"
    if choice.random_inputs:
        how += " on random data"
    console.print(
        f"auto: {how} at {escape(at) or 'no inputs'}; speedup vs ONNX Runtime fp32, "
        "accuracy: the worst judge score against it"
    )
    if choice.judge:
        console.print(f"auto: {escape(choice.judge)}")
    console.print(table)
    for row in choice.table:
        if row["error"]:
            console.print(f"{escape(row['label'])}: {escape(row['error'])}")
        elif row["accuracy"] is not None and not row["accuracy"]["passed"]:
            failed = [j for j in row["accuracy"]["judgements"] if not j["passed"]]
            why = "; ".join(f"{j['output']}: {j['detail']}" for j in failed)
            console.print(f"{escape(row['label'])}: outside the accuracy budget: {escape(why)}")
    if choice.random_inputs:
        console.print(
            "auto: judged on random data, which says little about reduced precisions on real "
            "inputs: give real ones with --input NAME=FILE.npy"
        )
    if choice.cache_path is not None:
        hint = " (--remeasure to measure again)" if choice.from_cache else ""
        console.print(
            f"auto: chose {escape(choice.label)}; table saved in "
            f"{escape(str(choice.cache_path))}{hint}"
        )
    else:
        console.print(f"auto: chose {escape(choice.label)}")


def _print_checks(checks: list[Any]) -> None:
    judged = any(c.accuracy is not None for c in checks)
    columns = ["#", "backend", "nodes", "max abs err"]
    columns += ["accuracy"] if judged else []
    table = Table(*columns, "ok", "first diverging node", box=None)
    for c in checks:
        worst = max((o.max_abs_error for o in c.outputs), default=0.0)
        bad = f"{c.first_bad_node} ({c.first_bad_op})" if c.first_bad_node else (c.error or "")
        row = [str(c.index), c.backend, str(c.nodes), f"{worst:.3g}" if c.outputs else "-"]
        if judged:
            row.append("-" if c.accuracy is None else f"{c.accuracy.worst:.6g}")
        table.add_row(*row, "yes" if c.passed else "NO", escape(bad))
    console.print(table)
    for c in checks:
        if c.accuracy is not None and not c.accuracy.passed:
            console.print(f"partition {c.index}: {escape(c.accuracy.summary())}")
