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
  if bash scripts/setup-paddle.sh "$PWD/.venv-paddle"; then
    export FERRY_PADDLE_PYTHON="$PWD/.venv-paddle/bin/python"
  else
    echo "WARNING: Paddle did not install; its converter tests will be skipped" >&2
  fi
fi
echo "==> ruff"
ruff check src tests benchmarks examples
ruff format --check src tests benchmarks examples
echo "==> mypy"
mypy
echo "==> pytest"
python -m pytest "$@"
