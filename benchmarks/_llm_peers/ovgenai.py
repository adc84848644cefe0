"""OpenVINO GenAI's LLMPipeline on a GGUF file (it reads and converts the GGUF itself), for
benchmarks/generate.py; run with ``.venv-ovgenai/bin/python`` (scripts/llm-peers-env.sh):
``ovgenai.py JOB.json OUT.json``.

Mode ``speed``: greedy generation of exactly ``new_tokens`` tokens (``ignore_eos``) after the
``prompt`` ids given as tokens (no tokenizer in the way), ``warmup`` untimed then ``repeats``
timed runs; prefix caching off so that every run prefills the whole prompt. A streamer stamps
each token as it comes.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _common
import numpy as np
import openvino as ov
import openvino_genai as ov_genai


class _Stamps(ov_genai.StreamerBase):  # type: ignore[misc]
    """Records when each new token arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def write(self, token: int | list[int]) -> Any:
        now = time.perf_counter()
        self.stamps.extend([now] * (len(token) if isinstance(token, list) else 1))
        return ov_genai.StreamingStatus.RUNNING

    def end(self) -> None:
        pass


def speed(job: dict[str, Any]) -> dict[str, Any]:
    prompt, m = list(job["prompt"]), int(job["new_tokens"])
    before = _common.peak_rss_mb()
    start = time.perf_counter()
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    pipe = ov_genai.LLMPipeline(
        job["gguf"],
        "CPU",
        scheduler_config=scheduler,
        INFERENCE_NUM_THREADS=int(job["threads"]),
    )
    load_s = time.perf_counter() - start
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = m
    config.min_new_tokens = m
    config.ignore_eos = True
    config.do_sample = False
    ids = np.asarray([prompt], dtype=np.int64)
    inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    runs = _common.Runs()
    for i in range(int(job["warmup"]) + int(job["repeats"])):
        streamer = _Stamps()
        start = time.perf_counter()
        pipe.generate(inputs, config, streamer)
        if len(streamer.stamps) != m:
            raise RuntimeError(f"OpenVINO GenAI made {len(streamer.stamps)} tokens, not {m}")
        if i >= int(job["warmup"]):
            runs.add(start, streamer.stamps, len(prompt))
    return runs.result(
        load_s=load_s,
        before=before,
        prompt_tokens=len(prompt),
        new_tokens=m,
        version=ov_genai.__version__,
    )


if __name__ == "__main__":
    sys.exit(_common.main({"speed": speed}))
