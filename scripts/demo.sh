#!/usr/bin/env bash
# ferry's main job on the bundled example, every verb once: train the digits CNN in PyTorch,
# convert it (verified), optimize, inspect and run it, quantize it to int8, compress it (prune,
# then distill from the original), export it for phones (TFLite, verified in LiteRT) and for the
# browser (verified in Node), score every model made on the 360 test digits, benchmark and serve.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
out="${1:-demo-out}"
start=$SECONDS

echo; echo "==> 1. the bundled example: a CNN trained on scikit-learn's digits, saved with torch.export"
python examples/digits_cnn.py export "$out"

echo; echo "==> 2. ferry convert: PyTorch -> ONNX, verified against PyTorch on 8 real digits"
# .pt2 archives hold pickled data; this one we just wrote ourselves, so we trust it.
ferry convert "$out/digits_cnn.pt2" -o "$out/model.onnx" --trust-pickle \
  --shape x=batch,1,8,8 --example-input "x=$out/digits.npy"

echo; echo "==> 3. ferry convert again: down to opset 17 for older runtimes, verified against the first"
ferry convert "$out/model.onnx" -o "$out/model17.onnx" --opset 17

echo; echo "==> 4. ferry optimize: graph passes and fusions, verified on the real digits and timed, or refused"
ferry optimize "$out/model.onnx" -o "$out/model.opt.onnx" --level extended --input "x=$out/digits.npy"

echo; echo "==> 5. ferry info"
ferry info "$out/model.onnx"

echo; echo "==> 6. ferry run on 8 real test images"
ferry run "$out/model.onnx" --input "x=$out/digits.npy" --output-dir "$out/outputs"
python - "$out" <<'PY'
import sys, numpy as np
logits = np.load(f"{sys.argv[1]}/outputs/output.npy")
print("predicted digits:", logits.argmax(axis=1).tolist())
PY

echo; echo "==> 7. ferry quantize: int8 for OpenVINO, calibrated on real training digits, judged on held-back ones and timed"
# Written only when it keeps the task's accuracy and runs faster; refused (exit 3) otherwise,
# which is a verdict too: on a model this small, int8 may not pay.
status=0
ferry quantize "$out/model.onnx" -o "$out/model.int8.onnx" --data "$out/train.npy" --target openvino || status=$?
if [ "$status" -eq 3 ]; then echo "quantize refused int8 here (exit 3): the float model stays"; elif [ "$status" -ne 0 ]; then exit "$status"; fi

echo; echo "==> 8. ferry prune + ferry distill: half the channels removed, then distilled from the original on unlabeled digits"
ferry prune "$out/model.onnx" -o "$out/pruned.onnx" --sparsity 0.5
# With no options distill trains until the held-back judge stops improving (up to 5 minutes);
# the demo gives it 10 s, enough for this CNN.
ferry distill --teacher "$out/model.onnx" --student "$out/pruned.onnx" --data "$out/train.npy" \
  -o "$out/distilled.onnx" --time-budget 10

echo; echo "==> 9. ferry export --target tflite: ferry's own lowering, verified in LiteRT against ONNX Runtime"
ferry export "$out/model.onnx" --target tflite -o "$out/model.tflite"

echo; echo "==> 10. ferry export --target web: a static site on onnxruntime-web, verified in Node"
if command -v node > /dev/null && command -v npm > /dev/null; then
  ferry export "$out/model.onnx" --target web -o "$out/site"
else
  echo "skipped: the web bundle is built with npm and verified in Node (apt-get install nodejs npm)"
fi

echo; echo "==> 11. every model made above on the 360 test digits, each in its own runtime"
models=("$out/model.onnx" "$out/model.opt.onnx")
[ -f "$out/model.int8.onnx" ] && models+=("$out/model.int8.onnx")
models+=("$out/pruned.onnx" "$out/distilled.onnx" "$out/model.tflite")
[ -f "$out/site/manifest.json" ] && models+=("$out/site")
python examples/digits_cnn.py accuracy "${models[@]}" 2> >(grep -v "XNNPACK delegate" >&2)

echo; echo "==> 12. ferry bench: ONNX Runtime and OpenVINO at each precision, batch 1 and 32, saved into the artifact's report"
ferry bench "$out" --backends onnxruntime,openvino --batch 1,32 --iterations 300 --plot "$out/bench.png" --save-report

echo; echo "==> 13. ferry serve: the artifact over HTTP (KServe v2, as Triton speaks it), queried with Triton's own client"
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
echo; echo "demo done in $((SECONDS - start)) s: every verb ran and was verified; its files are in $out/"
