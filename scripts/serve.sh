#!/usr/bin/env bash
# One command on a fresh machine: set everything up, then serve the bundled example repository
# (HTTP on :8000) with the settings in function.yaml. Extra arguments go to `bootstrap run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/bootstrap run "$@"
