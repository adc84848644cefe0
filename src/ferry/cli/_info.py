"""``ferry info``: what a model takes, gives and contains; with ``--backends``, the engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import (
    console,
    human_bytes,
    human_count,
    split_pairs,
    write_json,
)
from ferry.errors import InvalidInputError, ModelLoadError


@click.command("info")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option(
    "--backends",
    "list_backends",
    is_flag=True,
    help="List the engines ferry knows (built-in and plugins) instead: available or what to "
    "install, version, devices and their properties, precisions, options.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--top", type=click.IntRange(min=1), default=20, show_default=True, help="Ops to list."
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    metavar="NAME=DIMS",
    help="Count FLOPs at this input shape, e.g. x=1,3,640,640 (repeatable).",
)
def command(
    model: Path | None, list_backends: bool, as_json: bool, top: int, shapes: tuple[str, ...]
) -> None:
    """Describe MODEL: inputs and outputs, opsets, op histogram, parameters and FLOPs.

    Symbolic dims (such as a dynamic batch) are shown by name. FLOPs count Conv, ConvTranspose,
    MatMul and Gemm, at the shapes --shape gives, else with symbolic dims taken as 1 (and then
    say which dims they depend on).

    \b
    Examples:
      ferry info model.onnx
      ferry info detector.onnx --shape images=1,3,640,640 --json
      ferry info smollm/            (a generative folder: architecture, quantization, template)
      ferry info model.gguf
      ferry info --backends         (the engines: devices, precisions, options)
    """
    if list_backends:
        if model is not None:
            raise InvalidInputError(
                "ferry info --backends lists the engines and takes no MODEL; run it without one"
            )
        _print_backends(as_json)
        return
    if model is None:
        raise InvalidInputError(
            "ferry info needs a MODEL (ferry info model.onnx), or --backends to list the engines"
        )
    from ferry.cli._convert_decoder import info_decoder_command, is_decoder_file
    from ferry.graph import load_model, resolve_model_file, summarize
    from ferry.runtime import parse_shape

    if is_decoder_file(model):  # a GGUF file or a generative artifact folder
        info_decoder_command(model, as_json=as_json)
        return
    path = resolve_model_file(model)
    at = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    try:
        summary = summarize(load_model(path), at or None)
    except ModelLoadError as e:
        raise InvalidInputError(str(e)) from None
    if as_json:
        write_json({"path": str(path), "file_bytes": path.stat().st_size, **summary.to_dict()}, "-")
        return

    console.print(f"[bold]{escape(str(path))}[/bold]  ({human_bytes(path.stat().st_size)})")
    opsets = ", ".join(f"{k} {v}" for k, v in summary.opsets.items())
    console.print(
        f"producer: {summary.producer}   IR version: {summary.ir_version}   opsets: {opsets}"
    )
    io = Table(show_edge=False, box=None, pad_edge=False)
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind, tensors in (
        ("input", summary.inputs),
        ("optional input", summary.optional_inputs),  # has a default: a state, say
        ("output", summary.outputs),
    ):
        for t in tensors:
            shape = (
                "?"
                if t.shape is None
                else "[" + ", ".join("?" if d is None else str(d) for d in t.shape) + "]"
            )
            io.add_row(kind, escape(t.name), t.dtype or "?", escape(shape))
    console.print(io)
    label, flops = ("FLOPs" if summary.flops_shapes else "FLOPs/sample"), human_count(summary.flops)
    if summary.flops_unknown_nodes:
        flops += f" (+{summary.flops_unknown_nodes} nodes with unknown shapes)"
    if summary.flops_shapes:
        flops = f"{flops} at " + ", ".join(
            f"{name}=[{','.join(map(str, dims))}]" for name, dims in summary.flops_shapes.items()
        )
    elif summary.flops_assumed:
        flops += (
            f" with {', '.join(summary.flops_assumed)} taken as 1 "
            "(--shape NAME=DIMS for the real figure)"
        )
    console.print(
        f"nodes: {summary.node_count}   parameters: {human_count(summary.param_count)} "
        f"({human_bytes(summary.param_bytes)}{', external data' if summary.external_data else ''})   "
        f"{label}: {flops}"
    )
    from ferry.runtime import quantization_report

    quantized = quantization_report(path)
    if quantized:
        speed = quantized.get("speedup")
        metric = quantized.get("metric", {}).get("kind", "metric")
        console.print(
            f"quantized by ferry: {quantized.get('precision')} for {quantized.get('target')}, "
            f"{metric} {quantized.get('score_after', 0):.4f} on held-back data"
            + (f", {speed:.2f}x on {quantized.get('engine')}" if speed else "")
            + f", {len(quantized.get('kept_float', []))} node(s) kept float"
        )
    if summary.has_subgraphs:
        console.print("control flow: yes (If/Loop/Scan subgraphs; their nodes are counted)")
    ops = Table("op", "count", show_edge=False, box=None, pad_edge=False)
    for op, count in list(summary.op_counts.items())[:top]:
        ops.add_row(escape(op), str(count))
    rest = len(summary.op_counts) - top
    console.print(ops)
    if rest > 0:
        console.print(f"... and {rest} more op types (--top to see more)")


def backend_rows() -> list[dict[str, Any]]:
    """What ``ferry info --backends`` shows of every backend ferry knows, as JSON-ready dicts."""
    from ferry.backends import get_backend, known_backends
    from ferry.errors import FerryError

    rows: list[dict[str, Any]] = []
    for name in known_backends():
        try:
            backend = get_backend(name)
        except FerryError as e:  # not installed, or a plugin that fails to import: say which
            rows.append({"name": name, "available": False, "reason": str(e)})
            continue
        row: dict[str, Any] = {"name": name, "available": True, "version": backend.version}
        try:
            row["devices"] = [
                {"name": d.name, "kind": d.kind, "properties": dict(d.properties)}
                for d in backend.devices()
            ]
        except Exception as e:  # an engine that fails to list its devices: the rest still shows
            row["devices_error"] = f"{type(e).__name__}: {e}"
        row["precisions"] = list(backend.precisions)
        if backend.options:
            row["options"] = [spec.describe() for spec in backend.options.values()]
        elif backend.option_keys is None:
            row["options"] = ["any"]
        else:
            row["options"] = sorted(backend.option_keys)
        row["dynamic_shapes"] = backend.dynamic_shapes
        row["simulated"] = backend.simulated
        rows.append(row)
    return rows


def _print_backends(as_json: bool) -> None:
    rows = backend_rows()
    if as_json:
        write_json(rows, "-")
        return
    for row in rows:
        name = escape(row["name"])
        if not row["available"]:
            console.print(f"[bold]{name}[/bold]  not available: {escape(row['reason'])}")
            continue
        notes = ", simulated" if row["simulated"] else ""
        notes += "" if row["dynamic_shapes"] else ", static shapes only"
        console.print(f"[bold]{name}[/bold]  available, version {escape(row['version'])}{notes}")
        for device in row.get("devices", []):
            props = "; ".join(f"{k}: {v}" for k, v in device["properties"].items())
            line = f"  device {device['name']} ({device['kind']})" + (f": {props}" if props else "")
            console.print(escape(line))
        if "devices_error" in row:
            console.print(f"  devices: could not be listed ({escape(row['devices_error'])})")
        console.print(f"  precisions: {', '.join(row['precisions'])}")
        options = ["threads", "precision", *row["options"]]
        console.print(escape(f"  options: {'; '.join(options)}"))
