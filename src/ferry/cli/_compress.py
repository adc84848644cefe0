"""``ferry compress``: prune, distill and quantize in one recipe, each stage measured, or refused."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ferry.cli._common import (
    EXIT_REFUSED,
    console,
    image_data_options,
    image_preprocessing,
    show_report,
)
from ferry.errors import InvalidInputError


@click.command("compress")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ONNX file to write.",
)
@click.option(
    "--recipe",
    required=True,
    help="Stages in order, e.g. prune:channel=0.3,distill:epochs=5,quantize:int8.",
)
@click.option(
    "--data",
    required=True,
    type=click.Path(path_type=Path),
    help="Real samples (.npz, .npy or a folder of images with --image-size); unlabeled is "
    "enough. A quarter judges every stage, the rest trains and calibrates.",
)
@click.option(
    "--target",
    type=click.Choice(["onnxruntime", "openvino", "tensorrt", "tflite", "portable"]),
    default="onnxruntime",
    show_default=True,
    help="The engine the result is for: quantization's rules, and where stages are timed.",
)
@click.option(
    "--metric",
    default=None,
    help="top1, cosine, mask, mask@THRESHOLD, seq, or module:function (default: the judge the "
    "model's outputs call for, named in the report).",
)
@click.option(
    "--budget",
    default="1%",
    show_default=True,
    help="How much of the metric the end result may lose against MODEL.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Distillation's seed.")
@image_data_options
@click.option("--force", is_flag=True, help="Write the result even when refused.")
@click.option(
    "--report", type=click.Path(dir_okay=False), help="Write the report as JSON ('-': stdout)."
)
def command(
    model: Path,
    output: Path,
    recipe: str,
    data: Path,
    target: str,
    metric: str | None,
    budget: str,
    seed: int,
    image_size: str | None,
    layout: str,
    mean: str | None,
    std: str | None,
    scale: float,
    force: bool,
    report: str | None,
) -> None:
    """Run --recipe's stages on MODEL and write OUTPUT, if within --budget and not slower.

    Each stage is reported: size, MACs, latency on --target's engine against MODEL, and the
    metric against MODEL on held-back samples. Distillation learns from MODEL itself. Refused,
    nothing is written and the exit status is 3; --force writes it. The report is saved beside
    OUTPUT (OUTPUT.compress.json).

    \b
    Recipe stages (options after colons):
      prune:channel=0.3  prune:magnitude=0.5  prune:2:4  (criterion=l1|l2|bn-gamma, exclude=a+b)
      distill:epochs=5   (lr, batch_size, temperature, alpha, max_seconds)
      quantize:int8      quantize:fp16  quantize:bf16  (method, budget, dynamic, per_channel)

    \b
    Examples:
      ferry compress model.onnx -o small.onnx --data calib.npz --metric top1 \\
          --recipe prune:channel=0.3,distill:epochs=5,quantize:int8
      ferry compress cls.onnx -o cls.small.onnx --data photos/ --image-size 224x224 \\
          --recipe prune:channel=0.3,distill:epochs=3 --metric top1 --budget 5%
    """
    from ferry.optimizer import compress

    if model.exists() and output.exists() and output.resolve() == model.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {model}; choose another -o path"
        )
    result = compress(
        model,
        recipe=recipe,
        data=data,
        target=target,
        metric=metric,
        budget=budget,
        seed=seed,
        preprocessing=image_preprocessing(image_size, layout, mean, std, scale),
        force=force,
        progress=report != "-",
    )
    quiet = show_report(result.report, report, {"model": str(model), "output": str(output)})
    if not result.accepted:
        if not quiet:
            console.print(
                f"[bold red]not written[/]: {escape(result.report.refused or '')}. "
                "Use --force to write it anyway."
            )
        raise SystemExit(EXIT_REFUSED)
    written = result.save(output)
    if not quiet:
        console.print(
            f"wrote {escape(str(written))} and {escape(str(written.with_suffix('.compress.json')))}"
        )
