#!/usr/bin/env bash
# Creates the Python environment ferry's PaddlePaddle converter runs paddle2onnx in.
#
# paddle2onnx 2.1 pins onnx<=1.17, older than the onnx ferry needs, so it cannot share ferry's
# environment; ferry runs it (and Paddle, for the parity check) in this one, as a subprocess.
# ferry finds it at the default place below without being told; elsewhere, set
# FERRY_PADDLE_PYTHON=<venv>/bin/python. Safe to run again: it reinstalls only when the pins change.
#
#   scripts/setup-paddle.sh [VENV]    (default: ${XDG_DATA_HOME:-~/.local/share}/ferry/paddle-venv)
#
# About 900 MB on disk (Paddle is most of it), 20-30 s from a warm pip cache.
set -euo pipefail
python="${PYTHON:-python3}"
venv="${1:-${XDG_DATA_HOME:-$HOME/.local/share}/ferry/paddle-venv}"
# paddle2onnx's C++ core links against libpaddle: keep these two pinned together.
pins=("paddlepaddle==3.3.1" "paddle2onnx==2.1.0" "packaging")

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  echo "paddlepaddle 3.3 needs Python >= 3.9 (set PYTHON=/path/to/python3.x)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
stamp="$venv/.ferry-paddle-installed"
want="${pins[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing ${pins[*]} into $venv"
  # This machine's pip config names a mirror folder that may be absent; drop those warnings only.
  # packaging: paddle2onnx imports it without declaring it.
  "$venv/bin/python" -m pip install --quiet "${pins[@]}" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  "$venv/bin/python" -c 'import paddle, paddle2onnx' 2>/dev/null \
    || { echo "paddle or paddle2onnx does not import in $venv" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
if [ "$venv" != "${XDG_DATA_HOME:-$HOME/.local/share}/ferry/paddle-venv" ]; then
  echo "==> ferry finds this environment with: export FERRY_PADDLE_PYTHON=$venv/bin/python"
fi
