"""ONNX Runtime GenAI on a model its own builder made from the GGUF, for benchmarks/generate.py;
run with ``.venv-ortgenai/bin/python`` (scripts/llm-peers-env.sh): ``ortgenai.py JOB.json OUT.json``.

Modes (the job's ``mode``):

* ``build``: the GGUF loaded by transformers (dequantized to float32), saved as a Hugging Face
  folder (transformers refuses to ``save_pretrained`` a GGUF-loaded model; a fresh model of the
  same config with its state_dict copied saves fine), then ``python -m
  onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu``: its own int4 (round to
  nearest, blocks of 32) requantization of the float weights.
* ``speed``: greedy generation of exactly ``new_tokens`` tokens after the ``prompt`` ids
  (``min_length`` keeps eos from ending it early), ``warmup`` untimed then ``repeats`` timed
  runs, each with a fresh generator (an empty cache); ``threads`` intra-op threads written into
  the model's ``genai_config.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common


def build(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    gguf, out = Path(job["gguf"]), Path(job["out"])
    hf = out.parent / (out.name + "-hf")
    start = time.perf_counter()
    if not (hf / "config.json").is_file():
        kwargs: dict[str, Any] = {"gguf_file": gguf.name}
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), dtype=torch.float32, **kwargs
        )
        fresh = transformers.AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict())
        fresh.generation_config = loaded.generation_config
        fresh.save_pretrained(str(hf))
        tokenizer.save_pretrained(str(hf))
        # The saved config still says the weights are GGUF-quantized, which the builder refuses:
        # they are float32 now.
        config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
        config.pop("quantization_config", None)
        (hf / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
    command += ["-i", str(hf), "-o", str(out), "-p", "int4", "-e", "cpu"]
    command += ["-c", str(out.parent / (out.name + "-cache"))]
    log = out.parent / (out.name + "-build.log")
    with log.open("w", encoding="utf-8") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        last = log.read_text(encoding="utf-8").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the builder failed ({log}): {last[0]}")
    return {"build_s": time.perf_counter() - start, "command": " ".join(command[1:])}


def speed(job: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime_genai as og

    folder = Path(job["model"])
    config_file = folder / "genai_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = int(job["threads"])
    config_file.write_text(json.dumps(config, indent=4), encoding="utf-8")

    prompt, m = list(job["prompt"]), int(job["new_tokens"])
    before = _common.peak_rss_mb()
    start = time.perf_counter()
    model = og.Model(str(folder))
    load_s = time.perf_counter() - start
    runs = _common.Runs()
    for i in range(int(job["warmup"]) + int(job["repeats"])):
        params = og.GeneratorParams(model)
        total = len(prompt) + m
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        stamps: list[float] = []
        start = time.perf_counter()
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
            stamps.append(time.perf_counter())
        if len(stamps) != m:
            raise RuntimeError(f"ONNX Runtime GenAI made {len(stamps)} tokens, not {m}")
        if i >= int(job["warmup"]):
            runs.add(start, stamps, len(prompt))
        del generator
    return runs.result(
        load_s=load_s,
        before=before,
        prompt_tokens=len(prompt),
        new_tokens=m,
        version=og.__version__,
    )


if __name__ == "__main__":
    sys.exit(_common.main({"build": build, "speed": speed}))
