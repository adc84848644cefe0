#!/usr/bin/env bash
# The test suite, as the README and CI run it: sets up .venv, then lint, types and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
echo "==> ruff"
ruff check src tests benchmarks examples
ruff format --check src tests benchmarks examples
echo "==> mypy"
mypy
echo "==> pytest"
python -m pytest "$@"
