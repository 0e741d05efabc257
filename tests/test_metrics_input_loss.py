"""Lost inputs in the Prometheus export: a counter per stream, a gauge of inputs away now."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from captioner.app.metrics import MetricsExporter
from captioner.events import PipelineStatus


def scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def status(*lost: str) -> PipelineStatus:
    return PipelineStatus(time_s=1.0, provider="CPUExecutionProvider", model="tiny.en", device_name="cpu",
                          streams=("Me", "Meeting"), lost_inputs=lost)


@pytest.fixture
def exporter():
    exp = MetricsExporter(0)
    exp.start()
    yield exp
    exp.stop()


def lost_total(families) -> dict[str, float]:
    return {s.labels["stream"]: s.value for s in families["captioner_input_lost"] if s.name.endswith("_total")}


def test_each_loss_counts_once_and_the_gauge_says_who_is_away(exporter):
    exporter.update_status(status())
    families = scrape(exporter.port)
    assert lost_total(families) == {"Me": 0.0, "Meeting": 0.0}  # counters exist from the start
    assert families["captioner_inputs_lost"][0].value == 0.0

    for _ in range(3):  # statuses repeat several times a second while an input is away
        exporter.update_status(status("Meeting"))
    families = scrape(exporter.port)
    assert lost_total(families) == {"Me": 0.0, "Meeting": 1.0}
    assert families["captioner_inputs_lost"][0].value == 1.0

    exporter.update_status(status("Meeting", "Me"))  # the server went: both away
    exporter.update_status(status())  # both back
    exporter.update_status(status("Meeting"))  # and Meeting lost again
    families = scrape(exporter.port)
    assert lost_total(families) == {"Me": 1.0, "Meeting": 2.0}
    assert families["captioner_inputs_lost"][0].value == 1.0
