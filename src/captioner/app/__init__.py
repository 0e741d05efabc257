"""Composition root: the CLI and GUI entry points, configuration, pipeline wiring, shutdown."""
