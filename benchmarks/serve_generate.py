"""Serving the kit's SmolLM2-135M-Instruct (GGUF Q4_1) over an OpenAI-compatible chat endpoint:
``ferry serve`` against llama.cpp's server (llama-cpp-python's), under load, in one run.

Each server runs alone (never two loaded at once), in its own process on 127.0.0.1 and a free
port, started afresh for each concurrency in ``--concurrency`` and stopped after it: llama.cpp's
server on the GGUF with ``--threads`` threads (``.venv-llamacpp``, made by
``bash scripts/llm-peers-env.sh llamacpp``; it has no parallel slots: concurrent requests
queue), and ``ferry serve`` on the artifact ``ferry convert`` builds from the same GGUF into
``--work`` (kept between runs; ``--rebuild`` builds again; ``--artifact DIR`` serves another
build instead, e.g. one converted with other options), with ``--max-num-seqs`` set to the
concurrency where ``ferry serve`` has that flag. After a warm-up (rounds of that many requests
of 16 tokens at once, until ``--warmup-s`` seconds have passed: a freshly started llama.cpp server
took 80-130 ms a token in its first ~10 s on this 2-core machine, 20 ms after), a closed-loop driver
(benchmarks/_serve_generate/_driver.py: asyncio and httpx) runs that many virtual users, each
sending ``--requests-per-user`` streamed chat completions one after another: the kit's 16 chat
prompts, ``--max-tokens`` tokens at most, temperature 0, ``stream_options.include_usage``.

Per server and concurrency: output tokens/s (the completed requests' tokens, from ``usage`` when
the server sends it, else one per content chunk, over the whole window), time to first token (to
the first chunk with content) and inter-token latency (between chunks with content) at p50 and
p99, and the failed requests (a status other than 200, a broken stream, an error in the stream,
a timeout), counted and named, never dropped. The machine's load average is noted before and
after each run (other work on the machine skews the figures). Before ferry's loads,
``ferry bench ARTIFACT --generate`` gives ferry generate's own decode speed on the same artifact
and threads (``--no-reference`` skips it), which one stream at concurrency 1 is held to.

    python benchmarks/serve_generate.py [--servers llamacpp,ferry] [--concurrency 1,4,16]
        [--requests-per-user 3] [--max-tokens 128] [--threads 2] [--warmup-s 10] [--work DIR]
        [--rebuild | --artifact DIR]
        [--no-reference] [--markdown] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on sys.path (a module here named like a package
# would shadow it); the repository's root takes its place, for ``benchmarks._...``.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)

from benchmarks._serve_generate import (  # noqa: E402
    LLAMACPP_PYTHON,
    SCHEMA,
    LoadSpec,
    ServerError,
    ServerSpec,
    build_artifact,
    cpu_seconds,
    ferry_serve_flags,
    ferry_spec,
    llamacpp_spec,
    llamacpp_version,
    markdown,
    notes,
    plain,
    run_load,
    running,
    summarize,
)
from benchmarks._serve_generate._reference import (  # noqa: E402
    chat_reference,
    generate_reference,
)
from benchmarks.generate import GGUF, kit_chats  # noqa: E402

SERVERS = ("llamacpp", "ferry")


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise SystemExit(
            f"--concurrency: give whole numbers of 1 or more, e.g. 1,4,16 (got {text})"
        )
    return levels


def measure(
    spec: ServerSpec, chats: list[Any], concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One server at one concurrency: started, warmed up, loaded, stopped."""
    load_spec = LoadSpec(
        url=spec.url,
        model=spec.model,
        chats=chats,
        concurrency=concurrency,
        requests_per_user=args.requests_per_user,
        max_tokens=args.max_tokens,
        extra_body=spec.extra_body,
        timeout_s=args.timeout,
    )
    run: dict[str, Any] = {
        "server": spec.title,
        "name": spec.name,
        "concurrency": concurrency,
        "command": spec.command,
    }
    log = args.work / "logs" / f"{spec.name}-c{concurrency}.log"
    with running(spec, log) as process:
        run["warmup_requests"] = warm_up(load_spec, args.warmup_s)
        run["load_before"] = os.getloadavg()
        server_cpu, client_cpu = cpu_seconds(process.pid), time.process_time()
        load = asyncio.run(run_load(load_spec))
        run["load_after"] = os.getloadavg()
        # How much of the window each side got the CPU for: on a shared machine, a server short
        # of its cores shows here.
        run["client_cpu_s"] = time.process_time() - client_cpu
        after = cpu_seconds(process.pid)
        run["server_cpu_s"] = None if after is None or server_cpu is None else after - server_cpu
    run["summary"] = summarize(load)
    run["requests"] = [r.as_dict() for r in load.requests]
    return run


def warm_up(spec: LoadSpec, seconds: float) -> int:
    """Rounds of ``spec.concurrency`` short requests at once until ``seconds`` have passed (one
    round at least); how many requests were sent. ServerError when one fails."""
    short = replace(spec, requests_per_user=1, max_tokens=min(16, spec.max_tokens))
    start, sent = time.perf_counter(), 0
    while sent == 0 or time.perf_counter() - start < seconds:
        load = asyncio.run(run_load(short))
        sent += len(load.requests)
        failed = next((r for r in load.requests if not r.ok), None)
        if failed is not None:
            raise ServerError(f"a warm-up request failed: {failed.error}")
    return sent


def ferry_artifact(args: argparse.Namespace) -> Path:
    """The artifact ferry serves: ``--artifact``, else the one built into ``--work``."""
    return args.artifact if args.artifact is not None else args.work / "smollm2-int4"


def server_specs(
    name: str, args: argparse.Namespace, console_print: Any
) -> tuple[dict[str, Any], Any] | str:
    """The server's entry in the results and a function of the concurrency giving its spec, or
    why it cannot run here."""
    if name == "llamacpp":
        found = llamacpp_version()
        if found is None:
            return (
                f"no {LLAMACPP_PYTHON.parent.parent.name}/ with llama-cpp-python's server: "
                "bash scripts/llm-peers-env.sh llamacpp"
            )
        first = llamacpp_spec(args.gguf, threads=args.threads)
        return (
            {"name": name, "title": first.title, "version": found, "note": first.note},
            lambda c: llamacpp_spec(args.gguf, threads=args.threads),
        )
    artifact = ferry_artifact(args)
    start = time.perf_counter()
    if args.artifact is not None:
        if not (artifact / "model.onnx").is_file():
            return f"--artifact {artifact} holds no model.onnx: give a ferry convert output folder"
    else:
        try:
            if build_artifact(args.gguf, artifact, rebuild=args.rebuild):
                console_print(f"ferry convert: {artifact} in {time.perf_counter() - start:.0f} s")
        except ServerError as e:
            return str(e)
    flags = ferry_serve_flags()
    first = ferry_spec(artifact, concurrency=1, threads=args.threads, flags=flags)
    return (
        {"name": name, "title": first.title, "version": version("ferry"), "note": first.note},
        lambda c: ferry_spec(artifact, concurrency=c, threads=args.threads, flags=flags),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", type=Path, default=GGUF)
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "ferry-serve-gen"
    )
    parser.add_argument("--servers", default=",".join(SERVERS), help="llamacpp,ferry")
    parser.add_argument("--concurrency", default="1,4,16", help="virtual users, e.g. 1,4,16")
    parser.add_argument("--requests-per-user", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--warmup-s", type=float, default=10.0, help="seconds of warm-up requests per load"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--rebuild", action="store_true", help="convert the GGUF again")
    parser.add_argument(
        "--artifact",
        type=Path,
        default=None,
        help="serve this artifact (a ferry convert output folder) instead of "
        "the one built into --work",
    )
    parser.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip ferry bench --generate (ferry generate's decode speed, for concurrency 1)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    levels = _levels(args.concurrency)
    names = [n for n in args.servers.split(",") if n]
    unknown = [n for n in names if n not in SERVERS]
    if unknown or not names:
        print(f"--servers: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(SERVERS)}")
        return 2
    if args.requests_per_user < 1 or args.max_tokens < 1 or args.threads < 1:
        print("--requests-per-user, --max-tokens and --threads must be 1 or more")
        return 2
    if not args.gguf.is_file():
        print(f"no {args.gguf}: fetch the kit (scripts/fetch-kit.sh)", file=sys.stderr)
        return 2
    chats = kit_chats(16)
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "model": args.gguf.name,
        "settings": {
            "concurrency": levels,
            "requests_per_user": args.requests_per_user,
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "chats": len(chats),
            "temperature": 0.0,
            "warmup_s": args.warmup_s,
        },
        "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "servers": [],
        "runs": [],
    }
    for name in names:
        found = server_specs(name, args, print)
        if isinstance(found, str):
            print(f"{name}: not measured: {found}")
            results["runs"] += [
                {"server": name, "name": name, "concurrency": c, "error": found} for c in levels
            ]
            continue
        entry, spec_for = found
        results["servers"].append(entry)
        if name == "ferry" and args.reference and 1 in levels:
            # Just before ferry's own loads: the two see the machine as alike as can be.
            print("ferry bench --generate (ferry generate's decode speed, for concurrency 1) ...")
            results["reference"] = generate_reference(
                ferry_artifact(args), threads=args.threads, new_tokens=args.max_tokens
            )
            # the same chats as the one stream at concurrency 1 (user 0's requests)
            results["chat_reference"] = chat_reference(
                ferry_artifact(args),
                chats[: args.requests_per_user],
                threads=args.threads,
                new_tokens=args.max_tokens,
            )
        for i, c in enumerate(levels):
            spec = spec_for(c)
            try:
                run = measure(spec, chats, c, args)
            except ServerError as e:
                why = str(e).splitlines()[0]
                print(f"{spec.title} at concurrency {c}: {e}", file=sys.stderr)
                # A server that does not start at one concurrency will not at the next.
                results["runs"] += [
                    {"server": spec.title, "name": name, "concurrency": level, "error": why}
                    for level in levels[i:]
                ]
                break
            s = run["summary"]
            print(
                f"{spec.title} at concurrency {c}: {s['completed']}/{s['requests']} requests, "
                f"{s['output_tokens_per_s']:.1f} output tok/s, {s['errors']} errors"
            )
            results["runs"].append(run)
    results["machine"]["load_after"] = os.getloadavg()
    print(plain(results))
    for line in notes(results):
        print(line)
    if args.markdown:
        print(markdown(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
