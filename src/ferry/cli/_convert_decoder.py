"""The decoder side of ``ferry convert`` and ``ferry info``: a GGUF file or a Hugging Face
``*ForCausalLM`` folder converted to a generative artifact folder, and either one summarized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape

from ferry.cli._common import console, human_bytes, human_count

__all__ = [
    "convert_decoder_command",
    "info_decoder_command",
    "is_decoder_file",
    "print_decoder_summary",
]

_TEMPLATE_LINES = 6


def convert_decoder_command(
    source: Path,
    output: Path,
    *,
    precision: str | None,
    flavour: str = "ort",
    accuracy_level: int | None = None,
    verify: bool = True,
) -> None:
    """``ferry convert SOURCE -o FOLDER`` for a decoder: build, write, print the summary."""
    from ferry.generate._convert import convert_decoder
    from ferry.generate._describe import describe_decoder

    folder = convert_decoder(
        source,
        output,
        precision=precision,
        flavour=flavour,
        accuracy_level=accuracy_level,
        verify=verify,
    )
    summary = describe_decoder(folder)
    console.print(f"converted {escape(str(source))} to a generative decoder")
    print_decoder_summary(summary, template=False)
    from ferry.generate._artifact import read_generative_manifest

    verified = (read_generative_manifest(folder) or {}).get("verified")
    if verified:
        console.print(f"checked: {escape(str(verified))}")
    files = ", ".join(
        f"{escape(name)} ({human_bytes(size)})" for name, size in summary["files"].items()
    )
    console.print(f"wrote {escape(str(folder))}/: {files}")


def print_decoder_summary(summary: dict[str, Any], *, template: bool = True) -> None:
    """The text form of ``describe_decoder``'s dict."""
    if summary["kind"] == "gguf":
        console.print(
            f"[bold]{escape(summary['path'])}[/bold]  (GGUF, {human_bytes(summary['file_bytes'])})"
        )
    params = summary.get("parameters")
    console.print(
        f"architecture: {escape(str(summary.get('architecture')))}   "
        f"layers: {summary.get('layers')}   "
        f"parameters: {human_count(params) if params else '?'}"
        + (f"   precision: {summary['precision']}" if summary.get("precision") else "")
    )
    mix = summary.get("quantization") or {}
    ordered = sorted(mix.items(), key=lambda kv: -kv[1])
    console.print("weights: " + ", ".join(f"{count} {escape(kind)}" for kind, count in ordered))
    specials = summary.get("special_tokens") or {}
    shown = ", ".join(f"{k} {escape(repr(v))}" for k, v in specials.items() if v is not None)
    console.print(
        f"context: {summary.get('context_length')}   vocab: {summary.get('vocab_size')}"
        + (f"   special tokens: {shown}" if shown else "")
    )
    source = summary.get("chat_template")
    if not template:
        return
    if not source:
        console.print("chat template: none")
        return
    lines = source.strip("\n").splitlines()
    console.print(f"chat template ({len(lines)} lines):")
    for line in lines[:_TEMPLATE_LINES]:
        console.print("  " + escape(line), highlight=False)
    if len(lines) > _TEMPLATE_LINES:
        console.print(f"  ... {len(lines) - _TEMPLATE_LINES} more (--json for all)")


def is_decoder_file(path: Path) -> bool:
    """A GGUF file or a generative artifact folder (what ``ferry info`` describes as a decoder)."""
    from ferry.generate._convert import decoder_source_kind
    from ferry.generate._loop import is_generative_artifact

    return (path.is_file() and decoder_source_kind(path) == "gguf") or is_generative_artifact(path)


def info_decoder_command(path: Path, *, as_json: bool) -> None:
    """``ferry info`` on a GGUF file or a generative artifact folder."""
    from ferry.cli._common import write_json
    from ferry.generate._describe import describe_decoder

    summary = describe_decoder(path)
    if as_json:
        write_json(summary, "-")
        return
    if summary["kind"] == "artifact":
        console.print(f"[bold]{escape(summary['path'])}[/bold]  (generative decoder folder)")
    print_decoder_summary(summary)
    if summary.get("source"):
        console.print(f"built from: {escape(str(summary['source']))}")
