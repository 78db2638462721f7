#!/usr/bin/env bash
# Set up (idempotent), lint, type-check, and run the whole test suite against real servers on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy  # the files and settings are pyproject.toml's [tool.mypy]
.venv/bin/python -m pytest "$@"
