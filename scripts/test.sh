#!/usr/bin/env bash
# Set up (idempotent), lint, and run the whole test suite against real servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
