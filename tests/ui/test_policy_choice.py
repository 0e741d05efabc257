"""The streaming policy in the app (issue 14): chosen in the control panel or with
`captioner gui --policy`, remembered in the settings, and carried to the local engine's
``EngineConfig``; a server session keeps the server's."""

from __future__ import annotations

import pytest
from fakes import TIMEOUT_S, ConfigTakingFactory, write_tone_wav

from captioner.engine.core import EngineConfig
from captioner.ui.controls import ControlPanel
from captioner.ui.run_config import POLICIES

WAIT_MS = int(TIMEOUT_S * 1000)


def test_the_panel_offers_the_policies_and_puts_the_choice_in_the_run_config(qtbot):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    assert [panel.policy_combo.itemData(i) for i in range(panel.policy_combo.count())] == [c for c, _ in POLICIES]
    assert panel.policy() == "auto" and panel.run_config().policy == "auto"
    panel.set_policy("alignatt")
    assert panel.run_config().policy == "alignatt"
    panel.set_policy("waitk")  # a hand-edited settings file: back to auto
    assert panel.policy() == "auto"
    panel.set_running(True)
    assert not panel.policy_combo.isEnabled()  # fixed while a session runs


@pytest.mark.parametrize("policy", ["alignatt", "localagreement"])
def test_gui_policy_reaches_the_engine_config_and_only_the_app_s_choice_is_saved(qtbot, tmp_path, monkeypatch, gui_args, policy):
    from captioner.app.gui_main import open_window
    from captioner.ui.settings import load_settings, open_settings

    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(tmp_path / "transcripts"))
    clip = write_tone_wav(tmp_path / "clip.wav")
    factory = ConfigTakingFactory()
    args = gui_args("--policy", policy, "--file", str(clip), "--no-start")
    window, controller = open_window(args, pipeline_factory=factory)
    qtbot.addWidget(window)
    qtbot.addWidget(window.overlay)
    try:
        assert window.controls.policy() == policy
        window.controls.start_button.click()
        qtbot.waitUntil(lambda: bool(factory.configs), timeout=WAIT_MS)
        (config,) = factory.configs
        assert isinstance(config, EngineConfig) and config.policy.kind == policy
        window.save_settings()
        # Given on the command line: this run's, not saved; chosen in the app: saved.
        assert load_settings(open_settings(args.settings)).policy == "auto"
        other = "alignatt" if policy == "localagreement" else "localagreement"
        window.controls.set_policy(other)
        window.save_settings()
        assert load_settings(open_settings(args.settings)).policy == other
    finally:
        controller.shutdown(timeout_s=TIMEOUT_S)


def test_the_gui_refuses_an_unknown_policy(gui_args):
    with pytest.raises(SystemExit):
        gui_args("--policy", "waitk")


def test_the_library_default_is_the_cli_s():
    # The library, the CLI and the app all choose "auto" (docs/api.md).
    assert EngineConfig().policy.kind == "auto"
