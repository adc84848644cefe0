"""Generation speed of the kit's SmolLM2-135M-Instruct (GGUF Q4_1) through ferry and its peers,
in one table, and the fidelity of ferry's int4 build against llama.cpp on the same GGUF.

The GGUF is converted once per build (int4: the Q4_1 blocks as stored, float activations, what
``ferry convert`` makes; int4-a4: the same blocks with int8 activations, ``--accuracy-level 4``,
as llama.cpp quantizes its activations; int8: requantized per block of 32; fp32: dequantized,
built from standard ONNX ops so that OpenVINO can run it too), into ``--work`` (kept between
runs; ``--rebuild`` builds again), and each artifact is measured by ``ferry bench ARTIFACT
--generate`` on the engines asked for: time to first token after a fixed prompt of ``--prompt-tokens`` tokens, prefill and decode tokens/s of
greedy decoding of exactly ``--new-tokens`` tokens (eos ignored), and peak RSS of a fresh process
per configuration; the median and (min-max) of ``-n`` generations after one warm-up. OpenVINO on
an int4/int8 artifact (ONNX Runtime's MatMulNBits) is skipped with the reason.

``--peers llamacpp,ortgenai,ovgenai`` (default: those whose environment exists) adds a row per
peer to the same table, each measured the same way (the same prompt ids, threads, greedy, exactly
``--new-tokens`` tokens, one warm-up then ``-n`` runs) by its worker script in
benchmarks/_llm_peers/, run in a fresh process with the peer's own Python (the venvs
scripts/llm-peers-env.sh makes): llama.cpp (llama-cpp-python) on the GGUF as stored; ONNX Runtime
GenAI on the int4 model its builder makes from a Hugging Face folder of the GGUF dequantized
(built once into ``--work``); OpenVINO GenAI's LLMPipeline reading the GGUF itself.

``--fidelity`` compares ferry's default int4 build (the Q4_1 blocks as stored) with llama.cpp on
the same GGUF: (a) greedy tokens on the kit's 16 chat prompts x ``--fidelity-tokens`` new tokens
(each ending at an eos), counted up to the first divergence per prompt and as matching positions
(target >= 95%); (b) the perplexity of benchmarks/data/passage.txt (2,019 words, public domain):
ferry's ``perplexity`` on its own tokens, llama.cpp (``logits_all``) fed the very same ids in the
same windows of ``--ppl-window`` tokens; the ratio (target within 1%).

    python benchmarks/generate.py [--prompt-tokens 128] [--new-tokens 128] [--threads 2] [-n 3]
        [--precisions int4,int4-a4,int8,fp32|none] [--backends onnxruntime,openvino]
        [--peers llamacpp,ortgenai,ovgenai|none] [--fidelity] [--markdown] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on sys.path: a module here named like a package
# would shadow it.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

GGUF = Path.home() / ".cache/ferry-kit/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: ferry's builds by name: (precision, MatMulNBits accuracy level, row label). "int4" is what
#: ``ferry convert`` makes by default (float activations times the blocks as stored); "int4-a4"
#: the same blocks with int8 activations (``--accuracy-level 4``), as llama.cpp's CPU dot
#: products quantize theirs: ferry's fastest exact-weight configuration.
BUILDS = {
    "int4": ("int4", None, "int4 artifact"),
    "int4-a4": ("int4", 4, "int4 artifact, int8 activations (--accuracy-level 4)"),
    "int8": ("int8", None, "int8 artifact"),
    "fp32": ("fp32", None, "fp32 artifact"),
}
PRECISIONS = tuple(BUILDS)
PASSAGE = ROOT / "benchmarks" / "data" / "passage.txt"
WORKERS = ROOT / "benchmarks" / "_llm_peers"
# The kit's inputs.py (chat_prompts): the shared kit, else the repository's older copy.
KIT_INPUTS = (
    ROOT.parent / "shared" / "kit" / "inputs.py",
    ROOT / "tests" / "real" / "kit" / "inputs.py",
)
# A peer's worker is killed after this long.
WORKER_TIMEOUT_S = 1800


class Peer:
    """A generative peer: its venv beside the repository, its worker script, how its row reads."""

    def __init__(self, name: str, title: str, weights: str, note: str) -> None:
        self.name, self.title, self.weights, self.note = name, title, weights, note

    @property
    def python(self) -> Path:
        return ROOT / f".venv-{self.name}" / "bin" / "python"

    @property
    def worker(self) -> Path:
        return WORKERS / f"{self.name}.py"


PEERS = {
    p.name: p
    for p in (
        Peer(
            "llamacpp",
            "llama.cpp",
            "GGUF Q4_1 as stored",
            "llama-cpp-python compiled here from its source distribution (CPU, GGML_NATIVE), "
            "the GGUF's blocks as stored; its own sampler (greedy), cache emptied before each run",
        ),
        Peer(
            "ortgenai",
            "ONNX Runtime GenAI",
            "int4 from its builder",
            "its model builder (-p int4 -e cpu: round-to-nearest blocks of 32) on a Hugging Face "
            "folder of the GGUF dequantized to float32 by transformers",
        ),
        Peer(
            "ovgenai",
            "OpenVINO GenAI",
            "its GGUF reader",
            "LLMPipeline reading the GGUF itself (its own conversion), prefix caching off",
        ),
    )
}


def convert(gguf: Path, folder: Path, build: str) -> None:
    """The artifact of ``gguf`` for one of :data:`BUILDS`: ``convert_decoder`` (``ferry
    convert``), or, where this ferry has none yet, the same from the lower-level API."""
    precision, accuracy_level, _ = BUILDS[build]
    flavour = "standard" if precision == "fp32" else "ort"
    try:
        from ferry.generate._convert import convert_decoder
    except ImportError:  # a ferry from before ``ferry convert model.gguf``
        _build(gguf, folder, precision, flavour)
        return
    convert_decoder(
        gguf, folder, precision=precision, flavour=flavour, accuracy_level=accuracy_level
    )


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


def run_worker(peer: Peer, job: dict[str, Any]) -> dict[str, Any]:
    """``job`` run by the peer's worker script in a fresh process with the peer's Python; its
    result, or ``{"error": ...}`` saying why there is none."""
    with tempfile.TemporaryDirectory(prefix=f"ferry-peer-{peer.name}-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        command = [str(peer.python), str(peer.worker), str(job_file), str(out_file)]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": f"{peer.title} took over {WORKER_TIMEOUT_S} s; gave up"}
        try:
            out: dict[str, Any] = json.loads(out_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return {"error": f"{peer.title}'s worker died: {tail[0]}"}
    if out.get("error"):
        print(proc.stderr, file=sys.stderr)
    return out


def available_peers(asked: str | None) -> tuple[list[Peer], list[str]]:
    """The peers to measure and a line per peer left out (no venv: how to make it)."""
    names = list(PEERS) if asked is None else [n for n in asked.split(",") if n and n != "none"]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise SystemExit(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(PEERS)}")
    found, missing = [], []
    for name in names:
        peer = PEERS[name]
        if peer.python.is_file():
            found.append(peer)
        else:
            missing.append(
                f"{peer.title} not measured: no {peer.python.parent.parent.name}/ "
                f"(make it with: bash scripts/llm-peers-env.sh {name})"
            )
    return found, missing


def ortgenai_model(args: argparse.Namespace, console: Any) -> tuple[Path | None, str | None]:
    """ONNX Runtime GenAI's int4 model of the GGUF in ``--work`` (built by its builder once)."""
    out = args.work / "ortgenai-int4"
    if args.rebuild or not (out / "genai_config.json").is_file():
        start = time.perf_counter()
        done = run_worker(
            PEERS["ortgenai"], {"mode": "build", "gguf": str(args.gguf), "out": str(out)}
        )
        if done.get("error"):
            return None, f"its model builder failed: {done['error']}"
        console.print(
            f"built ONNX Runtime GenAI's int4 model in {time.perf_counter() - start:.0f} s: {out}"
        )
    return out, None


def measure_peer(
    peer: Peer, prompt: list[int], args: argparse.Namespace, console: Any
) -> dict[str, Any]:
    """The peer's row, with the keys of ``ferry bench --generate``'s configurations."""
    job: dict[str, Any] = {
        "mode": "speed",
        "gguf": str(args.gguf),
        "prompt": prompt,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "warmup": 1,
        "repeats": args.repeats,
    }
    out: dict[str, Any] = {}
    if peer.name == "ortgenai":
        model, error = ortgenai_model(args, console)
        out = {"error": error} if error else {}
        job["model"] = str(model)
    if not out:
        out = run_worker(peer, job)
    # "2026.4.1.0-3408-ab01d1771e4": the release, not the build.
    version = str(out["version"]).split("-")[0] if out.get("version") else None
    return {
        "label": f"{peer.title}{' ' + version if version else ''} / {peer.weights}",
        "backend": peer.name,
        "precision": peer.weights,
        "threads": args.threads,
        "baseline": False,
        "requested": True,
        "skipped": None,
        **{
            k: out.get(k)
            for k in (
                "load_s",
                "rss_before_load_mb",
                "peak_rss_mb",
                "prompt_tokens",
                "new_tokens",
                "ttft_ms",
                "prefill_tokens_per_s",
                "decode_tokens_per_s",
            )
        },
        "note": peer.note,
        "error": out.get("error"),
    }


def kit_chats(count: int) -> list[list[dict[str, str]]]:
    """The kit's chat prompts (its inputs.py's ``chat_prompts``), as tests/real reads them."""
    for path in KIT_INPUTS:
        spec = importlib.util.spec_from_file_location("_kit_inputs_chat", path)
        if spec is None or spec.loader is None or not path.is_file():
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "chat_prompts"):
            return list(module.chat_prompts(count=count))
    raise SystemExit(
        f"--fidelity: no kit inputs.py with chat_prompts at {', '.join(map(str, KIT_INPUTS))}"
    )


def agreement(
    ferry_tokens: list[list[int]], reference: list[list[int]], gaps: list[list[float]]
) -> dict[str, Any]:
    """Greedy agreement with the reference (llama.cpp): per prompt, the tokens up to the first
    divergence, and the positions where both chose the same token, over the reference's tokens;
    how many first divergences fall at a near-tie of the reference's top two logits (0.1%)."""
    prefix = same = total = ties = 0
    firsts: list[int | None] = []
    for ours, ref, gap in zip(ferry_tokens, reference, gaps, strict=True):
        first = next((i for i in range(len(ref)) if i >= len(ours) or ours[i] != ref[i]), None)
        firsts.append(first)
        prefix += len(ref) if first is None else first
        same += sum(a == b for a, b in zip(ours, ref))
        total += len(ref)
        ties += first is not None and gap[first] <= 0.001
    return {
        "prompts": len(reference),
        "reference_tokens": total,
        "prefix_tokens": prefix,
        "matching_positions": same,
        "prefix_rate": prefix / total,
        "matching_rate": same / total,
        "identical_prompts": sum(f is None for f in firsts),
        "first_divergences": firsts,
        "divergences_at_near_ties": ties,
    }


def fidelity(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """Ferry's builds (``--fidelity-builds``: int4, the default convert, and fp32, equal to
    transformers' float model, for scale) against llama.cpp on the same GGUF: greedy agreement on
    the kit's chat prompts and the passage's perplexity (module docstring). llama.cpp runs once,
    on the ids of the first build (every build has the same tokenizer and template)."""
    from ferry.generate._loop import DecoderSession

    peer = PEERS["llamacpp"]
    if not peer.python.is_file():
        raise SystemExit(
            "--fidelity compares with llama.cpp: bash scripts/llm-peers-env.sh llamacpp"
        )
    decoders = {}
    for precision in args.fidelity_builds.split(","):
        if precision not in BUILDS:
            raise SystemExit(f"--fidelity-builds: unknown {precision}; known: {', '.join(BUILDS)}")
        folder = args.work / f"smollm2-{precision}"
        if not (folder / "model.onnx").is_file():
            start = time.perf_counter()
            convert(args.gguf, folder, precision)
            console.print(f"converted {precision} in {time.perf_counter() - start:.0f} s: {folder}")
        decoders[precision] = DecoderSession.from_folder(
            folder, backends=["onnxruntime"], threads=args.threads, cache_dir=False
        )
    first = next(iter(decoders.values()))
    assert first.template is not None
    prompts = [
        list(first.tokenizer.encode(first.template.render(chat), add_special_tokens=False).ids)
        for chat in kit_chats(args.fidelity_prompts)
    ]
    passage = args.passage.read_text(encoding="utf-8")
    # The ids perplexity() scores: the passage as the tokenizer encodes it, special tokens added.
    ids = list(first.tokenizer.encode(passage, add_special_tokens=True).ids)
    window = min(args.ppl_window or len(ids), len(ids))
    greedy_job = {"prompts": prompts, "new_tokens": args.fidelity_tokens}
    greedy_job["eos"] = sorted(first.eos_ids)
    llama = {}
    for mode, job in (("greedy", greedy_job), ("perplexity", {"ids": ids, "window": window})):
        out = run_worker(
            peer, {"mode": mode, "gguf": str(args.gguf), "threads": args.threads, **job}
        )
        if out.get("error"):
            raise SystemExit(f"llama.cpp's {mode} run failed: {out['error']}")
        llama[mode] = out
    nll = llama["perplexity"]["token_nll"]
    llama_ppl = math.exp(sum(nll) / len(nll))
    builds = {
        precision: score_build(decoder, prompts, passage, window, llama, llama_ppl, args)
        for precision, decoder in decoders.items()
    }
    return {
        "prompts": len(prompts),
        "new_tokens": args.fidelity_tokens,
        "passage": str(
            args.passage.relative_to(ROOT) if args.passage.is_relative_to(ROOT) else args.passage
        ),
        "passage_tokens": len(ids),
        "window": window,
        "llamacpp_ppl": llama_ppl,
        "builds": builds,
    }


def score_build(
    decoder: Any,
    prompts: list[list[int]],
    passage: str,
    window: int,
    llama: dict[str, Any],
    llama_ppl: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One ferry build against llama.cpp's greedy tokens and perplexity."""
    from ferry.generate._perplexity import perplexity, teacher_forced_logits

    reference = llama["greedy"]["tokens"]
    ours = [
        list(decoder.generate(ids=ids, max_new_tokens=args.fidelity_tokens).ids) for ids in prompts
    ]
    found = agreement(ours, reference, llama["greedy"]["relative_gaps"])
    # Teacher-forced: ferry's next token on llama.cpp's own continuation, step by step, so that
    # one early divergence does not decide the rest of a prompt.
    forced = 0
    for ids, ref in zip(prompts, reference, strict=True):
        logits = teacher_forced_logits(decoder, ids + ref[:-1])[len(ids) - 1 :]
        forced += int((logits.argmax(axis=-1) == np.asarray(ref)).sum())
    found["teacher_forced_matching"] = forced
    found["teacher_forced_rate"] = forced / found["reference_tokens"]
    result = perplexity(decoder, passage, window=window)
    if result.tokens != len(llama["perplexity"]["token_nll"]):
        raise SystemExit(
            f"llama.cpp scored {len(llama['perplexity']['token_nll'])} tokens, ferry {result.tokens}"
        )
    found["ppl"] = result.ppl
    found["ppl_ratio"] = result.ppl / llama_ppl
    return found


def fidelity_lines(found: dict[str, Any]) -> list[str]:
    """One line per ferry build: greedy agreement and perplexity against llama.cpp."""
    lines = [
        f"fidelity against llama.cpp on the same GGUF: {found['prompts']} kit chat prompts x "
        f"{found['new_tokens']} new tokens (greedy, to eos); perplexity of {found['passage']} "
        f"({found['passage_tokens']} tokens, windows of {found['window']}): llama.cpp "
        f"{found['llamacpp_ppl']:.4f}"
    ]
    for precision, g in found["builds"].items():
        total = g["reference_tokens"]
        lines.append(
            f"ferry {precision}: greedy {g['prefix_tokens']}/{total} ({100 * g['prefix_rate']:.1f}%) "
            f"up to the first divergence per prompt, {g['matching_positions']}/{total} "
            f"({100 * g['matching_rate']:.1f}%) matching positions, {g['identical_prompts']} of "
            f"{g['prompts']} prompts identical, {g['divergences_at_near_ties']} first divergences "
            f"at a near-tie (top two within 0.1%); teacher-forced on llama.cpp's tokens "
            f"{g['teacher_forced_matching']}/{total} ({100 * g['teacher_forced_rate']:.1f}%); "
            f"perplexity {g['ppl']:.4f}, ratio to llama.cpp {g['ppl_ratio']:.4f} "
            f"({100 * (g['ppl_ratio'] - 1):+.2f}%)"
        )
    lines.append("targets (ferry int4): greedy >= 95%, perplexity within 1% of llama.cpp's")
    return lines


def _cell(figure: dict[str, Any] | None) -> str:
    if not figure:
        return "-"
    value = figure["median"]
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The table and the fidelity lines as markdown (medians), for the README."""
    lines = []
    if results["configurations"]:
        lines += [
            "| configuration | prompt | new | TTFT ms | prefill tok/s | decode tok/s | peak RSS MiB |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
    for row in results["configurations"]:
        if row["skipped"] or row["error"]:
            why = "skipped" if row["skipped"] else "failed"
            lines.append(f"| {row['label']} | | | {why} | | | |")
            continue
        rss = row["peak_rss_mb"]
        lines.append(
            f"| {row['label']} | {row['prompt_tokens']} | {row['new_tokens']} | "
            f"{_cell(row['ttft_ms'])} | {_cell(row['prefill_tokens_per_s'])} | "
            f"{_cell(row['decode_tokens_per_s'])} | {'-' if rss is None else f'{rss:,.0f}'} |"
        )
    if "fidelity" in results:
        lines += [""] if lines else []
        lines += [f"- {line}" for line in fidelity_lines(results["fidelity"])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ferry-gen")
    parser.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"ferry's builds ({', '.join(BUILDS)}), or none",
    )
    parser.add_argument("--backends", default="onnxruntime,openvino")
    parser.add_argument(
        "--peers",
        default=None,
        help="llamacpp,ortgenai,ovgenai or none (default: those whose venv exists)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-n", "--repeats", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--fidelity", action="store_true", help="ferry int4 against llama.cpp")
    parser.add_argument(
        "--fidelity-builds", default="int4,fp32", help="ferry's builds scored (int4 first)"
    )
    parser.add_argument("--fidelity-prompts", type=int, default=16)
    parser.add_argument("--fidelity-tokens", type=int, default=32)
    parser.add_argument("--passage", type=Path, default=PASSAGE)
    parser.add_argument(
        "--ppl-window", type=int, default=1024, help="tokens per window; 0: the whole passage"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown too")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.gguf.is_file():
        print(f"no {args.gguf}: fetch the kit (scripts/fetch-kit.sh)", file=sys.stderr)
        return 2

    from rich.console import Console

    from ferry.bench import device_summary, generate_lines, generate_table
    from ferry.bench._device import device_info

    console = Console(width=200, highlight=False)
    peers, missing = available_peers(args.peers)
    for line in missing:
        console.print(line)
    precisions = [p for p in args.precisions.split(",") if p and p != "none"]
    unknown = [p for p in precisions if p not in BUILDS]
    if unknown:
        raise SystemExit(f"--precisions: unknown {', '.join(unknown)}; known: {', '.join(BUILDS)}")
    merged: dict[str, Any] = {
        "schema": "ferry.bench.generate/1",
        "model": {"name": args.gguf.name, "precisions": precisions},
        "settings": {
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "warmup": 1,
            "isolated": True,
            "prompt": "a fixed English passage (Alice's Adventures in Wonderland) tokenized "
            "without special tokens, repeated and cut to prompt_tokens",
        },
        "configurations": [],
    }
    for precision in precisions:
        folder = args.work / f"smollm2-{precision}"
        if args.rebuild or not (folder / "model.onnx").is_file():
            start = time.perf_counter()
            convert(args.gguf, folder, precision)
            console.print(f"converted {precision} in {time.perf_counter() - start:.0f} s: {folder}")
        results = bench(folder, args)
        for row in results["configurations"]:
            row["label"] = f"{BUILDS[precision][2]} / {row['label']}"
        merged["settings"] = results["settings"]
        merged["device"] = results["device"]
        merged["configurations"] += results["configurations"]
    if peers:
        from ferry.bench._generate import prompt_ids
        from ferry.formats import read_gguf
        from ferry.generate import build_tokenizer

        # The very prompt ids ferry's rows were given (the same tokenizer, passage and cut).
        prompt = prompt_ids(build_tokenizer(read_gguf(args.gguf).metadata), args.prompt_tokens)
        for peer in peers:
            console.print(f"measuring {peer.title} ...")
            merged["configurations"].append(measure_peer(peer, prompt, args, console))
    if args.fidelity:
        merged["fidelity"] = fidelity(args, console)
    merged.setdefault("device", device_info())
    console.print(generate_table(merged))
    for line in generate_lines(merged):
        console.print(line)
    if peers:
        console.print(
            "peers: each in a fresh process with its own venv's Python, the same prompt ids; "
            "ferry's decode steps also detokenize each token (as ferry generate streams), the "
            "peers' workers do not."
        )
    if "fidelity" in merged:
        for line in fidelity_lines(merged["fidelity"]):
            console.print(line, markup=False)
    console.print(f"device: {device_summary(device_info())}")
    if args.markdown:
        console.print(markdown(merged), markup=False)
    if args.json is not None:
        args.json.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
