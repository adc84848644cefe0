"""``ferry quantize``: int8, fp16 or bf16 for a target, judged on held-back data, timed, or refused; and
``--check``: where a quantized model breaks a target's rules."""

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


@click.command("quantize")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="ONNX file to write."
)
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    help="Calibration samples: a .npz (one array per input, samples along the first axis), a "
    ".npy (one-input models) or a folder of images (with --image-size). A quarter is held back "
    "for judging.",
)
@click.option(
    "--target",
    type=click.Choice(["onnxruntime", "openvino", "tensorrt", "tflite", "portable"]),
    default="onnxruntime",
    show_default=True,
    help="The engine's quantization rules; latency is measured there (ONNX Runtime for tflite "
    "and portable).",
)
@click.option(
    "--method",
    type=click.Choice(["auto", "minmax", "percentile", "entropy", "mse"]),
    default="auto",
    show_default=True,
    help="Calibration (auto: minmax and mse both tried, the more accurate kept).",
)
@click.option(
    "--per-channel/--per-tensor",
    "per_channel",
    default=None,
    help="Weights per channel (default: the target's choice).",
)
@click.option(
    "--precision",
    type=click.Choice(["int8", "fp16", "bf16"]),
    default="int8",
    show_default=True,
    help="bf16 for --target openvino or tensorrt (judged and timed on OpenVINO).",
)
@click.option("--dynamic", is_flag=True, help="Dynamic int8 (MatMul/LSTM/GRU-heavy models).")
@click.option(
    "--budget", default="1%", show_default=True, help="How much of the metric may be lost."
)
@click.option(
    "--metric",
    default=None,
    help="top1, cosine, mask, mask@THRESHOLD, seq, or module:function (default: the judge the "
    "model's outputs call for, named in the report).",
)
@image_data_options
@click.option(
    "--random",
    is_flag=True,
    help="Calibrate on random data: tries the pipeline, the result means nothing.",
)
@click.option(
    "--requantize",
    is_flag=True,
    help="MODEL is already quantized (QDQ, dynamic int8, int8 weights): quantize its "
    "dequantized float graph, judged and timed against MODEL (without it such a MODEL is "
    "refused).",
)
@click.option("--force", is_flag=True, help="Write the model even when refused.")
@click.option(
    "--check", "check_only", is_flag=True, help="Only list where MODEL breaks --target's rules."
)
@click.option(
    "--report", type=click.Path(dir_okay=False), help="Write the report as JSON ('-': stdout)."
)
def command(
    model: Path,
    output: Path | None,
    data: Path | None,
    target: str,
    method: str,
    per_channel: bool | None,
    precision: str,
    dynamic: bool,
    budget: str,
    metric: str | None,
    image_size: str | None,
    layout: str,
    mean: str | None,
    std: str | None,
    scale: float,
    random: bool,
    requantize: bool,
    force: bool,
    check_only: bool,
    report: str | None,
) -> None:
    """Quantize MODEL for --target and write OUTPUT, if it is within --budget and not slower.

    The calibration data is split: three quarters calibrate, a quarter judges the result against
    the float model with --metric. Over budget, the nodes that add the most error are kept float
    until it fits. The result is timed against MODEL on the target engine. Refused (nothing
    quantized, over budget, slower, or --random), nothing is written and the exit status is 3;
    --force writes it. A MODEL already quantized is refused unless --requantize. The report is
    saved beside OUTPUT (OUTPUT.quantize.json).

    \b
    Examples:
      ferry quantize model.onnx -o model.int8.onnx --data calib.npz --metric top1
      ferry quantize det.onnx -o det.int8.onnx --data pages/ --image-size 640x480 --mean 0.5 --std 0.5 --metric mask
      ferry quantize model.onnx -o model.int8.onnx --data calib.npz --target tensorrt
      ferry quantize model.onnx -o model.bf16.onnx --data calib.npz --precision bf16 --target openvino
      ferry quantize model.qdq.onnx -o model.int8.onnx --data calib.npz --requantize
      ferry quantize model.int8.onnx --check --target tensorrt
    """
    from ferry.graph import load_model
    from ferry.optimizer.quantize import check, quantize

    if check_only:
        breaches = check(load_model(model), target)
        for b in breaches:
            console.print(f"{escape(b.rule)}: {escape(b.node)}: {escape(b.detail)}")
        console.print(
            f"{len(breaches)} breach(es) of {target}'s rules"
            if breaches
            else f"follows {target}'s rules"
        )
        raise SystemExit(1 if breaches else 0)
    if output is None:
        raise InvalidInputError("give -o OUTPUT (or --check to only validate MODEL)")
    if output.exists() and model.exists() and output.resolve() == model.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {model}; choose another -o path"
        )
    preprocessing = image_preprocessing(image_size, layout, mean, std, scale)
    result = quantize(
        model,
        data=data,
        target=target,
        method=method,
        precision=precision,
        per_channel=per_channel,
        dynamic=dynamic,
        budget=budget,
        metric=metric,
        random=random,
        preprocessing=preprocessing,
        force=force,
        requantize=requantize,
    )
    quiet = show_report(result.report, report, {"model": str(model), "output": str(output)})
    if not result.accepted:
        if not quiet:
            # --force writes a result made; a source refused before quantizing has none.
            hint = " Use --force to write it anyway." if result.report.quantized else ""
            console.print(f"[bold red]not written[/]: {escape(result.report.refused or '')}.{hint}")
        raise SystemExit(EXIT_REFUSED)
    written = result.save(output)
    if not quiet:
        console.print(
            f"wrote {escape(str(written))} and its report {escape(str(written.with_suffix('.quantize.json')))}"
        )
