#!/usr/bin/env bash
# The environments benchmarks/generate.py measures its generative peers in, one venv each beside
# the repository (each peer pins and pulls in packages ferry's own .venv should not be bent to):
#
#   .venv-llamacpp/  llama-cpp-python, compiled here from PyPI's source distribution for this
#                    CPU (GGML_NATIVE: the AVX-512/VNNI kernels this machine has; no CUDA, no
#                    BLAS), with its [server] extra (fastapi, uvicorn, sse-starlette: the
#                    OpenAI-compatible server benchmarks/serve_generate.py loads). The compile
#                    takes ~7 minutes on a 2-core machine; a venv made before the extra was
#                    added only gains the extra's packages (the installed build is kept).
#   .venv-ortgenai/  onnxruntime-genai and what its model builder needs to turn the GGUF into an
#                    int4 ONNX model: torch (CPU, 2.13.0 only), transformers (to load the GGUF
#                    and save the Hugging Face folder the builder reads), accelerate, gguf, onnx-ir.
#   .venv-ovgenai/   openvino-genai (its LLMPipeline reads the GGUF itself).
#
# Idempotent: each venv carries a stamp file naming what was installed in it; a venv whose stamp
# matches this script's pins is left alone. Each step says what it does; a failing step stops
# the script with one line naming it. Not part of scripts/setup.sh nor CI: the benchmark finds
# the venvs by itself and, for a missing one, names this script.
#
#   bash scripts/llm-peers-env.sh                      # all three
#   bash scripts/llm-peers-env.sh llamacpp ovgenai     # some of them
#   bash scripts/llm-peers-env.sh --force ortgenai     # remove and make again
#
# Versions (override with the environment variables): FERRY_LLAMACPP_VERSION (0.3.36),
# FERRY_ORTGENAI_VERSION (0.18.0), FERRY_OVGENAI_VERSION (2026.4.1.0). Then:
#   .venv/bin/python benchmarks/generate.py --peers llamacpp,ortgenai,ovgenai --fidelity
#   .venv/bin/python benchmarks/serve_generate.py --markdown
set -Eeuo pipefail

FORCE=0
PEERS=()
for arg in "$@"; do
    case "$arg" in
    --force) FORCE=1 ;;
    llamacpp | ortgenai | ovgenai) PEERS+=("$arg") ;;
    -h | --help)
        sed -n '2,/^set -Eeuo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "llm-peers-env: unknown argument $arg (see --help)" >&2
        exit 2
        ;;
    esac
done
[[ ${#PEERS[@]} -gt 0 ]] || PEERS=(llamacpp ortgenai ovgenai)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="$ROOT/.venv/bin/python"
LLAMACPP_VERSION="${FERRY_LLAMACPP_VERSION:-0.3.36}"
ORTGENAI_VERSION="${FERRY_ORTGENAI_VERSION:-0.18.0}"
OVGENAI_VERSION="${FERRY_OVGENAI_VERSION:-2026.4.1.0}"
TORCH_VERSION="2.13.0+cpu"

STEP="start"
say() { echo "llm-peers-env: $*"; }
fail() {
    echo "llm-peers-env: error: step '$STEP' failed${1:+: $1}" >&2
    exit 1
}
trap 'fail' ERR

# The Python .venv was made with (same minor version: the same wheels exist for it).
[[ -x "$MAIN" ]] || { STEP="find .venv"; fail "no $MAIN: bash scripts/setup.sh first"; }
PYTHON="${FERRY_LLMPEERS_PYTHON:-$(readlink -f "$MAIN")}"

# make_venv NAME STAMP REQUIREMENT...: the venv .venv-NAME with exactly these pins, or nothing
# to do when its stamp says so. Extra environment (CMAKE_ARGS, ...) comes from the caller.
make_venv() {
    local name="$1" stamp="$2"
    shift 2
    local venv="$ROOT/.venv-$name"
    STEP="$name: stamp"
    if [[ "$FORCE" == 1 && -d "$venv" ]]; then
        STEP="$name: remove $venv"
        say "$STEP"
        rm -rf "$venv"
    fi
    if [[ -f "$venv/.ferry-stamp" && "$(cat "$venv/.ferry-stamp")" == "$stamp" ]]; then
        say "$name: $venv is up to date ($stamp)"
        return 0
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        STEP="$name: create $venv with $PYTHON"
        say "$STEP"
        "$PYTHON" -m venv "$venv"
    fi
    STEP="$name: pip install $*"
    say "$STEP"
    "$venv/bin/python" -m pip install --quiet "$@"
    echo "$stamp" >"$venv/.ferry-stamp"
    say "$name: ready: $venv/bin/python"
}

for peer in "${PEERS[@]}"; do
    case "$peer" in
    llamacpp)
        # From the source distribution (never a prebuilt wheel): compiled for this CPU, CPU only.
        export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF"
        export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
        say "llamacpp: llama-cpp-python $LLAMACPP_VERSION from source, CMAKE_ARGS='$CMAKE_ARGS' (installing it compiles for ~7 min)"
        # The same version already installed satisfies pip: a venv from before [server] only
        # gains the extra's packages, without compiling again.
        make_venv llamacpp "llama-cpp-python[server]==$LLAMACPP_VERSION $CMAKE_ARGS" \
            --no-binary llama-cpp-python --no-cache-dir "llama-cpp-python[server]==$LLAMACPP_VERSION"
        unset CMAKE_ARGS
        STEP="llamacpp: import llama_cpp, llama_cpp.server"
        "$ROOT/.venv-llamacpp/bin/python" -c "import llama_cpp, llama_cpp.server.app; print('  llama_cpp', llama_cpp.__version__, '(with its server)')"
        ;;
    ortgenai)
        # torch pinned to the CPU build (the local wheel pip's find-links offers); a CUDA build
        # would be gigabytes. The builder itself imports onnx-ir; transformers loads the GGUF.
        make_venv ortgenai "onnxruntime-genai==$ORTGENAI_VERSION torch==$TORCH_VERSION" \
            "onnxruntime-genai==$ORTGENAI_VERSION" "torch==$TORCH_VERSION" transformers \
            accelerate gguf onnx-ir onnx
        STEP="ortgenai: import onnxruntime_genai, torch"
        "$ROOT/.venv-ortgenai/bin/python" -c "import onnxruntime_genai as og, torch, transformers; print('  onnxruntime_genai', og.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
        ;;
    ovgenai)
        make_venv ovgenai "openvino-genai==$OVGENAI_VERSION" "openvino-genai==$OVGENAI_VERSION"
        STEP="ovgenai: import openvino_genai"
        "$ROOT/.venv-ovgenai/bin/python" -c "import openvino_genai as g; print('  openvino_genai', g.__version__)"
        ;;
    esac
done
say "done: ${PEERS[*]}"
