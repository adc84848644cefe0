#!/usr/bin/env bash
# The environment benchmarks/tflite_export.py runs the peer ONNX -> .tflite converter onnx2tf in:
#
#   .venv-onnx2tf/      onnx2tf with its extra "tensorflow" (tensorflow, tf-keras, keras: its legacy
#                       tf_converter backend), on Python 3.12 (onnx2tf 2.x requires >= 3.12;
#                       ferry's .venv is 3.11). onnx2tf pins every dependency to one exact version
#                       (numpy, onnx, onnxruntime, onnxsim, onnxoptimizer, onnxscript, ai-edge-litert,
#                       sne4onnx, sng4onnx, psutil, protobuf, h5py, opencv-python, ...): they go in
#                       as it pins them, which is why it has a venv of its own.
#
# Its default backend, flatbuffer_direct, writes the .tflite without TensorFlow; the benchmark uses
# it, and falls back to --tflite_backend tf_converter where it refuses a model (as onnx2tf's README
# advises), which needs TensorFlow. No PyTorch (onnx2tf's extra "torch" is for its PyTorch exports,
# not used here), and this script refuses to finish if pip pulled torch in anyway (a CUDA build is
# gigabytes). About 2.7 GB on disk, mostly TensorFlow.
#
# Idempotent: what is already in place and at the right versions is kept. Not part of
# scripts/setup.sh nor CI: the benchmark finds .venv-onnx2tf by itself and, without it, says so
# (naming this script) and marks onnx2tf's columns n/a.
#
#   bash scripts/onnx2tf-env.sh          # set it up (or check it), print the versions
#   bash scripts/onnx2tf-env.sh --force  # remove it and make it again
#   FERRY_ONNX2TF_VENV=/path/to/venv FERRY_ONNX2TF_PYTHON=/path/to/python3.12 \
#   FERRY_ONNX2TF_VERSION=2.6.9 bash scripts/onnx2tf-env.sh
#
# Python 3.12 is looked for as FERRY_ONNX2TF_PYTHON, then python3.12 on PATH, then in pyenv
# ($(pyenv root)/versions/3.12.*); without one the script says what to install.
# (a venv made elsewhere: give the benchmark --onnx2tf /path/to/venv/bin/onnx2tf)
# onnx2tf's version is pinned to the one the benchmark was written against (set it to "latest"
# for the newest release; its own pins then decide the rest). Then:
#   .venv/bin/python benchmarks/tflite_export.py [--quick] [--models a,b]
set -euo pipefail

FORCE=0
for arg in "$@"; do
    case "$arg" in
    --force) FORCE=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "onnx2tf-env: unknown argument $arg (see --help)" >&2
        exit 2
        ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FERRY_ONNX2TF_VENV:-$ROOT/.venv-onnx2tf}"
ONNX2TF_VERSION="${FERRY_ONNX2TF_VERSION:-2.6.9}"

die() {
    echo "onnx2tf-env: error: $*" >&2
    exit 1
}
say() { echo "onnx2tf-env: $*"; }

# -- a Python 3.12 ------------------------------------------------------------------------------------
is312() { # path -> true when it runs and is CPython 3.12 with venv and ensurepip
    [[ -n "$1" && -x "$1" ]] &&
        "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null
}
find_python() {
    if [[ -n "${FERRY_ONNX2TF_PYTHON:-}" ]]; then
        is312 "$FERRY_ONNX2TF_PYTHON" || die "FERRY_ONNX2TF_PYTHON=$FERRY_ONNX2TF_PYTHON is not a Python 3.12 with venv"
        echo "$FERRY_ONNX2TF_PYTHON"
        return
    fi
    local candidates=()
    # On PATH (a pyenv shim only runs when 3.12 is a selected version: checked by running it).
    if command -v python3.12 >/dev/null 2>&1; then candidates+=("$(command -v python3.12)"); fi
    local roots=()
    if command -v pyenv >/dev/null 2>&1; then roots+=("$(pyenv root)"); fi
    roots+=("${PYENV_ROOT:-$HOME/.pyenv}")
    local root p
    for root in "${roots[@]}"; do
        for p in "$root"/versions/3.12*/bin/python3.12; do
            [[ -e "$p" ]] && candidates+=("$p")
        done
    done
    candidates+=(/usr/bin/python3.12 /usr/local/bin/python3.12)
    for p in "${candidates[@]}"; do
        if is312 "$p"; then
            echo "$p"
            return
        fi
    done
    die "onnx2tf $ONNX2TF_VERSION needs Python 3.12 and none was found (looked on PATH, in pyenv, /usr/bin).
  Install one, e.g.:  pyenv install 3.12   or   apt-get install python3.12 python3.12-venv
  or   uv python install 3.12   then set FERRY_ONNX2TF_PYTHON=/path/to/python3.12"
}

if [[ "$ONNX2TF_VERSION" == latest ]]; then REQ="onnx2tf[tensorflow]"; else REQ="onnx2tf[tensorflow]==$ONNX2TF_VERSION"; fi

# -- the venv -----------------------------------------------------------------------------------------
if [[ "$FORCE" == 1 && -d "$VENV" ]]; then
    say "removing $VENV"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    PYTHON="$(find_python)"
    say "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
is312 "$PY" || die "$VENV is not a Python 3.12 venv: bash $0 --force"

# Every requirement met as pinned, the command there, and no torch: nothing to install.
check() {
    "$PY" - "$ONNX2TF_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
want = sys.argv[1]
# They import, not just install (onnx2tf imports onnx, onnxruntime and its helpers at once).
import onnx2tf, tensorflow, ai_edge_litert.interpreter, onnx, onnxruntime  # noqa: E401,F401
bad = [] if want == "latest" or version("onnx2tf") == want.lstrip("v") else ["onnx2tf"]
try:
    version("torch")
    bad.append("torch")
except PackageNotFoundError:
    pass
sys.exit(1 if bad else 0)
EOF
    [[ -x "$VENV/bin/onnx2tf" ]]
}

if check; then
    say "$VENV is up to date"
else
    # torch must not come in: a constraint no pip resolution can meet if anything asks for it.
    CONSTRAINTS="$(mktemp)"
    trap 'rm -f "$CONSTRAINTS"' EXIT
    printf 'torch==0+never\n' >"$CONSTRAINTS"
    say "installing $REQ into $VENV (with onnx2tf's own pins; no torch)"
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -c "$CONSTRAINTS" "$REQ" ||
        die "pip could not install $REQ without torch
  (set FERRY_ONNX2TF_VERSION to another version, or --force to start over)"
    check || die "$VENV still does not import onnx2tf $ONNX2TF_VERSION and tensorflow (or has torch): bash $0 --force"
fi

say "ready: $VENV/bin/onnx2tf"
"$PY" - <<'EOF'
import sys
from importlib.metadata import version
print(f"  {'python':<15} {sys.version.split()[0]}")
for name in ("onnx2tf", "tensorflow", "ai-edge-litert", "onnx", "onnxruntime", "onnxsim", "numpy"):
    print(f"  {name:<15} {version(name)}")
EOF
