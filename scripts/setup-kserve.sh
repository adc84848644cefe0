#!/usr/bin/env bash
# Creates the Python environment the KServe manifest tests validate in: the KServe Python SDK.
#
# kserve 0.21 pins protobuf<7 and pandas<3, which clash with ferry's own environment, so it gets
# one of its own; tests/deploy/test_kserve.py runs its validator there, as a subprocess, when
# FERRY_KSERVE_PYTHON=<venv>/bin/python is set (scripts/test.sh sets it). ferry itself never
# imports kserve: `ferry deploy kserve` writes plain YAML. Safe to run again: it reinstalls only
# when the pins change.
#
#   scripts/setup-kserve.sh [VENV]    (default: $PWD/.venv-kserve)
set -euo pipefail
python="${PYTHON:-python3}"
venv="${1:-$PWD/.venv-kserve}"
# The SDK's models (V1beta1InferenceService, its ApiClient) are all the tests need; its server
# extras (ray, fastapi, ...) are not installed.
pins=("kserve==0.21.0" "pyyaml")

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  echo "kserve 0.21 needs Python >= 3.9 (set PYTHON=/path/to/python3.x)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
stamp="$venv/.ferry-kserve-installed"
want="${pins[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing ${pins[*]} into $venv"
  # This machine's pip config names a mirror folder that may be absent; drop those warnings only.
  "$venv/bin/python" -m pip install --quiet "${pins[@]}" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  "$venv/bin/python" -c 'import kserve, yaml; kserve.V1beta1InferenceService' 2>/dev/null \
    || { echo "the kserve SDK does not import in $venv" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
echo "==> the KServe manifest tests find this environment with: export FERRY_KSERVE_PYTHON=$venv/bin/python"
