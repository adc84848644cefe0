"""``ferry optimize``: a model's graph optimized, verified against the input, timed, and reported."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import (
    EXIT_REFUSED,
    console,
    human_bytes,
    human_count,
    split_pairs,
    write_json,
)
from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.optimizer import OptimizeReport


@click.command("optimize")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ONNX file to write.",
)
@click.option(
    "--level",
    type=click.Choice(["basic", "extended"]),
    default="basic",
    show_default=True,
    help="basic: folding, dead code, CSE, cancelling pairs, fusing BatchNorm/bias/pads/affine ops "
    "into neighbours, static shape arithmetic. extended: also Gelu, HardSwish, "
    "LayerNormalization and the target's fused kernels.",
)
@click.option(
    "--target",
    type=click.Choice(["onnxruntime", "openvino", "tensorrt"]),
    default=None,
    help="The engine the model is for: adds its own rules; latency is measured there. "
    "Default: rules valid on every engine, timed on ONNX Runtime.",
)
@click.option(
    "--fix-shapes",
    "fix_shapes",
    multiple=True,
    metavar="NAME=DIMS",
    help="Fix an input's size so shape arithmetic folds, e.g. x=1x3x224x224 (repeatable); the "
    "result then takes only that size.",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DIMS",
    help="Size of an input to verify and time at, e.g. x=1,3,640,640 (the model keeps its "
    "symbolic dims). Default: sizes found by running the model, named in the report.",
)
@click.option(
    "--input",
    "-i",
    "input_files",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="Verify and time with this input instead of random data (repeatable).",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare the outputs with the input model's.",
)
@click.option(
    "--measure/--no-measure",
    default=True,
    show_default=True,
    help="Time both models on the target engine (about 2 s).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write the optimized model even when it fails parity or runs slower.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False),
    help="Write the report as JSON ('-': stdout).",
)
def command(
    model: Path,
    output: Path,
    level: str,
    target: str | None,
    fix_shapes: tuple[str, ...],
    shapes: tuple[str, ...],
    input_files: tuple[str, ...],
    verify: bool,
    measure: bool,
    force: bool,
    report: str | None,
) -> None:
    """Optimize MODEL's graph and write it to OUTPUT, if it computes the same and is no slower.

    The result is compared with MODEL on the same inputs (ONNX Runtime) and timed against it on
    the target engine, at the sizes given or, with none, at sizes found by running MODEL. When it computes something else or runs slower, nothing is written and
    the exit status is 3 (--force writes it anyway). MODEL is never modified; OUTPUT is written
    atomically.

    \b
    Examples:
      ferry optimize model.onnx -o model.opt.onnx
      ferry optimize model.onnx -o model.opt.onnx --level extended --target openvino
      ferry optimize model.onnx -o model.opt.onnx --fix-shapes x=1x3x224x224
      ferry optimize det.onnx -o det.opt.onnx --shape x=1,3,640,640 --input x=page.npy
    """
    from ferry.optimizer import optimize
    from ferry.runtime import load_npy, parse_shape

    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {model}; choose another --output path"
        )
    fixed = {
        k: _dims(v, "--fix-shapes") for k, v in split_pairs(fix_shapes, "--fix-shapes").items()
    }
    sizes = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    inputs = {k: load_npy(v, k) for k, v in split_pairs(input_files, "--input").items()}
    result = optimize(
        model,
        level=level,
        target=target,
        fix_shapes=fixed or None,
        verify=verify,
        measure=measure,
        example_inputs=inputs or None,
        shapes=sizes or None,
        force=force,
    )
    quiet = report == "-"
    if not quiet:
        _print(result.report)
    if report is not None:
        write_json({"model": str(model), "output": str(output), **result.report.to_dict()}, report)
    if not result.accepted:
        if not quiet:
            console.print(
                f"[bold red]not written[/]: {escape(result.report.refused or '')}. "
                "Use --force to write it anyway."
            )
        raise SystemExit(EXIT_REFUSED)
    result.save(output)
    if not quiet:
        console.print(f"wrote {escape(str(output))}")


def _dims(text: str, option: str) -> tuple[int, ...]:
    """``1x3x224x224`` (or ``1,3,224,224``) -> ``(1, 3, 224, 224)``, every size positive."""
    from ferry.runtime import parse_shape

    dims = parse_shape(text)
    if not dims or 0 in dims:
        raise InvalidInputError(
            f"{option} sizes must be positive, such as 1x3x224x224; got {text!r}"
        )
    return dims


def _print(report: OptimizeReport) -> None:
    what = f"level {report.level}" + (f", target {report.target}" if report.target else "")
    if report.fixed_shapes:
        fixed = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in report.fixed_shapes.items())
        what += f", shapes fixed: {fixed}"
    console.print(f"optimized ({escape(what)})")
    table = Table("op", "before", "after", box=None)
    for op, before, after in report.changed_ops():
        table.add_row(escape(op), str(before), str(after))
    table.add_row("[bold]nodes[/]", str(report.nodes_before), str(report.nodes_after))
    table.add_row(
        "parameters", human_count(report.parameters_before), human_count(report.parameters_after)
    )
    table.add_row("size", human_bytes(report.bytes_before), human_bytes(report.bytes_after))
    console.print(table)
    if report.latency is not None:
        console.print(escape(report.latency.summary()))
    console.print(escape(report.parity.summary()))
    if report.forced:
        console.print(f"[yellow]kept although refused[/]: {escape(report.refused or '')}")
