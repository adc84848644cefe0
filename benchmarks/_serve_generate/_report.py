"""The results of benchmarks/serve_generate.py as a table (plain or markdown) and its notes.

Every row is one server at one concurrency: output tokens/s over the whole load, time to first
token and inter-token latency at p50/p99 (milliseconds), and the failed requests (counted, with
their kinds in the notes). A server that could not be measured gets one row saying why.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "ferry.bench.serve_generate/1"
HEADER = (
    "server",
    "concurrency",
    "requests",
    "output tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "errors",
)


def _ms(figures: dict[str, float] | None, key: str) -> str:
    if not figures:
        return "-"
    value = figures[key]
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row of :data:`HEADER`'s cells per run."""
    out = []
    for run in results["runs"]:
        if run.get("error"):
            out.append((run["server"], str(run["concurrency"]), "-", "failed", *["-"] * 4, "-"))
            continue
        s = run["summary"]
        out.append(
            (
                run["server"],
                str(run["concurrency"]),
                f"{s['completed']}/{s['requests']}",
                f"{s['output_tokens_per_s']:.1f}",
                _ms(s["ttft_ms"], "p50"),
                _ms(s["ttft_ms"], "p99"),
                _ms(s["itl_ms"], "p50"),
                _ms(s["itl_ms"], "p99"),
                str(s["errors"]),
            )
        )
    return out


def markdown(results: dict[str, Any]) -> str:
    """The table as markdown."""
    numeric = "|---|" + "---:|" * (len(HEADER) - 1)
    lines = ["| " + " | ".join(HEADER) + " |", numeric]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines)


def plain(results: dict[str, Any]) -> str:
    """The table in aligned columns, for the terminal."""
    table = [HEADER, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    )


def notes(results: dict[str, Any]) -> list[str]:
    """The lines under the table: settings, how each server ran, the machine's load, failures,
    and ferry against llama.cpp's server where both ran."""
    s = results["settings"]
    lines = [
        f"settings: {s['requests_per_user']} requests per user, closed loop; the kit's "
        f"{s['chats']} chat prompts; max_tokens {s['max_tokens']}, temperature 0, streamed; "
        f"{s['threads']} threads per server; one server at a time, started afresh for each "
        f"concurrency, warmed up for {s['warmup_s']:g} s before each load",
        "TTFT: to the first chunk with content; ITL: between chunks with content; output tok/s: "
        "tokens of the completed requests over the whole window",
    ]
    for server in results["servers"]:
        version = f" {server['version']}" if server.get("version") else ""
        lines.append(f"{server['title']}{version}: {server['note']}")
    for run in results["runs"]:
        where = f"{run['server']} at concurrency {run['concurrency']}"
        if run.get("error"):
            lines.append(f"{where}: not measured: {run['error']}")
            continue
        summary = run["summary"]
        decode = summary.get("decode_tokens_per_s")
        lines.append(
            f"{where}: {summary['output_tokens']} tokens (counted from "
            f"{summary['tokens_counted_from']}) in {summary['window_s']:.1f} s"
            + (f", {decode:.1f} tok/s per stream once started (median)" if decode else "")
            + "; finish "
            + ", ".join(f"{k} {v}" for k, v in summary["finish_reasons"].items())
            + f"; load average {run['load_before'][0]:.2f} before, "
            f"{run['load_after'][0]:.2f} after" + _cpu(run, summary["window_s"])
        )
        for kind, count in summary["error_kinds"].items():
            lines.append(f"  {count} failed: {kind}")
    lines += comparison(results)
    machine = results["machine"]
    lines.append(
        f"machine: {machine['cpus']} CPUs; load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.2f}' for x in machine['load_before'])} at the start, "
        f"{', '.join(f'{x:.2f}' for x in machine['load_after'])} at the end"
    )
    return lines


def _cpu(run: dict[str, Any], window_s: float) -> str:
    """ "; CPU: server 1.85 cores, client 0.10" (CPU seconds over the window), where known."""
    parts = [
        f"{who} {run[key] / window_s:.2f} cores"
        for who, key in (("server", "server_cpu_s"), ("client", "client_cpu_s"))
        if run.get(key) is not None and window_s > 0
    ]
    return f"; CPU: {', '.join(parts)}" if parts else ""


def comparison(results: dict[str, Any]) -> list[str]:
    """ferry against llama.cpp's server at each concurrency both ran (issue 30's goal at 16:
    output tokens/s at least 2x, and a lower p99 time to first token), and one ferry stream
    against ferry generate's decode speed (the goal at 1: within 10%)."""
    by: dict[tuple[str, int], dict[str, Any]] = {
        (run["name"], run["concurrency"]): run["summary"]
        for run in results["runs"]
        if not run.get("error")
    }
    lines = []
    reference = results.get("reference")
    single = by.get(("ferry", 1))
    if reference and reference.get("error"):
        lines.append(
            f"ferry bench --generate (the reference at concurrency 1): {reference['error']}"
        )
    elif reference and single and single.get("decode_tokens_per_s"):
        ratio = single["decode_tokens_per_s"] / reference["decode_tokens_per_s"]
        lines.append(
            f"ferry serve at concurrency 1 decodes {single['decode_tokens_per_s']:.1f} tok/s per "
            f"stream (median), ferry generate {reference['decode_tokens_per_s']:.1f} "
            f"(ferry bench --generate, {reference['label']}): {ratio:.2f}x (goal: within 10%)"
        )
    chat = results.get("chat_reference")
    if chat and single and single.get("decode_tokens_per_s") and not chat.get("error"):
        ratio = single["decode_tokens_per_s"] / chat["decode_tokens_per_s"]
        lines.append(
            f"ferry serve at concurrency 1 against {chat['label']} "
            f"({chat['decode_tokens_per_s']:.1f} tok/s, measured as a stream): {ratio:.2f}x"
        )
    elif chat and chat.get("error"):
        lines.append(f"the token loop on the chats: {chat['error']}")
    for (name, c), ours in sorted(by.items()):
        theirs = by.get(("llamacpp", c))
        if name != "ferry" or theirs is None or not theirs["output_tokens_per_s"]:
            continue
        ratio = ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
        line = f"ferry / llama.cpp server at concurrency {c}: output tok/s {ratio:.2f}x"
        if ours["ttft_ms"] and theirs["ttft_ms"]:
            line += f", TTFT p99 {ours['ttft_ms']['p99']:.0f} vs {theirs['ttft_ms']['p99']:.0f} ms"
        lines.append(line)
    return lines
