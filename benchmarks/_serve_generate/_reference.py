"""``ferry generate``'s own decode speed on the artifact ``ferry serve`` loads, the yardstick of
issue 30's goal at concurrency 1 (one served stream within 10% of it): ``ferry bench ARTIFACT
--generate`` (a fresh process, greedy, exactly ``new_tokens`` tokens, eos ignored, the median of
three runs after a warm-up), on ONNX Runtime with the same threads."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 64


def generate_reference(artifact: Path, *, threads: int, new_tokens: int) -> dict[str, Any]:
    """``{"decode_tokens_per_s", "ttft_ms", "label"}`` (medians) from ``ferry bench --generate``,
    or ``{"error": why}``."""
    with tempfile.TemporaryDirectory(prefix="ferry-serve-gen-ref-") as tmp:
        out = Path(tmp) / "bench.json"
        command = [sys.executable, "-m", "ferry.cli.main", "bench", str(artifact), "--generate"]
        command += ["--prompt-tokens", str(PROMPT_TOKENS), "--new-tokens", str(new_tokens)]
        command += ["--threads", str(threads), "-n", "3", "--backends", "onnxruntime"]
        command += ["--json", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            return {"error": f"ferry bench --generate failed ({done.returncode}): {tail[0]}"}
        results = json.loads(out.read_text(encoding="utf-8"))
    for row in results.get("configurations", []):
        if row.get("backend") == "onnxruntime" and not row.get("error") and not row.get("skipped"):
            return {
                "label": row.get("label"),
                "decode_tokens_per_s": row["decode_tokens_per_s"]["median"],
                "ttft_ms": row["ttft_ms"]["median"],
                "prompt_tokens": PROMPT_TOKENS,
                "new_tokens": new_tokens,
            }
    return {"error": "ferry bench --generate measured no ONNX Runtime configuration"}


_CHAT_SCRIPT = """
import json, sys, time
from ferry.generate import DecoderSession
artifact, threads, new_tokens, chats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
decoder = DecoderSession.from_folder(artifact, backends=["onnxruntime"], threads=threads)
decoder.generate(messages=chats[0], max_new_tokens=8)  # warm-up
rates, ttfts = [], []
for _ in range(2):
    for messages in chats:
        start = time.perf_counter()
        first, new = None, 0
        for item in decoder.generate(messages=messages, max_new_tokens=new_tokens, temperature=0, stream=True):
            if first is None:
                first = time.perf_counter()
            new += 1
        end = time.perf_counter()
        new -= 1  # the final Generation
        if new > 1:
            rates.append((new - 1) / (end - first))
        ttfts.append(1000 * (first - start))
rates.sort(); ttfts.sort()
print(json.dumps({"decode_tokens_per_s": rates[len(rates) // 2], "ttft_ms": ttfts[len(ttfts) // 2]}))
"""


def chat_reference(
    artifact: Path, chats: list[Any], *, threads: int, new_tokens: int
) -> dict[str, Any]:
    """``ferry generate``'s token loop on the very chats one served stream gets at concurrency 1,
    measured as the driver measures a stream (new tokens after the first over the time after it,
    the median over the chats, twice each after a warm-up), in a fresh process with the same
    threads: ``{"decode_tokens_per_s", "ttft_ms", "label"}`` or ``{"error": why}``."""
    command = [sys.executable, "-c", _CHAT_SCRIPT, str(artifact), str(threads), str(new_tokens)]
    command.append(json.dumps(chats))
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        return {"error": f"the token loop on the chats failed ({done.returncode}): {tail[0]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["label"] = f"the token loop on the same {len(chats)} chats"
    return result
