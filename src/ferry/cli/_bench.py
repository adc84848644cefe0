"""``ferry bench``: latency, throughput, start-up time and memory of every engine and precision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from ferry.cli._common import console, input_options, model_argument, split_pairs
from ferry.errors import InvalidInputError


@click.command("bench")
@model_argument
@click.option(
    "--backends",
    default="onnxruntime",
    show_default=True,
    metavar="NAMES",
    help="Engines to compare, comma-separated, each measured on its own (what one cannot run "
    "goes to ONNX Runtime); 'auto' too. Plain ONNX Runtime fp32 is always measured as the "
    "baseline.",
)
@click.option(
    "--precision",
    "precisions",
    default=None,
    metavar="LIST",
    help="Precisions to run each engine in, e.g. fp32,bf16 (default: all each one offers).",
)
@click.option(
    "--accuracy",
    default=None,
    metavar="BUDGET",
    help="Accuracy budget each configuration is judged by against ONNX Runtime fp32 on the same "
    "inputs, e.g. cosine=0.9995,top1=0.98 (measures: cosine, top1 or argmax, mask@THRESHOLD; "
    "default cosine=0.999,top1=0.99). The fastest configuration within it is starred.",
)
@click.option(
    "--batch",
    "batches",
    default=None,
    metavar="LIST",
    help="Batch sizes, e.g. 1,8: the first dim of inputs whose first dim is symbolic.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Intra-op threads per engine (default: the engine's, all cores).",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Untimed calls per configuration first.",
)
@click.option(
    "--iterations",
    "-n",
    type=click.IntRange(min=1),
    default=None,
    help="Timed calls per configuration (default 100).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds of timed calls per configuration (with -n: whichever comes first).",
)
@input_options
@click.option(
    "--force-cpu",
    multiple=True,
    metavar="OP|NODE",
    help="Keep this op type or node on ONNX Runtime when splitting (repeatable).",
)
@click.option(
    "--no-isolate",
    is_flag=True,
    help="Measure everything in this process: faster, but no peak memory or warm start, and "
    "cold starts that share the engines' one-time set-up.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the results as JSON ('-': stdout).",
)
@click.option(
    "--csv",
    "csv_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write one CSV row per configuration ('-': stdout).",
)
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw the latency distributions into a PNG (needs the plot extra).",
)
@click.option(
    "--save-report",
    is_flag=True,
    help="Store the results in the artifact's ferry.json (MODEL must be an artifact folder).",
)
@click.option(
    "--generate",
    is_flag=True,
    help="MODEL is a generative artifact: measure time to first token, prefill and decode "
    "tokens/s and peak RSS of greedy generation on each engine x precision (-n: timed "
    "generations, default 3; --warmup: untimed ones, default 1).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="With --generate: the prompt's length in tokens.",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=2),
    default=128,
    show_default=True,
    help="With --generate: new tokens per generation (eos ignored).",
)
@click.option(
    "--device",
    "device_url",
    default=None,
    metavar="URL",
    help="Run on a device where `ferry agent` listens, e.g. http://192.168.1.20:8765.",
)
@click.option(
    "--token",
    envvar="FERRY_AGENT_TOKEN",
    default=None,
    help="The agent's token (default: $FERRY_AGENT_TOKEN).",
)
def command(
    model: Path,
    backends: str,
    precisions: str | None,
    accuracy: str | None,
    batches: str | None,
    threads: int | None,
    warmup: int,
    iterations: int | None,
    duration: float | None,
    input_files: tuple[str, ...],
    shapes: tuple[str, ...],
    seed: int,
    force_cpu: tuple[str, ...],
    no_isolate: bool,
    json_out: str | None,
    csv_out: str | None,
    plot_out: str | None,
    save_report: bool,
    generate: bool,
    prompt_tokens: int,
    new_tokens: int,
    device_url: str | None,
    token: str | None,
) -> None:
    """Measure MODEL (an .onnx file or an artifact folder) on every engine and precision asked
    for: cold and warm start, latency p50/p90/p99/mean/std/min, throughput and peak memory, each
    also as a ratio to plain ONNX Runtime fp32 at the same batch, and accuracy: each
    configuration's outputs judged against ONNX Runtime fp32's on the same inputs (--accuracy).
    At each batch the fastest configuration within the accuracy budget is starred.

    Inputs not given with --input are generated (a symbolic first dim as 1, other symbolic dims
    as 224, unless --shape or --batch say otherwise). Configurations are timed in alternating blocks of calls in one process; cold
    start and peak memory are measured in a fresh process per engine setup.

    \b
    Examples:
      ferry bench model.onnx --iterations 200
      ferry bench model.onnx --backends onnxruntime,openvino --batch 1,8 --plot lat.png
      ferry bench artifact/ --backends openvino --precision bf16 --save-report
      ferry bench model.onnx --backends openvino --accuracy cosine=0.9999,top1=1
      ferry bench model.onnx --device http://192.168.1.20:8765 --token "$TOKEN"
      ferry bench smollm/ --generate --prompt-tokens 128 --new-tokens 128 --threads 2
    """
    from ferry.bench import BenchSpec
    from ferry.parity import parse_budget

    if generate:
        given = {
            "--accuracy": accuracy,
            "--batch": batches,
            "--duration": duration,
            "--input": input_files,
            "--shape": shapes,
            "--force-cpu": force_cpu,
            "--csv": csv_out,
            "--plot": plot_out,
            "--device": device_url,
        }
        refused = [name for name, value in given.items() if value]
        if refused:
            raise InvalidInputError(f"--generate does not take {', '.join(refused)}")
        source = click.get_current_context().get_parameter_source("warmup")
        _bench_generate(
            model,
            backends=_names(backends, "--backends"),
            precisions=_names(precisions, "--precision") if precisions else None,
            threads=threads,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            repeats=iterations or 3,
            warmup=1 if source == click.core.ParameterSource.DEFAULT else warmup,
            isolate=not no_isolate,
            json_out=json_out,
            save_report=save_report,
        )
        return

    if iterations is None and duration is None:
        iterations = 100
    if save_report and not model.is_dir():
        raise InvalidInputError(
            f"--save-report needs an artifact folder (a folder holding model.onnx); {model} is "
            "a file: put it in a folder as model.onnx and bench the folder"
        )
    spec = BenchSpec(
        backends=_names(backends, "--backends"),
        precisions=_names(precisions, "--precision") if precisions else None,
        batches=_batches(batches) if batches else None,
        threads=threads,
        warmup=warmup,
        iterations=iterations,
        duration_s=duration,
        shapes=_shapes(shapes),
        seed=seed,
        isolate=not no_isolate,
        force_cpu=force_cpu,
        accuracy=None if accuracy is None else tuple(parse_budget(accuracy)),
    )
    inputs = _inputs(input_files)
    quiet = "-" in (json_out, csv_out)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(stage: str, done: float, total: float) -> None:
            bar.update(task, description=escape(stage), completed=done, total=max(total, 1e-9))

        if device_url:
            from ferry.bench import run_remote

            if not token:
                raise InvalidInputError(
                    "--device needs the agent's token: --token TOKEN or $FERRY_AGENT_TOKEN"
                )
            results = run_remote(device_url, token, model, spec, inputs=inputs, progress=progress)
        else:
            from ferry.bench import run_bench

            results = run_bench(model, spec, inputs=inputs, progress=progress)
    _write_outputs(results, json_out, csv_out, plot_out)
    saved = None
    if save_report:
        from ferry.bench import save_to_artifact

        saved = save_to_artifact(results, model)
    if not quiet:
        _print(results)
        if saved is not None:
            console.print(f"results saved in {escape(str(saved))} (under 'benchmarks')")


def _bench_generate(model: Path, *, json_out: str | None, save_report: bool, **spec: Any) -> None:
    """``--generate``: measure, write the JSON, save the report, print the table."""
    import json

    from ferry import bench

    results = bench.run_generate_bench(model, bench.GenerateSpec(**spec))
    if json_out == "-":
        click.echo(json.dumps(results, indent=2))
    elif json_out is not None:
        bench.write_json(results, json_out)
    saved = bench.save_to_artifact(results, model) if save_report else None
    if json_out == "-":
        return
    _print_full(bench.generate_table(results))
    for line in bench.generate_lines(results):
        console.print(escape(line))
    console.print(f"device: {escape(bench.device_summary(results['device']))}")
    if saved is not None:
        console.print(f"results saved in {escape(str(saved))} (under 'benchmarks')")


def _names(text: str, option: str) -> tuple[str, ...]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise InvalidInputError(f"{option} takes names joined by commas, got {text!r}")
    return tuple(dict.fromkeys(items))


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise InvalidInputError(
            f"--batch takes positive integers joined by commas, e.g. 1,8; got {text!r}"
        )
    return tuple(dict.fromkeys(values))


def _shapes(pairs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    from ferry.runtime import parse_shape

    return {k: parse_shape(v) for k, v in split_pairs(pairs, "--shape").items()}


def _inputs(pairs: tuple[str, ...]) -> dict[str, Any]:
    from ferry.runtime import load_npy

    return {k: load_npy(v, k) for k, v in split_pairs(pairs, "--input").items()}


def _write_outputs(
    results: dict[str, Any], json_out: str | None, csv_out: str | None, plot_out: str | None
) -> None:
    import json

    from ferry import bench

    if json_out == "-":
        click.echo(json.dumps(results, indent=2))
    elif json_out is not None:
        bench.write_json(results, json_out)
    if csv_out == "-":
        click.echo(bench.to_csv(results), nl=False)
    elif csv_out is not None:
        bench.write_csv(results, csv_out)
    if plot_out is not None:
        from ferry.bench import plot_latency

        plot_latency(results, plot_out)


def _print_full(table: Any, need: int | None = None) -> None:
    """Print ``table`` whole: a pipe or a log gets it at the width it needs."""
    from rich.measure import Measurement

    if need is None:
        need = Measurement.get(console, console.options.update_width(1000), table).maximum
    if need > console.width:
        # console.print cannot widen past the console's own width; a pipe gets its own console.
        from rich.console import Console

        Console(width=need, highlight=False, soft_wrap=True).print(table)
    else:
        console.print(table)


def _print(results: dict[str, Any]) -> None:
    from rich.measure import Measurement

    from ferry import bench

    # A terminal gets the table that fits it; a pipe or a log gets the full one.
    full = bench.table(results)
    need = Measurement.get(console, console.options.update_width(1000), full).maximum
    compact = console.is_terminal and need > console.width
    if compact:
        console.print(bench.table(results, compact=True))
    else:
        _print_full(full, need)
    for line in bench.partition_lines(results):
        console.print(f"  partitions of {escape(line)}")
    for line in bench.notes(results):
        console.print(f"note: {escape(line)}")
    for line in bench.outside_budget(results):
        console.print(f"[yellow]outside the accuracy budget[/yellow] {escape(line)}")
    for line in bench.errors(results):
        console.print(f"[red]failed[/red] {escape(line)}")
    if compact:
        console.print(
            "vs ORT: p50 over plain ONNX Runtime fp32's. A wider terminal shows warm start, "
            "p90, p99, mean, std, min, peak RSS and the throughput ratio; --json has everything."
        )
    settings = results["settings"]
    counts = []
    if settings["iterations"] is not None:
        counts.append(f"{settings['iterations']} timed calls")
    if settings["duration_s"] is not None:
        counts.append(f"{settings['duration_s']:g} s of timed calls")
    threads = settings["threads"] or "default"
    how = (
        "cold start and peak RSS in a fresh process per engine setup"
        if settings["isolated"]
        else "all in one process (no peak RSS)"
    )
    console.print(
        f"{' or '.join(counts)} per configuration after {settings['warmup']} warm-up calls, "
        f"alternating in blocks of {settings['block']}; threads: {threads}; {how}. "
        "* = fastest p50 within the accuracy budget at its batch (! = fastest, but not within "
        "it); vs ORT = ratio to plain ONNX Runtime fp32."
    )
    budget = bench.budget_summary(results)
    if budget:
        console.print(
            f"accuracy: the worst judge score and ok/out of the budget ({escape(budget)})."
        )
    console.print(f"device: {escape(bench.device_summary(results['device']))}")
