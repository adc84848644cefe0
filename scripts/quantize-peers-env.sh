#!/usr/bin/env bash
# The environment benchmarks/quantize.py runs the peer quantizer NNCF in:
#
#   .venv-quantpeers/   nncf, with the onnx and onnxruntime versions .venv has (NNCF's ONNX
#                       backend collects its statistics by running the model in ONNX Runtime, so
#                       both quantizers calibrate in one engine build). A venv of its own: NNCF
#                       pins and pulls in packages (networkx, scikit-learn, ninja, ...) ferry's
#                       own environment should not be bent to.
#
# No PyTorch: NNCF's wheel does not require it (torch is only needed for its PyTorch backend),
# and this script refuses to finish if pip pulled torch in anyway (a CUDA build is gigabytes).
# ONNX Runtime's quantize_static, the other peer, is part of onnxruntime and runs in .venv.
#
# Idempotent: what is already in place and at the right versions is kept. Not part of
# scripts/setup.sh nor CI: the benchmark finds .venv-quantpeers by itself and, without it, says
# so (naming this script) and marks NNCF's columns n/a.
#
#   bash scripts/quantize-peers-env.sh          # set it up (or check it), print the versions
#   bash scripts/quantize-peers-env.sh --force  # remove it and make it again
#   FERRY_QUANTPEERS_VENV=/path/to/venv FERRY_QUANTPEERS_PYTHON=/path/to/python3 \
#   FERRY_NNCF_VERSION=3.4.0 bash scripts/quantize-peers-env.sh
#
# (a venv made elsewhere: give the benchmark --peers /path/to/venv/bin/python)
# NNCF's version is pinned to the one the benchmark was written against (set it to "latest" for
# the newest release). Then:
#   .venv/bin/python benchmarks/quantize.py [--quick] [--models a,b]
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
        echo "quantize-peers-env: unknown argument $arg (see --help)" >&2
        exit 2
        ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FERRY_QUANTPEERS_VENV:-$ROOT/.venv-quantpeers}"
MAIN="$ROOT/.venv/bin/python"
NNCF_VERSION="${FERRY_NNCF_VERSION:-3.4.0}"

die() {
    echo "quantize-peers-env: error: $*" >&2
    exit 1
}
say() { echo "quantize-peers-env: $*"; }

# -- the versions ferry's own environment runs ------------------------------------------------------
[[ -x "$MAIN" ]] || die "no $MAIN: make ferry's environment first (bash scripts/setup.sh)"
read -r ONNX_VERSION ORT_VERSION NUMPY_VERSION < <("$MAIN" -c 'import onnx, onnxruntime, numpy; print(onnx.__version__, onnxruntime.__version__, numpy.__version__)') ||
    die "$MAIN cannot import onnx, onnxruntime and numpy: bash scripts/setup.sh"

if [[ "$NNCF_VERSION" == latest ]]; then NNCF_REQ=nncf; else NNCF_REQ="nncf==$NNCF_VERSION"; fi
REQS=(
    "onnx==$ONNX_VERSION"
    "onnxruntime==$ORT_VERSION"
    "$NNCF_REQ"
)

# -- the venv -----------------------------------------------------------------------------------------
if [[ "$FORCE" == 1 && -d "$VENV" ]]; then
    say "removing $VENV"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    # The Python .venv was made with (same minor version: the same wheels exist for it).
    PYTHON="${FERRY_QUANTPEERS_PYTHON:-$(readlink -f "$MAIN")}"
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON (set FERRY_QUANTPEERS_PYTHON)"
    "$PYTHON" -c "import venv, ensurepip" 2>/dev/null ||
        die "$PYTHON cannot make a virtual environment with pip: apt-get install python3-venv"
    say "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Every requirement met as pinned, and no torch: nothing to install.
check() {
    "$PY" - "$ONNX_VERSION" "$ORT_VERSION" "$NNCF_VERSION" <<'EOF2' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
want = dict(zip(["onnx", "onnxruntime", "nncf"], sys.argv[1:]))
import onnx, onnxruntime, nncf  # noqa: E401,F401  (they import, not just install)
bad = [k for k, v in want.items() if v != "latest" and version(k) != v.lstrip("v")]
try:
    version("torch")
    bad.append("torch")
except PackageNotFoundError:
    pass
sys.exit(1 if bad else 0)
EOF2
}

if check; then
    say "$VENV is up to date"
else
    # torch must not come in: a constraint no pip resolution can meet if anything asks for it.
    CONSTRAINTS="$(mktemp)"
    trap 'rm -f "$CONSTRAINTS"' EXIT
    printf 'torch==0+never\nnumpy==%s\n' "$NUMPY_VERSION" >"$CONSTRAINTS"
    say "installing ${REQS[*]} into $VENV (no torch; numpy $NUMPY_VERSION as in .venv)"
    "$PY" -m pip install --quiet -c "$CONSTRAINTS" "${REQS[@]}" ||
        die "pip could not install ${REQS[*]} without torch
  (is this onnxruntime published for $("$PY" -c 'import sys; print(sys.version.split()[0])')?
  set FERRY_NNCF_VERSION to another version, or --force to start over)"
    check || die "$VENV still does not import ${REQS[*]} at those versions (or has torch): bash $0 --force"
fi

say "ready: $PY"
"$PY" - <<'EOF2'
from importlib.metadata import version
for name in ("nncf", "onnx", "onnxruntime", "numpy"):
    print(f"  {name:<12} {version(name)}")
EOF2
