"""Generation speed of the kit's SmolLM2-135M-Instruct (GGUF Q4_1) through ferry, in one table.

The GGUF is converted once per precision the converter offers (int4: the Q4_1 blocks as stored;
int8: requantized per block of 32; fp32: dequantized, built from standard ONNX ops so that
OpenVINO can run it too), into ``--work`` (kept between runs; ``--rebuild`` builds again), and
each artifact is measured by ``ferry bench ARTIFACT --generate`` on the engines asked for: time to
first token after a fixed prompt of ``--prompt-tokens`` tokens, prefill and decode tokens/s of
greedy decoding of exactly ``--new-tokens`` tokens (eos ignored), and peak RSS of a fresh process
per configuration; the median and (min-max) of ``-n`` generations. OpenVINO on an int4/int8
artifact (ONNX Runtime's MatMulNBits) is skipped with the reason.

The peers (llama.cpp through llama-cpp-python on the same GGUF, ONNX Runtime GenAI, OpenVINO
GenAI) are measured separately, each in its own environment; their figures and how they were
built are in /work/shared/notes/llm-peers.md.

    python benchmarks/generate.py [--prompt-tokens 128] [--new-tokens 128] [--threads 2] [-n 3]
        [--precisions int4,int8,fp32] [--backends onnxruntime,openvino] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on sys.path (benchmarks/tflite.py would shadow the
# tflite schema package).
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

GGUF = Path.home() / ".cache/ferry-kit/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PRECISIONS = ("int4", "int8", "fp32")


def convert(gguf: Path, folder: Path, precision: str) -> None:
    """The artifact of ``gguf`` at ``precision``: ``convert_decoder`` (``ferry convert``), or,
    where this ferry has none yet, the same from the lower-level API."""
    flavour = "standard" if precision == "fp32" else "ort"
    try:
        from ferry.generate._convert import convert_decoder
    except ImportError:  # a ferry from before ``ferry convert model.gguf``
        _build(gguf, folder, precision, flavour)
        return
    convert_decoder(gguf, folder, precision=precision, flavour=flavour)


def _build(gguf: Path, folder: Path, precision: str, flavour: str) -> None:
    """What ``convert_decoder`` does, from the lower-level API (without its check run)."""
    from ferry.formats import read_gguf
    from ferry.generate import DecoderConfig, DecoderWeights
    from ferry.generate._artifact import decoder_files_from_gguf, write_decoder_artifact
    from ferry.generate._graph import build_decoder

    source = read_gguf(gguf)
    config = DecoderConfig.from_gguf(source)
    weights = DecoderWeights.from_gguf(source, config)
    quantized = precision != "fp32"
    model = build_decoder(
        config,
        weights,
        precision=precision,
        flavour=flavour,
        accuracy_level=4 if quantized else 0,
    )
    files = decoder_files_from_gguf(source.metadata, config)
    write_decoder_artifact(
        folder,
        model=model,
        config=config,
        tokenizer=files.tokenizer,
        template=files.template,
        generation_config=files.generation_config,
        source=str(gguf),
        precision=precision,
    )


def bench(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``ferry bench FOLDER --generate ...``'s JSON document."""
    with tempfile.TemporaryDirectory(prefix="ferry-generate-bench-") as tmp:
        out = Path(tmp) / "results.json"
        command = [
            sys.executable,
            "-m",
            "ferry.cli.main",
            "bench",
            str(folder),
            "--generate",
            "--prompt-tokens",
            str(args.prompt_tokens),
            "--new-tokens",
            str(args.new_tokens),
            "--threads",
            str(args.threads),
            "-n",
            str(args.repeats),
            "--backends",
            args.backends,
            "--json",
            str(out),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        results: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ferry-gen")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--backends", default="onnxruntime,openvino")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-n", "--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.gguf.is_file():
        print(f"no {args.gguf}: fetch the kit (scripts/fetch-kit.sh)", file=sys.stderr)
        return 2

    from rich.console import Console

    from ferry.bench import generate_lines, generate_table
    from ferry.bench._device import device_info

    console = Console(width=200, highlight=False)
    merged: dict[str, Any] | None = None
    for precision in args.precisions.split(","):
        folder = args.work / f"smollm2-{precision}"
        if args.rebuild or not (folder / "model.onnx").is_file():
            start = time.perf_counter()
            convert(args.gguf, folder, precision)
            console.print(f"converted {precision} in {time.perf_counter() - start:.0f} s: {folder}")
        results = bench(folder, args)
        for row in results["configurations"]:
            row["label"] = f"{precision} artifact / {row['label']}"
        if merged is None:
            merged = results
        else:
            merged["configurations"] += results["configurations"]
    assert merged is not None
    merged["model"] = {"name": args.gguf.name, "precisions": args.precisions.split(",")}
    console.print(generate_table(merged))
    for line in generate_lines(merged):
        console.print(line)
    from ferry.bench import device_summary

    console.print(f"device: {device_summary(device_info())}")
    if args.json is not None:
        args.json.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
