"""Options and helpers shared by the commands."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from ferry.errors import InvalidInputError

F = TypeVar("F", bound=Callable[..., Any])

# soft_wrap: long paths stay on one line (copyable), only tables are fitted to the width.
console = Console(highlight=False, soft_wrap=True)

#: Exit status of a verb whose result was refused (``optimize``, ``quantize``, ``compress``,
#: ``export``): it computes something else than the model, is over the accuracy budget, is slower,
#: or (``quantize``) was calibrated on random data.
EXIT_REFUSED = 3


def model_argument(f: F) -> F:
    return click.argument("model", type=click.Path(path_type=Path))(f)


def session_options(f: F) -> F:
    f = click.option(
        "--precision",
        default=None,
        metavar="NAME",
        help="Run in this precision (fp32, bf16, fp16, int8) on every engine of the plan that "
        "offers it, e.g. --backends openvino --precision bf16 (ONNX Runtime runs fp32 only; "
        "ferry bench shows each precision's speed and accuracy). Default: each engine's fp32.",
    )(f)
    f = click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        help="Intra-op threads (default: all cores).",
    )(f)
    f = click.option(
        "--backends",
        default=None,
        metavar="NAMES",
        help="Comma-separated backends in priority order (default: onnxruntime).",
    )(f)
    return f


def generation_options(where: str = "", seqs_note: str = "", kv_note: str = "") -> Callable[[F], F]:
    """The continuous-batching options of a command serving generative models (``ferry serve``,
    ``ferry deploy ray``, ``ferry deploy kserve``): ``where`` says whose they are ("each
    replica"), the notes what else they set there."""
    whose = f" ({where})" if where else ""

    def decorate(f: F) -> F:
        f = click.option(
            "--max-queue",
            type=click.IntRange(min=1),
            default=256,
            show_default=True,
            help=f"Generative models{whose}: requests waiting beyond this are answered 429 with "
            "Retry-After.",
        )(f)
        f = click.option(
            "--kv-cache-mib",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help=f"Generative models{whose}: the KV cache budget in MiB; each running sequence "
            "reserves its prompt + max_tokens out of it and requests wait for room [default: "
            f"--max-num-seqs sequences of --max-model-len]{kv_note}.",
        )(f)
        f = click.option(
            "--max-model-len",
            type=click.IntRange(min=2),
            default=None,
            help="Generative models: a sequence's prompt + new tokens at most [default: the "
            "model's context].",
        )(f)
        return click.option(
            "--max-num-seqs",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help=f"Generative models{whose}: sequences decoded at once (continuous batching's "
            f"batch){seqs_note}.",
        )(f)

    return decorate


def input_options(f: F) -> F:
    f = click.option(
        "--seed", type=int, default=0, show_default=True, help="Seed for generated inputs."
    )(f)
    f = click.option(
        "--shape",
        "shapes",
        multiple=True,
        metavar="NAME=DIMS",
        help="Shape of a generated input, e.g. input=8,3,224,224 (otherwise a symbolic first "
        "dim is 1 and other symbolic dims 224).",
    )(f)
    f = click.option(
        "--input",
        "-i",
        "input_files",
        multiple=True,
        metavar="NAME=FILE.npy",
        help="Feed input NAME from a .npy file (repeatable).",
    )(f)
    return f


def split_pairs(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``, with a clear error for malformed pairs."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise InvalidInputError(f"{option} expects NAME=VALUE, got {pair!r}")
        if name in out:
            raise InvalidInputError(f"{option} names {name!r} twice")
        out[name] = value
    return out


def build_feeds(
    session: Any, input_files: Sequence[str], shapes: Sequence[str], seed: int, *, random: bool
) -> tuple[dict[str, Any], str]:
    """Inputs for ``session`` from ``--input`` files, the rest found when ``random`` is set
    (:func:`ferry.runtime.found_inputs`: sizes that run, ids within their tables).

    Returns the feeds and, in words, how the generated ones were found (empty when none were):
    say it in reports and when the model fails, so the user knows which ``--shape`` to give.
    """
    from ferry.runtime import InputChecker, found_inputs, load_npy, parse_shape

    files = split_pairs(input_files, "--input")
    shape_map = {k: parse_shape(v) for k, v in split_pairs(shapes, "--shape").items()}
    names = {s.name for s in session.inputs}
    unknown = sorted(set(files) - names)
    if unknown:
        raise InvalidInputError(
            f"--input names unknown input {', '.join(map(repr, unknown))}; the model takes "
            f"{', '.join(repr(s.name) + ' (' + s.describe() + ')' for s in session.inputs)}"
        )
    feeds = {name: load_npy(path, name) for name, path in files.items()}
    rest = [s for s in session.inputs if s.name not in feeds]
    if rest and not random:
        raise InvalidInputError(
            "no data for input "
            + ", ".join(f"{s.name!r} ({s.describe()})" for s in rest)
            + "; pass --input NAME=FILE.npy or --random"
        )
    if not rest:
        return feeds, ""
    # The files first, checked as the session checks them (dtype, rank, fixed dims): their
    # errors are the user's to fix, not sizes to search for.
    InputChecker([s for s in session.inputs if s.name in feeds]).check(feeds)
    generated_shapes = {k: v for k, v in shape_map.items() if k not in feeds}
    found = found_inputs(session, generated_shapes, given=feeds, seed=seed)
    feeds.update({s.name: found.feeds[s.name] for s in rest})
    return feeds, found.how


def run_feeds(session: Any, feeds: dict[str, Any], how: str) -> dict[str, Any]:
    """``session.run(feeds)``; when the model fails on generated inputs, say how they were
    found and how to give the real ones."""
    from ferry.errors import ExecutionError

    try:
        return dict(session.run(feeds))
    except ExecutionError as e:
        if not how:
            raise
        raise InvalidInputError(
            f"{e}. The inputs were generated ({how}): give the sizes the model takes with "
            "--shape NAME=DIMS (e.g. --shape x=1,3,640,640) or real inputs with --input"
        ) from e


def write_json(data: Any, path: str | os.PathLike[str]) -> None:
    """Write JSON atomically ('-' prints it)."""
    text = json.dumps(data, indent=2)
    if str(path) == "-":
        click.echo(text)
        return
    from ferry.graph import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


def human_count(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.2f}{unit}"
        n /= 1000
    return f"{n:.2f}P"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_tolerance(text: str | None) -> tuple[float, float] | None:
    """``--tolerance ATOL[,RTOL]`` -> ``(atol, rtol)``; None when not given."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise InvalidInputError(
            f"--tolerance takes ATOL or ATOL,RTOL as numbers, got {text!r}"
        ) from None
    if len(values) not in (1, 2) or any(v < 0 for v in values):
        raise InvalidInputError(f"--tolerance takes ATOL or ATOL,RTOL (non-negative), got {text!r}")
    return (values[0], values[1] if len(values) == 2 else 0.0)


def image_data_options(f: F) -> F:
    """``--image-size``, ``--layout``, ``--mean``, ``--std``, ``--scale``: how a ``--data`` folder
    of images becomes the model's input (quantize, distill, compress)."""
    for decorator in reversed(
        [
            click.option(
                "--image-size",
                default=None,
                metavar="HxW",
                help="Images resized to this (a --data folder).",
            ),
            click.option(
                "--layout", type=click.Choice(["NCHW", "NHWC"]), default="NCHW", show_default=True
            ),
            click.option(
                "--mean", default=None, metavar="M[,M,M]", help="Per-channel mean after /--scale."
            ),
            click.option(
                "--std", default=None, metavar="S[,S,S]", help="Per-channel std after /--scale."
            ),
            click.option(
                "--scale",
                type=float,
                default=255.0,
                show_default=True,
                help="Pixels are divided by this first.",
            ),
        ]
    ):
        f = decorator(f)
    return f


def image_preprocessing(
    image_size: str | None, layout: str, mean: str | None, std: str | None, scale: float
) -> Any:
    """The :class:`ImagePreprocessing` the image options describe, or None without a size."""
    if image_size is None:
        for given, option in ((mean, "--mean"), (std, "--std")):
            if given is not None:
                raise InvalidInputError(f"{option} applies to images: give --image-size too")
        return None
    from ferry.optimizer.quantize import ImagePreprocessing

    try:
        h, w = (int(v) for v in image_size.lower().split("x"))
    except ValueError:
        raise InvalidInputError(
            f"--image-size takes HxW, e.g. 224x224, got {image_size!r}"
        ) from None
    return ImagePreprocessing(
        size=(h, w),
        layout=layout,
        mean=_floats(mean, "--mean") or (0.0,),
        std=_floats(std, "--std") or (1.0,),
        scale=scale,
    )


def _floats(text: str | None, option: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InvalidInputError(
            f"{option} takes numbers separated by commas, got {text!r}"
        ) from None


def show_report(report: Any, json_path: str | None, about: dict[str, str]) -> bool:
    """Print a compression report's lines (unless its JSON goes to stdout) and write its JSON
    (``about`` first: the files it concerns) to ``json_path``; whether the terminal stays quiet."""
    from rich.markup import escape

    quiet = json_path == "-"
    if not quiet:
        for line in report.lines():
            console.print(escape(line))
    if json_path is not None:
        write_json({**about, **report.to_dict()}, json_path)
    return quiet
