"""``GET /metrics``: the process's admission decisions for model calls in the Prometheus text format.

Read at scrape time from every live endpoint scheduler (:func:`planweave.models.admission.live_endpoints`), through
a collector on a registry of this module's own (not ``prometheus_client``'s global one, so two apps in one process
do not collide). Labels: ``model`` and ``base_url`` of the endpoint.

* gauges ``planweave_model_queue_length``, ``planweave_model_in_flight``, ``planweave_model_window`` (the adaptive
  window, or the fixed limit), ``planweave_model_oldest_wait_seconds``, ``planweave_model_paused_seconds``
  (what is left of a 429's Retry-After), ``planweave_model_requests_in_window`` and
  ``planweave_model_tokens_in_window`` (against the per-minute limits);
* counters ``planweave_model_admitted_total``, ``planweave_model_finished_total``,
  ``planweave_model_window_decreases_total`` and ``planweave_model_signals_total`` (label ``signal``: ok,
  rate_limited, server_error, slow_first_token, failed);
* the histogram ``planweave_model_wait_seconds`` of queue waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from planweave.extras import require

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector
except ModuleNotFoundError:  # pragma: no cover - the server extra brings it
    require("server", "GET /metrics (prometheus-client)")
    raise

from planweave.models.admission import WAIT_BUCKETS, EndpointScheduler, live_endpoints

__all__ = ["CONTENT_TYPE", "AdmissionCollector", "metrics_text"]

CONTENT_TYPE = CONTENT_TYPE_LATEST


class AdmissionCollector(Collector):
    """Turns the endpoint schedulers' figures into metric families at each scrape."""

    def __init__(self, endpoints: Callable[[], Iterable[EndpointScheduler]] = live_endpoints) -> None:
        self._endpoints = endpoints

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "base_url"]
        gauges = {
            "queue_length": GaugeMetricFamily("planweave_model_queue_length", "Model calls waiting for admission.",
                                              labels=labels),
            "in_flight": GaugeMetricFamily("planweave_model_in_flight", "Model calls admitted and running.",
                                           labels=labels),
            "window": GaugeMetricFamily("planweave_model_window",
                                        "Calls the endpoint may have in flight now (adaptive window or fixed limit).",
                                        labels=labels),
            "oldest": GaugeMetricFamily("planweave_model_oldest_wait_seconds",
                                        "How long the longest-waiting queued call has waited.", labels=labels),
            "paused": GaugeMetricFamily("planweave_model_paused_seconds",
                                        "Seconds left of a pause a 429's Retry-After asked for.", labels=labels),
            "requests": GaugeMetricFamily("planweave_model_requests_in_window",
                                          "Calls admitted within the rate-limit window.", labels=labels),
            "tokens": GaugeMetricFamily("planweave_model_tokens_in_window",
                                        "Tokens admitted within the rate-limit window.", labels=labels),
        }
        admitted = CounterMetricFamily("planweave_model_admitted", "Model calls admitted.", labels=labels)
        finished = CounterMetricFamily("planweave_model_finished", "Model calls that ended.", labels=labels)
        decreases = CounterMetricFamily("planweave_model_window_decreases", "Times the adaptive window halved.",
                                        labels=labels)
        signals = CounterMetricFamily("planweave_model_signals", "How admitted calls ended, as load signals.",
                                      labels=[*labels, "signal"])
        waits = HistogramMetricFamily("planweave_model_wait_seconds", "Seconds model calls waited for admission.",
                                      labels=labels)
        for endpoint in self._endpoints():
            s = endpoint.stats()
            values = [endpoint.model, endpoint.base_url]
            gauges["queue_length"].add_metric(values, s.queued)
            gauges["in_flight"].add_metric(values, s.in_flight)
            gauges["window"].add_metric(values, s.limit if s.limit is not None else float("inf"))
            gauges["oldest"].add_metric(values, s.oldest_wait)
            gauges["paused"].add_metric(values, s.paused_for)
            gauges["requests"].add_metric(values, s.requests_in_window)
            gauges["tokens"].add_metric(values, s.tokens_in_window)
            admitted.add_metric(values, s.admitted)
            finished.add_metric(values, s.finished)
            decreases.add_metric(values, s.decreases)
            for signal, count in sorted(s.signals.items()):
                signals.add_metric([*values, signal], count)
            waits.add_metric(values, _cumulative(s.wait_buckets), s.wait_sum)
        yield from gauges.values()
        yield from (admitted, finished, decreases, signals, waits)


def _cumulative(counts: Sequence[int]) -> list[tuple[str, float]]:
    bounds = [*(f"{b:g}" for b in WAIT_BUCKETS), "+Inf"]
    total, out = 0, []
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        out.append((bound, float(total)))
    return out


def metrics_text(endpoints: Callable[[], Iterable[EndpointScheduler]] = live_endpoints) -> bytes:
    """The Prometheus text exposition of the endpoints' admission figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AdmissionCollector(endpoints))
    return generate_latest(registry)
