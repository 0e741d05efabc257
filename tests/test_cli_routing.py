"""`captioner` with no command, or with only the app's own options, opens the desktop app."""

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "captioner", *args], capture_output=True, text=True, timeout=60)


def test_app_options_without_a_command_go_to_the_app():
    # An invalid value for a gui-only option is rejected by the gui command's parser,
    # which shows that the options were routed there (and no window is opened).
    result = run_cli("--theme", "purple")
    assert result.returncode == 2
    assert "captioner gui" in result.stderr and "invalid choice: 'purple'" in result.stderr


def test_version_and_help_stay_top_level():
    assert run_cli("--version").stdout.strip().startswith("captioner ")
    help_text = run_cli("--help").stdout
    assert all(name in help_text for name in ("gui", "devices", "transcribe", "listen"))
