#!/usr/bin/env bash
# The test suite, as the README and CI run it: sets up .venv, then lint, types and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
if [ "${FERRY_TEST_HEAVY:-0}" = "1" ]; then
  # TensorFlow (~275 MB wheel) and PaddlePaddle (~200 MB, in its own environment because
  # paddle2onnx pins an old onnx) are optional; their tests skip, saying why, when these fail.
  echo "==> FERRY_TEST_HEAVY=1: TensorFlow + tf2onnx into .venv, Paddle + paddle2onnx into .venv-paddle"
  pip_install "tensorflow-cpu==2.21.0" "tf2onnx==1.17.0" \
    || echo "WARNING: TensorFlow did not install; its converter tests will be skipped" >&2
  # tf-keras (Keras 2 objects in memory) asks for the `tensorflow` package, which tensorflow-cpu
  # already provides under another name: without --no-deps pip would add a second, 572 MB TF.
  pip_install --no-deps "tf-keras==2.21.0" \
    || echo "WARNING: tf-keras did not install; the Keras 2 object test will be skipped" >&2
  # paddlepaddle itself (no paddle2onnx) also goes into .venv: converting in-memory paddle.nn.Layers.
  pip_install "paddlepaddle==3.3.1" \
    || echo "WARNING: PaddlePaddle did not install into .venv; the paddle.nn.Layer test will be skipped" >&2
  if bash scripts/setup-paddle.sh "$PWD/.venv-paddle"; then
    export FERRY_PADDLE_PYTHON="$PWD/.venv-paddle/bin/python"
  else
    echo "WARNING: Paddle did not install; its converter tests will be skipped" >&2
  fi
fi
# The KServe Python SDK (kserve 0.21, in .venv-kserve: it pins protobuf<7 and pandas<3) checks
# the manifests `ferry deploy kserve` writes (tests/serving/test_kserve.py); ~40 s the first time.
echo "==> KServe SDK into .venv-kserve"
if bash scripts/setup-kserve.sh "$PWD/.venv-kserve"; then
  export FERRY_KSERVE_PYTHON="$PWD/.venv-kserve/bin/python"
else
  echo "WARNING: the KServe SDK did not install; the KServe manifest tests will be skipped" >&2
fi
# The browser tests (tests/web): Debian's chromium and chromedriver, node and npm (the web
# bundle's onnxruntime-web), selenium into .venv. Without them those tests skip, saying why
# (under FERRY_CI they fail).
echo "==> browser, node and npm"
bash scripts/browser-env.sh \
  || echo "WARNING: chromium/node/npm could not be installed; the browser tests will skip" >&2
# Triton's perf_analyzer (from the tritonclient 2.41 wheel; Debian's libb64-0d) drives ferry serve
# in tests/e2e/test_perf_analyzer.py.
echo "==> perf_analyzer"
bash scripts/triton-bench-env.sh --perf-analyzer-only \
  || echo "WARNING: perf_analyzer could not be set up; its e2e test will be skipped" >&2
# The real-model kit (about 152 MB, once; cached in ${FERRY_KIT:-~/.cache/ferry-kit}, outside the
# repository): the tests/real tier runs every verb on models made by other people.
echo "==> real-model kit"
bash scripts/fetch-kit.sh \
  || echo "WARNING: the real-model kit could not be fetched; the tests/real tier will be skipped" >&2
echo "==> ruff"
ruff check src tests benchmarks examples
ruff format --check src tests benchmarks examples
echo "==> mypy"
mypy
echo "==> pytest"
python -m pytest "$@"
