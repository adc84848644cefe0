#!/usr/bin/env bash
# What the browser tests (tests/web/test_web_browser.py) and benchmarks/web.py need beyond the venv:
#
#   chromium, chromium-driver   Debian's packages: the browser and the chromedriver built from the
#                               same source (so their versions always match). Tools that download a
#                               browser of their own (playwright install, Selenium Manager) cannot
#                               reach their download hosts from these machines.
#   selenium (PyPI, pinned)     the WebDriver client, into ferry's venv; it is told where Debian's
#                               chromedriver is, so Selenium Manager never runs.
#   node, npm                   the web exporter builds its bundle from onnxruntime-web on npm.
#
# Idempotent: what is already installed is kept (apt-get runs only when a command is missing, pip
# only when the pinned version is not there). Needs root (or sudo) for apt-get.
#
#   bash scripts/browser-env.sh                   # install or check, then print the versions
#   FERRY_VENV=/path/to/venv FERRY_SELENIUM_VERSION=4.51.0 bash scripts/browser-env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FERRY_VENV:-$ROOT/.venv}"
SELENIUM_VERSION="${FERRY_SELENIUM_VERSION:-4.51.0}"

say() { echo "browser-env: $*"; }
die() {
    echo "browser-env: error: $*" >&2
    exit 1
}

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "apt-get needs root: run this as root or install sudo"
    SUDO=(sudo)
fi

# -- Debian packages ------------------------------------------------------------------------------
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# Fonts, so that the pages' screenshots show text (a bare container has none).
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || missing+=(fonts-dejavu-core)
if ((${#missing[@]})); then
    say "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "chromium, chromedriver, node and npm are installed"
fi

# -- the Python driver ----------------------------------------------------------------------------
[[ -x "$VENV/bin/python" ]] || die "no venv at $VENV: run scripts/setup.sh first (or set FERRY_VENV)"
if "$VENV/bin/python" - "$SELENIUM_VERSION" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(version("selenium") != sys.argv[1])
PY
    say "selenium $SELENIUM_VERSION is in $VENV"
else
    say "installing selenium==$SELENIUM_VERSION into $VENV"
    "$VENV/bin/python" -m pip install --quiet "selenium==$SELENIUM_VERSION"
fi

say "ready"
echo "  $(chromium --version 2>/dev/null)"
echo "  $(chromedriver --version 2>/dev/null)"
echo "  node $(node --version), npm $(npm --version)"
echo "  selenium $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("selenium"))')"
