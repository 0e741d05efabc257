#!/usr/bin/env bash
# Installs everything (scripts/setup.sh test) and runs the whole test suite.
# Tests start what they need themselves: PulseAudio with a null sink, Xvfb, espeak-ng.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
exec .venv/bin/python -m pytest "$@"
