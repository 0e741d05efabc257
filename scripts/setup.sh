#!/usr/bin/env bash
# Installs everything captioner needs into ./.venv: Debian packages (when this user may install
# them), the Python package with its dependencies, and the CUDA runtime wheels when an NVIDIA
# driver is present.  usage: scripts/setup.sh app|test
#
# At the end it builds the default model's ONNX graphs (python -m captioner.app.prepare), so the
# first launch captions at once.
#
# A set-up that succeeded leaves a stamp in .venv (one per mode): a hash of what it was made
# from (pyproject.toml, this script, the mode and extras, the venv's Python, the installed
# captioner's dist-info). While that still matches, a later call skips the apt checks and pip
# and returns at once. The install is editable, so changed sources need nothing; a changed
# pyproject.toml, another extra, or an uninstalled captioner runs the full set-up again.
# A 'test' set-up covers 'app' too (its packages and extras are a superset).
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$script")/.."
mode="${1:-app}"
case "$mode" in app|test) ;; *) echo "usage: scripts/setup.sh app|test" >&2; exit 2 ;; esac
venv=.venv
python="${PYTHON:-python3}"

extras_for() {  # the pip extras of a mode on this machine
  local extras="$1"
  [ "$extras" = app ] && extras=""
  if [ "$has_nvidia" = 1 ]; then extras="${extras:+$extras,}cuda"; fi
  echo "$extras"
}

stamp_key() {  # what a set-up of mode $1 was made from, hashed
  {
    echo "mode=$1 extras=$(extras_for "$1")"
    cat pyproject.toml "$script"
    cat "$venv/pyvenv.cfg" 2>/dev/null || true
    # The installed captioner: its dist-info folder names the version; gone once uninstalled.
    ls -d "$venv"/lib/python*/site-packages/captioner-*.dist-info 2>/dev/null || echo "captioner not installed"
  } | sha256sum | cut -d' ' -f1
}

stamp_file() { echo "$venv/.captioner-setup-$1.stamp"; }

stamp_matches() {  # whether mode $1 was set up from exactly what is here now
  local file
  file="$(stamp_file "$1")"
  [ -x "$venv/bin/python" ] && [ -f "$file" ] && [ "$(cat "$file")" = "$(stamp_key "$1")" ]
}

has_nvidia=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then has_nvidia=1; fi

covering=("$mode")
[ "$mode" = app ] && covering+=(test)
for done_mode in "${covering[@]}"; do
  if stamp_matches "$done_mode"; then
    echo "captioner setup: up to date ($venv, set up for '$done_mode'; nothing changed since: skipping apt and pip)"
    exit 0
  fi
done

apt_app=(libportaudio2 libsndfile1 libasound2-plugins libegl1 libgl1 libfontconfig1 libdbus-1-3
         libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0
         libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0)
apt_test=(pulseaudio pulseaudio-utils xvfb xauth espeak-ng sox g++)  # g++: the rules kernel's CUDA source run on the CPU (tests)
# desktop-file-utils, x11-utils: the desktop entry is validated, and launched to read its window's class and icon.
apt_test+=(desktop-file-utils x11-utils)
wanted=("${apt_app[@]}")
[ "$mode" = test ] && wanted+=("${apt_test[@]}")
# Debian's python3 makes virtual environments only with python3-venv (it carries ensurepip).
if [ ! -x "$venv/bin/python" ] && ! "$python" -c "import ensurepip" >/dev/null 2>&1; then
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
    echo "captioner setup: installing Debian packages: ${missing[*]}"
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
else
  echo "captioner setup: not a Debian-family system; install PortAudio and libsndfile yourself." >&2
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "captioner setup: creating the virtual environment $venv"
  "$python" -m venv "$venv" || {
    echo "captioner setup: '$python -m venv' failed; on Debian/Ubuntu run: sudo apt-get install -y python3-venv" >&2
    exit 1
  }
fi
extras="$(extras_for "$mode")"
echo "captioner setup: installing captioner${extras:+[$extras]} and its Python packages into $venv" \
     "(the first time downloads a few hundred MB; later runs skip this)"
"$venv/bin/python" -m pip install --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --disable-pip-version-check -e ".${extras:+[$extras]}"
# Speaker labels: resemblyzer's voice encoder weights (Apache-2.0). Without --no-deps it would
# pull PyTorch, librosa and webrtcvad; captioner reads its checkpoint itself and needs none.
"$venv/bin/python" -m pip install --disable-pip-version-check --no-deps "resemblyzer==0.1.4"
# The default model is converted to ONNX graphs on first use (cached per user). Done here, where a
# wait is expected and shown, rather than behind the first window (14 s without captions on a
# 2-core CPU): tiny.en for the device the app will use, and base, which its language check loads.
echo "captioner setup: preparing the default model (tiny.en) and the language check's (base)"
"$venv/bin/python" -m captioner.app.prepare
# "Captioner" in the desktop's menu, with its icon (captioner install-desktop). A machine without
# a desktop is no reason to fail a set-up: a failure here is only a warning.
if [ "$(uname -s)" != Darwin ] && ! desktop_error="$("$venv/bin/python" -m captioner install-desktop 2>&1 >/dev/null)"; then
  desktop_error="${desktop_error##*$'\n'}"  # its last line: the one-line error
  desktop_error="${desktop_error#captioner: error: }"
  echo "captioner setup: warning: Captioner was not added to the desktop menu: ${desktop_error:-no reason given}" >&2
fi
stamp_key "$mode" >"$(stamp_file "$mode")"
echo "captioner setup: ready ($venv, extras: ${extras:-none})"
