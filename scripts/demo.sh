#!/usr/bin/env bash
# ferry's main job on the bundled example: train the digits CNN in PyTorch, convert it (verified),
# optimize it (verified), inspect, run, benchmark and serve it.
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

echo; echo "==> 4. ferry optimize: graph passes and fusions, verified on the real digits and timed, or refused"
ferry optimize "$out/model.onnx" -o "$out/model.opt.onnx" --level extended --input "x=$out/digits.npy"
python examples/digits_cnn.py accuracy "$out/model.opt.onnx"

echo; echo "==> 4b. ferry info"
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

echo; echo "==> 7. ferry serve: the artifact over HTTP (KServe v2, as Triton speaks it), queried with Triton's own client"
port="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
ferry serve "$out" --port "$port" > "$out/serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
python - "$out" "$port" <<'PY'
import sys, time
import numpy as np
import tritonclient.http as http

out, port = sys.argv[1], sys.argv[2]
client = http.InferenceServerClient(f"127.0.0.1:{port}")
for _ in range(300):  # the server loads and warms the model before it reports ready
    try:
        if client.is_server_ready():
            break
    except Exception:
        pass
    time.sleep(0.1)
else:
    sys.exit(f"ferry serve did not become ready; see {out}/serve.log")
(model,) = [m["name"] for m in client.get_model_repository_index()]
digits = np.load(f"{out}/digits.npy")
x = http.InferInput("x", list(digits.shape), "FP32")
x.set_data_from_numpy(digits)
logits = client.infer(model, [x]).as_numpy("output")
print(f"served model {model!r} at http://127.0.0.1:{port}: predicted digits {logits.argmax(1).tolist()}")
stats = client.get_inference_statistics(model)["model_stats"][0]
print(f"server statistics: {stats['inference_count']} inferences in {stats['execution_count']} executions")
PY
kill -TERM $server && wait $server
trap - EXIT
echo "server stopped cleanly"
