"""``ferry bench``: latency and throughput of a model on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ferry.cli._common import (
    build_feeds,
    console,
    input_options,
    model_argument,
    session_options,
    write_json,
)


@click.command("bench")
@model_argument
@input_options
@session_options
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Untimed runs first.",
)
@click.option(
    "--iterations", "-n", type=click.IntRange(min=1), default=None, help="Timed runs (default 100)."
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to run for.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write results as JSON ('-': stdout).",
)
def command(
    model: Path,
    input_files: tuple[str, ...],
    shapes: tuple[str, ...],
    seed: int,
    backends: str | None,
    threads: int | None,
    warmup: int,
    iterations: int | None,
    duration: float | None,
    json_out: str | None,
) -> None:
    """Measure MODEL's latency: load time, then p50/p90/p99, mean, min and throughput.

    Inputs not given with --input are generated (symbolic dims as 1 unless --shape says otherwise).

    \b
    Example:
      ferry bench model.onnx --shape input=8x3x224x224 --iterations 200
    """
    import ferry
    from ferry.backends import get_backend
    from ferry.bench import measure
    from ferry.runtime.session import backend_names

    if iterations is None and duration is None:
        iterations = 100
    # Import the engines before the clock starts: load time should be the model's, not Python's.
    for name in backend_names(backends):
        get_backend(name)
    start = time.perf_counter()
    session = ferry.load(model, backends=backends, threads=threads)
    load_s = time.perf_counter() - start
    feeds = build_feeds(session, input_files, shapes, seed, random=True)
    batch = _batch_of(feeds)
    with Progress(
        TextColumn("benchmarking"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=json_out == "-",
    ) as progress:
        task = progress.add_task("bench", total=iterations)
        stats = measure(
            lambda: session.run(feeds),
            warmup=warmup,
            iterations=iterations,
            duration_s=duration,
            batch=batch,
            on_progress=lambda n: progress.update(task, completed=n) if n % 10 == 0 else None,
        )
    result = {
        "model": str(model),
        "backends": session.plan.backends,
        "threads": threads,
        "inputs": {name: list(value.shape) for name, value in feeds.items()},
        "load_s": load_s,
        **stats.to_dict(),
    }
    if json_out is not None:
        write_json(result, json_out)
        if json_out == "-":
            return
    table = Table(
        "backend", "load ms", "p50 ms", "p90 ms", "p99 ms", "mean ms", "std ms", "per s", box=None
    )
    table.add_row(
        ",".join(session.plan.backends),
        f"{load_s * 1000:.0f}",
        *(
            f"{v:.3f}"
            for v in (stats.p50_ms, stats.p90_ms, stats.p99_ms, stats.mean_ms, stats.std_ms)
        ),
        f"{stats.throughput:.0f}",
    )
    console.print(table)
    console.print(f"{stats.iterations} runs at batch {batch} after {warmup} warm-up runs")


def _batch_of(feeds: dict[str, object]) -> int:
    for value in feeds.values():
        shape = getattr(value, "shape", ())
        if shape:
            return int(shape[0])
    return 1
