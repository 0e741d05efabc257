#!/usr/bin/env bash
# Installs everything (scripts/setup.sh app) and runs captioner on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh app
exec .venv/bin/captioner "$@"
