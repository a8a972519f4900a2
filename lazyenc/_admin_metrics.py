"""Prometheus metrics for the admin panel, read from ``manager.status()`` at scrape time.

A custom collector (not module-level Gauges) so that a scrape reads the same
lock-free snapshots as the panel and every app gets its own registry: two
managers in one process never clash, and nothing lands in the global registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._process import rss_bytes, uptime_s
from ._proxy import STATES

if TYPE_CHECKING:
    from ._manager import EncoderManager

__all__ = ["METRIC_NAMES", "StatusCollector", "metrics_registry"]

# The names a scrape shows (counters get ``_total`` appended in the text format).
METRIC_NAMES = (
    "lazyenc_encoder_loaded",
    "lazyenc_encoder_state",
    "lazyenc_encoder_build_seconds",
    "lazyenc_encoder_loading_seconds",
    "lazyenc_encoder_rss_delta_bytes",
    "lazyenc_encoder_calls_total",
    "lazyenc_encoder_errors_total",
    "lazyenc_process_rss_bytes",
    "lazyenc_process_uptime_seconds",
)


class StatusCollector:
    """Turns the manager's status snapshots into metric families; never builds."""

    def __init__(self, manager: EncoderManager) -> None:
        self._manager = manager

    def describe(self) -> list[Any]:
        # Describing by collecting would read the manager at registration; nothing to pre-declare.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["encoder", "kind"]
        loaded = GaugeMetricFamily("lazyenc_encoder_loaded", "1 while a built model is held.", labels=labels)
        state = GaugeMetricFamily(
            "lazyenc_encoder_state",
            "1 for the encoder's current state, 0 for the others.",
            labels=[*labels, "state"],
        )
        build = GaugeMetricFamily(
            "lazyenc_encoder_build_seconds", "Duration of the encoder's last build.", labels=labels
        )
        loading = GaugeMetricFamily(
            "lazyenc_encoder_loading_seconds", "How long the running build has taken so far.", labels=labels
        )
        rss_delta = GaugeMetricFamily(
            "lazyenc_encoder_rss_delta_bytes",
            "Process RSS change measured around the encoder's last build.",
            labels=labels,
        )
        calls = CounterMetricFamily("lazyenc_encoder_calls", "Calls into the model.", labels=labels)
        errors = CounterMetricFamily("lazyenc_encoder_errors", "Calls that raised.", labels=labels)
        for s in self._manager.status():
            key = [s.name, s.kind]
            loaded.add_metric(key, 1.0 if s.loaded else 0.0)
            for name in STATES:
                state.add_metric([*key, name], 1.0 if s.state == name else 0.0)
            if s.load_seconds is not None:
                build.add_metric(key, s.load_seconds)
            if s.loading_for_s is not None:
                loading.add_metric(key, s.loading_for_s)
            if s.rss_delta_bytes is not None:
                rss_delta.add_metric(key, float(s.rss_delta_bytes))
            calls.add_metric(key, float(s.calls))
            errors.add_metric(key, float(s.errors))
        yield from (loaded, state, build, loading, rss_delta, calls, errors)

        rss = rss_bytes()
        if rss is not None:
            yield GaugeMetricFamily(
                "lazyenc_process_rss_bytes", "Resident set size of the process.", value=rss
            )
        yield GaugeMetricFamily(
            "lazyenc_process_uptime_seconds", "Seconds since the process started.", value=uptime_s()
        )


def metrics_registry(manager: EncoderManager) -> Any:
    """A fresh CollectorRegistry holding one StatusCollector (never the global registry)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(manager))
    return registry
