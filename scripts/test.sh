#!/usr/bin/env bash
# The test suite, as the README gives it and CI runs it (.ci/run calls exactly this command):
# sets up everything the suite needs on a fresh machine, then lint, types and pytest.
#
#   bash scripts/test.sh [PYTEST ARGS]           the whole suite, everything installed first
#   bash scripts/test.sh --quick [PYTEST ARGS]   daily work: installs nothing beyond .venv, skips
#                                                the slow and real tiers; what is missing skips,
#                                                saying what installs it
#
# The whole suite is ferry's (tests/, in .venv) and then the IREE plugin's (plugins/ferry-iree/
# tests, in .venv-iree: scripts/setup-iree.sh). Given PYTEST ARGS, only ferry's tests run, as asked.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
asked=$#  # pytest arguments given: then only ferry's tests run, as asked
source scripts/setup.sh
# A step that fails stops the run, naming itself: a suite that silently lost a tier would pass.
need() {
  local what="$1"
  shift
  if ! "$@"; then
    echo "scripts/test.sh: setting up $what failed (see above); the tests need it." >&2
    echo "  Fix that and run again, or run 'bash scripts/test.sh --quick', which installs nothing beyond .venv." >&2
    exit 1
  fi
}

if [ "$quick" = "0" ]; then
  # TensorFlow (~275 MB wheel) with tf2onnx and tf-keras, and PaddlePaddle: the converter tests
  # and the kit's TensorFlow, Keras and Paddle models need them. Paddle's converter runs
  # paddle2onnx in an environment of its own (.venv-paddle: paddle2onnx pins an old onnx).
  echo "==> TensorFlow + tf2onnx + tf-keras and PaddlePaddle into .venv, paddle2onnx into .venv-paddle"
  heavy_stamp="$venv/.ferry-heavy-installed"
  heavy_want="tensorflow-cpu==2.21.0 tf2onnx==1.17.0 tf-keras==2.21.0 paddlepaddle==3.3.1"
  if [ ! -f "$heavy_stamp" ] || [ "$(cat "$heavy_stamp")" != "$heavy_want" ]; then
    need TensorFlow pip_install "tensorflow-cpu==2.21.0" "tf2onnx==1.17.0"
    # tf-keras (Keras 2 objects in memory) asks for the `tensorflow` package, which tensorflow-cpu
    # already provides under another name: without --no-deps pip would add a second, 572 MB TF.
    need tf-keras pip_install --no-deps "tf-keras==2.21.0"
    # paddlepaddle itself (no paddle2onnx) also goes into .venv: converting in-memory paddle.nn.Layers.
    need PaddlePaddle pip_install "paddlepaddle==3.3.1"
    echo "$heavy_want" > "$heavy_stamp"
  fi
  # The IREE plugin (plugins/ferry-iree, its own distribution: ~600 MB of IREE compiler and
  # runtime wheels, pinned there to 3.13.0) in .venv-iree, which sees .venv's packages: in .venv
  # it would be an engine every `auto` of ferry's own suite measures. Its tests run after ferry's.
  echo "==> the IREE plugin into .venv-iree"
  need "the IREE plugin" bash scripts/setup-iree.sh "$PWD/.venv-iree"
  need "the Paddle environment" bash scripts/setup-paddle.sh "$PWD/.venv-paddle"
  export FERRY_PADDLE_PYTHON="$PWD/.venv-paddle/bin/python"
  # The KServe Python SDK (kserve 0.21, in .venv-kserve: it pins protobuf<7 and pandas<3) checks
  # the manifests `ferry deploy kserve` writes (tests/deploy/test_kserve.py); ~40 s the first time.
  echo "==> KServe SDK into .venv-kserve"
  need "the KServe SDK" bash scripts/setup-kserve.sh "$PWD/.venv-kserve"
  export FERRY_KSERVE_PYTHON="$PWD/.venv-kserve/bin/python"
  # The browser tests (tests/web): Debian's chromium and chromedriver, node and npm (the web
  # bundle's onnxruntime-web), selenium into .venv.
  echo "==> browser, node and npm"
  need "the browser" bash scripts/browser-env.sh
  # Triton's perf_analyzer (from the tritonclient 2.41 wheel; Debian's libb64-0d) drives ferry
  # serve in tests/e2e/test_perf_analyzer.py.
  echo "==> perf_analyzer"
  need perf_analyzer bash scripts/triton-bench-env.sh --perf-analyzer-only
  # The real-model kit (once; cached in ${FERRY_KIT:-~/.cache/ferry-kit}, outside the
  # repository): the tests/real tier runs every verb on models made by other people.
  echo "==> real-model kit"
  need "the real-model kit" bash scripts/fetch-kit.sh
else
  # Whatever an earlier full run set up is used; nothing more is installed.
  [ -x "$PWD/.venv-paddle/bin/python" ] && export FERRY_PADDLE_PYTHON="$PWD/.venv-paddle/bin/python"
  [ -x "$PWD/.venv-kserve/bin/python" ] && export FERRY_KSERVE_PYTHON="$PWD/.venv-kserve/bin/python"
  set -- -m "not slow and not real" "$@"
fi
echo "==> ruff"
ruff check src tests benchmarks examples plugins
ruff format --check src tests benchmarks examples plugins
echo "==> mypy"
mypy
echo "==> pytest"
if [ "$asked" -gt 0 ]; then
  python -m pytest "$@"  # the tests asked for, in ferry's environment
  exit
fi
# ferry's suite, then the IREE plugin's in its environment (both run; either failing fails the
# run). --quick runs the plugin's quick tests where .venv-iree exists.
plugin_args=()
[ "$quick" = "1" ] && plugin_args=(-m "not slow and not real")
code=0
python -m pytest "$@" || code=$?
plugin=0
if [ "$quick" = "0" ] || [ -x "$PWD/.venv-iree/bin/python" ]; then
  echo "==> pytest: the IREE plugin (plugins/ferry-iree/tests, in .venv-iree)"
  "$PWD/.venv-iree/bin/python" -m pytest plugins/ferry-iree/tests "${plugin_args[@]}" || plugin=$?
else
  echo "==> the IREE plugin's tests: not run (bash scripts/setup-iree.sh sets up .venv-iree)"
fi
if [ "$code" -eq 0 ]; then
  code=$plugin
fi
exit "$code"
