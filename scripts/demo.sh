#!/usr/bin/env bash
# ferry's main job on the bundled example: build the digits CNN, convert, inspect, run and benchmark it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
out="${1:-demo-out}"

echo; echo "==> 1. the bundled example: a CNN trained on scikit-learn's digits, exported from PyTorch"
python examples/digits_cnn.py "$out"

echo; echo "==> 2. ferry convert: opset conversion, shape inference and ONNX's checker"
ferry convert "$out/digits_cnn.onnx" -o "$out/model.onnx" --opset 17

echo; echo "==> 3. ferry info"
ferry info "$out/model.onnx"

echo; echo "==> 4. ferry run on 8 real test images"
ferry run "$out/model.onnx" --input "input=$out/digits.npy" --output-dir "$out/outputs"
python - "$out" <<'PY'
import sys, numpy as np
logits = np.load(f"{sys.argv[1]}/outputs/logits.npy")
print("predicted digits:", logits.argmax(axis=1).tolist())
PY

echo; echo "==> 5. ferry bench (batch 1, then batch 32)"
ferry bench "$out/model.onnx" --iterations 1000
ferry bench "$out/model.onnx" --shape input=32x1x8x8 --iterations 300
