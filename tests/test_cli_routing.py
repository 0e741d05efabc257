"""`captioner` with no command, or with only the app's own options, opens the desktop app."""

import subprocess

from captioner.app.cli import main


def run_cli(capsys, *args: str) -> subprocess.CompletedProcess:
    """``captioner ARGS`` through the CLI's ``main`` in this process (what ``python -m captioner``
    runs): the routing is the argument parsing's, no process boundary is involved."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own --version, --help and refusals
        code = exit_.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["captioner", *args], code, out, err)


def test_app_options_without_a_command_go_to_the_app(capsys):
    # An invalid value for a gui-only option is rejected by the gui command's parser,
    # which shows that the options were routed there (and no window is opened).
    result = run_cli(capsys, "--theme", "purple")
    assert result.returncode == 2
    assert "captioner gui" in result.stderr and "invalid choice: 'purple'" in result.stderr


def test_version_and_help_stay_top_level(capsys):
    version = run_cli(capsys, "--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("captioner ")
    help_text = run_cli(capsys, "--help").stdout
    assert all(name in help_text for name in ("gui", "devices", "transcribe", "listen"))

