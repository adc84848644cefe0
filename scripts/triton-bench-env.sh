#!/usr/bin/env bash
# The environment benchmarks/serving.py and tests/e2e/test_perf_analyzer.py compare ferry serve in:
#
#   .venv-triton/                 NVIDIA Triton through PyTriton (nvidia-pytriton), with ONNX Runtime
#                                 (the version .venv has) and numpy, on a Python with a shared
#                                 libpython (PyTriton's Python backend stub links against it)
#   .venv-triton/bin/perf_analyzer  Triton's own load generator, taken from the tritonclient==2.41.0
#                                 wheel (the perf-analyzer name on PyPI is a placeholder); a wrapper
#                                 that puts libcudart.so.12 (nvidia-cuda-runtime-cu12) on the library
#                                 path (it runs without a GPU) and execs the real binary
#   libb64-0d                     Debian's package, which perf_analyzer links against (apt-get)
#
# Idempotent: what is already in place is kept. Not part of scripts/setup.sh nor of CI's default
# path: the benchmark and the e2e test find .venv-triton by themselves and skip (the test) or run
# ferry alone (the benchmark) without it.
#
#   bash scripts/triton-bench-env.sh           # set it up (or check it), print the environment
#   bash scripts/triton-bench-env.sh --perf-analyzer-only   # perf_analyzer alone (~20 MB, for the
#                                              # e2e test): no PyTriton (~450 MB), any Python 3
#   FERRY_TRITON_PYTHON=/path/to/python3 bash scripts/triton-bench-env.sh
#
# Then:
#   .venv/bin/python benchmarks/serving.py     # ferry serve against Triton, side by side
#   .venv/bin/python -m pytest tests/e2e/test_perf_analyzer.py
set -euo pipefail

PA_ONLY=0
for arg in "$@"; do
    case "$arg" in
    --perf-analyzer-only) PA_ONLY=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "triton-bench-env: unknown argument $arg (see --help)" >&2
        exit 2
        ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-triton"
CACHE="$VENV/cache"
TRITONCLIENT_VERSION="2.41.0"
PA_REAL="$VENV/libexec/perf_analyzer"
PA="$VENV/bin/perf_analyzer"

die() {
    echo "triton-bench-env: error: $*" >&2
    exit 1
}
say() { echo "triton-bench-env: $*"; }

[[ "$(uname -s)/$(uname -m)" == "Linux/x86_64" ]] ||
    die "PyTriton's and perf_analyzer's binaries are built for Linux x86_64, this is $(uname -s)/$(uname -m)"

# -- the Python: one with a shared libpython ------------------------------------------------------
shared_python() { # prints "major.minor" when $1 is a CPython 3.8-3.12 built with --enable-shared
    "$1" - <<'EOF' 2>/dev/null
import sys, sysconfig
ok = sysconfig.get_config_var("Py_ENABLE_SHARED") and (3, 8) <= sys.version_info[:2] <= (3, 12)
print(f"{sys.version_info[0]}.{sys.version_info[1]}" if ok else "")
EOF
}

if [[ -x "$VENV/bin/python" ]]; then
    PYTHON="$VENV/bin/python"
    [[ "$PA_ONLY" == 1 || -n "$(shared_python "$PYTHON")" ]] ||
        die "$VENV exists but its Python has no shared libpython (PyTriton needs one); remove it: rm -rf $VENV"
else
    candidates=()
    [[ -n "${FERRY_TRITON_PYTHON:-}" ]] && candidates+=("$FERRY_TRITON_PYTHON")
    candidates+=(/usr/bin/python3)
    [[ -x "$ROOT/.venv/bin/python" ]] && candidates+=("$(readlink -f "$ROOT/.venv/bin/python")")
    PYTHON=""
    for candidate in "${candidates[@]}"; do
        if [[ -x "$candidate" ]] && [[ "$PA_ONLY" == 1 || -n "$(shared_python "$candidate")" ]]; then
            PYTHON="$candidate"
            break
        fi
        say "skipping $candidate: not a CPython 3.8-3.12 with a shared libpython"
    done
    [[ -n "$PYTHON" ]] || die "no Python 3.8-3.12 with a shared libpython found (tried: ${candidates[*]}).
  PyTriton's Python backend needs one: apt-get install python3 python3-venv (Debian's is shared),
  or set FERRY_TRITON_PYTHON to one built with --enable-shared"
    "$PYTHON" -c "import venv, ensurepip" 2>/dev/null ||
        die "$PYTHON cannot make a virtual environment with pip: apt-get install python3-venv"
    say "creating $VENV with $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv "$VENV"
    PYTHON="$VENV/bin/python"
fi

# -- the packages -----------------------------------------------------------------------------------
# The ONNX Runtime ferry runs in .venv, so both servers run the same engine build.
ORT_VERSION="${FERRY_TRITON_ORT_VERSION:-}"
if [[ -z "$ORT_VERSION" && -x "$ROOT/.venv/bin/python" ]]; then
    ORT_VERSION="$("$ROOT/.venv/bin/python" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || true)"
fi
ort_spec="onnxruntime${ORT_VERSION:+==$ORT_VERSION}"

have() { "$PYTHON" -c "$1" >/dev/null 2>&1; }

if [[ "$PA_ONLY" == 0 ]] && ! have "import pytriton.triton, numpy, onnxruntime as o; assert not '$ORT_VERSION' or o.__version__ == '$ORT_VERSION'"; then
    say "installing nvidia-pytriton, $ort_spec and numpy into $VENV"
    "$PYTHON" -m pip install --quiet nvidia-pytriton "$ort_spec" numpy ||
        die "pip could not install nvidia-pytriton $ort_spec numpy (is $ort_spec published for this Python?
  set FERRY_TRITON_ORT_VERSION to another version to override)"
fi
if ! have "import nvidia.cuda_runtime"; then
    say "installing nvidia-cuda-runtime-cu12 (libcudart.so.12 for perf_analyzer; no GPU needed)"
    "$PYTHON" -m pip install --quiet "nvidia-cuda-runtime-cu12>=12,<13" ||
        die "pip could not install nvidia-cuda-runtime-cu12"
fi
CUDART_DIR="$("$PYTHON" - <<'EOF'
import pathlib, nvidia.cuda_runtime as m
roots = [pathlib.Path(p) for p in m.__path__]
found = [p for r in roots for p in r.glob("lib/libcudart.so.12*")]
print(found[0].parent if found else "")
EOF
)"
[[ -n "$CUDART_DIR" ]] || die "nvidia-cuda-runtime-cu12 is installed but has no lib/libcudart.so.12"

# -- perf_analyzer ------------------------------------------------------------------------------------
if [[ ! -x "$PA_REAL" ]]; then
    mkdir -p "$CACHE" "$(dirname "$PA_REAL")"
    wheel="$(ls "$CACHE"/tritonclient-"$TRITONCLIENT_VERSION"-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)"
    if [[ -z "$wheel" ]]; then
        say "downloading the tritonclient==$TRITONCLIENT_VERSION wheel (it ships perf_analyzer) into $CACHE"
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux1_x86_64 --python-version 3 --implementation py \
            "tritonclient==$TRITONCLIENT_VERSION" -d "$CACHE" ||
            die "pip could not download tritonclient==$TRITONCLIENT_VERSION"
        wheel="$(ls "$CACHE"/tritonclient-"$TRITONCLIENT_VERSION"-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)"
        [[ -n "$wheel" ]] || die "no manylinux x86_64 tritonclient-$TRITONCLIENT_VERSION wheel in $CACHE"
    fi
    member="tritonclient-$TRITONCLIENT_VERSION.data/data/bin/perf_analyzer"
    "$PYTHON" - "$wheel" "$member" "$PA_REAL" <<'EOF' || die "could not extract $member from $wheel"
import os, shutil, sys, zipfile
wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(target + ".tmp", 0o755)
os.replace(target + ".tmp", target)
EOF
    say "extracted perf_analyzer to $PA_REAL"
fi

if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
    command -v apt-get >/dev/null || die "perf_analyzer needs libb64.so.0d (Debian/Ubuntu: libb64-0d) and there is no apt-get"
    [[ "$(id -u)" == 0 ]] || die "perf_analyzer needs libb64.so.0d: run as root, or: sudo apt-get install libb64-0d"
    say "installing Debian's libb64-0d (perf_analyzer links against libb64.so.0d)"
    apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null ||
        die "apt-get install libb64-0d failed"
fi

# A wrapper on PATH-able bin/ that finds libcudart.so.12 by itself.
cat >"$PA.tmp" <<EOF
#!/bin/sh
# Made by scripts/triton-bench-env.sh: perf_analyzer (tritonclient==$TRITONCLIENT_VERSION) with
# libcudart.so.12 from nvidia-cuda-runtime-cu12 on the library path (no GPU needed).
LD_LIBRARY_PATH="$CUDART_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PA_REAL" "\$@"
EOF
chmod 755 "$PA.tmp"
mv "$PA.tmp" "$PA"

missing="$(LD_LIBRARY_PATH="$CUDART_DIR" ldd "$PA_REAL" | grep 'not found' || true)"
[[ -z "$missing" ]] || die "perf_analyzer still misses libraries:
$missing"
"$PA" --version >/dev/null 2>&1 || die "perf_analyzer does not start: $PA --version"

say "ready:"
if have "import pytriton.triton, onnxruntime"; then
    echo "  Triton (PyTriton):  $PYTHON  (pytriton $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("nvidia-pytriton"))'), onnxruntime $("$PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)'))"
else
    echo "  Triton (PyTriton):  not installed (--perf-analyzer-only); benchmarks/serving.py measures ferry alone"
fi
echo "  perf_analyzer:      $PA  (wrapper; or run the binary with the environment below)"
echo "  environment for the bare binary:"
echo "    export LD_LIBRARY_PATH=$CUDART_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "    $PA_REAL --version"
