"""``ferry prune``: remove channels (smaller, faster), or zero weights (magnitude, 2:4)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ferry.cli._common import console, show_report
from ferry.errors import InvalidInputError


@click.command("prune")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="ONNX file to write.",
)
@click.option(
    "--method",
    type=click.Choice(["channel", "magnitude", "2:4"]),
    default="channel",
    show_default=True,
    help="channel: remove whole channels (smaller and faster); magnitude: zero the smallest "
    "weights (smaller once compressed); 2:4: two of every four input-channel weights zeroed "
    "(faster on TensorRT's sparse kernels).",
)
@click.option(
    "--sparsity",
    type=float,
    default=0.5,
    show_default=True,
    help="Fraction removed, in [0, 1) (2:4 takes 0.5).",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="NODE",
    help="A node left alone (its channels kept, its weights untouched); repeat for more.",
)
@click.option(
    "--criterion",
    type=click.Choice(["l1", "l2", "bn-gamma"]),
    default="l1",
    show_default=True,
    help="How channels are ranked: their filters' norm, or their BatchNorm's |scale|.",
)
@click.option(
    "--multiple",
    type=click.IntRange(min=1),
    default=None,
    help="Keep channel counts a multiple of this (default: this CPU's channel block, 16 with "
    "AVX-512, else 8); 1 keeps exactly 1 - sparsity.",
)
@click.option(
    "--report", type=click.Path(dir_okay=False), help="Write the report as JSON ('-': stdout)."
)
def command(
    model: Path,
    output: Path,
    method: str,
    sparsity: float,
    exclude: tuple[str, ...],
    criterion: str,
    multiple: int | None,
    report: str | None,
) -> None:
    """Prune MODEL and write OUTPUT: a valid model, checked in ONNX Runtime.

    Channel pruning removes the weakest channels of each group of layers that must shrink
    together (a conv, its BatchNorm and activation, residual partners, the next layer's inputs);
    groups that reach an output or a shape the graph pins are kept, and the report says why.
    Accuracy drops: win it back with `ferry distill` from the original.

    \b
    Examples:
      ferry prune model.onnx -o model.pruned.onnx --sparsity 0.3
      ferry prune model.onnx -o model.pruned.onnx --sparsity 0.5 --criterion bn-gamma --exclude conv1
      ferry prune model.onnx -o model.24.onnx --method 2:4
    """
    from ferry.graph import save_model
    from ferry.optimizer.prune import prune

    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {model}; choose another -o path"
        )
    result = prune(
        model,
        method=method,
        sparsity=sparsity,
        exclude=list(exclude),
        criterion=criterion,
        multiple=multiple,
    )
    quiet = show_report(result.report, report, {"model": str(model), "output": str(output)})
    written = save_model(result.model, output)
    if not quiet:
        console.print(f"wrote {escape(str(written))}")
