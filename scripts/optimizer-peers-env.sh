#!/usr/bin/env bash
# The environment benchmarks/optimizer.py runs the peer optimizers in:
#
#   .venv-optpeers/     onnxsim and onnxslim, with the onnx and onnxruntime versions .venv has
#                       (onnxsim folds constants by running the model in ONNX Runtime, so both sides
#                       of the comparison see one engine build). A venv of its own: the peers pin
#                       and pull in packages ferry's own environment should not be bent to.
#
# Idempotent: what is already in place and at the right versions is kept. Not part of
# scripts/setup.sh nor CI: the benchmark finds .venv-optpeers by itself and, without it, says so
# (naming this script), marks the peers' columns n/a and holds ferry against the original only.
#
#   bash scripts/optimizer-peers-env.sh          # set it up (or check it), print the versions
#   bash scripts/optimizer-peers-env.sh --force  # remove it and make it again
#   FERRY_OPTPEERS_VENV=/path/to/venv FERRY_OPTPEERS_PYTHON=/path/to/python3 \
#   FERRY_ONNXSIM_VERSION=0.8.1 FERRY_ONNXSLIM_VERSION=0.1.98 bash scripts/optimizer-peers-env.sh
#
# (a venv made elsewhere: give the benchmark --peers /path/to/venv/bin/python)
# The peers' versions are pinned to the ones the benchmark was written against (set them to
# "latest" for the newest release). Then:
#   .venv/bin/python benchmarks/optimizer.py [--quick] [--models a,b]
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
        echo "optimizer-peers-env: unknown argument $arg (see --help)" >&2
        exit 2
        ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FERRY_OPTPEERS_VENV:-$ROOT/.venv-optpeers}"
MAIN="$ROOT/.venv/bin/python"
ONNXSIM_VERSION="${FERRY_ONNXSIM_VERSION:-0.8.1}"
ONNXSLIM_VERSION="${FERRY_ONNXSLIM_VERSION:-0.1.98}"

die() {
    echo "optimizer-peers-env: error: $*" >&2
    exit 1
}
say() { echo "optimizer-peers-env: $*"; }

# -- the versions ferry's own environment runs ------------------------------------------------------
[[ -x "$MAIN" ]] || die "no $MAIN: make ferry's environment first (bash scripts/setup.sh)"
read -r ONNX_VERSION ORT_VERSION < <("$MAIN" -c 'import onnx, onnxruntime; print(onnx.__version__, onnxruntime.__version__)') ||
    die "$MAIN cannot import onnx and onnxruntime: bash scripts/setup.sh"

spec() { # name version -> pip requirement ("latest": unpinned)
    if [[ "$2" == latest ]]; then echo "$1"; else echo "$1==$2"; fi
}
REQS=(
    "onnx==$ONNX_VERSION"
    "onnxruntime==$ORT_VERSION"
    "$(spec onnxsim "$ONNXSIM_VERSION")"
    "$(spec onnxslim "$ONNXSLIM_VERSION")"
)

# -- the venv -----------------------------------------------------------------------------------------
if [[ "$FORCE" == 1 && -d "$VENV" ]]; then
    say "removing $VENV"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    # The Python .venv was made with (same minor version: the same wheels exist for it).
    PYTHON="${FERRY_OPTPEERS_PYTHON:-$(readlink -f "$MAIN")}"
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON (set FERRY_OPTPEERS_PYTHON)"
    "$PYTHON" -c "import venv, ensurepip" 2>/dev/null ||
        die "$PYTHON cannot make a virtual environment with pip: apt-get install python3-venv"
    say "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Every requirement met as pinned: nothing to install.
check() {
    "$PY" - "$ONNX_VERSION" "$ORT_VERSION" "$ONNXSIM_VERSION" "$ONNXSLIM_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(["onnx", "onnxruntime", "onnxsim", "onnxslim"], sys.argv[1:]))
import onnx, onnxruntime, onnxsim, onnxslim  # noqa: E401,F401  (they import, not just install)
bad = [k for k, v in want.items() if v != "latest" and version(k) != v.lstrip("v")]
sys.exit(1 if bad else 0)
EOF
}

if check; then
    say "$VENV is up to date"
else
    say "installing ${REQS[*]} into $VENV"
    "$PY" -m pip install --quiet "${REQS[@]}" ||
        die "pip could not install ${REQS[*]}
  (is this onnxruntime published for $("$PY" -c 'import sys; print(sys.version.split()[0])')?
  set FERRY_ONNXSIM_VERSION / FERRY_ONNXSLIM_VERSION to other versions, or --force to start over)"
    check || die "$VENV still does not import ${REQS[*]} at those versions: bash $0 --force"
fi

say "ready: $PY"
"$PY" - <<'EOF'
from importlib.metadata import version
for name in ("onnxsim", "onnxslim", "onnx", "onnxruntime"):
    print(f"  {name:<12} {version(name)}")
EOF
