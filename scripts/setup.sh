#!/usr/bin/env bash
# Installs everything captioner needs into ./.venv: Debian packages (when this user may install
# them), the Python package with its dependencies, and the CUDA runtime wheels when an NVIDIA
# driver is present.  usage: scripts/setup.sh app|test
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-app}"

apt_app=(libportaudio2 libsndfile1 libasound2-plugins libegl1 libgl1 libfontconfig1 libdbus-1-3
         libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0
         libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0)
apt_test=(pulseaudio pulseaudio-utils xvfb xauth espeak-ng sox)
wanted=("${apt_app[@]}")
[ "$mode" = test ] && wanted+=("${apt_test[@]}")
python="${PYTHON:-python3}"
# Debian's python3 makes virtual environments only with python3-venv (it carries ensurepip).
if [ ! -x .venv/bin/python ] && ! "$python" -c "import ensurepip" >/dev/null 2>&1; then
  wanted+=(python3-venv)
fi

if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo_cmd=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo_cmd=(sudo -n)
    else
      echo "captioner setup: these Debian packages are missing and this user cannot install them:" >&2
      echo "  sudo apt-get install -y ${missing[*]}" >&2
      echo "Run that line, then this command again." >&2
      exit 1
    fi
    echo "captioner setup: installing ${missing[*]}"
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "captioner setup: not a Debian-family system; install PortAudio and libsndfile yourself." >&2
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv || {
    echo "captioner setup: '$python -m venv' failed; on Debian/Ubuntu run: sudo apt-get install -y python3-venv" >&2
    exit 1
  }
fi
extras="$mode"
[ "$mode" = app ] && extras=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  extras="${extras:+$extras,}cuda"
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
echo "captioner setup: ready (.venv, extras: ${extras:-none})"
