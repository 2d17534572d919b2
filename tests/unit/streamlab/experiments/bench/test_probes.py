from __future__ import annotations

import math

from streamlab.experiments.bench.probes import WireBytes, parse_wire_bytes
from streamlab.experiments.bench.stats import percentile, summary

METRICS = """\
# HELP toxiproxy_proxy_received_bytes_total The total bytes received
# TYPE toxiproxy_proxy_received_bytes_total counter
toxiproxy_proxy_received_bytes_total{direction="downstream",listener="127.0.0.1:8470",proxy="edge",upstream="127.0.0.1:8471"} 1646
toxiproxy_proxy_received_bytes_total{direction="upstream",listener="127.0.0.1:8470",proxy="edge",upstream="127.0.0.1:8471"} 571
toxiproxy_proxy_sent_bytes_total{direction="downstream",listener="127.0.0.1:8470",proxy="edge",upstream="127.0.0.1:8471"} 1640
toxiproxy_proxy_sent_bytes_total{direction="upstream",listener="127.0.0.1:8470",proxy="edge",upstream="127.0.0.1:8471"} 571
toxiproxy_proxy_sent_bytes_total{direction="downstream",listener="127.0.0.1:8473",proxy="engine",upstream="127.0.0.1:50051"} 9e+06
"""  # noqa: E501


def test_up_is_read_from_the_client_and_down_is_written_to_it() -> None:
    # Up: what the proxy received from the client; down: what it sent to the
    # client (a toxic may hold bytes between the two sides).
    assert parse_wire_bytes(METRICS, "edge") == WireBytes(up=571, down=1640)
    assert parse_wire_bytes(METRICS, "engine") == WireBytes(up=0, down=9_000_000)
    assert parse_wire_bytes(METRICS, "nope") == WireBytes(0, 0)


def test_wire_bytes_subtract() -> None:
    assert WireBytes(10, 100) - WireBytes(4, 40) == WireBytes(6, 60)


def test_percentiles_interpolate_between_ranks() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == 25.0
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert math.isnan(percentile([], 50))


def test_summary_ignores_missing_values() -> None:
    assert summary([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert summary([None]) == {"median": None, "min": None, "max": None}
