"""``ferry export``: a model for phones and edge devices (.tflite or ONNX Runtime Mobile) or for
the browser (a web bundle on onnxruntime-web), verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from ferry.cli._common import EXIT_REFUSED, console, split_pairs, write_json
from ferry.errors import ConversionError, InvalidInputError


@click.command("export")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--target",
    type=click.Choice(["tflite", "ort-mobile", "web"]),
    required=True,
    help="tflite: a .tflite file of TFLite builtin ops (LiteRT, XNNPACK, GPU/NNAPI delegates). "
    "ort-mobile: a folder with the .ort file and the op config of a minimal ONNX Runtime build. "
    "web: a folder a static host serves, the model running in the page on onnxruntime-web "
    "(needs Node.js and npm).",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="The .tflite file (tflite) or the folder (ort-mobile, web) to write.",
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "fp16", "int8"]),
    default=None,
    help="tflite only. fp16: float16 weights (half the size, float kernels). int8: integer "
    "kernels, from a QDQ model (`ferry quantize --target tflite` or another quantizer's). "
    "Default: int8 for a QDQ model, else fp32.",
)
@click.option(
    "--nhwc-io",
    is_flag=True,
    help="tflite only: 4-D inputs and outputs channels-last (NHWC, as cameras give images) "
    "instead of the model's NCHW; the transposes at the edges disappear.",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DIMS",
    help="Size of an input to export at, e.g. x=1,3,224,224 (TFLite fixes every size but the "
    "batch; a symbolic batch is 1 unless given).",
)
@click.option(
    "--input",
    "-i",
    "input_files",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="Verify with this input instead of random data (repeatable).",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Run the export (LiteRT, or ONNX Runtime for ort-mobile) against ONNX Runtime on the "
    "model; a failure writes nothing.",
)
@click.option(
    "--force",
    is_flag=True,
    help="web only: replace the output folder even when it holds files that are not an earlier "
    "ferry web bundle.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False),
    help="Write the report as JSON ('-': stdout).",
)
def command(
    model: Path,
    target: str,
    output: Path,
    precision: str | None,
    nhwc_io: bool,
    shapes: tuple[str, ...],
    input_files: tuple[str, ...],
    verify: bool,
    force: bool,
    report: str | None,
) -> None:
    """Export MODEL for a phone or an edge device and verify it there.

    tflite: ferry lowers the ONNX graph to TFLite builtin ops itself (NHWC inside, BatchNorm
    folded, activations fused, transposes only where the data must move), writes the .tflite
    file, and runs it in LiteRT (XNNPACK, then the reference kernels) against ONNX Runtime on the
    same inputs. Ops TFLite cannot run are listed all at once. MODEL is never modified; OUTPUT is
    written atomically, and only when the check passes (exit status 3 otherwise).

    \b
    Examples:
      ferry export model.onnx --target tflite -o model.tflite
      ferry export model.onnx --target tflite -o model.tflite --precision fp16 --nhwc-io
      ferry export ocr.onnx --target tflite -o ocr.tflite --shape x=1,3,48,320
      ferry export model.int8.onnx --target tflite -o model.int8.tflite --precision int8
      ferry export model.onnx --target ort-mobile -o mobile/
      ferry export model.onnx --target web -o site/      # then: ferry serve --web site/
    """
    from ferry.runtime import load_npy, parse_shape

    sizes = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    inputs = {k: load_npy(v, k) for k, v in split_pairs(input_files, "--input").items()}
    quiet = report == "-"
    result: Any
    if force and target != "web":
        raise InvalidInputError("--force applies to --target web")
    if target == "web":
        if precision is not None or nhwc_io:
            raise InvalidInputError(
                "--precision and --nhwc-io apply to --target tflite; a web export keeps the "
                "model's own types and layout (quantize it first for int8)"
            )
        from ferry.generate._loop import is_generative_artifact
        from ferry.web import export_chat, export_web

        if is_generative_artifact(model):  # a decoder: a chat page (ferry.web._chat)
            if inputs or sizes:
                raise InvalidInputError("--input and --shape apply to plain models, not a decoder")
            result = export_chat(model, output, force=force, verify=verify)
        else:
            result = export_web(
                model,
                output,
                force=force,
                verify=verify,
                samples=inputs or None,
                shapes=sizes or None,
            )
    elif target == "ort-mobile":
        if precision is not None or nhwc_io:
            raise InvalidInputError(
                "--precision and --nhwc-io apply to --target tflite; an ort-mobile export keeps "
                "the model's own types and layout (quantize it first for int8)"
            )
        from ferry.mobile import export_ort_mobile

        result = export_ort_mobile(
            model, output, samples=inputs or None, shapes=sizes or None, verify=verify
        )
    else:
        from ferry.mobile import export_tflite

        if output.exists() and output.is_dir():
            raise InvalidInputError(f"{output} is a folder; -o takes the .tflite file to write")
        try:
            result = export_tflite(
                model,
                output,
                precision=precision,
                nhwc_io=nhwc_io,
                verify=verify,
                samples=inputs or None,
                shapes=sizes or None,
            )
        except ConversionError as e:
            refused = getattr(e, "report", None)
            if refused is None:
                raise
            if not quiet:
                for line in refused.lines():
                    console.print(escape(line))
                console.print(f"[bold red]not written[/]: {escape(str(e))}")
            if report is not None:
                write_json({"model": str(model), "written": False, **refused.to_dict()}, report)
            raise SystemExit(EXIT_REFUSED) from None
    if not quiet:
        for line in result.lines():
            console.print(escape(line))
    if report is not None:
        details = result.report.to_dict() if target == "tflite" else dict(result.manifest)
        write_json({"model": str(model), "written": True, **details}, report)
    if not quiet and target == "tflite":
        console.print(f"wrote {escape(str(output))}")
