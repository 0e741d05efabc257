"""What the live controller tells the window about a session: the :class:`SessionView` protocol.

Plain Python (no Qt): the controller in :mod:`captioner.app.gui_app` is written against this
protocol only, so it never touches a widget and never imports Qt; the window's Qt implementation
is :class:`captioner.ui.session_bridge.SessionBridge`, and tests use a recording fake.

The contract, for implementations:

- Calls come from the GUI thread (``devices_listed``, ``session_starting``,
  ``session_stopping``) or from the controller's start/stop helper threads (the others). An
  implementation must return at once (queue the call, never block) and must not call back into
  the controller: the controller may hold its lock while calling.
- The session calls are shown in the order they were made; one start makes ``session_starting``,
  any number of ``session_progress``, then exactly one of ``session_started`` or
  ``session_failed``; one stop makes ``session_stopping`` then ``session_stopped``.
- Captions, pipeline status and telemetry during a session are *not* pushed here: the window
  pulls them from its feed (``drain_captions``, ``latest_status``, ``latest_telemetry``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from captioner.events import CaptionUpdate, PipelineStatus


@runtime_checkable
class SessionView(Protocol):
    def devices_listed(self, devices: Sequence[Any], error: str | None) -> None:
        """The audio inputs to offer (values with ``name``, ``is_monitor``, ``open_as``), and
        ``error``, a sentence to show for a while, when listing them failed (``devices`` is then
        empty)."""

    def session_starting(self, model: str) -> None:
        """A start was accepted: the model ``model`` is being prepared; no start or stop is
        possible until the session starts or fails."""

    def session_progress(self, message: str, fraction: float) -> None:
        """How far preparing the model has come (``fraction`` in 0..1)."""

    def session_started(self, transcript_path: str | None, meta: Mapping[str, Any]) -> None:
        """Captioning: committed lines are saved to ``transcript_path``; ``meta`` describes the
        run (requested device, GPU, back-end) for a saved trace."""

    def session_failed(self, message: str, setting: str = "") -> None:
        """The start failed, for the reason ``message`` (one sentence for the user); ``setting``
        names the run's setting it is about ("sources", "model", "server"; "" when none is)."""

    def session_stopping(self, finished: bool) -> None:
        """A stop began: the user asked for it, the pipeline failed, or (``finished``) every file
        has played to its end and the last words are being committed."""

    def session_stopped(self, leftovers: Sequence[CaptionUpdate], status: PipelineStatus | None,
                        error: str | None) -> None:
        """Stopped: ``leftovers`` are the caption updates committed while stopping (show them
        before anything else), ``status`` the pipeline's last status, ``error`` why its worker
        or capture failed, if it did."""
