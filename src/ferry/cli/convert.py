"""``ferry convert``: bring a model into ferry's unified graph and write it as ONNX."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ferry.cli._common import console, model_argument
from ferry.errors import ConversionError, InvalidInputError


@click.command("convert")
@model_argument
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ONNX file to write.",
)
@click.option("--opset", type=int, default=None, help="Convert to this default-domain opset.")
@click.option(
    "--external-data/--no-external-data",
    default=None,
    help="Keep weights in OUTPUT.data beside the model (default: as the input did, or above 1 GiB).",
)
def command(model: Path, output: Path, opset: int | None, external_data: bool | None) -> None:
    """Convert MODEL to an ONNX file OUTPUT: opset conversion, shape inference and ONNX's checker.

    The input file is never modified; OUTPUT is written atomically.

    \b
    Example:
      ferry convert model.onnx -o model17.onnx --opset 17
    """
    from ferry.converters import convert_onnx
    from ferry.graph import load_model, resolve_model_file, save_model

    source = resolve_model_file(model)
    if source.suffix.lower() != ".onnx":
        raise ConversionError(
            f"cannot convert {source.name}: this version of ferry converts ONNX models (.onnx)"
        )
    if output.exists() and output.resolve() == source.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {source}; choose another --output path"
        )
    loaded = load_model(source)
    before = loaded.opset_imports.get("", None)
    converted = convert_onnx(loaded, opset=opset)
    save_model(converted, output, external_data=external_data)
    after = converted.opset_imports.get("", None)
    console.print(f"wrote {escape(str(output))} (opset {before} -> {after}, checked)")
