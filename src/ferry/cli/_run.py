"""``ferry run``: run a model once on given or generated inputs."""

from __future__ import annotations

import re
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
    run_feeds,
    session_options,
    split_pairs,
)


@click.command("run")
@model_argument
@input_options
@click.option(
    "--random", "random_inputs", is_flag=True, help="Generate inputs not given with --input."
)
@click.option(
    "--output-dir",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Save each output as OUTPUT_NAME.npy in this folder.",
)
@session_options
def command(
    model: Path,
    input_files: tuple[str, ...],
    shapes: tuple[str, ...],
    seed: int,
    random_inputs: bool,
    output_dir: Path | None,
    backends: str | None,
    threads: int | None,
    precision: str | None,
) -> None:
    """Run MODEL once and print each output's name, shape, dtype and statistics.

    \b
    Examples:
      ferry run model.onnx --input input=image.npy
      ferry run model.onnx --random --shape input=4,3,224,224 -o outputs/
      ferry run model.onnx --random --backends openvino --precision bf16
    """
    import ferry
    from ferry.runtime import parse_shape

    # --shape also sizes the check that a split across engines beats ONNX Runtime alone.
    sizes = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    session = ferry.load(
        model, backends=backends, threads=threads, precision=precision, shapes=sizes or None
    )
    feeds, how = build_feeds(session, input_files, shapes, seed, random=random_inputs)
    outputs = run_feeds(session, feeds, how)
    if how:
        console.print(f"inputs: {escape(how)}")
    table = Table(
        "output", "shape", "dtype", "min", "max", "mean", "std", show_edge=False, box=None
    )
    table.columns[0].overflow = "fold"  # exporters' output names are long; show them whole
    for name, value in outputs.items():
        table.add_row(
            escape(name), escape(str(list(value.shape))), str(value.dtype), *_stats(value)
        )
    console.print(table)
    if output_dir is not None:
        from ferry.graph import atomic_path

        output_dir.mkdir(parents=True, exist_ok=True)
        for name, value in outputs.items():
            dest = output_dir / f"{_file_safe(name)}.npy"
            with atomic_path(dest, suffix=".npy") as tmp, tmp.open("wb") as f:
                np.save(f, value, allow_pickle=False)
            console.print(f"saved {escape(str(dest))}")


def _stats(value: np.ndarray[Any, Any]) -> list[str]:
    if value.size == 0 or value.dtype.kind not in "biuf":
        return ["-"] * 4
    v = value.astype(np.float64)
    return [f"{v.min():.4g}", f"{v.max():.4g}", f"{v.mean():.4g}", f"{v.std():.4g}"]


def _file_safe(name: str) -> str:
    # Output names come from the model and may hold '/', ':' or worse; keep them inside the folder.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "output"
