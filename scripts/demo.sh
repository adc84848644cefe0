#!/usr/bin/env bash
# ferry's main job on the bundled example: train the digits CNN in PyTorch, convert it (verified),
# inspect, run and benchmark it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
out="${1:-demo-out}"

echo; echo "==> 1. the bundled example: a CNN trained on scikit-learn's digits, saved with torch.export"
python examples/digits_cnn.py export "$out"

echo; echo "==> 2. ferry convert: PyTorch -> ONNX, verified against PyTorch on 8 real digits"
# .pt2 archives hold pickled data; this one we just wrote ourselves, so we trust it.
ferry convert "$out/digits_cnn.pt2" -o "$out/model.onnx" --trust-pickle \
  --shape x=batch,1,8,8 --example-input "x=$out/digits.npy"
python examples/digits_cnn.py accuracy "$out/model.onnx"

echo; echo "==> 3. ferry convert again: down to opset 17 for older runtimes, verified against the first"
ferry convert "$out/model.onnx" -o "$out/model17.onnx" --opset 17

echo; echo "==> 4. ferry info"
ferry info "$out/model.onnx"

echo; echo "==> 5. ferry run on 8 real test images"
ferry run "$out/model.onnx" --input "x=$out/digits.npy" --output-dir "$out/outputs"
python - "$out" <<'PY'
import sys, numpy as np
logits = np.load(f"{sys.argv[1]}/outputs/output.npy")
print("predicted digits:", logits.argmax(axis=1).tolist())
PY

echo; echo "==> 6. ferry bench: ONNX Runtime and OpenVINO at each precision, batch 1 and 32, saved into the artifact's report"
ferry bench "$out" --backends onnxruntime,openvino --batch 1,32 --iterations 300 --plot "$out/bench.png" --save-report
