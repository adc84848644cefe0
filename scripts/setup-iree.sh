#!/usr/bin/env bash
# Creates the environment the IREE plugin (plugins/ferry-iree) is tested in: ferry's own .venv,
# plus the plugin and IREE's compiler and runtime (~600 MB), and nothing of them in .venv.
#
# A plugin installed in .venv would be one of the engines `backends="auto"` measures in every
# test of ferry's own suite (an IREE compile is seconds to a minute a model), and ferry's suite
# must pass without it. So .venv-iree sees .venv's packages through a .pth file (ferry itself,
# its engines, pytest) and adds only the plugin, which registers itself there alone through its
# `ferry.backends` entry point. Safe to run again: it reinstalls only when the plugin changes.
#
#   scripts/setup-iree.sh [VENV]    (default: $PWD/.venv-iree; needs .venv: scripts/setup.sh)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
main="$root/.venv"
venv="${1:-$root/.venv-iree}"
if [ ! -x "$main/bin/python" ]; then
  echo "setup-iree: $main is missing; run scripts/setup.sh (or scripts/test.sh) first" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv (on top of $main)"
  "$main/bin/python" -m venv --without-pip "$venv"
fi
site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# .venv's packages, after .venv-iree's own on sys.path, its own .pth files processed too (ferry
# is installed editable there through one).
echo "import site; site.addsitedir('$(site "$main")')" > "$(site "$venv")/ferry-main-venv.pth"
stamp="$venv/.ferry-iree-installed"
want="$(cat "$root/plugins/ferry-iree/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "==> installing plugins/ferry-iree (and IREE) into $venv"
  # pip comes from .venv (through the .pth); this machine's pip config names a mirror folder
  # that may be absent: drop those warnings only.
  "$venv/bin/python" -m pip install --quiet -e "$root/plugins/ferry-iree" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  echo "$want" > "$stamp"
fi
"$venv/bin/python" - <<'PY'
from ferry.backends import known_backends
import iree.compiler, iree.runtime  # noqa: F401
assert "iree" in known_backends(), known_backends()
PY
"$main/bin/python" - <<'PY'
from ferry.backends import known_backends
assert "iree" not in known_backends(), (
    "the IREE plugin is installed in .venv: pip uninstall ferry-iree there (it belongs in .venv-iree)"
)
PY
echo "==> the IREE plugin's tests run with: $venv/bin/python -m pytest plugins/ferry-iree/tests"
