"""``ferry convert``: bring a model from any supported framework into ONNX, verified against its source."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import console, parse_tolerance, split_pairs, write_json
from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.converters import ConversionResult


@click.command("convert")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="ONNX file to write (a folder for a GGUF file or a Hugging Face decoder).",
)
@click.option(
    "--from",
    "from_",
    metavar="FORMAT",
    help="Force the source format: onnx, pytorch, tensorflow, tflite, paddle, sklearn.",
)
@click.option(
    "--opset", type=int, default=None, help="ONNX opset of the result (default: the converter's)."
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DIMS",
    help="Shape of an input the source leaves open, e.g. input=batch,3,224,224 (names stay symbolic).",
)
@click.option(
    "--example-input",
    "examples",
    multiple=True,
    metavar="NAME=FILE.npy",
    help="Verify with this input instead of random data (repeatable).",
)
@click.option(
    "--trust-pickle",
    is_flag=True,
    help="Allow loading pickled files (.pt2 archives, .pt checkpoints and TorchScript, .pkl, "
    ".joblib): they can run code, so only for files you trust.",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare outputs with the source framework.",
)
@click.option(
    "--tolerance",
    metavar="ATOL[,RTOL]",
    help="Parity tolerance for every output (default: by dtype).",
)
@click.option(
    "--external-data/--no-external-data",
    default=None,
    help="Keep weights in a data file beside the model, OUTPUT.data (OUTPUT.<hash>.data when "
    "replacing a model that used that name: the pair is replaced atomically). Default: above "
    "1 GiB or as the input did.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False),
    help="Write the parity report as JSON ('-': stdout).",
)
@click.option(
    "--precision",
    type=click.Choice(["int4", "int8", "fp16", "bf16", "fp32"]),
    default=None,
    help="Decoders (GGUF, Hugging Face *ForCausalLM folder) only: weight precision. Default: "
    "as the source stores them (a Q4_1 GGUF stays int4, blocks as stored; float checkpoints fp32).",
)
@click.option(
    "--flavour",
    type=click.Choice(["ort", "standard"]),
    default=None,
    help="Decoders only: 'ort' (default: onnxruntime's fused contrib operators) or 'standard' "
    "(plain ONNX ops, for OpenVINO and other engines).",
)
@click.option(
    "--accuracy-level",
    type=click.IntRange(0, 4),
    default=None,
    help="Quantized decoders: MatMulNBits' accuracy_level. 0 (default): float activations, "
    "exactly the stored weights; 4: int8 activations per block, faster, further from the "
    "source (and from llama.cpp, which rounds its own way).",
)
def command(
    source: Path,
    output: Path,
    from_: str | None,
    opset: int | None,
    shapes: tuple[str, ...],
    examples: tuple[str, ...],
    trust_pickle: bool,
    verify: bool,
    tolerance: str | None,
    external_data: bool | None,
    report: str | None,
    precision: str | None,
    flavour: str | None,
    accuracy_level: int | None,
) -> None:
    """Convert SOURCE to an ONNX file OUTPUT and check it computes what SOURCE does.

    SOURCE: .onnx, PyTorch (.pt2 torch.export archive or .pt TorchScript, needs --trust-pickle),
    TensorFlow (SavedModel folder, .keras, .h5), .tflite, PaddlePaddle (.pdmodel or .json with
    .pdiparams), scikit-learn (.pkl/.joblib, needs --trust-pickle). The result passes ONNX's checker and, unless
    --no-verify, its outputs match the source framework's on the same inputs; otherwise nothing is
    written. SOURCE is never modified; OUTPUT is written atomically.

    \b
    Examples:
      ferry convert model.onnx -o model17.onnx --opset 17
      ferry convert model.pt2 -o model.onnx --trust-pickle --shape x=batch,3,224,224
      ferry convert saved_model/ -o model.onnx --shape input=batch,224,224,3
      ferry convert model.tflite -o model.onnx
      ferry convert pipeline.joblib -o pipeline.onnx --trust-pickle
      ferry convert SmolLM2-135M-Instruct.Q4_1.gguf -o smollm/
      ferry convert hf_checkpoint/ -o decoder/ --precision int4

    A GGUF file or a Hugging Face folder whose config.json names a *ForCausalLM becomes a
    generative artifact folder OUTPUT (model.onnx, tokenizer, chat template) for ferry generate.
    """
    import ferry
    from ferry.generate._convert import decoder_source_kind
    from ferry.runtime import load_npy, parse_dims

    if decoder_source_kind(source) is not None:
        given = [
            flag
            for flag, value in (
                ("--from", from_),
                ("--opset", opset),
                ("--shape", shapes),
                ("--example-input", examples),
                ("--tolerance", tolerance),
                ("--external-data", external_data),
                ("--report", report),
            )
            if value
        ]
        if given:
            raise InvalidInputError(
                f"{', '.join(given)} do not apply to a decoder ({source}); it takes --precision"
            )
        from ferry.cli._convert_decoder import convert_decoder_command

        convert_decoder_command(
            source,
            output,
            precision=precision,
            flavour=flavour or "ort",
            accuracy_level=accuracy_level,
            verify=verify,
        )
        return
    if precision is not None or accuracy_level is not None or flavour is not None:
        raise InvalidInputError(
            "--precision, --flavour and --accuracy-level apply to decoders (a GGUF file or a "
            "*ForCausalLM folder)"
        )

    if output.exists() and source.exists() and output.resolve() == source.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the input model {source}; choose another --output path"
        )
    input_shapes = {name: parse_dims(dims) for name, dims in split_pairs(shapes, "--shape").items()}
    example_inputs = {
        name: load_npy(path, name)
        for name, path in split_pairs(examples, "--example-input").items()
    }
    result = ferry.convert(
        source,
        example_inputs=example_inputs or None,
        input_shapes=input_shapes or None,
        opset=opset,
        verify=verify,
        tolerance=parse_tolerance(tolerance),
        from_=from_,
        trust_pickle=trust_pickle,
    )
    result.save(output, external_data=external_data)
    quiet = report == "-"
    if not quiet:
        _print(result, output)
    if report is not None:
        write_json(
            {
                "source": result.source,
                "converter": result.converter,
                "output": str(output),
                "notes": result.notes,
                "parity": result.parity.to_dict(),
            },
            report,
        )


def _print(result: ConversionResult, output: Path) -> None:
    console.print(f"converted {escape(result.source)} with the {result.converter} converter")
    for note in result.notes:
        console.print(f"note: {escape(note)}")
    parity = result.parity
    if parity.skipped is None:
        table = Table(
            "output", "shape", "dtype", "max abs err", "max rel err", "tolerance", "ok", box=None
        )
        for o in parity.outputs:
            table.add_row(
                escape(o.name),
                escape(str(list(o.shape))),
                o.dtype,
                f"{o.max_abs_error:.3g}",
                f"{o.max_rel_error:.3g}",
                f"{o.atol:g}+{o.rtol:g}·|x|",
                "yes" if o.passed else "NO",
            )
        console.print(table)
    console.print(escape(parity.summary()))
    opset = result.model.opset_imports.get("", None)
    console.print(f"wrote {escape(str(output))} (opset {opset}, checked)")
