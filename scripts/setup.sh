#!/usr/bin/env bash
# Creates .venv and installs ferry with what the demo and the tests need. Safe to run again: it
# reinstalls only when pyproject.toml changed. Sourced by demo.sh and test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "ferry needs Python >= 3.10 (set PYTHON=/path/to/python3.x)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "$python" -m venv "$venv"
fi
pip_install() {
  # This machine's pip config names a mirror folder that may be absent; drop those warnings only.
  "$venv/bin/python" -m pip install --quiet "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
}
stamp="$venv/.ferry-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing ferry and its test/demo dependencies into $venv"
  pip_install --upgrade pip
  # The CPU build of torch, pinned first so that no extra can pull a multi-GB CUDA build.
  pip_install "torch==2.13.0"
  pip_install -e "$root[dev,zoo,sklearn,tflite,openvino,serve,ray,plot,generate]"
  # The example vendor adapter is an example: environments set up before it stopped being
  # installed lose it (tests register it themselves).
  "$venv/bin/python" -m pip uninstall -y --quiet ferry-acme-npu 2>/dev/null || true
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
