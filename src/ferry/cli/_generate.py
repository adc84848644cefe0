"""``ferry generate``: run a generative artifact on a prompt, streaming the tokens."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ferry.cli._common import session_options
from ferry.errors import InvalidInputError

if TYPE_CHECKING:
    from ferry.generate._loop import Generation


@click.command("generate")
@click.argument(
    "artifact", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="ARTIFACT"
)
@click.option("--prompt", "-p", required=True, help="The prompt text.")
@click.option(
    "--chat",
    is_flag=True,
    help="Send the prompt as a user message through the model's chat template.",
)
@click.option("--system", default=None, help="A system message (implies --chat).")
@click.option(
    "--max-new-tokens",
    type=int,
    default=256,
    show_default=True,
    help="At most this many new tokens (fewer where the context ends first).",
)
@click.option(
    "--temperature", type=float, default=0.0, show_default=True, help="0: greedy (deterministic)."
)
@click.option("--top-k", type=int, default=0, show_default=True, help="0: off.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1: off.")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True, help="1: off.")
@click.option("--seed", type=int, default=None, help="Sampling seed: the same seed, the same text.")
@click.option(
    "--stop", "stops", multiple=True, metavar="TEXT", help="Stop at this text (repeatable)."
)
@session_options
def command(
    artifact: Path,
    prompt: str,
    chat: bool,
    system: str | None,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    repetition_penalty: float,
    seed: int | None,
    stops: tuple[str, ...],
    backends: str | None,
    threads: int | None,
    precision: str | None,
) -> None:
    """Generate text with the decoder in ARTIFACT (a folder `ferry convert` made from a GGUF
    file or a Hugging Face checkpoint), streaming tokens as they come; the finish reason, token
    counts and speed go to stderr.

    \b
    Examples:
      ferry generate smollm/ --prompt "The capital of France is"
      ferry generate smollm/ --chat --prompt "Write a haiku about ferries." --max-new-tokens 64
      ferry generate smollm/ --chat --system "Answer in French." --prompt "Hello" \\
          --temperature 0.7 --top-p 0.9 --seed 1
      ferry generate smollm/ --prompt "Once upon a time" --backends auto
    """
    from ferry.generate._loop import DecoderSession, Generation, is_generative_artifact

    if not is_generative_artifact(artifact):
        raise InvalidInputError(
            f"{artifact} is not a generative artifact (neither a 'generative' section in its "
            "ferry.json nor ferry.generative in its model.onnx); make one with: "
            "ferry convert model.gguf -o FOLDER"
        )
    import ferry

    session = ferry.load(artifact, backends=backends, threads=threads, precision=precision)
    assert isinstance(session, DecoderSession)
    if session.auto is not None:
        _report_auto(session.auto)
    options: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "repetition_penalty": repetition_penalty,
        "seed": seed,
        "stop": stops,
    }
    if chat or system is not None:
        messages = [{"role": "system", "content": system}] if system is not None else []
        messages.append({"role": "user", "content": prompt})
        events = session.generate(messages=messages, stream=True, **options)
    else:
        events = session.generate(prompt, stream=True, **options)
    start = time.perf_counter()
    first: float | None = None
    for event in events:
        if isinstance(event, Generation):
            _report(event, start, first)
            return
        if first is None:
            first = time.perf_counter()
        if event.text:
            click.echo(event.text, nl=False)  # click.echo flushes: the tokens show as they come


def _report(result: Generation, start: float, first: float | None) -> None:
    end = time.perf_counter()
    click.echo("")  # end the streamed text's line
    new = len(result.ids)
    # Decode speed: tokens after the first over the time after it (the first carries prefill).
    decode = (new - 1) / (end - first) if first is not None and new > 1 and end > first else 0.0
    ttft = f", first token {1000 * (first - start):.0f} ms" if first is not None else ""
    click.echo(
        f"finish: {result.finish_reason}, {result.prompt_tokens} prompt tokens, "
        f"{new} new tokens{ttft}, {decode:.1f} tokens/s",
        err=True,
    )


def _report_auto(choice: Any) -> None:
    """What ``--backends auto`` measured, one line per candidate, on stderr."""
    origin = " (cached)" if choice.from_cache else ""
    if choice.busy:
        origin += f" (measured on a busy machine, {choice.busy}: not cached)"
    click.echo(
        f"auto chose {choice.label}{origin}: decode tokens/s after a {choice.prompt_tokens}-token "
        f"prompt, greedy agreement with onnxruntime over {choice.new_tokens} tokens:",
        err=True,
    )
    for row in choice.table:
        if row["error"]:
            figures = row["error"]
        else:
            figures = (
                f"{row['decode_tokens_per_s']:.1f} tokens/s, first token {row['ttft_ms']:.0f} ms, "
                f"agreement {row['agreement']:.1%}" + ("" if row["passed"] else " (too low)")
            )
        click.echo(f"  {row['label']:<20} {figures}", err=True)
