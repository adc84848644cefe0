"""llama.cpp (llama-cpp-python) on a GGUF file, for benchmarks/generate.py; run with
``.venv-llamacpp/bin/python`` (scripts/llm-peers-env.sh): ``llamacpp.py JOB.json OUT.json``.

Modes (the job's ``mode``):

* ``speed``: greedy generation of exactly ``new_tokens`` tokens after the ``prompt`` ids (eos
  does not end it), ``warmup`` untimed then ``repeats`` timed runs, the cache emptied before
  each (no prefix reuse between runs): time to first token, prefill and decode tokens/s, load
  time and peak RSS.
* ``greedy``: for each prompt (ids), at most ``new_tokens`` tokens, each the argmax of the
  logits, ending at an id of ``eos``; with each step's top-two logit gap (near-ties).
* ``perplexity``: the ``ids`` cut into windows of ``window`` tokens, each evaluated from an
  empty cache with every position's logits kept (``logits_all``); each next token's negative
  log-likelihood from a float64 log-softmax.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _common
import llama_cpp
import numpy as np
from llama_cpp import Llama


def _load(job: dict[str, Any], n_ctx: int, logits_all: bool) -> tuple[Llama, float]:
    start = time.perf_counter()
    llm = Llama(
        model_path=job["gguf"],
        n_ctx=n_ctx,
        n_batch=min(n_ctx, 512),
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        logits_all=logits_all,
        verbose=False,
    )
    return llm, time.perf_counter() - start


def speed(job: dict[str, Any]) -> dict[str, Any]:
    prompt, m = list(job["prompt"]), int(job["new_tokens"])
    before = _common.peak_rss_mb()
    llm, load_s = _load(job, len(prompt) + m + 8, logits_all=False)
    runs = _common.Runs()
    for i in range(int(job["warmup"]) + int(job["repeats"])):
        llm.reset()  # no prefix of the last run reused: every run prefills the whole prompt
        stamps: list[float] = []
        start = time.perf_counter()
        for _ in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == m:
                break
        if i >= int(job["warmup"]):
            runs.add(start, stamps, len(prompt))
    return runs.result(
        load_s=load_s,
        before=before,
        prompt_tokens=len(prompt),
        new_tokens=m,
        version=llama_cpp.__version__,
    )


def greedy(job: dict[str, Any]) -> dict[str, Any]:
    prompts, m, eos = job["prompts"], int(job["new_tokens"]), set(job["eos"])
    longest = max(len(p) for p in prompts)
    llm, _ = _load(job, longest + m + 8, logits_all=True)
    out, gaps = [], []
    for prompt in prompts:
        llm.reset()
        llm.eval(prompt)
        new: list[int] = []
        gap: list[float] = []
        while len(new) < m:
            logits = llm.scores[llm.n_tokens - 1].astype(np.float64)
            top2 = np.sort(logits)[-2:]
            token = int(logits.argmax())
            new.append(token)
            gap.append(float((top2[1] - top2[0]) / max(abs(top2[1]), 1e-30)))
            if token in eos:
                break
            llm.eval([token])
        out.append(new)
        gaps.append(gap)
    return {"tokens": out, "relative_gaps": gaps}


def perplexity(job: dict[str, Any]) -> dict[str, Any]:
    ids, window = list(job["ids"]), int(job["window"])
    llm, _ = _load(job, window, logits_all=True)
    nll: list[float] = []
    for start in range(0, len(ids), window):
        part = ids[start : start + window]
        if len(part) < 2:
            continue
        llm.reset()
        llm.eval(part)
        x = llm.scores[: len(part) - 1].astype(np.float64)
        top = x.max(axis=-1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(x - top).sum(axis=-1))
        nll.extend((lse - x[np.arange(len(x)), part[1:]]).tolist())
    return {"token_nll": nll}


if __name__ == "__main__":
    sys.exit(_common.main({"speed": speed, "greedy": greedy, "perplexity": perplexity}))
